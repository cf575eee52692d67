"""The `tfcli` command line. Thin by design: parse options, call one function, print.

Errors the user can fix are printed as one line on stderr (exit 1); usage errors exit 2; an interrupt exits 130.
Pass --debug (or set TFCLI_DEBUG=1) to see full tracebacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer
from rich.console import Console
from rich.markup import escape

import tfcli
from tfcli.errors import (
    EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, TfcliError, debug_enabled, interrupt, quiet_enabled, raise_if_interrupted,
)
from tfcli.generate.config import GenerateConfig, TranslateConfig
from tfcli.train.config import TrainConfig

_T, _G, _TRAIN = TranslateConfig(), GenerateConfig(), TrainConfig()


def _default(value) -> str:
    return f" \\[default: {value}]."


def _value_type(self, ctx):
    """A flag takes no value, so its help row shows none (typer prints `<bool>`, which made users type `--json
    true`)."""
    return None if getattr(self, "is_flag", False) else _typer_value_type(self, ctx)


# typer's rich help asks each option for its value type here from typer 0.29 on; older ones print no `<bool>`
_typer_value_type = getattr(typer.core.TyperOption, "display_type_rich", None)
if _typer_value_type is not None:
    typer.core.TyperOption.display_type_rich = _value_type

app = typer.Typer(
    name="tfcli",
    help="A command-line Transformer toolkit: prepare corpora, train translation models and language models, "
    "translate, generate and score.\n\nThe stages chain: prepare -> train -> translate / lm-generate -> eval.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_ERROR) -> None:
    if err.is_terminal:
        err.print(f"[bold red]error:[/] {escape(message)}", markup=True)  # escape: paths may contain [brackets]
    else:
        print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def run(fn, *args, **kwargs):
    """Call `fn`, turning user errors into one-line messages and exit codes (tracebacks only with --debug)."""
    try:
        result = fn(*args, **kwargs)
        raise_if_interrupted()  # a signal whose KeyboardInterrupt was lost in C code still ends in status 130
        return result
    except TfcliError as e:
        if debug_enabled():
            raise
        fail(str(e), e.exit_code)
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        print("interrupted", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        # downstream closed the pipe (`| head`): stop quietly, like other Unix tools
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        raise typer.Exit(0)
    except (typer.Exit, typer.Abort, typer.TyperException):
        raise
    except OSError as e:  # the environment: permissions, a full disk, a file that vanished
        if debug_enabled():
            raise
        fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e))
    except Exception as e:
        if debug_enabled():
            raise
        if _out_of_memory(e):
            size = re.search(r"allocate (\d+) bytes", str(e))
            tried = f" (tried to allocate {int(size.group(1)) / 2**30:.1f} GiB)" if size else ""
            fail(f"out of memory{tried}; use a smaller model or lower --batch-size / --max-tokens")
        first = (str(e).strip().splitlines() or [""])[0]
        fail(f"internal error: {type(e).__name__}: {first} (run with --debug for the traceback, and please report it)")


def refuse_unused(ctx: typer.Context, names, why: str) -> None:
    """A flag the chosen mode does not use is a usage error naming it, never silently ignored (`eval --dtype int8`
    on perplexity would print fp32's number). `names`: parameter names; only those given on the command line count."""
    for name in names:
        source = ctx.get_parameter_source(name)  # (by name: typer vendors its own click from 0.2x on)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT"):
            param = next(p for p in ctx.command.params if p.name == name)
            flag = max(param.opts, key=len) if param.opts else name
            fail(f"{flag} {why}", EXIT_USAGE)


def check_choice(flag: str, value, choices) -> None:
    """A flag's value outside its choices is a usage error (exit 2), as click's own choices are, with the choices and
    the closest one."""
    import difflib

    values = value if isinstance(value, list) else [value]
    for v in values:
        if v is not None and v not in choices:
            close = difflib.get_close_matches(str(v), [str(c) for c in choices], n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            fail(f"{flag} {v}: unknown; choose from {', '.join(map(str, choices))}{hint}", EXIT_USAGE)


def choices_of(cls, name: str) -> tuple:
    """The values a config dataclass's Literal field allows (its one place of definition)."""
    import typing

    return typing.get_args(typing.get_type_hints(cls)[name])


def _out_of_memory(e: Exception) -> bool:
    """MemoryError, torch's CUDA OutOfMemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError" or "can't allocate memory" in str(e)


def _set_env(name: str):
    def callback(value: bool):
        if value:
            os.environ[name] = "1"
        return value
    return callback


Quiet = Annotated[bool, typer.Option(
    "--quiet", "-q", callback=_set_env("TFCLI_QUIET"), is_eager=True,
    help="Only warnings and errors on stderr: no progress bars, summaries or log lines (results still go to stdout).",
)]


def info(message: str) -> None:
    """A line for the user on stderr, unless --quiet."""
    if not quiet_enabled():
        print(message, file=sys.stderr)


def _version(value: bool):
    if value:
        print(f"tfcli {tfcli.__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors (also TFCLI_DEBUG=1)."),
    quiet: Quiet = False,
):
    if debug:
        os.environ["TFCLI_DEBUG"] = "1"


# --- commands --------------------------------------------------------------------------------------------------


_PAR, _ONE, _HUB, _CLEAN, _TOK = (
    "Parallel text (two aligned files per split)",
    "One file per split (TSV, JSONL, monolingual text)",
    "Datasets (datasets.load_dataset)",
    "Cleaning",
    "Tokenizer",
)


@app.command()
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
        help="Monolingual JSONL/dataset field (used without --src-field/--tgt-field) \\[default: text].",
    ),
    mono_mode: Optional[str] = typer.Option(
        None, "--mono-mode", rich_help_panel=_ONE,
        help="Monolingual sequences: line (each line), paragraph (blank-line separated, WikiText style) or "
        "document (the whole file, newlines kept: character LMs) \\[default: line].",
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
    nfc: Optional[bool] = typer.Option(None, "--nfc/--no-nfc", rich_help_panel=_CLEAN, help="Unicode NFC normalisation \\[default: on]."),
    strip: Optional[bool] = typer.Option(
        None, "--strip/--no-strip", rich_help_panel=_CLEAN, help="Strip leading/trailing whitespace \\[default: on; never in document mode]."
    ),
    drop_empty: Optional[bool] = typer.Option(
        None, "--drop-empty/--keep-empty", rich_help_panel=_CLEAN,
        help="Drop empty rows; keep them to score WikiText-style (an empty line is one </s>) \\[default: drop].",
    ),
    dedupe: Optional[bool] = typer.Option(
        None, "--dedupe/--no-dedupe", rich_help_panel=_CLEAN, help="Drop repeated training rows (pairs) \\[default: off]."
    ),
    max_length: Optional[int] = typer.Option(
        None, "--max-length", metavar="N", rich_help_panel=_CLEAN,
        help="Drop training pairs with a side longer than N tokens; 0 = off \\[default: 256].",
    ),
    max_ratio: Optional[float] = typer.Option(
        None, "--max-ratio", metavar="R", rich_help_panel=_CLEAN,
        help="Drop training pairs whose longer side has more than R times the tokens of the shorter; 0 = off "
        "\\[default: 3].",
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", rich_help_panel=_TOK,
        help="bpe, unigram, wordpiece, bytelevel (GPT-2 style, no <unk>) or char \\[default: bpe].",
    ),
    vocab_size: Optional[int] = typer.Option(
        None, "--vocab-size", metavar="N", rich_help_panel=_TOK,
        help="Vocabulary size, special tokens included; for char every training character is kept \\[default: 8000].",
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

    Filters: empty rows (every split); duplicates, --max-length and --max-ratio (train only).
    A table of the rows each filter dropped, per split, goes to stderr.
    A re-run with the same inputs and settings does nothing (it says so) unless --force.
    The directory is built in a temp dir and renamed at the end: a failed run leaves nothing behind.
    Memory stays bounded on any corpus size (read, cleaned and encoded in chunks), except for --mono-mode document.
    """
    import contextlib
    import time

    from tfcli.data.prepare import PrepareConfig, prepare as run_prepare, prepare_config

    for flag, value, name in (("--format", fmt, "format"), ("--mono-mode", mono_mode, "mono_mode"),
                              ("--tokenizer", tokenizer, "tokenizer"), ("--encoding-errors", encoding_errors,
                                                                         "encoding_errors")):
        check_choice(flag, value, choices_of(PrepareConfig, name))

    cfg = run(
        prepare_config, config,
        out=out, src=src, tgt=tgt, valid_src=valid_src, valid_tgt=valid_tgt, test_src=test_src, test_tgt=test_tgt,
        train=train, valid=valid, test=test, format=fmt, src_field=src_field, tgt_field=tgt_field,
        text_field=text_field, mono_mode=mono_mode, valid_ratio=valid_ratio, dataset=dataset,
        dataset_config=dataset_config, data_files=data_files or None, dataset_splits=dataset_splits or None,
        streaming=streaming, nfc=nfc, strip=strip, drop_empty=drop_empty, dedupe=dedupe, max_length=max_length, max_ratio=max_ratio,
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


_OPT, _BATCH, _VAL, _HW = "Optimisation", "Batching", "Validation, logging, checkpoints", "Hardware"


@app.command()
def train(
    ctx: typer.Context,
    data: Optional[str] = typer.Argument(
        None, metavar="DATA", show_default=False, help="Prepared directory (tfcli prepare); parallel for a "
        "translation model, monolingual for a language model."
    ),
    out: Optional[str] = typer.Option(None, "--out", "--output", "-o", metavar="RUN", help="Run directory to write."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", metavar="FILE", help="YAML/TOML file with `train:` and `model:` sections."
    ),
    sets: Optional[List[str]] = typer.Option(
        None, "--set", metavar="SECTION.KEY=VALUE", show_default=False,
        help="Set any option, e.g. --set model.dropout=0.3 --set train.warmup=800 (repeat).",
    ),
    arch: Optional[str] = typer.Option(
        None, "--arch", "-a", help="Architecture preset: tiny, small, base, big (translation); lm-tiny, lm-cpu, "
        "baby-gpt, gpt2-small (language model) \\[default: small]."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in RUN from its latest checkpoint."),
    init_from: Optional[str] = typer.Option(
        None, "--init-from", metavar="CKPT", help="Fine-tune: start from this checkpoint's weights and architecture "
        "(a fresh optimizer and schedule). DATA must use its tokenizer: tfcli prepare --tokenizer-from CKPT."
    ),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", rich_help_panel=_OPT, help="Updates (0: no limit) \\[default: 0]."),
    max_epochs: Optional[int] = typer.Option(None, "--max-epochs", rich_help_panel=_OPT, help="Epochs (0: no limit) \\[default: 20]."),
    max_minutes: Optional[float] = typer.Option(
        None, "--max-minutes", rich_help_panel=_OPT, help="Wall-clock budget, validations included (0: none). Without "
        "--max-steps the step count is planned at the end of warmup from the measured speed (logged; --max-steps N "
        "repeats it) \\[default: 0]."
    ),
    lr: Optional[float] = typer.Option(None, "--lr", rich_help_panel=_OPT, help="Peak learning rate \\[default: 5e-4]."),
    schedule: Optional[str] = typer.Option(
        None, "--schedule", rich_help_panel=_OPT, help="inverse_sqrt (the 2017 paper's), cosine or constant, all with "
        "linear warmup \\[default: inverse_sqrt]."
    ),
    warmup: Optional[int] = typer.Option(None, "--warmup", rich_help_panel=_OPT, help="Warmup steps \\[default: 4000]."),
    label_smoothing: Optional[float] = typer.Option(
        None, "--label-smoothing", rich_help_panel=_OPT, help="\\[default: 0.1]."
    ),
    weight_decay: Optional[float] = typer.Option(
        None, "--weight-decay", rich_help_panel=_OPT, help="AdamW decay of weight matrices \\[default: 0]."
    ),
    clip_norm: Optional[float] = typer.Option(
        None, "--clip-norm", rich_help_panel=_OPT, help="Clip gradients to this global norm (0: off) \\[default: 1]."
    ),
    grad_accum: Optional[int] = typer.Option(
        None, "--grad-accum", rich_help_panel=_OPT, help="Micro-batches per update \\[default: 1]."
    ),
    seed: Optional[int] = typer.Option(None, "--seed", rich_help_panel=_OPT, help="\\[default: 1]."),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", rich_help_panel=_BATCH, help="Padded tokens per batch per process \\[default: 4096]."
    ),
    max_sentences: Optional[int] = typer.Option(
        None, "--max-sentences", rich_help_panel=_BATCH, help="Sentences per batch, at most (0: no limit)."
    ),
    max_len: Optional[int] = typer.Option(
        None, "--max-len", rich_help_panel=_BATCH,
        help="Translation: truncate longer sentences; LM: block length \\[default: the model's max_len].",
    ),
    bpe_dropout: Optional[float] = typer.Option(
        None, "--bpe-dropout", metavar="P", rich_help_panel=_BATCH,
        help="BPE-dropout for translation training: each epoch re-cuts the training pairs into subwords, skipping "
        "each merge with probability P (0.1 is usual; a bpe tokenizer; valid, test and inference unchanged) "
        "\\[default: 0].",
    ),
    log_every: Optional[int] = typer.Option(None, "--log-every", rich_help_panel=_VAL, help="\\[default: 100]."),
    valid_every: Optional[int] = typer.Option(
        None, "--valid-every", rich_help_panel=_VAL, help="Validate and checkpoint every N steps \\[default: 1000]."
    ),
    valid_bleu: Optional[bool] = typer.Option(
        None, "--valid-bleu/--no-valid-bleu", rich_help_panel=_VAL, help="Greedy BLEU on the valid set \\[default: on]."
    ),
    early_stop: Optional[str] = typer.Option(
        None, "--early-stop", rich_help_panel=_VAL, help="Metric for early stopping and BEST: loss, ppl or bleu "
        "\\[default: loss]."
    ),
    patience: Optional[int] = typer.Option(
        None, "--patience", rich_help_panel=_VAL, help="Validations without improvement before stopping (0: never)."
    ),
    keep_last: Optional[int] = typer.Option(
        None, "--keep-last", rich_help_panel=_VAL, help="Checkpoints kept besides the best" + _default(_TRAIN.keep_last)
    ),
    average_last: Optional[int] = typer.Option(
        None, "--average-last", rich_help_panel=_VAL, help="At the end, average the last K checkpoints into "
        "RUN/checkpoints/avg-lastK."
    ),
    tensorboard: Optional[bool] = typer.Option(
        None, "--tensorboard/--no-tensorboard", rich_help_panel=_VAL,
        help="Also write TensorBoard events to RUN/tensorboard (pip install 'tfcli[tensorboard]') \\[default: off].",
    ),
    device: Optional[str] = typer.Option(None, "--device", rich_help_panel=_HW, help="auto, cpu, cuda, cuda:N."),
    precision: Optional[str] = typer.Option(
        None, "--precision", rich_help_panel=_HW, help="auto, native-bf16, fp32, bf16 or fp16 (GPU, with "
        "loss scaling) \\[default: auto = bf16 on a GPU that has it, else fp32; native-bf16: also bf16 on a CPU with "
        "AMX]."
    ),
    compile_: Optional[bool] = typer.Option(None, "--compile/--no-compile", rich_help_panel=_HW, help="torch.compile."),
    threads: Optional[int] = typer.Option(None, "--threads", rich_help_panel=_HW, help="CPU threads for torch."),
    profile: Optional[str] = typer.Option(
        None, "--profile", metavar="A-B", rich_help_panel=_HW, help="Run steps A to B under torch.profiler: "
        "RUN/profile/ops.txt (ops by device time) and trace.json (Chrome trace)."
    ),
    quiet: Quiet = False,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", callback=_set_env("TFCLI_VERBOSE"), is_eager=True,
        help="Also print the whole resolved config at the start (it is always in RUN/config.yaml and RUN/train.log).",
    ),
):
    """Train an encoder-decoder (translation) or decoder-only (language model) Transformer.

    tfcli train prep/ -o run/ --arch small --warmup 4000
    tfcli train prep/ -o run/ -c train.yaml --set model.dropout=0.3
    tfcli train -o run/ --resume --max-steps 50000      continue exactly
    tfcli train prep/ -o tuned/ --init-from run/ --lr 1e-4      fine-tune
    torchrun --nproc_per_node=4 $(which tfcli) train prep/ -o run/

    Writes RUN/config.yaml (the resolved config), RUN/metrics.jsonl (one JSON line per log step and per
    validation) and RUN/checkpoints/step-N/ with BEST and LATEST pointers; `tfcli translate -m RUN` uses BEST.
    Ctrl-C or SIGTERM finishes the step, saves a checkpoint and exits with status 130.
    Prints the best (else the last) checkpoint's path on stdout. "tok/s" counts non-padding target tokens.
    """
    from tfcli.model.config import PRESETS
    from tfcli.train.trainer import run as run_training

    check_choice("--arch", arch, list(PRESETS))
    if init_from:
        refuse_unused(ctx, ["arch"], "is not used with --init-from: the architecture is the checkpoint's")
    for flag, value, name in (("--schedule", schedule, "schedule"), ("--precision", precision, "precision"),
                              ("--early-stop", early_stop, "early_stop_metric")):
        check_choice(flag, value, choices_of(TrainConfig, name))
    flags = dict(
        data=data, out=out, arch=arch, resume=resume or None, init_from=init_from, max_steps=max_steps, max_epochs=max_epochs,
        max_minutes=max_minutes, lr=lr, schedule=schedule, warmup=warmup, label_smoothing=label_smoothing,
        weight_decay=weight_decay, clip_norm=clip_norm, grad_accum=grad_accum, seed=seed, max_tokens=max_tokens, max_sentences=max_sentences,
        max_len=max_len, bpe_dropout=bpe_dropout, log_every=log_every, valid_every=valid_every, valid_bleu=valid_bleu,
        early_stop_metric=early_stop, patience=patience, keep_last=keep_last, average_last=average_last,
        tensorboard=tensorboard,
        device=device, precision=precision, compile=compile_, threads=threads, profile=profile,
    )
    result = run(run_training, config, flags, sets)
    if result.interrupted:
        print(f"interrupted at step {result.step}; saved {result.checkpoint}; continue with: tfcli train -o "
              f"{result.run_dir} --resume", file=sys.stderr)
        raise typer.Exit(EXIT_INTERRUPTED)
    print(result.best or result.checkpoint)


@app.command("config")
def config_(
    sections: Optional[List[str]] = typer.Argument(
        None, metavar="SECTION", show_default=False,
        help="model, train, prepare, translate or generate \\[default: model and train, what `tfcli train -c` reads].",
    ),
    arch: str = typer.Option("small", "--arch", "-a", help="The preset whose shapes fill `model:`."),
    quiet: Quiet = False,
):
    """Print every config key with its default and help, as a file that --config accepts.

    tfcli config > train.yaml          model: and train:, for tfcli train prep/ -o run/ -c train.yaml
    tfcli config --arch lm-cpu         a language model's shapes
    tfcli config translate generate    the decoding sections (tfcli translate / lm-generate -c FILE)
    """
    from tfcli.config import CONFIG_SECTIONS, defaults_yaml
    from tfcli.model.config import PRESETS

    check_choice("SECTION", list(sections or []), list(CONFIG_SECTIONS))
    check_choice("--arch", arch, list(PRESETS))

    print(run(defaults_yaml, sections or ["model", "train"], arch), end="")


@app.command("average-checkpoints")
def average_checkpoints(
    run_dir: Optional[Path] = typer.Argument(None, metavar="RUN", show_default=False, help="Run directory."),
    last: Optional[int] = typer.Option(
        None, "--last", "-k", help="Average the last K checkpoints of RUN \\[default: what `tfcli train` keeps, "
        f"--keep-last {_TRAIN.keep_last}; fewer when the run wrote fewer]."
    ),
    checkpoints: Optional[List[Path]] = typer.Option(
        None, "--checkpoint", metavar="CKPT", show_default=False, help="Average these checkpoints instead (repeat)."
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", metavar="CKPT", help="New checkpoint directory \\[default: RUN/checkpoints/avg-lastK]."
    ),
    force: bool = typer.Option(False, "--force", "-f", help="Replace --output if it exists."),
    quiet: Quiet = False,
):
    """Average the weights of a run's last K checkpoints into a new checkpoint (weights only).

    tfcli average-checkpoints run/ --last 5        -> run/checkpoints/avg-last5
    tfcli translate -m run/checkpoints/avg-last5 test.de
    """
    from tfcli.train.average import average_checkpoints as average

    if (run_dir is None) == (not checkpoints):
        fail("give a RUN directory or --checkpoint CKPT (repeated), not both", EXIT_USAGE)
    if last is not None and checkpoints:
        fail("--last counts a RUN's checkpoints; with --checkpoint, name each one", EXIT_USAGE)
    if run_dir is not None and last is None:  # the default: what training keeps, or all of a shorter run
        from tfcli.train.average import available_checkpoints

        last = min(_TRAIN.keep_last, run(available_checkpoints, run_dir))
    if output is None:
        if run_dir is None:
            fail("--output is needed with --checkpoint", EXIT_USAGE)
        output = run_dir / "checkpoints" / f"avg-last{last}"
    source = list(checkpoints) if checkpoints else run_dir
    print(run(average, source, last or 0, output, force))


@app.command("export")
def export_(
    model: str = typer.Argument(..., metavar="RUN_OR_CKPT", show_default=False, help="Checkpoint or run directory."),
    to: str = typer.Option(..., "--to", metavar="TARGET", show_default=False,
                           help="ctranslate2 (Translator/Generator) or hf (transformers)."),
    output: Path = typer.Option(..., "--output", "-o", metavar="DIR", show_default=False,
                                help="New model directory (must not exist)."),
    quantization: Optional[str] = typer.Option(
        None, "--quantization", metavar="TYPE", show_default=False,
        help="ctranslate2 only: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16 or bfloat16 "
        "\\[default: float32].",
    ),
    quiet: Quiet = False,
):
    """Export a model to CTranslate2 or Hugging Face transformers, computing the same function.

    tfcli export run/ --to ctranslate2 -o model-ct2 [--quantization int8]
    tfcli export run/ --to hf -o model-hf

    ctranslate2: ctranslate2.Translator(DIR), or ctranslate2.Generator(DIR) for a language model, with the tokenizer
    files copied beside it; every tfcli architecture is supported. hf: AutoModelForSeq2SeqLM /
    AutoModelForCausalLM and AutoTokenizer load it, as MarianMT (post-norm translation models), Pegasus (pre-norm,
    shared embeddings) or GPT-2 (language models with learned positions); other options are refused, naming the
    option. The directory is written whole or not at all.
    """
    from tfcli.interop.ct2 import QUANTIZATIONS
    from tfcli.interop.export import TARGETS, export

    check_choice("--to", to, TARGETS)
    check_choice("--quantization", quantization, QUANTIZATIONS)
    info = run(export, model, to, output, quantization)
    print(f"{info['out']}: {info['class']} ({info['to']}{', ' + info['quantization'] if info['quantization'] else ''})")


@app.command("import")
def import_(
    source: str = typer.Argument(..., metavar="HF_DIR", show_default=False,
                                 help="A transformers model directory (save_pretrained), or a hub name when online."),
    output: Path = typer.Option(..., "--output", "-o", metavar="CKPT", show_default=False,
                                help="New tfcli checkpoint directory."),
    force: bool = typer.Option(False, "--force", "-f", help="Replace --output if it exists."),
    quiet: Quiet = False,
):
    """Import a Hugging Face Marian, Pegasus or GPT-2 model as a tfcli checkpoint.

    tfcli import opus-mt-de-en/ -o ckpt
    tfcli translate -m ckpt test.de

    Weights are read from safetensors only (never a pickle), the tokenizer from tokenizer.json. The vocabulary is
    reordered so that tfcli's special tokens have their fixed ids; the model computes the same distribution.
    """
    from tfcli.interop.hf import import_model

    info = run(import_model, source, output, force)
    vocab = ", ".join(f"{side} {n}" for side, n in info["vocab"].items())
    print(f"{output}: {info['arch']} -> tfcli {info['kind']}, {info['parameters'] / 1e6:.2f}M parameters, vocabulary {vocab}")


# --- options that several commands share, each defined once (defaults shown from the config dataclasses) ------------

_DEC, _FMT, _RUN, _SAMPLE = "Decoding", "Output format", "Batching and device", "Sampling"


Checkpoint = Annotated[str, typer.Option("--model", "-m", metavar="CKPT", help="Checkpoint or run directory.")]
OutputFile = Annotated[
    Optional[str], typer.Option("--output", "-o", metavar="FILE", help="Write here (atomically) instead of stdout.")
]
BeamSize = Annotated[
    Optional[int], typer.Option("--beam-size", "-b", rich_help_panel=_DEC, help="Beam size" + _default(_T.beam_size))
]
Greedy = Annotated[
    bool, typer.Option("--greedy", rich_help_panel=_DEC, help="Greedy decoding (same as --beam-size 1).")
]
LenPenalty = Annotated[Optional[float], typer.Option(
    "--alpha", "--len-penalty", rich_help_panel=_DEC,
    help="GNMT length penalty alpha: rank by sum(log p) / ((5+|Y|)/6)^alpha" + _default(_T.len_penalty),
)]
MaxLenA = Annotated[Optional[float], typer.Option(
    "--max-len-a", rich_help_panel=_DEC, help="At most a * source tokens + b output tokens" + _default(_T.max_len_a)
)]
MaxLenB = Annotated[
    Optional[int], typer.Option("--max-len-b", rich_help_panel=_DEC, help="See --max-len-a" + _default(_T.max_len_b))
]
Device = Annotated[
    Optional[str],
    typer.Option("--device", rich_help_panel=_RUN, help="auto, cpu, cuda or cuda:N" + _default(_T.device)),
]
Dtype = Annotated[Optional[str], typer.Option(
    "--dtype", rich_help_panel=_RUN,
    help="fp32, bf16 or fp16 (autocast; fp16 needs CUDA), or int8 (the CPU: every linear layer quantised; the "
    "inputs by batch, so an output can change with the batch it is in)" + _default(_T.dtype)
)]
Threads = Annotated[Optional[int], typer.Option("--threads", rich_help_panel=_RUN, help="CPU threads for torch.")]
EncodingErrors = Annotated[Optional[str], typer.Option(
    "--encoding-errors", metavar="strict|replace",
    help="Input that is not UTF-8: strict stops at the first bad byte, naming file, line and column; replace reads "
    "each bad byte as U+FFFD (the line is kept, the line count holds; a warning counts them) \\[default: strict].",
)]
ShowProgress = Annotated[Optional[bool], typer.Option(
    "--progress/--no-progress", rich_help_panel=_RUN,
    help="Progress bar on stderr \\[default: when stderr is a terminal].",
)]


def _config_file(section: str):
    return typer.Option(
        None, "--config", "-c", metavar="FILE", help=f"YAML/TOML/JSON file whose `{section}:` section sets the options."
    )


@app.command()
def translate(
    ctx: typer.Context,
    inputs: Optional[List[str]] = typer.Argument(
        None, metavar="FILE", show_default=False, help="Input files, one sentence a line ('-' or none: stdin)."
    ),
    model: Checkpoint = ...,
    output: OutputFile = None,
    output_dir: Optional[str] = typer.Option(
        None, "--output-dir", metavar="DIR", show_default=False,
        help="One output per input file: DIR/NAME + --suffix (written atomically each).",
    ),
    suffix: str = typer.Option("", "--suffix", help="Appended to each input's file name with --output-dir, e.g. .en."),
    config: Optional[Path] = _config_file("translate"),
    beam_size: BeamSize = None,
    greedy: Greedy = False,
    len_penalty: LenPenalty = None,
    max_len_a: MaxLenA = None,
    max_len_b: MaxLenB = None,
    min_len: Optional[int] = typer.Option(
        None, "--min-len", rich_help_panel=_DEC, help="No </s> before this many output tokens" + _default(_T.min_len)
    ),
    nbest: Optional[int] = typer.Option(
        None, "--nbest", rich_help_panel=_FMT, help="Print the N best hypotheses per input (format below)."
    ),
    scores: bool = typer.Option(
        False, "--scores", rich_help_panel=_FMT, help="Add per-token log-probs (uses the --nbest format)."
    ),
    raw: bool = typer.Option(False, "--raw", rich_help_panel=_FMT, help="Print subword tokens, not detokenised text."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", rich_help_panel=_RUN, help="Sentences per batch, at most" + _default(_T.batch_size)
    ),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", rich_help_panel=_RUN,
        help="Padded source tokens per batch, at most" + _default(_T.max_tokens),
    ),
    buffer_size: Optional[int] = typer.Option(
        None, "--buffer-size", rich_help_panel=_RUN,
        help="Lines read ahead and sorted by length" + _default(_T.buffer_size),
    ),
    device: Device = None,
    dtype: Dtype = None,
    threads: Threads = None,
    progress: ShowProgress = None,
    encoding_errors: EncodingErrors = None,
    quiet: Quiet = False,
):
    """Translate lines from files or stdin to stdout with beam search or greedy decoding.

    cat test.de | tfcli translate -m run/ | sacrebleu test.en
    tfcli translate -m run/ test.de -o test.hyp.en --beam-size 8 --alpha 1.0
    tfcli translate -m run/ --nbest 5 --scores test.de
    tfcli translate -m run/ a.de b.de --output-dir hyp/ --suffix .en    -> hyp/a.de.en, hyp/b.de.en

    One line out per line in, in input order; empty lines give empty lines. Output is detokenised text (--raw:
    subword tokens separated by spaces). Lines longer than the model's max_len are cut, with a warning.
    With --nbest N or --scores, each input line gives N lines (an empty one gives one), best first:
        INDEX<TAB>SCORE<TAB>HYPOTHESIS[<TAB>TOKEN_SCORES]
    INDEX is the input line's 0-based number; SCORE = sum of the tokens' log-probs / ((5+|Y|)/6)^alpha, |Y|
    counting </s>; TOKEN_SCORES (with --scores) are the log-probs of each output subword and of </s>.
    """
    from tfcli.generate.config import translate_config
    from tfcli.generate.translate import translate as run_translate

    if greedy and beam_size not in (None, 1):
        refuse_unused(ctx, ["beam_size"], "is not used with --greedy (a beam of 1); give one of them")
    check_choice("--dtype", dtype, choices_of(TranslateConfig, "dtype"))
    check_choice("--encoding-errors", encoding_errors, choices_of(TranslateConfig, "encoding_errors"))
    cfg = run(
        translate_config, config,
        beam_size=1 if greedy else beam_size, len_penalty=len_penalty, max_len_a=max_len_a, max_len_b=max_len_b,
        min_len=min_len, nbest=nbest, scores=scores or None, raw=raw or None, batch_size=batch_size,
        max_tokens=max_tokens, buffer_size=buffer_size, device=device, dtype=dtype, threads=threads,
        encoding_errors=encoding_errors,
    )
    if output_dir is not None and output is not None:
        fail("-o FILE and --output-dir DIR exclude each other", EXIT_USAGE)
    if suffix and output_dir is None:
        fail("--suffix names the files of --output-dir", EXIT_USAGE)
    run(run_translate, model, inputs or ["-"], output, cfg, progress, output_dir, suffix)


@app.command("lm-generate")
def lm_generate(
    ctx: typer.Context,
    prompts: Optional[List[str]] = typer.Argument(
        None, metavar="PROMPT", show_default=False,
        help="Prompts to continue. None: one per line of --input, or of stdin when piped; else generate from scratch.",
    ),
    model: Checkpoint = ...,
    input_file: Optional[str] = typer.Option(
        None, "--input", "-i", metavar="FILE", help="Read prompts from FILE, one a line ('-': stdin)."
    ),
    output: OutputFile = None,
    config: Optional[Path] = _config_file("generate"),
    max_new_tokens: Optional[int] = typer.Option(
        None, "--max-new-tokens", "-n", rich_help_panel=_SAMPLE,
        help="Tokens to generate, at most" + _default(_G.max_new_tokens),
    ),
    min_new_tokens: Optional[int] = typer.Option(
        None, "--min-new-tokens", rich_help_panel=_SAMPLE,
        help="No </s> before this many new tokens" + _default(_G.min_new_tokens),
    ),
    ignore_eos: bool = typer.Option(
        False, "--ignore-eos", rich_help_panel=_SAMPLE, help="Never stop at </s>: generate --max-new-tokens tokens."
    ),
    greedy: bool = typer.Option(False, "--greedy", rich_help_panel=_SAMPLE, help="Always take the most likely token."),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", "-t", rich_help_panel=_SAMPLE,
        help="Divide logits by T before sampling" + _default(_G.temperature),
    ),
    top_k: Optional[int] = typer.Option(
        None, "--top-k", rich_help_panel=_SAMPLE,
        help="Sample among the K most likely tokens (0: all)" + _default(_G.top_k),
    ),
    top_p: Optional[float] = typer.Option(
        None, "--top-p", rich_help_panel=_SAMPLE,
        help="Nucleus: sample among the most likely tokens holding probability P" + _default(_G.top_p),
    ),
    repetition_penalty: Optional[float] = typer.Option(
        None, "--repetition-penalty", rich_help_panel=_SAMPLE,
        help="CTRL penalty on tokens already in the text (1: none; 1.2 is common)" + _default(_G.repetition_penalty),
    ),
    seed: Optional[int] = typer.Option(
        None, "--seed", rich_help_panel=_SAMPLE, help="Random seed: same seed, prompts and options give the same text."
    ),
    num_samples: Optional[int] = typer.Option(
        None, "--num-samples", "-N", rich_help_panel=_SAMPLE, help="Samples per prompt" + _default(_G.num_samples)
    ),
    stop: Optional[List[str]] = typer.Option(
        None, "--stop", rich_help_panel=_SAMPLE, help="Stop when this string appears (not printed); repeatable."
    ),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", rich_help_panel=_RUN, help="Samples generated together" + _default(_G.batch_size)
    ),
    device: Device = None,
    dtype: Dtype = None,
    threads: Threads = None,
    progress: ShowProgress = None,
    quiet: Quiet = False,
):
    """Generate text with a language model: greedy, or sampling with temperature, top-k, top-p.

    tfcli lm-generate -m run/ "ROMEO:" --max-new-tokens 200 --top-p 0.9 --seed 1
    tfcli lm-generate -m run/ -i prompts.txt --num-samples 3 > samples.txt
    echo "The meaning of" | tfcli lm-generate -m run/ --greedy --stop "."

    Each sample is written as its prompt followed by the generated text, then a newline, in prompt order (samples
    of one prompt together). Generation stops at </s> (a warning says so when it comes before --max-new-tokens;
    --min-new-tokens and --ignore-eos hold it back), at a --stop string (cut off), or after --max-new-tokens.
    Past the model's context (max_len tokens, prompt included) it goes on from the last max_len / 2 tokens.
    A single prompt with a single sample streams to stdout as tokens are made.
    """
    from tfcli.generate.config import generate_config
    from tfcli.generate.lm import lm_generate as run_generate

    if greedy:
        refuse_unused(ctx, ["temperature", "top_k", "top_p", "seed"], "is not used with --greedy (no sampling)")
    if ignore_eos:
        refuse_unused(ctx, ["min_new_tokens"], "is not used with --ignore-eos (</s> never ends the text)")
    check_choice("--dtype", dtype, choices_of(GenerateConfig, "dtype"))

    cfg = run(
        generate_config, config,
        max_new_tokens=max_new_tokens, min_new_tokens=min_new_tokens, ignore_eos=ignore_eos or None,
        greedy=greedy or None, temperature=temperature, top_k=top_k, top_p=top_p,
        repetition_penalty=repetition_penalty, seed=seed, num_samples=num_samples, stop=stop or None,
        batch_size=batch_size, device=device, dtype=dtype, threads=threads,
    )
    run(run_generate, model, prompts or [], input_file, output, cfg, progress)


_TEXT, _SIG, _MODEL, _TR, _OUT = (
    "Text scoring (sacrebleu)", "Significance", "Model scoring (perplexity)", "Translate and score", "Output"
)


@app.command("eval")
def eval_(
    ctx: typer.Context,
    hypotheses: Optional[List[str]] = typer.Argument(
        None, metavar="HYP", show_default=False,
        help="Hypothesis files, one system each ('-' = stdin; stdin is read when none is given and it is not a "
        "terminal).",
    ),
    refs: Optional[List[str]] = typer.Option(
        None, "--ref", "-r", metavar="REF", show_default=False, rich_help_panel=_TEXT,
        help="Reference file, line-aligned with the hypotheses; repeat for several references.",
    ),
    metrics: str = typer.Option(
        "bleu,chrf,ter", "--metrics", rich_help_panel=_TEXT, help="Comma-separated: bleu, chrf, ter."
    ),
    tokenize: str = typer.Option(
        "13a", "--tokenize", rich_help_panel=_TEXT,
        help="BLEU tokenizer: 13a (mteval, the WMT default), intl, char, none, zh, ja-mecab, ko-mecab, spm, "
        "flores101, flores200. chrF uses characters and TER its own TERCOM rules.",
    ),
    lowercase: bool = typer.Option(False, "--lowercase", rich_help_panel=_TEXT, help="Case-insensitive BLEU and chrF."),
    ter_case_sensitive: bool = typer.Option(
        False, "--ter-case-sensitive", rich_help_panel=_TEXT, help="Case-sensitive TER (TERCOM ignores case)."
    ),
    chrf_word_order: int = typer.Option(
        0, "--chrf-word-order", rich_help_panel=_TEXT, help="Word n-gram order of chrF; 2 gives chrF++."
    ),
    paired_bs: bool = typer.Option(
        False, "--paired-bs", rich_help_panel=_SIG,
        help="Paired bootstrap resampling test of every system against the baseline (also gives 95% CIs).",
    ),
    paired_ar: bool = typer.Option(
        False, "--paired-ar", rich_help_panel=_SIG, help="Paired approximate randomization test against the baseline."
    ),
    baseline: Optional[str] = typer.Option(
        None, "--baseline", metavar="HYP", rich_help_panel=_SIG, help="Baseline system file \\[default: the first HYP]."
    ),
    n_samples: int = typer.Option(
        0, "--n-samples", rich_help_panel=_SIG,
        help="Bootstrap resamples / randomization trials; 0 = sacrebleu's defaults (1000 / 10000). The seed is "
        "sacrebleu's (12345, or $SACREBLEU_SEED).",
    ),
    model: Optional[str] = typer.Option(
        None, "--model", "-m", metavar="CKPT", rich_help_panel=_MODEL,
        help="Checkpoint (or run) directory: perplexity on --data, or BLEU etc. of its --translate output.",
    ),
    data: Optional[Path] = typer.Option(
        None, "--data", metavar="PREP", rich_help_panel=_MODEL,
        help="Prepared directory tokenized with the checkpoint's tokenizer.",
    ),
    split: str = typer.Option("test", "--split", rich_help_panel=_MODEL, help="Split of --data to score."),
    words: Optional[int] = typer.Option(
        None, "--words", rich_help_panel=_MODEL,
        help="Word-level token count for word perplexity = exp(total NLL / words) \\[default: whitespace words of "
        "PREP/{split}.tgt.txt + one </s> per line, the WikiText convention of one <eos> per line].",
    ),
    window: Optional[int] = typer.Option(
        None, "--window", rich_help_panel=_MODEL, help="LM: context window \\[default: the model's max_len]."
    ),
    stride: Optional[int] = typer.Option(
        None, "--stride", rich_help_panel=_MODEL,
        help="LM: tokens newly scored per window; below --window gives a sliding window \\[default: the window].",
    ),
    max_tokens: int = typer.Option(4096, "--max-tokens", rich_help_panel=_MODEL, help="Tokens per batch."),
    device: str = typer.Option("auto", "--device", rich_help_panel=_MODEL, help="auto, cpu, cuda or cuda:N."),
    translate_src: Optional[str] = typer.Option(
        None, "--translate", metavar="SRC", rich_help_panel=_TR,
        help="Translate SRC ('-' = stdin) with --model (as `tfcli translate` does), then score against -r REF.",
    ),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", metavar="FILE", rich_help_panel=_TR, help="Also keep the translations in FILE."
    ),
    beam_size: BeamSize = None,
    greedy: Greedy = False,
    len_penalty: LenPenalty = None,
    max_len_a: MaxLenA = None,
    max_len_b: MaxLenB = None,
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", rich_help_panel=_TR, help="Sentences per batch" + _default(_T.batch_size)
    ),
    dtype: Dtype = None,
    encoding_errors: EncodingErrors = None,
    json_out: bool = typer.Option(False, "--json", rich_help_panel=_OUT, help="Print one JSON object on stdout."),
    width: int = typer.Option(2, "--width", "-w", rich_help_panel=_OUT, help="Decimals in text output."),
    score_only: bool = typer.Option(
        False, "--score-only", rich_help_panel=_OUT, help="Print only the scores, one per line (one system)."
    ),
    quiet: Quiet = False,
):
    """Score translations with sacrebleu (BLEU, chrF, chrF++, TER), or a model by perplexity.

    tfcli eval hyp.en -r ref.en                    BLEU, chrF2, TER + signatures
    tfcli translate ... | tfcli eval -r ref.en     hypotheses from stdin
    tfcli eval a.en b.en -r ref.en --paired-bs     table + significance vs a.en
    tfcli eval --model CKPT --data PREP            loss, perplexity per token/word
    tfcli eval --model CKPT --translate src.de -r ref.en    translate, then score

    Scores and signatures are sacrebleu's own and agree with the sacrebleu command line.
    Hypothesis and reference files must have the same number of lines (exit status 1 otherwise).
    Perplexity is teacher-forced. Translation models score every target token, </s> included.
    Language models score the split as one stream (</s> line </s> line ...) in windows of the model's context.
    Word perplexity = exp(total NLL / words), words = whitespace words + one </s> per line (WikiText's count).
    """
    from rich.console import Console

    if translate_src is not None and model is None:
        fail("--translate needs --model CKPT", EXIT_USAGE)
    if output is not None and translate_src is None:
        fail("-o/--output keeps the translations of --translate; scores go to stdout", EXIT_USAGE)
    check_choice("--dtype", dtype, choices_of(TranslateConfig, "dtype"))
    check_choice("--encoding-errors", encoding_errors, choices_of(TranslateConfig, "encoding_errors"))
    text_scoring = ["metrics", "tokenize", "lowercase", "ter_case_sensitive", "chrf_word_order", "paired_bs",
                    "paired_ar", "baseline", "n_samples", "score_only", "encoding_errors"]
    decoding = ["beam_size", "greedy", "len_penalty", "max_len_a", "max_len_b", "batch_size", "dtype"]
    perplexity = ["split", "words", "window", "stride"]
    if model is not None and translate_src is None:
        if hypotheses or refs:
            fail("--model scores a prepared --data split; it takes no hypothesis or reference files", EXIT_USAGE)
        if data is None:
            fail("--model needs --data PREP (a prepared directory) to score", EXIT_USAGE)
        refuse_unused(ctx, text_scoring + decoding + ["width"], "is not used by perplexity scoring (--model --data): "
                      "it applies to text scoring or --translate; perplexity is computed in fp32")
        from tfcli.evaluate.perplexity import PerplexityConfig, evaluate_checkpoint

        cfg = PerplexityConfig(split, max_tokens, window, stride, words, device)
        result = run(evaluate_checkpoint, model, data, cfg)
        print(json.dumps(result.to_json(), indent=2) if json_out else result.format())
        return
    if data is not None:
        fail("--data needs --model CKPT" if model is None else "--data and --translate exclude each other", EXIT_USAGE)
    refuse_unused(ctx, perplexity, "is for perplexity (--model CKPT --data PREP)")
    if translate_src is None:
        refuse_unused(ctx, decoding + ["max_tokens", "device"], "is for --translate (or perplexity); scoring text "
                      "files decodes nothing")
    elif greedy and beam_size not in (None, 1):
        refuse_unused(ctx, ["beam_size"], "is not used with --greedy (a beam of 1); give one of them")
    if translate_src is not None and (hypotheses or baseline or paired_bs or paired_ar):
        fail("--translate scores one system, the model's translations; it takes no HYP files", EXIT_USAGE)

    from tfcli.config import from_dict
    from tfcli.evaluate.metrics import (
        METRIC_NAMES, TOKENIZERS, MetricsConfig, format_single, render_table, score_files, to_json,
    )

    check_choice("--metrics", [m.strip().lower() for m in metrics.split(",") if m.strip()], METRIC_NAMES)
    check_choice("--tokenize", tokenize, TOKENIZERS)

    if paired_bs and paired_ar:
        fail("--paired-bs and --paired-ar exclude each other", EXIT_USAGE)
    if score_only and (len(hypotheses or []) + (baseline is not None) > 1):
        fail("--score-only prints one system's scores; use --json for several systems", EXIT_USAGE)
    if not hypotheses and baseline is None and translate_src is None:
        if sys.stdin.isatty():
            fail("no hypothesis file given (pass HYP files, or pipe hypotheses into stdin)", EXIT_USAGE)
        hypotheses = ["-"]
    if not refs:
        fail("no reference: pass -r REF", EXIT_USAGE)
    fields = dict(
        metrics=[m.strip().lower() for m in metrics.split(",") if m.strip()],
        tokenize=tokenize,
        lowercase=lowercase,
        ter_case_sensitive=ter_case_sensitive,
        chrf_word_order=chrf_word_order,
        paired="bs" if paired_bs else "ar" if paired_ar else "none",
        n_samples=n_samples,
    )
    cfg = run(from_dict, MetricsConfig, fields, "eval")
    from tfcli.io import refuse_overwriting_inputs

    # the scores go to stdout: not into one of the files being scored (`>> ref.en`)
    run(refuse_overwriting_inputs, ["-"], [*(hypotheses or []), *refs, baseline, translate_src],
        "send the scores elsewhere")
    if translate_src is not None:
        from tfcli.evaluate.translate_score import translate_and_score
        from tfcli.generate.config import translate_config

        decoding = run(
            translate_config, None, beam_size=1 if greedy else beam_size, len_penalty=len_penalty,
            max_len_a=max_len_a, max_len_b=max_len_b, batch_size=batch_size, max_tokens=max_tokens, device=device,
            dtype=dtype, encoding_errors=encoding_errors,
        )
        report = run(translate_and_score, model, translate_src, refs, cfg, decoding, output)
    else:
        report = run(score_files, hypotheses or [], refs, cfg, baseline, encoding_errors or "strict")
    if json_out:
        print(json.dumps(to_json(report), indent=2, ensure_ascii=False))
    elif len(report.systems) == 1:
        print(format_single(report, width, score_only))
    else:
        out = Console(highlight=False)
        render_table(report, out if out.is_terminal else Console(highlight=False, width=200), width)


@app.command()
def attention(
    ctx: typer.Context,
    sentences: Optional[List[str]] = typer.Argument(
        None, metavar="SENTENCE", show_default=False,
        help="Input sentences: the source for a translation model, the prompt for a language model.",
    ),
    model: Path = typer.Option(..., "--model", "-m", metavar="CKPT", help="Checkpoint or run directory."),
    input_file: Optional[str] = typer.Option(
        None, "--input", "-i", metavar="FILE", help="Read the sentences from a file, one per line ('-' = stdin)."
    ),
    targets: Optional[List[str]] = typer.Option(
        None, "--target", metavar="TEXT", show_default=False,
        help="Translation: the target to attend with, one per sentence (repeat) \\[default: the model's greedy "
        "translation].",
    ),
    generate: int = typer.Option(
        0, "--generate", "--max-new-tokens", "-n", metavar="N",
        help="Language model: continue the prompt greedily by up to N tokens.",
    ),
    output: Path = typer.Option(Path("attention"), "--output", "-o", metavar="DIR", help="Directory for the pictures."),
    kinds: Optional[List[str]] = typer.Option(
        None, "--kind", show_default=False,
        help="encoder, self or cross (repeat) \\[default: all the model has].",
    ),
    layers: Optional[str] = typer.Option(
        None, "--layers", metavar="LIST", help="Layers in the PNGs, 1-based, e.g. 1,3 or 4-6 \\[default: all]."
    ),
    png: bool = typer.Option(True, "--png/--no-png", help="Write a PNG per sentence and kind (needs matplotlib)."),
    html: bool = typer.Option(True, "--html/--no-html", help="Write attention.html (self-contained, interactive)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    quiet: Quiet = False,
):
    """Draw a model's attention weights as heatmaps, per layer and head, with the tokens on both axes.

    tfcli attention -m run/ "Ein Hund ."                 greedy translation
    tfcli attention -m run/ "Ein Hund ." --target "A dog ."    a given target
    tfcli attention -m lm-run/ "To be or" -n 10          LM prompt + 10 tokens

    Writes DIR/sentence<i>-encoder-self.png, -decoder-self.png and -cross.png (a language model: -self.png), i
    counting from 1, each layers x heads plus the mean of the heads, and DIR/attention.html (pick sentence, kind,
    layer and head; values on hover). Kinds: encoder (source x source), self (target x target,
    causal) and cross (target x source). The weights are the model's own, from one teacher-forced forward.
    Sentences come from the arguments, --input FILE, or stdin when it is not a terminal.
    """
    from tfcli.io import read_lines
    from tfcli.viz.attention import write_attention

    if not png:
        refuse_unused(ctx, ["layers"], "picks the layers of the PNGs; with --no-png the HTML page has every layer")
    if not png and not html:
        fail("--no-png and --no-html leave nothing to write", EXIT_USAGE)
    check_choice("--kind", list(kinds or []), ("encoder", "self", "cross"))

    texts = list(sentences or [])
    if input_file is not None:
        texts += run(read_lines, input_file)
    if not texts and input_file is None and not sys.stdin.isatty():
        texts = run(read_lines, "-")
    if not texts:
        fail("no input: give sentences as arguments, --input FILE or on stdin", EXIT_USAGE)
    written = run(
        write_attention, model, texts, output, targets or None, generate, kinds, layers, png, html, device,
        [input_file] if input_file else [],
    )
    for path in written:
        info(f"wrote {path}")


@app.command()
def plot(
    ctx: typer.Context,
    runs: List[Path] = typer.Argument(
        ..., metavar="RUN", show_default=False, help="Run directories (or metrics.jsonl files); several are overlaid."
    ),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", metavar="PNG", help="Figure to write \\[default: curves.png; none with --terminal]."
    ),
    terminal: bool = typer.Option(
        False, "--terminal", help="Print the curves as text (first/last/best values and a sparkline)."
    ),
    title: Optional[str] = typer.Option(None, "--title", help="Figure title \\[default: the run names]."),
    quiet: Quiet = False,
):
    """Plot training curves from runs' metrics logs: loss, perplexity, BLEU, learning rate, tokens/s.

    tfcli plot run/                        -> curves.png
    tfcli plot run-a/ run-b/ -o cmp.png    two runs on one figure
    tfcli plot run/ --terminal             text summary in the terminal, no picture

    Curves are against the training step: train solid, validation dashed. Panels without data (BLEU for a
    language model) are left out.
    """
    from tfcli.viz.plot import load_runs, plot_runs, print_summary

    if terminal and output is None:
        refuse_unused(ctx, ["title"], "is the figure's title; --terminal draws no figure (add -o PNG for one)")
    loaded = run(load_runs, runs)
    if terminal:
        print_summary(loaded, Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=120))
    if output is not None or not terminal:
        path = output or Path("curves.png")
        run(plot_runs, loaded, path, title)
        info(f"wrote {path}")


def main() -> None:
    # SIGTERM acts as Ctrl-C: temp files are removed, no output is replaced, training saves a checkpoint
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    try:
        app()
    except SystemExit as e:
        if e.code != EXIT_INTERRUPTED:
            # The command is over: a signal from here on ends the process as signals do by default, instead of
            # raising KeyboardInterrupt into the interpreter's shutdown (a traceback after a finished command).
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            raise
        # Everything is cleaned up by now. Exit at once: when the KeyboardInterrupt was raised (and lost) inside
        # Python code that an extension module ran while being imported, CPython would otherwise end the process
        # with a SIGINT of its own instead of status 130.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe, a closed stream
                stream.flush()
        os._exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
