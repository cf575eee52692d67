"""`train.profile`: record a few training steps with torch.profiler, to see what the GPU (or the CPU) spends them on.

The steps A..B (1-based, inclusive) run under the profiler; after step B it writes RUN/profile/ops.txt (the ops by
their own device time, or CPU time on a CPU: the table `torch.profiler` prints) and RUN/profile/trace.json (a Chrome
trace: chrome://tracing or https://ui.perfetto.dev). The profiled steps run slower, so the throughput and MFU logged
for their interval are not the run's.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tfcli.errors import ConfigError
from tfcli.io import atomic_write_text


def parse_steps(spec: str) -> tuple[int, int] | None:
    """'A-B' (or 'A') -> (A, B); '' -> None."""
    if not spec:
        return None
    m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", str(spec))
    if not m or int(m.group(1)) < 1 or int(m.group(2) or m.group(1)) < int(m.group(1)):
        raise ConfigError(f"train.profile: expected steps as A-B with 1 <= A <= B (e.g. 20-24), got '{spec}'")
    return int(m.group(1)), int(m.group(2) or m.group(1))


def new_profiler(cuda: bool) -> torch.profiler.profile:
    """torch.profiler over the CPU's ops, and the GPU's kernels where `cuda`."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def op_table(ops, sort: str) -> str:
    """`ops` (a profile's key_averages()) as torch.profiler's table, the 50 largest by `sort`."""
    return f"sorted by {sort}\n{ops.table(sort_by=sort, row_limit=50, max_name_column_width=60)}"


class StepProfiler:
    """Starts torch.profiler before step A and writes its tables after step B (on the main process only)."""

    def __init__(self, spec: str, run_dir: Path, device: torch.device, enabled: bool):
        self.steps = parse_steps(spec) if enabled else None
        self.out = Path(run_dir) / "profile"
        self.cuda = device.type == "cuda"
        self.prof: torch.profiler.profile | None = None

    def before(self, step: int) -> None:
        """`step`: the step about to run."""
        if self.steps and step == self.steps[0]:
            self.prof = new_profiler(self.cuda)
            self.prof.__enter__()

    def after(self, step: int) -> Path | None:
        """`step`: the step just run. Returns the profile's directory once it is written."""
        if self.prof is None or step < self.steps[1]:
            return None
        return self.close()

    def close(self) -> Path | None:
        """Stop and write (also when the run ends inside the profiled steps)."""
        if self.prof is None:
            return None
        if self.cuda:
            torch.cuda.synchronize()
        self.prof.__exit__(None, None, None)
        sort = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        self.out.mkdir(parents=True, exist_ok=True)
        table = op_table(self.prof.key_averages(), sort)
        atomic_write_text(self.out / "ops.txt", f"steps {self.steps[0]}-{self.steps[1]}, {table}\n")
        self.prof.export_chrome_trace(str(self.out / "trace.json"))
        self.prof = None
        return self.out
