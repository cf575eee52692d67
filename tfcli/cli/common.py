"""What every command of the command line shares: the Typer app, turning errors into one line and an exit
code, the options several commands take (each defined once), and the checks of flags against modes and choices."""

from __future__ import annotations

import gc
import os
import re
import sys
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

import tfcli
from tfcli import console
from tfcli.console import info  # noqa: F401  (the commands' one way to print a line for the user)
from tfcli.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, TfcliError, raise_if_interrupted, was_interrupted
from tfcli.generate.config import TranslateConfig
from tfcli.train.config import TrainConfig

_T, _TRAIN = TranslateConfig(), TrainConfig()


def _default(value) -> str:
    return f" \\[default: {_shown(value)}]."


def _shown(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def config_defaults(*configs):
    """Decorate a command: each option named after a field of one of the config dataclasses `configs` gets that
    field's default in its help, so the one place of a default is its dataclass. Help that already says its
    default (something the field does not hold: "the model's max_len") is left as it is."""
    import dataclasses
    import inspect

    fields = {}
    for cls in reversed(configs):
        instance = cls()
        fields.update({f.name: getattr(instance, f.name) for f in dataclasses.fields(cls)})

    def decorate(fn):
        for name, param in inspect.signature(fn).parameters.items():
            option = param.default
            if not isinstance(option, typer.models.OptionInfo):  # Annotated[...]: the shared options, defaulted there
                continue
            if option.default not in (None, ...) and not isinstance(option.default, bool):
                continue  # the option's own default, which typer shows
            if option.default is False and "/" not in str(option.param_decls):
                continue  # a plain switch: off unless given
            value = fields.get(name)
            if value not in (None, "", []) and option.help is not None and "[default" not in option.help:
                option.help = option.help.rstrip().rstrip(".") + _default(value)
        return fn

    return decorate


def _value_type(self, ctx):
    """A flag takes no value, so its help row shows none (typer prints `<bool>`, which made users type `--json
    true`)."""
    return None if getattr(self, "is_flag", False) else _typer_value_type(self, ctx)


# typer's rich help asks each option for its value type here from typer 0.29 on; older ones print no `<bool>`
_typer_value_type = getattr(typer.core.TyperOption, "display_type_rich", None)
if _typer_value_type is not None:
    typer.core.TyperOption.display_type_rich = _value_type

# old spellings that still work, hidden from --help, so that no pipeline breaks: old -> the flag's one name
# old spellings of flags, still read: one name per concept (n outputs an input: --nbest; a number type: --dtype)
FLAG_ALIASES = {"--alpha": "--len-penalty", "--topk": "--top-k", "--topp": "--top-p", "--num-samples": "--nbest",
                "--precision": "--dtype", "--quantization": "--dtype"}


def unalias(args: list[str]) -> list[str]:
    """Command-line arguments with FLAG_ALIASES' old spellings (also as --old=VALUE) as the flags they name; what
    follows `--` is left alone."""
    out = list(args)
    for i, a in enumerate(out):
        if a == "--":
            break
        name, eq, value = a.partition("=")
        if name in FLAG_ALIASES:
            out[i] = FLAG_ALIASES[name] + eq + value
    return out


class _Command(typer.core.TyperCommand):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, unalias(args))


class _App(typer.Typer):
    """Every command reads the old spellings of its flags (FLAG_ALIASES)."""

    def command(self, *args, cls=None, **kwargs):
        return super().command(*args, cls=cls or _Command, **kwargs)


app = _App(
    name="tfcli",
    help="A command-line Transformer toolkit: prepare corpora, train translation models and language models, "
    "translate, generate and score.\n\nThe stages chain: prepare -> train -> translate / generate -> eval.",
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
    _imports_done()
    try:
        result = fn(*args, **kwargs)
        raise_if_interrupted()  # a signal whose KeyboardInterrupt was lost in C code still ends in status 130
        return result
    except KeyboardInterrupt:
        if debug_enabled():
            raise
        _exit_interrupted()
    except TfcliError as e:
        if debug_enabled():
            raise
        _interrupted_first()
        fail(str(e), e.exit_code)
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
        _interrupted_first()
        fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e.strerror or e))
    except Exception as e:
        if debug_enabled():
            raise
        _interrupted_first()
        if _out_of_memory(e):
            size = re.search(r"allocate (\d+) bytes", str(e))
            tried = f" (tried to allocate {int(size.group(1)) / 2**30:.1f} GiB)" if size else ""
            fail(f"out of memory{tried}; use a smaller model or lower --batch-size / --max-tokens")
        first = (str(e).strip().splitlines() or [""])[0]
        fail(f"internal error: {type(e).__name__}: {first} (run with --debug for the traceback, and please report it)")


def _imports_done() -> None:
    """A command has imported what it needs when it first calls `run`: the garbage collector that the entry point
    held off during the imports (tfcli.__main__) goes on, leaving out of its passes every object there is now
    (gc.freeze: modules, functions, classes that live to the end of the process)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def _exit_interrupted() -> None:
    print("interrupted", file=sys.stderr)
    raise typer.Exit(EXIT_INTERRUPTED)


def _interrupted_first() -> None:
    """An error after a signal is its consequence (a KeyboardInterrupt lost inside a lazy import leaves a half-made
    module, e.g. numpy without `void`): the command was interrupted, and says so."""
    if was_interrupted():
        _exit_interrupted()


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


_debug = False


def debug_enabled() -> bool:
    """--debug, or TFCLI_DEBUG=1 in the environment: errors with their tracebacks."""
    return _debug or os.environ.get("TFCLI_DEBUG", "").lower() not in ("", "0", "false", "no")


def _set_level(name: str):
    """A callback that sets a console level (quiet, verbose) for the command, when the flag is given."""
    def callback(value: bool):
        if value:
            console.set_levels(**{name: True})
        return value
    return callback


Quiet = Annotated[bool, typer.Option(
    "--quiet", "-q", callback=_set_level("quiet"), is_eager=True,
    help="Only warnings and errors on stderr: no progress bars, summaries or log lines (results still go to stdout).",
)]


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
    global _debug
    _debug = debug
    console.set_levels(quiet=quiet, verbose=False)  # each command starts from the defaults; its own -q/-v follow


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
    "--len-penalty", rich_help_panel=_DEC,
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
    help="fp32, bf16 or fp16 (on a GPU a copy of the weights in that dtype; on the CPU bf16 autocast; fp16 needs "
    "CUDA), or int8 (the CPU: every linear layer in int8, its "
    "inputs with a scale per token, so an output never depends on its batch; faster than fp32 from 128-wide models "
    "up: docs/performance.md; `tfcli quantize` stores them for a faster start)" + _default(_T.dtype)
)]
SplitSentences = Annotated[Optional[str], typer.Option(
    "--split-sentences", metavar="WHEN", rich_help_panel=_DEC,
    help="auto, always or never: translate a line sentence by sentence, joined on its one output line (auto: a "
    "line longer than 99% of the model's training sources or than its max_len; any line for a model imported "
    r"from transformers, trained on sentences) \[default: auto]. A sentence longer than max_len is translated in "
    "windows, never cut.",
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
