"""What the commands do to their own process, which the library never does: the thread count from the cores that
are free when a command starts (`choose_threads`, before torch loads). The rest (`--threads`, which wins, and
keeping freed memory in the allocator) is tfcli.runtime's, which a script that owns its process may call too."""

from __future__ import annotations

import math
import os

from tfcli.cpu_watch import Watch

# the commands that compute (the others start faster without the look at the machine)
COMPUTING = ("train", "translate", "lm-generate", "eval", "prepare", "attention")
SAMPLE_S = 0.1  # how long the CPUs are watched at start, at least


def choose_threads(sample_s: float = SAMPLE_S, given: int | None = None, watch: Watch | None = None) -> int | None:
    """Before torch loads: OMP_NUM_THREADS (torch's and oneDNN's threads) and RAYON_NUM_THREADS (the tokenizers')
    set to the cores this process may use that other work is not using now; returns the count, or None where the
    user chose (OMP_NUM_THREADS set). `given`: the command's --threads (`threads_flag`), used as it is, without the
    look at the CPUs (tfcli.runtime.tune_process applies it to torch later; the tokenizers take it from here).

    Why: a thread of an OpenMP team that shares its core with another process's busy thread is late to every
    barrier, and the others spin there waiting for it: beside one busy thread on 2 cores, 2 threads made training
    2.75x and decoding 2.05x slower than alone, where its fair share is about 1.5x. With as many threads as free
    cores nobody waits on a core it does not have, and an idle machine keeps every core (and OpenMP's default,
    spinning briefly at barriers, which is the fastest when the cores are its own). Measured once, at start, over
    `sample_s` seconds or since `watch` began (the command line's start: its imports overlap the watch): load that
    comes later is not followed (give --threads)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    threads = given or max(1, usable_cores() - round(busy_cores(sample_s, watch)))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    return threads


def threads_flag(args: list[str]) -> int | None:
    """The positive count a command line's --threads gives (`--threads N` or `--threads=N`, before any `--`), or None
    (absent, 0 or not a number: the command reads it then and says what is wrong)."""
    for i, a in enumerate(args):
        if a == "--":
            break
        if a == "--threads":
            value = args[i + 1] if i + 1 < len(args) else ""
        elif a.startswith("--threads="):
            value = a.partition("=")[2]
        else:
            continue
        return int(value) if value.isdigit() and int(value) > 0 else None
    return None


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity), at most its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def busy_cores(sample_s: float, watch: Watch | None = None) -> float:
    """How many of this process's CPUs other work kept busy over `sample_s` seconds (or since `watch` began, if that
    is longer; 0 where there is no /proc/stat)."""
    return (watch or Watch()).busy_cores(sample_s)
