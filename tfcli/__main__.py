"""The `tfcli` command and `python -m tfcli`: Ctrl-C and SIGTERM are taken over before the command line's own
imports, so that a signal at any moment of the start ends in `interrupted` and status 130, never a traceback.

The garbage collector is held off while the command's modules import (tfcli.cli.common.run lets it go on): torch
alone leaves some 170,000 objects that live as long as the process, and the collector's full passes over them, as
they pile up, cost a quarter of a second of every command's start. The look at how busy the CPUs are, which picks a
computing command's thread count, begins here too, so that those imports run while it watches."""

import gc
import os
import signal
import sys

from tfcli.cpu_watch import Watch
from tfcli.errors import EXIT_INTERRUPTED, interrupt, was_interrupted


def main() -> None:
    gc.disable()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, interrupt)
    watch = Watch()
    try:
        from tfcli.cli import main as cli_main

        cli_main(watch)
    except KeyboardInterrupt:  # outside a command's own handling (its imports, its arguments being read)
        _interrupted()
    except Exception:  # an interrupt lost inside an import surfaces as another error (numpy: "cannot load module
        if not was_interrupted():  # more than once per process" when it is imported again)
            raise
        _interrupted()


def _interrupted() -> None:
    print("interrupted", file=sys.stderr)
    os._exit(EXIT_INTERRUPTED)  # (outputs are atomic: an interrupted write was never renamed into place)


if __name__ == "__main__":
    main()
