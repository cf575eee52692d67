"""The `tfcli` command line: a table from command to library function, one module per command (or pair of related
commands), each parsing its options, checking them against each other and calling the library. Nothing in the
library imports this package.

Errors the user can fix are printed as one line on stderr (exit 1); usage errors exit 2; an interrupt exits 130.
Pass --debug (or set TFCLI_DEBUG=1) to see full tracebacks.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

# the commands, registered on `app` in the order `tfcli --help` lists them: the pipeline's order
from tfcli.cli import prepare, train, config, average, interop, translate, generate, eval, viz  # noqa: F401, I001
from tfcli.cli.common import app, fail, run
from tfcli.cli.process import COMPUTING, choose_threads, threads_flag
from tfcli.cpu_watch import Watch
from tfcli.errors import EXIT_INTERRUPTED, interrupt

__all__ = ["app", "main", "run", "fail"]


def _unraisable(info) -> None:
    """The interrupt raised where Python cannot propagate it (a callback inside an import, say) is not printed as a
    traceback: `interrupt` remembered the signal, and the command stops at its next commit or at its end."""
    if isinstance(info.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(info)


def main(watch: Watch | None = None) -> None:
    """`watch`: the look at the CPUs, begun before these modules imported (None: it begins now)."""
    # SIGTERM acts as Ctrl-C: temp files are removed, no output is replaced, training saves a checkpoint
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    sys.unraisablehook = _unraisable
    if len(sys.argv) > 1 and sys.argv[1] in COMPUTING and not {"--help", "-h"} & set(sys.argv):
        # (before torch loads: it reads OMP_NUM_THREADS once)
        choose_threads(given=threads_flag(sys.argv[2:]), watch=watch)
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
