"""`tfcli translate`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tfcli.cli.common import (
    _SAMPLE,
    config_defaults,
    BeamSize, Device, Dtype, EncodingErrors, Greedy, LenPenalty, MaxLenA, MaxLenB, OutputFile,
    Quiet, ShowProgress, SplitSentences, Threads, _DEC, _FMT, _RUN, _config_file, _set_level, app, check_choice,
    choices_of,
    fail, refuse_unused, run,
)
from tfcli.errors import EXIT_USAGE
from tfcli.generate.config import TranslateConfig


@app.command()
@config_defaults(TranslateConfig)
def translate(
    ctx: typer.Context,
    inputs: Optional[List[str]] = typer.Argument(
        None, metavar="FILE", show_default=False, help="Input files, one sentence a line ('-' or none: stdin)."
    ),
    model: List[str] = typer.Option(
        ..., "--model", "-m", metavar="CKPT",
        help="Checkpoint or run directory; repeat for an ensemble (the models' probabilities averaged).",
    ),
    output: OutputFile = None,
    tgt_lang: Optional[str] = typer.Option(
        None, "--tgt-lang", metavar="LANG",
        help="A multilingual model's target language (its >>LANG<< tag first in every line; an imported M2M-100 or "
        "NLLB model's: its token forced first in every output, e.g. fr, fra_Latn); required for one.",
    ),
    split_sentences: SplitSentences = None,
    src_lang: Optional[str] = typer.Option(
        None, "--src-lang", metavar="LANG", rich_help_panel=_DEC,
        help="The input's language (de, en, fr, ...), for the sentence splitter's rules (default: generic ones); "
        "an imported M2M-100 or NLLB model needs it (en, eng_Latn): its token goes first in every line.",
    ),
    input_format: Optional[str] = typer.Option(
        None, "--input-format", metavar="FORMAT", rich_help_panel=_FMT,
        help='Lines: text; jsonl (each line {"text": ..., "tgt_lang": ..., "src_lang": ..., "prefix": ..., "avoid": '
        '[...], "constraints": [...]}, all but the text optional); xml or html (each line a fragment with inline '
        "markup: the tags put back around the words they enclosed). Whole files, their structure kept: html-page, "
        "markdown, srt, vtt, po, xliff, json. auto: by the file's extension (.html .md .srt .vtt .po .xlf .json "
        r".jsonl; text otherwise and for stdin) \[default: auto].",
    ),
    protect: Optional[List[str]] = typer.Option(
        None, "--protect", metavar="REGEX", rich_help_panel=_FMT,
        help="Text matching REGEX is copied untouched, put back next to the words around it (repeatable).",
    ),
    placeholders: Optional[str] = typer.Option(
        None, "--placeholders", metavar="WHEN", rich_help_panel=_FMT,
        help="Copy placeholders untouched (printf %s %1$d, %(name)s, {name}, {{var}}, ICU, BBCode, URLs, e-mail "
        r"addresses): auto (every format but text and jsonl), always, never \[default: auto].",
    ),
    keep_tags: Optional[List[str]] = typer.Option(
        None, "--keep-tags", metavar="NAME", rich_help_panel=_FMT,
        help="Elements copied whole, content untranslated (repeatable; besides code, kbd, samp, var, pre, script, "
        'style and translate="no" or class="notranslate" in HTML).',
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", rich_help_panel=_FMT,
        help="po, xliff: also translate the entries that have a translation (default: keep them).",
    ),
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
        None, "--min-len", rich_help_panel=_DEC, help="No </s> before this many output tokens."
    ),
    no_repeat_ngram_size: Optional[int] = typer.Option(
        None, "--no-repeat-ngram-size", metavar="N", rich_help_panel=_DEC,
        help="No N-gram twice in an output (0: no rule), as fairseq's and transformers' option.",
    ),
    repetition_penalty: Optional[float] = typer.Option(
        None, "--repetition-penalty", metavar="P", rich_help_panel=_DEC,
        help="CTRL's penalty on tokens already output (1: none; 1.2 is common): on the logits in greedy search and "
        "sampling, on the log-probs in beam search, as transformers has it.",
    ),
    prefix: Optional[str] = typer.Option(
        None, "--prefix", metavar="FILE", rich_help_panel=_DEC,
        help="Target prefixes, one a line of the input (an empty line: none): each output starts with its prefix.",
    ),
    avoid: Optional[str] = typer.Option(
        None, "--avoid", metavar="FILE", rich_help_panel=_DEC,
        help="Target phrases to avoid, one line a line of the input, tab-separated (an empty line: none): no "
        "output holds any of its line's phrases.",
    ),
    constraints: Optional[str] = typer.Option(
        None, "--constraints", metavar="FILE", rich_help_panel=_DEC,
        help="Target phrases to hold (terminology), one line a line of the input, tab-separated (an empty line: "
        "none; 'a ||| b': either form): every output holds each of its line's phrases, in any order (beam search "
        "with dynamic beam allocation; a beam of 4 or more).",
    ),
    glossary: Optional[List[str]] = typer.Option(
        None, "--glossary", metavar="FILE", rich_help_panel=_DEC,
        help="A glossary, TSV or CSV (.csv): source term, target term ('a ||| b': either form); repeat for more. "
        "Each source term found in a line (whole words; any case unless the term has capitals inside; inflected "
        "forms where simplemma knows --src-lang) makes its target term one of the line's constraints.",
    ),
    prompt_template: Optional[str] = typer.Option(
        None, "--prompt-template", metavar="TEXT|FILE", rich_help_panel=_DEC,
        help="A decoder-only model's prompt, {text} where the source goes ({src_lang}, {tgt_lang}: the languages' "
        "names): a string, or a file holding it. Default: the model's chat template around Tower's translation "
        "instruction (--tgt-lang needed). The reply, up to the model's end token, is the translation (one line).",
    ),
    sampling: bool = typer.Option(
        False, "--sampling", rich_help_panel=_SAMPLE,
        help="Draw each translation instead of searching (back-translation): one per line, its random numbers keyed "
        "by --seed and the line's index, so a line's sample does not depend on batches, order or processes.",
    ),
    temperature: Optional[float] = typer.Option(
        None, "--temperature", rich_help_panel=_SAMPLE, help="Divide the logits by T before sampling."
    ),
    top_k: Optional[int] = typer.Option(
        None, "--top-k", rich_help_panel=_SAMPLE, help="Sample among the K most likely tokens (0: all)."
    ),
    top_p: Optional[float] = typer.Option(
        None, "--top-p", rich_help_panel=_SAMPLE, help="Nucleus: sample among the most likely tokens holding P."
    ),
    seed: Optional[int] = typer.Option(None, "--seed", rich_help_panel=_SAMPLE, help="Seed of every line's draw."),
    nbest: Optional[int] = typer.Option(
        None, "--nbest", rich_help_panel=_FMT, help="Print the N best hypotheses per input (format below)."
    ),
    scores: bool = typer.Option(
        False, "--scores", rich_help_panel=_FMT, help="Add per-token log-probs (uses the --nbest format)."
    ),
    jsonl: bool = typer.Option(
        False, "--jsonl", rich_help_panel=_FMT,
        help="One JSON object a translation: index, text, score, and what --nbest, --scores, --alignment and the "
             "line's constraints add (format below).",
    ),
    raw: bool = typer.Option(False, "--raw", rich_help_panel=_FMT, help="Print subword tokens, not detokenised text."),
    alignment: bool = typer.Option(
        False, "--alignment", rich_help_panel=_FMT,
        help="Add word alignments after a tab, Pharaoh format (source-target word indices, e.g. 0-0 1-2).",
    ),
    alignment_layer: Optional[int] = typer.Option(
        None, "--alignment-layer", metavar="N", rich_help_panel=_FMT,
        help="Decoder layer (1-based) whose cross-attention aligns (0: the penultimate).",
    ),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", rich_help_panel=_RUN, help="Sentences per batch, at most."
    ),
    max_tokens: Optional[int] = typer.Option(
        None, "--max-tokens", rich_help_panel=_RUN,
        help="Padded source tokens per batch, at most.",
    ),
    check_every: Optional[int] = typer.Option(
        None, "--check-every", rich_help_panel=_RUN,
        help="Read the search's state from the device every N steps, to stop and let finished sentences leave "
        "(0: every step on the CPU, every 8 on a GPU). Outputs do not depend on it.",
    ),
    buffer_size: Optional[int] = typer.Option(
        None, "--buffer-size", rich_help_panel=_RUN,
        help="Lines read ahead and sorted by length.",
    ),
    part_lines: Optional[int] = typer.Option(
        None, "--part-lines", rich_help_panel=_RUN,
        help="Lines per part, written atomically each, with --resume or on several processes.",
    ),
    resume: bool = typer.Option(
        False, "--resume", rich_help_panel=_RUN,
        help="Translate -o FILE in parts, keeping the parts an interrupted run of the same command finished.",
    ),
    device: Device = None,
    dtype: Dtype = None,
    threads: Threads = None,
    progress: ShowProgress = None,
    encoding_errors: EncodingErrors = None,
    quiet: Quiet = False,
    verbose: bool = typer.Option(
        False, "--verbose", "-v", callback=_set_level("verbose"), is_eager=True,
        help="Also say how it decodes: the search, the precision and the step's backends (one line on stderr).",
    ),
):
    """Translate lines from files or stdin to stdout with beam search or greedy decoding.

    cat test.de | tfcli translate -m run/ | sacrebleu test.en
    tfcli translate -m run/ test.de -o test.hyp.en --beam-size 8 --len-penalty 1.0
    tfcli translate -m run/ --nbest 5 --scores test.de
    tfcli translate -m run/ --alignment test.de | cut -f2 > test.align       # Pharaoh: 0-0 1-2 2-1 ...
    tfcli translate -m en-de/ mono.en --sampling --top-k 10 --seed 3 -o synthetic.de   # back-translation
    tfcli translate -m run/ test.de --prefix starts.en       # each output continues its line of starts.en
    tfcli translate -m run/ test.de --glossary terms.tsv     # each term found: its translation in the output
    tfcli translate -m run-a/ -m run-b/ test.de              # an ensemble: the probabilities averaged
    tfcli translate -m multi/ --tgt-lang fr test.de          # a multilingual model (prepare --lang-pairs)
    tfcli translate -m run/ a.de b.de --output-dir hyp/ --suffix .en    -> hyp/a.de.en, hyp/b.de.en
    tfcli translate -m en-de/ messages.pot -o de.po                 # a PO file: msgstr filled, marked fuzzy
    tfcli translate -m en-de/ page.html -o page.de.html             # tags, scripts and attributes kept
    tfcli translate -m en-de/ --input-format xml tagged.en          # a line: Click <b>Save</b> -> ... <b>...</b>
    torchrun --nproc_per_node 4 $(which tfcli) translate -m run/ big.de -o big.en

    On several processes (torchrun: one per GPU, or CPU processes with a share of the cores each) every process
    translates its parts of the file (--part-lines lines each) into big.en.parts/, and the first joins them into
    big.en: the same bytes one process writes. A stopped run keeps its finished parts; the same command with
    --resume translates only what is missing (one process can use --resume too).

    One line out per line in, in input order; empty lines give empty lines. Output is detokenised text (--raw:
    subword tokens separated by spaces). A line of several sentences may be translated sentence by sentence
    (--split-sentences), and a sentence longer than the model's max_len in windows, with a warning: never cut.
    With --nbest N or --scores, each input line gives N lines (an empty one gives one), best first:
        INDEX<TAB>SCORE<TAB>HYPOTHESIS[<TAB>TOKEN_SCORES]
    INDEX is the input line's 0-based number; SCORE = sum of the tokens' log-probs / ((5+|Y|)/6)^len_penalty, |Y|
    counting </s>; TOKEN_SCORES (with --scores) are the log-probs of each output subword and of </s>.
    --alignment adds a last tab-separated field: the words aligned, "i-j" for source word i and output word j
    (0-based, whitespace-separated words; subword tokens with --raw), each output token aligned to the source token
    that the cross-attention of --alignment-layer (heads averaged) weighs most.
    With --jsonl, one JSON object a translation instead: {"index", "text", "score"}, "rank" with --nbest,
    "token_scores" with --scores, "alignment" ([\\[i, j], ...]) with --alignment, and where the line has constraints
    (--constraints, JSONL "constraints", --glossary terms) "constraints": [{"phrase", "held"}, ...].
    """
    from tfcli.runtime import tune_process
    from tfcli.generate.config import translate_config
    from tfcli.generate.translate import translate as run_translate

    from tfcli.distributed import launched

    if not resume and launched().world_size == 1:
        refuse_unused(ctx, ["part_lines"], "is for --resume or several processes (torchrun)")
    if not alignment:
        refuse_unused(ctx, ["alignment_layer"], "is for --alignment")
    if sampling:
        refuse_unused(ctx, ["beam_size", "greedy", "nbest"], "is not used with --sampling (one draw a line)")
    else:
        refuse_unused(ctx, ["temperature", "top_k", "top_p", "seed"], "is for --sampling")
    if greedy and beam_size not in (None, 1):
        refuse_unused(ctx, ["beam_size"], "is not used with --greedy (a beam of 1); give one of them")
    check_choice("--dtype", dtype, choices_of(TranslateConfig, "dtype"))
    check_choice("--input-format", input_format, choices_of(TranslateConfig, "input_format"))
    check_choice("--placeholders", placeholders, choices_of(TranslateConfig, "placeholders"))
    check_choice("--split-sentences", split_sentences, choices_of(TranslateConfig, "split_sentences"))
    check_choice("--encoding-errors", encoding_errors, choices_of(TranslateConfig, "encoding_errors"))
    cfg = run(
        translate_config, config,
        beam_size=1 if greedy else beam_size, len_penalty=len_penalty, max_len_a=max_len_a, max_len_b=max_len_b,
        min_len=min_len, no_repeat_ngram_size=no_repeat_ngram_size, repetition_penalty=repetition_penalty, nbest=nbest, scores=scores or None, jsonl=jsonl or None, raw=raw or None,
        alignment=alignment or None,
        sampling=sampling or None, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        alignment_layer=alignment_layer, batch_size=batch_size,
        max_tokens=max_tokens, check_every=check_every, buffer_size=buffer_size, part_lines=part_lines, device=device, dtype=dtype,
        threads=threads, encoding_errors=encoding_errors, tgt_lang=tgt_lang, input_format=input_format,
        split_sentences=split_sentences, src_lang=src_lang, glossary=glossary or None, protect=protect or None,
        prompt_template=prompt_template, placeholders=placeholders, keep_tags=keep_tags or None, overwrite=overwrite or None,
    )
    if output_dir is not None and output is not None:
        fail("-o FILE and --output-dir DIR exclude each other", EXIT_USAGE)
    if suffix and output_dir is None:
        fail("--suffix names the files of --output-dir", EXIT_USAGE)
    run(tune_process, cfg.device, cfg.threads)
    run(run_translate, model, inputs or ["-"], output, cfg, progress, output_dir, suffix, resume, prefix, avoid,
        constraints)
