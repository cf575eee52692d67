"""User-facing errors.

Anything a user can cause (bad input, a wrong path, an impossible config) raises a `TfcliError`; the CLI prints its
message as one line on stderr and exits with its code. Tracebacks are only shown with `--debug`.
"""

from __future__ import annotations

import os
import signal

# Exit codes, so shell pipelines can tell failures apart.
EXIT_ERROR = 1  # bad input, bad config, missing file: the user can fix it
EXIT_USAGE = 2  # wrong command-line usage (also what click/typer use), or a command not available
EXIT_INTERRUPTED = 130  # SIGINT / SIGTERM


class TfcliError(Exception):
    """An error with a message meant for the user; no traceback needed."""

    exit_code = EXIT_ERROR

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InputError(TfcliError):
    """Bad input data. Built with the file and line so the user can find it."""

    def __init__(self, path: os.PathLike | str, line: int | None, message: str):
        where = f"{path}:{line}" if line is not None else f"{path}"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.line = line


class ConfigError(TfcliError, ValueError):
    """A config file or flag with an unknown key, a wrong type or an impossible value (a ValueError, so that the
    Python API's callers can catch it as one)."""


class CheckpointError(TfcliError):
    """A checkpoint that is missing, corrupt, or does not fit the model/tokenizer asked for."""


class NotANumber(TfcliError):
    """A model whose weights or outputs hold NaN or inf (a diverged run's checkpoint, a broken conversion, an
    activation past fp16's range): decoding stops rather than print what such a model chose. `module`: the layer
    whose weights hold them, where known."""

    def __init__(self, message: str, module=None):
        super().__init__(message)
        self.module = module


# --- interruption -------------------------------------------------------------------------------------------
# The CLI turns SIGINT/SIGTERM into KeyboardInterrupt. C code that calls back into Python (an extension module being
# imported, say) can swallow that exception, so the signal is also remembered, and every commit (the rename of an
# atomic write) and the end of a command check it: an interrupted command never replaces an output.
_signalled: int | None = None


def interrupt(signum, frame) -> None:
    """Signal handler: remember the signal and raise KeyboardInterrupt; inside an import, later.

    An extension module being imported runs Python from C++ (pybind11) where an exception may have nowhere to go,
    and the process aborts; a module whose import was cut is left half made. So inside an import the signal is only
    remembered, and comes back every 50 ms (SIGALRM) until the import is over."""
    global _signalled
    _signalled = signum
    if _importing(frame) and hasattr(signal, "setitimer"):
        signal.signal(signal.SIGALRM, _again)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        return
    raise KeyboardInterrupt


def _again(_alarm, frame) -> None:
    interrupt(_signalled, frame)


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def was_interrupted() -> bool:
    """Whether `interrupt` has seen a signal (even one whose exception was lost)."""
    return _signalled is not None


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if `interrupt` has seen a signal (even one whose exception was lost)."""
    if was_interrupted():
        raise KeyboardInterrupt
