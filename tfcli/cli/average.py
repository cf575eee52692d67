"""`tfcli average-checkpoints`."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tfcli.cli.common import (
    Quiet, _TRAIN, app, fail, run,
)
from tfcli.errors import EXIT_USAGE


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
