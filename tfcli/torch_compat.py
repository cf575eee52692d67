"""What differs between the PyTorch versions tfcli supports (2.2 and later: pyproject.toml)."""

from __future__ import annotations

import os

import torch

if hasattr(torch.compiler, "is_compiling"):  # torch 2.3+
    is_compiling = torch.compiler.is_compiling
else:  # torch 2.2
    from torch._dynamo import is_compiling  # noqa: F401 (re-exported)


def grad_scaler(device_type: str, enabled: bool):
    """torch.amp.GradScaler(device_type) (2.3+); torch 2.2 has the CUDA one only (fp16 training is CUDA-only anyway)."""
    if hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device_type, enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled and device_type == "cuda")


def fused_adamw(device_type: str) -> bool:
    """Whether torch.optim.AdamW(fused=True) runs on this device type: CUDA in every supported torch, the CPU from
    2.4. Fused, each parameter's update is one kernel instead of a dozen element-wise ops (on a CPU the ops' own
    overhead dominates for the small tensors of a small model)."""
    return device_type == "cuda" or (device_type == "cpu" and torch.__version__ >= "2.4")


def _onednn_allows(*levels: str) -> bool:
    """Whether oneDNN's own ISA setting (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA; unset: all) reaches a level whose
    name holds one of `levels`, e.g. "AMX" (AVX512_CORE_VNNI keeps it below AMX and AVX-512 BF16)."""
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    return isa in ("ALL", "DEFAULT") or any(level in isa for level in levels)


def _cpu_has(check: str) -> bool:
    """torch.cpu's private feature check `check` (2.3+): False where this torch lacks it."""
    fn = getattr(torch.cpu, check, None)
    return bool(fn and fn())


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon 4th gen and later), on which oneDNN runs bf16 and int8 matrix
    products several times faster than fp32 ones; False where oneDNN's ISA setting keeps it below AMX."""
    return _onednn_allows("AMX") and _cpu_has("_is_amx_tile_supported")


def cpu_has_native_bf16() -> bool:
    """Whether oneDNN multiplies bf16 matrices natively on this CPU, where bf16 autocast trains faster than fp32:
    AMX tiles, or AVX-512 BF16 dot products (AMD Zen 4 and later, Intel Cooper Lake); False where oneDNN's ISA
    setting keeps it below both."""
    return cpu_has_amx() or (_onednn_allows("BF16", "FP16", "AMX", "AVX10") and _cpu_has("_is_avx512_bf16_supported"))


def autocast_dtype(device_type: str) -> torch.dtype | None:
    """The dtype autocast casts to on `device_type` ("cpu" or "cuda") where it is on, else None."""
    if device_type == "cpu":
        return cpu_autocast_dtype()
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def cpu_autocast_dtype() -> torch.dtype | None:
    """The dtype CPU autocast casts to where it is on, else None (torch.is_autocast_enabled("cpu") is 2.4+)."""
    if hasattr(torch, "get_autocast_dtype"):
        return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
    return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
