"""What a command prints besides its results, all on stderr: warnings, info lines and progress bars, and how much of
it. The command line sets the levels for each command (`-q`, `-v`); a library caller gets info and progress (on a
terminal) unless it sets them too."""

from __future__ import annotations

import contextvars
import sys

from tfcli.errors import raise_if_interrupted

_quiet = contextvars.ContextVar("tfcli_quiet", default=False)
_verbose = contextvars.ContextVar("tfcli_verbose", default=False)


def set_levels(quiet: bool | None = None, verbose: bool | None = None) -> None:
    """`quiet`: warnings and errors only (no progress bars, summaries or log lines); `verbose`: more detail
    (training prints its whole resolved config). None leaves a level as it is."""
    if quiet is not None:
        _quiet.set(quiet)
    if verbose is not None:
        _verbose.set(verbose)


def quiet_enabled() -> bool:
    return _quiet.get()


def verbose_enabled() -> bool:
    return _verbose.get()


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def info(message: str) -> None:
    """A line for the user, unless quiet."""
    if not quiet_enabled():
        print(message, file=sys.stderr)


class Progress:
    """A rich progress bar on stderr, only when stderr is a terminal; otherwise it does nothing.

    Its rate is everything done so far over the time since the start: output comes in bursts (a batch finishes many
    lines at once), which made rich's moving estimate report tens of thousands a second. Lines printed with `emit`
    go above the bar when stdout is the same terminal, instead of through it."""

    def __init__(self, description: str, total: int | None, unit: str, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty() and not quiet_enabled()
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False,
            )
            self._unit = unit
            self._task = self._bar.add_task(description, total=total, rate="")

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, n: int) -> None:
        raise_if_interrupted()  # long loops pass here: one whose KeyboardInterrupt was lost in C code stops too
        if self._bar is not None:
            self._bar.advance(self._task, n)
            task = self._bar.tasks[0]
            if task.elapsed:
                self._bar.update(self._task, rate=f"{task.completed / task.elapsed:.1f} {self._unit}/s")

    def emit(self, out, text: str) -> None:
        """Write one output line to `out`; above the bar when `out` is stdout and both share the terminal."""
        if self._bar is not None and out is not None and _is_terminal_stdout(out):
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
        else:
            out.write(text + "\n")
            out.flush()  # a pipeline's next stage sees each line as soon as it is ready

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


def _is_terminal_stdout(out) -> bool:
    try:
        return out.fileno() == sys.stdout.fileno() and sys.stdout.isatty()
    except (OSError, ValueError, AttributeError):  # a file, a StringIO, a closed or replaced stdout
        return False
