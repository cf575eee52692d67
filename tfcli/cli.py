"""The `tfcli` command line. Thin by design: parse options, call one function, print.

Errors the user can fix are printed as one line on stderr (exit 1); usage errors exit 2; an interrupt exits 130.
Pass --debug (or set TFCLI_DEBUG=1) to see full tracebacks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

import tfcli
from tfcli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, TfcliError, debug_enabled

app = typer.Typer(
    name="tfcli",
    help="A command-line Transformer toolkit: prepare corpora, train translation models and language models, "
    "translate, generate and score.\n\nThe stages chain: prepare -> train -> translate / lm-generate -> eval.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = EXIT_ERROR) -> None:
    err.print(f"[bold red]error:[/] {message}", markup=True) if err.is_terminal else print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def run(fn, *args, **kwargs):
    """Call `fn`, turning user errors into one-line messages and exit codes (tracebacks only with --debug)."""
    try:
        return fn(*args, **kwargs)
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
    except MemoryError:
        if debug_enabled():
            raise
        fail("out of memory; lower --batch-size / --max-tokens")


def not_implemented(command: str) -> None:
    fail(f"'tfcli {command}' is not implemented yet", EXIT_USAGE)


def _version(value: bool):
    if value:
        print(f"tfcli {tfcli.__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors (also TFCLI_DEBUG=1)."),
):
    if debug:
        os.environ["TFCLI_DEBUG"] = "1"


# --- commands --------------------------------------------------------------------------------------------------


@app.command()
def prepare():
    """Load a corpus, clean it, train a subword tokenizer and write a prepared directory for training."""
    not_implemented("prepare")


@app.command()
def train():
    """Train an encoder-decoder (translation) or decoder-only (language model) Transformer."""
    not_implemented("train")


@app.command()
def translate():
    """Translate lines from files or stdin to stdout with beam search or greedy decoding."""
    not_implemented("translate")


@app.command("lm-generate")
def lm_generate():
    """Sample text from a language model (greedy, temperature, top-k, top-p)."""
    not_implemented("lm-generate")


@app.command("eval")
def eval_():
    """Score translations with sacrebleu (BLEU, chrF, TER) or a model by perplexity."""
    not_implemented("eval")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
