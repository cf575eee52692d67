"""How many of this process's CPUs other work keeps busy, watched over an interval (from /proc/stat). A leaf, so
that the command line can begin its watch before its own imports: what this process does meanwhile is its own work,
and is taken out, so the imports need not wait."""

from __future__ import annotations

import os
import time


class Watch:
    """Begun when made; `busy_cores` ends it."""

    def __init__(self):
        try:
            self.allowed = {f"cpu{i}" for i in os.sched_getaffinity(0)}
        except (AttributeError, OSError):
            self.allowed = None
        self.wall, self.own, self.ticks = time.monotonic(), time.process_time(), self._ticks()

    def busy_cores(self, at_least_s: float) -> float:
        """The cores other work kept busy since the watch began (after at least `at_least_s` seconds: it sleeps out
        the rest): the busy share of each CPU summed, less this process's own CPU time over the interval. 0 where
        there is no /proc/stat."""
        time.sleep(max(0.0, at_least_s - (time.monotonic() - self.wall)))
        after, own, wall = self._ticks(), time.process_time(), time.monotonic()
        if not self.ticks or not after:
            return 0.0
        busy = 0.0
        for name, (work, total) in after.items():
            if name in self.ticks and total > self.ticks[name][1]:
                busy += (work - self.ticks[name][0]) / (total - self.ticks[name][1])
        return max(0.0, busy - (own - self.own) / max(wall - self.wall, 1e-9))

    def _ticks(self) -> dict[str, tuple[int, int]] | None:
        """Per allowed CPU (busy ticks, all ticks) so far; None where /proc/stat cannot be read."""
        out = {}
        try:
            with open("/proc/stat") as f:
                for line in f:
                    name, *fields = line.split()
                    if name.startswith("cpu") and name != "cpu" and (self.allowed is None or name in self.allowed):
                        ticks = [int(x) for x in fields[:8]]
                        idle = ticks[3] + ticks[4]  # idle, iowait
                        out[name] = (sum(ticks) - idle, sum(ticks))
        except (OSError, ValueError, IndexError):
            return None
        return out
