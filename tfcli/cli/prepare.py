"""`tfcli prepare`: a corpus in, a prepared directory out."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import List, Optional

import typer

from tfcli.cli.common import (
    config_defaults,
    EncodingErrors, Quiet, app, check_choice, choices_of, err, info, run,
)
from tfcli.console import quiet_enabled
from tfcli.data.config import PrepareConfig


_PAR, _MULTI, _ONE, _HUB, _CLEAN, _TOK = (
    "Parallel text (two aligned files per split)",
    "Several directions, one multilingual model (files PREFIX.LANG)",
    "One file per split (TSV, JSONL, monolingual text)",
    "Datasets (datasets.load_dataset)",
    "Cleaning",
    "Tokenizer",
)


@app.command()
@config_defaults(PrepareConfig)
def prepare(
    out: Optional[str] = typer.Option(None, "--out", "--output", "-o", metavar="DIR", help="Prepared directory to write."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", metavar="FILE", help="YAML/TOML/JSON file whose `prepare:` section sets the options."
    ),
    force: bool = typer.Option(
        False, "--force", "-f", help="Rebuild even when up to date; replace a directory prepared with other settings."
    ),
    src: Optional[str] = typer.Option(None, "--src", metavar="FILE", rich_help_panel=_PAR, help="Training source text, one sentence a line."),
    tgt: Optional[str] = typer.Option(None, "--tgt", metavar="FILE", rich_help_panel=_PAR, help="Training target text, line-aligned with --src."),
    valid_src: Optional[str] = typer.Option(None, "--valid-src", metavar="FILE", rich_help_panel=_PAR, help="Validation source text."),
    valid_tgt: Optional[str] = typer.Option(None, "--valid-tgt", metavar="FILE", rich_help_panel=_PAR, help="Validation target text."),
    test_src: Optional[str] = typer.Option(None, "--test-src", metavar="FILE", rich_help_panel=_PAR, help="Test source text."),
    test_tgt: Optional[str] = typer.Option(None, "--test-tgt", metavar="FILE", rich_help_panel=_PAR, help="Test target text."),
    lang_pairs: Optional[str] = typer.Option(
        None, "--lang-pairs", metavar="SRC-TGT,...", rich_help_panel=_MULTI,
        help="Directions for one model, e.g. de-en,en-de,en-fr: each source gets its target language's tag >>fr<< "
        "(translate --tgt-lang fr); files PREFIX.SRC and PREFIX.TGT, or fairseq's PREFIX.SRC-TGT.LANG. One pair "
        "with --src/--tgt names their languages (an imported M2M-100/NLLB or chat model needs them).",
    ),
    add_language: Optional[List[str]] = typer.Option(
        None, "--add-language", metavar="CODE[=LIKE]", rich_help_panel=_MULTI,
        help="With --tokenizer-from a checkpoint: a language it lacks (repeat), its token added (__xx__, NLLB's "
        "code, >>xx<<); train --init-from gives it rows copied from language LIKE's, or the mean of all rows.",
    ),
    corpus: Optional[List[str]] = typer.Option(
        None, "--corpus", metavar="NAME=SRC,TGT[,W]", rich_help_panel=_MULTI,
        help="A training corpus by name (repeat): each epoch draws from the corpora in proportion to their weights "
        "W (default 1), e.g. a new domain's beside an earlier one's replayed.",
    ),
    valid_corpus: Optional[List[str]] = typer.Option(
        None, "--valid-corpus", metavar="NAME=SRC,TGT", rich_help_panel=_MULTI,
        help="A valid set by name (repeat), each scored and reported alone during training.",
    ),
    train_prefix: Optional[str] = typer.Option(
        None, "--train-prefix", metavar="PREFIX", rich_help_panel=_MULTI, help="Training files, e.g. data/train (data/train.de, ...)."
    ),
    valid_prefix: Optional[str] = typer.Option(
        None, "--valid-prefix", metavar="PREFIX", rich_help_panel=_MULTI,
        help="Validation files: one valid split per direction, each scored during training.",
    ),
    test_prefix: Optional[str] = typer.Option(None, "--test-prefix", metavar="PREFIX", rich_help_panel=_MULTI, help="Test files."),
    train: Optional[str] = typer.Option(
        None, "--train", metavar="FILE", rich_help_panel=_ONE,
        help="Training data in one file: .tsv (SRC<TAB>TGT), .jsonl (fields below) or text (a language model's).",
    ),
    valid: Optional[str] = typer.Option(None, "--valid", metavar="FILE", rich_help_panel=_ONE, help="Validation data, same kinds as --train."),
    test: Optional[str] = typer.Option(None, "--test", metavar="FILE", rich_help_panel=_ONE, help="Test data, same kinds as --train."),
    fmt: Optional[str] = typer.Option(
        None, "--format", rich_help_panel=_ONE,
        help="auto, tsv, jsonl or text \\[default: auto: .tsv, .jsonl/.json (also .gz), anything else is text].",
    ),
    src_field: Optional[str] = typer.Option(
        None, "--src-field", metavar="FIELD", rich_help_panel=_ONE,
        help="JSONL/dataset source field, dotted for nesting (translation.de); TSV: column number \\[default: 1].",
    ),
    tgt_field: Optional[str] = typer.Option(
        None, "--tgt-field", metavar="FIELD", rich_help_panel=_ONE,
        help="JSONL/dataset target field (translation.en); TSV: column number \\[default: 2].",
    ),
    text_field: Optional[str] = typer.Option(
        None, "--text-field", metavar="FIELD", rich_help_panel=_ONE,
        help="Monolingual JSONL/dataset field (used without --src-field/--tgt-field); 'messages': conversations "
        "for a chat model (--tokenizer-from it), the loss on the assistant's replies only.",
    ),
    mono_mode: Optional[str] = typer.Option(
        None, "--mono-mode", rich_help_panel=_ONE,
        help="Monolingual sequences: line (each line), paragraph (blank-line separated, WikiText style) or "
        "document (the whole file, newlines kept: character LMs).",
    ),
    valid_ratio: Optional[float] = typer.Option(
        None, "--valid-ratio", metavar="R", rich_help_panel=_ONE,
        help="Without a valid split: the LAST fraction R of train becomes valid (of the characters in document "
        "mode, as nanoGPT splits Tiny Shakespeare).",
    ),
    dataset: Optional[str] = typer.Option(
        None, "--dataset", metavar="NAME", rich_help_panel=_HUB,
        help="Load with datasets.load_dataset: a hub name (wmt14), or json/text/csv/parquet with --data-files.",
    ),
    dataset_config: Optional[str] = typer.Option(
        None, "--dataset-config", metavar="NAME", rich_help_panel=_HUB, help="Dataset configuration, e.g. de-en."
    ),
    data_files: Optional[List[str]] = typer.Option(
        None, "--data-files", metavar="SPLIT=PATH", show_default=False, rich_help_panel=_HUB,
        help="Local files for --dataset json/text, e.g. train=train.jsonl (repeat per split; globs allowed).",
    ),
    dataset_splits: Optional[List[str]] = typer.Option(
        None, "--dataset-split", metavar="SPLIT=NAME", show_default=False, rich_help_panel=_HUB,
        help="Which dataset split feeds train/valid/test, e.g. valid=validation or train=train[:100000] "
        "\\[default: train, validation|valid|dev, test].",
    ),
    streaming: Optional[bool] = typer.Option(
        None, "--streaming/--no-streaming", rich_help_panel=_HUB, help="Stream rows instead of caching the dataset first."
    ),
    nfc: Optional[bool] = typer.Option(None, "--nfc/--no-nfc", rich_help_panel=_CLEAN, help="Unicode NFC normalisation."),
    lowercase: Optional[bool] = typer.Option(
        None, "--lowercase/--keep-case", rich_help_panel=_CLEAN,
        help="Lowercase every side (as fairseq's IWSLT'14 example does); the saved tokenizers lowercase "
        "what they encode, so translate takes cased input and writes lowercase \\[default: keep case].",
    ),
    strip: Optional[bool] = typer.Option(
        None, "--strip/--no-strip", rich_help_panel=_CLEAN, help="Strip leading/trailing whitespace \\[default: on; never in document mode]."
    ),
    drop_empty: Optional[bool] = typer.Option(
        None, "--drop-empty/--keep-empty", rich_help_panel=_CLEAN,
        help="Drop empty rows; keep them to score WikiText-style (an empty line is one </s>) \\[default: drop].",
    ),
    dedupe: Optional[bool] = typer.Option(
        None, "--dedupe/--no-dedupe", rich_help_panel=_CLEAN, help="Drop repeated training rows (pairs)."
    ),
    max_length: Optional[int] = typer.Option(
        None, "--max-length", metavar="N", rich_help_panel=_CLEAN,
        help="Drop training pairs with a side longer than N tokens; 0 = off.",
    ),
    max_ratio: Optional[float] = typer.Option(
        None, "--max-ratio", metavar="R", rich_help_panel=_CLEAN,
        help="Drop training pairs whose longer side has more than R times the tokens of the shorter; 0 = off.",
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", rich_help_panel=_TOK,
        help="bpe, unigram, wordpiece, bytelevel (GPT-2 style, no <unk>) or char.",
    ),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", metavar="N", rich_help_panel=_TOK,
        help="Vocabulary size, special tokens included; for char every training character is kept.",
    ),
    joint_vocab: Optional[bool] = typer.Option(
        None, "--joint-vocab/--separate-vocab", rich_help_panel=_TOK,
        help="One vocabulary shared by source and target, or one each \\[default: joint].",
    ),
    tokenizer_from: Optional[str] = typer.Option(
        None, "--tokenizer-from", metavar="PATH", rich_help_panel=_TOK,
        help="Reuse tokenizers instead of training: a tokenizer.json, a SentencePiece unigram model (.spm/.model), "
        "a prepared directory, or a checkpoint/run (to prepare evaluation data for a trained model; no train split "
        "needed).",
    ),
    encoding_errors: EncodingErrors = None,
    tokenizer_sample: Optional[int] = typer.Option(
        None, "--tokenizer-sample", metavar="N", rich_help_panel=_TOK,
        help="Train the tokenizer on a random sample of N train rows (SentencePiece's input_sentence_size): "
        "faster on millions of rows; every row is still encoded \\[default: 0, all rows].",
    ),
    quiet: Quiet = False,
):
    """Clean a corpus, train a tokenizer on its train split and write token ids to a prepared directory.

    tfcli prepare --src train.de --tgt train.en --valid-src valid.de --valid-tgt valid.en -o prep/
    tfcli prepare --train pairs.tsv --valid dev.tsv --tokenizer unigram -o prep/
    tfcli prepare --train input.txt --mono-mode document --tokenizer char --valid-ratio 0.1 -o prep/
    tfcli prepare --lang-pairs de-en,en-de,en-fr,fr-en --train-prefix d/train --valid-prefix d/valid -o prep/
    tfcli prepare --corpus new=t.de,t.en --corpus old=m.de,m.en,0.3 --valid-corpus new=tv.de,tv.en
        --valid-corpus old=mv.de,mv.en --tokenizer-from ckpt -o prep/      (fine-tuning with replay)
    tfcli prepare --src t.de --tgt t.en --lang-pairs deu_Latn-eng_Latn --tokenizer-from nllb -o prep/
    tfcli prepare --train chats.jsonl --text-field messages --tokenizer-from qwen-instruct -o prep/

    With --tokenizer-from a checkpoint imported from a published family, the data is written in the family's
    conventions: M2M-100/NLLB language tokens, OPUS-MT's >>xx<<, a chat model's template (the loss on its replies).

    Filters: empty rows (every split); duplicates, --max-length and --max-ratio (train only).
    A table of the rows each filter dropped, per split, goes to stderr.
    A re-run with the same inputs and settings does nothing (it says so) unless --force.
    The directory is built in a temp dir and renamed at the end: a failed run leaves nothing behind.
    Memory stays bounded on any corpus size (read, cleaned and encoded in chunks), except for --mono-mode document.
    """
    import time

    from tfcli.data.config import prepare_config
    from tfcli.data.prepare import prepare as run_prepare

    for flag, value, name in (("--format", fmt, "format"), ("--mono-mode", mono_mode, "mono_mode"),
                              ("--tokenizer", tokenizer, "tokenizer"), ("--encoding-errors", encoding_errors,
                                                                         "encoding_errors")):
        check_choice(flag, value, choices_of(PrepareConfig, name))

    cfg = run(
        prepare_config, config,
        out=out, src=src, tgt=tgt, valid_src=valid_src, valid_tgt=valid_tgt, test_src=test_src, test_tgt=test_tgt,
        lang_pairs=[lang_pairs] if lang_pairs else None, train_prefix=train_prefix, valid_prefix=valid_prefix,
        test_prefix=test_prefix, add_languages=add_language or None, corpora=corpus or None, valid_corpora=valid_corpus or None,
        train=train, valid=valid, test=test, format=fmt, src_field=src_field, tgt_field=tgt_field,
        text_field=text_field, mono_mode=mono_mode, valid_ratio=valid_ratio, dataset=dataset,
        dataset_config=dataset_config, data_files=data_files or None, dataset_splits=dataset_splits or None,
        streaming=streaming, nfc=nfc, lowercase=lowercase, strip=strip, drop_empty=drop_empty, dedupe=dedupe,
        max_length=max_length, max_ratio=max_ratio,
        tokenizer=tokenizer, vocab_size=vocab_size, joint_vocab=joint_vocab,
        tokenizer_from=tokenizer_from, tokenizer_sample=tokenizer_sample, encoding_errors=encoding_errors,
    )
    start = time.perf_counter()
    # a spinner naming the stage, on a terminal only
    with err.status("preparing") if err.is_terminal and not quiet_enabled() else contextlib.nullcontext() as status:
        stage = (lambda s: status.update(f"{s} ...")) if status is not None else (lambda s: None)
        path = run(run_prepare, cfg, force, stage, info)
    if not quiet_enabled():
        _print_prepare_summary(path, time.perf_counter() - start)


def _print_prepare_summary(path: Path, seconds: float) -> None:
    """The cleaning report (rows dropped by each filter, per split) and what was written, on stderr."""
    from rich.table import Table

    from tfcli.data.cleaning import COLUMNS
    from tfcli.data.prepared import PreparedData

    meta = PreparedData(path).meta
    table = Table(title=f"{path}: cleaning", title_justify="left")
    table.add_column("split")
    for c in COLUMNS:
        table.add_column(c.replace("_", " "), justify="right")
    for split, counts in meta["cleaning"].items():
        table.add_row(split, *(f"{counts[c]:,}" for c in COLUMNS))
    err.print(table)
    sides = list(meta["vocab"])
    vocab = ", ".join(f"{side} {meta['vocab'][side]:,}" for side in sides)
    joint = " (joint)" if meta.get("joint_vocab") else ""
    tokens = "; ".join(
        f"{split} " + " / ".join(f"{info[side]['tokens']:,}" for side in sides if side in info)
        for split, info in meta["splits"].items()
    )
    tok = meta["tokenizer"]
    kind = f"tokenizer of {tok['from']}," if "from" in tok else tok["type"]
    err.print(f"{meta['kind']}, {kind} vocab {vocab}{joint}; tokens {tokens}; {seconds:.1f} s")
