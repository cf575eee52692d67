"""`tfcli eval`: sacrebleu scores of text, or a model's perplexity."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from tfcli.cli.common import (
    config_defaults,
    BeamSize, Dtype, EncodingErrors, Greedy, LenPenalty, MaxLenA, MaxLenB, Quiet, SplitSentences, Threads, app,
    check_choice, choices_of, fail, refuse_unused, run,
)
from tfcli.errors import EXIT_USAGE
from tfcli.evaluate.config import METRIC_NAMES, MetricsConfig, PerplexityConfig
from tfcli.generate.config import TranslateConfig


_TEXT, _SIG, _MODEL, _TR, _OUT = (
    "Text scoring (sacrebleu)", "Significance", "Model scoring (perplexity)", "Translate and score", "Output"
)


@app.command("eval")
@config_defaults(MetricsConfig, PerplexityConfig, TranslateConfig)
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
    text: Optional[Path] = typer.Option(
        None, "--text", metavar="FILE", rich_help_panel=_MODEL,
        help="A plain text file to score with a language model: an imported model reads it whole, as its tokenizer "
        "does (its BOS first where it adds one), a tfcli-trained one line by line.",
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
    threads: Threads = None,
    translate_src: Optional[str] = typer.Option(
        None, "--translate", metavar="SRC", rich_help_panel=_TR,
        help="Translate SRC ('-' = stdin) with --model (as `tfcli translate` does), then score against -r REF.",
    ),
    output: Optional[str] = typer.Option(
        None, "--output", "-o", metavar="FILE", rich_help_panel=_TR, help="Also keep the translations in FILE."
    ),
    tgt_lang: Optional[str] = typer.Option(
        None, "--tgt-lang", metavar="LANG", rich_help_panel=_TR, help="A multilingual model's target language."
    ),
    src_lang: Optional[str] = typer.Option(
        None, "--src-lang", metavar="LANG", rich_help_panel=_TR,
        help="The source's language (what an imported M2M-100 or NLLB model needs; the sentence splitter's rules).",
    ),
    split_sentences: SplitSentences = None,
    beam_size: BeamSize = None,
    greedy: Greedy = False,
    len_penalty: LenPenalty = None,
    max_len_a: MaxLenA = None,
    max_len_b: MaxLenB = None,
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", rich_help_panel=_TR, help="Sentences per batch."
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
    tfcli eval --model CKPT --text FILE            the same on a text file (an imported LLM: as transformers)
    tfcli eval --model CKPT --translate src.de -r ref.en    translate, then score

    Scores and signatures are sacrebleu's own and agree with the sacrebleu command line.
    Hypothesis and reference files must have the same number of lines (exit status 1 otherwise).
    Perplexity is teacher-forced. Translation models score every target token, </s> included.
    Language models score the split as one stream (</s> line </s> line ...) in windows of the model's context.
    Word perplexity = exp(total NLL / words), words = whitespace words + one </s> per line (WikiText's count).
    """
    if translate_src is not None and model is None:
        fail("--translate needs --model CKPT", EXIT_USAGE)
    if output is not None and translate_src is None:
        fail("-o/--output keeps the translations of --translate; scores go to stdout", EXIT_USAGE)
    check_choice("--dtype", dtype, choices_of(TranslateConfig, "dtype"))
    check_choice("--encoding-errors", encoding_errors, choices_of(TranslateConfig, "encoding_errors"))
    check_choice("--split-sentences", split_sentences, choices_of(TranslateConfig, "split_sentences"))
    if model is not None and translate_src is None:
        if hypotheses or refs:
            fail("--model scores a prepared --data split; it takes no hypothesis or reference files", EXIT_USAGE)
        cfg = PerplexityConfig(split, max_tokens, window, stride, words, device)
        return _perplexity(ctx, model, data, text, cfg, threads, json_out)
    if data is not None or text is not None:
        what = "--data" if data is not None else "--text"
        fail(f"{what} needs --model CKPT" if model is None else f"{what} and --translate exclude each other",
             EXIT_USAGE)
    refuse_unused(ctx, _PERPLEXITY, "is for perplexity (--model CKPT --data PREP)")
    if translate_src is None:
        refuse_unused(ctx, _DECODING + ["max_tokens", "device", "threads"], "is for --translate (or perplexity); "
                      "scoring text files decodes nothing")
    elif greedy and beam_size not in (None, 1):
        refuse_unused(ctx, ["beam_size"], "is not used with --greedy (a beam of 1); give one of them")
    if translate_src is not None and (hypotheses or baseline or paired_bs or paired_ar):
        fail("--translate scores one system, the model's translations; it takes no HYP files", EXIT_USAGE)
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
    cfg = _metrics_config(metrics, tokenize, lowercase, ter_case_sensitive, chrf_word_order,
                          "bs" if paired_bs else "ar" if paired_ar else "none", n_samples)
    from tfcli.io import refuse_overwriting_inputs

    # the scores go to stdout: not into one of the files being scored (`>> ref.en`)
    run(refuse_overwriting_inputs, ["-"], [*(hypotheses or []), *refs, baseline, translate_src],
        "send the scores elsewhere")
    if translate_src is not None:
        decoding = dict(beam_size=1 if greedy else beam_size, len_penalty=len_penalty, max_len_a=max_len_a,
                        max_len_b=max_len_b, batch_size=batch_size, max_tokens=max_tokens, device=device, dtype=dtype,
                        encoding_errors=encoding_errors, threads=threads, tgt_lang=tgt_lang, src_lang=src_lang,
                        split_sentences=split_sentences)
        report = _translate_and_score(model, translate_src, refs, cfg, decoding, output)
    else:
        from tfcli.evaluate.metrics import score_files

        report = run(score_files, hypotheses or [], refs, cfg, baseline, encoding_errors or "strict")
    _print_report(report, json_out, width, score_only)


_TEXT_SCORING = ["metrics", "tokenize", "lowercase", "ter_case_sensitive", "chrf_word_order", "paired_bs", "paired_ar",
                 "baseline", "n_samples", "score_only", "encoding_errors"]
_DECODING = ["beam_size", "greedy", "len_penalty", "max_len_a", "max_len_b", "batch_size", "dtype", "tgt_lang",
             "src_lang", "split_sentences"]
_PERPLEXITY = ["split", "words", "window", "stride", "text"]


def _perplexity(ctx, model: str, data: Path | None, text: Path | None, cfg: PerplexityConfig, threads: int | None,
                json_out: bool) -> None:
    """--model CKPT --data PREP (or --text FILE): teacher-forced loss and perplexity of a prepared split (a file)."""
    from tfcli.runtime import tune_process
    from tfcli.evaluate.perplexity import evaluate_checkpoint, evaluate_text

    if data is not None and text is not None:
        fail("--data and --text exclude each other: score a prepared split or a text file", EXIT_USAGE)
    if data is None and text is None:
        fail("--model needs --data PREP (a prepared directory) or --text FILE to score", EXIT_USAGE)
    unused = _TEXT_SCORING + _DECODING + ["width"] + (["split"] if text is not None else [])
    refuse_unused(ctx, unused, f"is not used by perplexity scoring (--model {'--text' if text else '--data'}): it "
                  "applies to text scoring or --translate; perplexity is computed in fp32")
    run(tune_process, cfg.device, threads)
    result = run(evaluate_text, model, str(text), cfg) if text is not None else run(evaluate_checkpoint, model, data,
                                                                                     cfg)
    print(json.dumps(result.to_json(), indent=2) if json_out else result.format())


def _metrics_config(metrics: str, tokenize: str, lowercase: bool, ter_case_sensitive: bool, chrf_word_order: int,
                    paired: str, n_samples: int) -> MetricsConfig:
    from tfcli.config import from_dict
    from tfcli.evaluate.metrics import TOKENIZERS

    names = [m.strip().lower() for m in metrics.split(",") if m.strip()]
    check_choice("--metrics", names, METRIC_NAMES)
    check_choice("--tokenize", tokenize, TOKENIZERS)
    fields = dict(metrics=names, tokenize=tokenize, lowercase=lowercase, ter_case_sensitive=ter_case_sensitive,
                  chrf_word_order=chrf_word_order, paired=paired, n_samples=n_samples)
    return run(from_dict, MetricsConfig, fields, "eval")


def _translate_and_score(model: str, src: str, refs: list[str], cfg: MetricsConfig, decoding: dict,
                         output: str | None):
    """--model CKPT --translate SRC -r REF: translate as `tfcli translate` does, then score."""
    from tfcli.runtime import tune_process
    from tfcli.evaluate.translate_score import translate_and_score
    from tfcli.generate.config import translate_config

    translate_cfg = run(translate_config, None, **decoding)
    run(tune_process, translate_cfg.device, translate_cfg.threads)
    return run(translate_and_score, model, src, refs, cfg, translate_cfg, output)


def _print_report(report, json_out: bool, width: int, score_only: bool) -> None:
    from rich.console import Console

    from tfcli.evaluate.metrics import format_single, render_table, to_json

    if json_out:
        print(json.dumps(to_json(report), indent=2, ensure_ascii=False))
    elif len(report.systems) == 1:
        print(format_single(report, width, score_only))
    else:
        out = Console(highlight=False)
        render_table(report, out if out.is_terminal else Console(highlight=False, width=200), width)
