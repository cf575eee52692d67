"""benchmarks/common.py's Isolated: a runner built and timed in a process of its own, errors carried back."""

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from common import Isolated  # noqa: E402


class Doubler:
    def __init__(self, offset):
        self.offset = offset

    def run(self, x, pause=0.0):
        if x < 0:
            raise ValueError("negative input")
        time.sleep(pause)
        return os.getpid(), 2 * x + self.offset


def test_runs_in_its_own_process_and_reports_the_time():
    with Isolated("doubler", Doubler, 1, threads=1) as runner:
        seconds, (pid, y) = runner.run(20, 0.25)
        assert y == 41 and pid != os.getpid()
        assert seconds >= 0.25  # the call is timed (a sleep lasts at least as long as asked)
        with pytest.raises(RuntimeError, match="(?s)doubler .*negative input"):
            runner.run(-1)
        assert runner.run(1)[1][1] == 3  # the process survives a failed call


def test_a_failing_factory_is_reported():
    with pytest.raises(RuntimeError, match="(?s)broken .*TypeError"):
        Isolated("broken", Doubler, threads=1)  # Doubler() misses its argument
