"""`tfcli attention` and `tfcli plot`: pictures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from tfcli.cli.common import (
    EncodingErrors, Quiet, app, check_choice, fail, info, refuse_unused, run,
)
from tfcli.errors import EXIT_USAGE


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
    tgt_lang: Optional[str] = typer.Option(
        None, "--tgt-lang", metavar="LANG", help="A multilingual translation model's target language."
    ),
    src_lang: Optional[str] = typer.Option(
        None, "--src-lang", metavar="LANG", help="An imported M2M-100 or NLLB model's source language (en, eng_Latn)."
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
    encoding_errors: EncodingErrors = None,
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
    from tfcli.io import ENCODING_ERRORS, encoding_errors as reading, read_lines
    from tfcli.viz.attention import write_attention

    if not png:
        refuse_unused(ctx, ["layers"], "picks the layers of the PNGs; with --no-png the HTML page has every layer")
    if not png and not html:
        fail("--no-png and --no-html leave nothing to write", EXIT_USAGE)
    check_choice("--kind", list(kinds or []), ("encoder", "self", "cross"))
    check_choice("--encoding-errors", encoding_errors, ENCODING_ERRORS)

    texts = list(sentences or [])
    with reading(encoding_errors or "strict"):
        if input_file is not None:
            texts += run(read_lines, input_file)
        if not texts and input_file is None and not sys.stdin.isatty():
            texts = run(read_lines, "-")
    if not texts:
        fail("no input: give sentences as arguments, --input FILE or on stdin", EXIT_USAGE)
    written = run(
        write_attention, model, texts, output, targets or None, generate, kinds, layers, png, html, device,
        [input_file] if input_file else [], tgt_lang, src_lang,
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
