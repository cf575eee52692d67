"""What `tfcli translate` and `tfcli lm-generate` do to their own process, which the library never does: the thread
count the user asked for, and an allocator that keeps freed memory for the next decoding step."""

from __future__ import annotations

import torch

from tfcli.device import resolve_device


def tune_process(device: torch.device | str, threads: int | None) -> None:
    """Use `threads` CPU threads, and on the CPU let glibc keep freed memory for reuse. `device`: as --device."""
    device = resolve_device(device) if isinstance(device, str) else device
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cpu":
        keep_freed_memory()


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the OS at once.

    Decoding allocates tensors of the same sizes every step (logits and log-probs: rows x vocabulary floats, MBs).
    By default glibc serves blocks above 128 KiB with fresh mmaps and returns them on free, so each step's tensors
    arrive as new pages that fault on first touch, a visible share of a beam-search step. A 32 MiB
    mmap threshold (glibc's largest) and no heap trimming below 512 MiB keep them in the heap. Returns False,
    changing nothing, where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 512 << 20))
