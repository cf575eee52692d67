"""What the commands do to their own process before they compute, for a script that owns its process and wants
the commands' speed: tfcli.load and the rest of the library never do it on their own (a library does not change
the process it is imported into)."""

from __future__ import annotations

__all__ = ["tune_process", "keep_freed_memory"]


def tune_process(device="cpu", threads: int | None = None) -> None:
    """Use `threads` CPU threads, and on the CPU let glibc keep freed memory for reuse. `device`: as --device."""
    import torch

    from tfcli.device import resolve_device

    device = resolve_device(device) if isinstance(device, str) else device
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cpu":
        keep_freed_memory()


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the OS at once.

    Decoding and training allocate tensors of the same sizes every step (logits and their gradient: rows x
    vocabulary floats, MBs to hundreds of MBs). By default glibc serves blocks above 128 KiB (at most 32 MiB, as it
    adapts) with fresh mmaps and unmaps them on free, so each step's tensors arrive as new pages that fault on first
    touch: a visible share of a beam-search step, and of a training step on the CPU (1,500 tokens x 8,000 words of
    fp32 logits are 48 MB). An mmap threshold of 1 GiB (32 MiB where glibc refuses more) and no heap trimming below
    2 GiB keep them in the heap. Returns False, changing nothing, where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    kept = any(mallopt(M_MMAP_THRESHOLD, size) for size in (1 << 30, 32 << 20))
    return kept and bool(mallopt(M_TRIM_THRESHOLD, (1 << 31) - 1))
