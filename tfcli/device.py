"""Where and at what precision a model runs: the device a name means, the autocast context for a dtype, what
this torch build can do (oneDNN's packed linear layers, the quantised int8 linear), and host values copied to a
device without waiting for it."""

from __future__ import annotations

import contextlib

import functools

import torch

from tfcli.errors import ConfigError, TfcliError
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID
from tfcli.torch_compat import cpu_has_amx

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = (*DTYPES, "int8")


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when a GPU is visible, else the CPU; also `cpu`, `cuda`, `cuda:N`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not (name == "cuda" or name.startswith("cuda:") and name[5:].isdigit()):
        raise ConfigError(f"--device {name}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TfcliError(f"--device {name}: no CUDA GPU is available to torch; use --device cpu")
    return torch.device(name)


def precision(device: torch.device, dtype: str, half: bool = False):
    """A context for the forward passes: autocast to bf16/fp16, or nothing for fp32 and int8 (whose linear layers
    are quantised once, by tfcli.generate.step.StepModel) and for `half` weights (already in bf16/fp16: a GPU's
    decoding copy, tfcli.generate.loader)."""
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"--dtype {dtype}: choose from {', '.join(DTYPE_NAMES)}")
    if dtype == "fp32":
        return contextlib.nullcontext()
    if dtype == "int8":
        if device.type != "cpu":
            raise ConfigError("--dtype int8 is for the CPU; on a GPU use bf16 or fp16")
        if not int8_available():
            raise ConfigError("--dtype int8: this torch build has no quantised int8 linear layers; use fp32")
        return contextlib.nullcontext()
    if dtype == "fp16" and device.type != "cuda":
        raise ConfigError("--dtype fp16 needs a CUDA device; on the CPU use bf16 or fp32")
    return contextlib.nullcontext() if half else torch.autocast(device.type, dtype=DTYPES[dtype])


def onednn_available() -> bool:
    """Whether this torch has the private oneDNN linear ops that packed weights need (they are not public API, so
    every use is behind this check)."""
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(mkldnn, "_linear_pointwise")
        and hasattr(mkldnn, "_reorder_linear_weight")
    )


def int8_engines() -> tuple[str, ...]:
    """The engines --dtype int8 runs its integer products on (tfcli.generate.int8), for few rows first: fbgemm
    (torch's x86/fbgemm quantised linear with a static input scale) and, on a CPU with AMX, oneDNN's int8 linear;
    oneDNN alone where this torch lacks fbgemm; oneDNN only where its sums are exact; none where neither serves."""
    engines = torch.backends.quantized.supported_engines
    quantized, onednn = getattr(torch.ops, "quantized", None), getattr(torch.ops, "onednn", None)
    fbgemm = ("x86" in engines or "fbgemm" in engines) and quantized is not None \
        and hasattr(quantized, "linear_with_input_q_dq_qweight_dq_output_fp32") and hasattr(quantized, "linear_prepack")
    dnn = torch.backends.mkldnn.is_available() and onednn is not None and hasattr(onednn, "qlinear_pointwise") \
        and hasattr(onednn, "qlinear_prepack") and onednn_int8_exact()
    if fbgemm and dnn and cpu_has_amx():
        return ("fbgemm", "onednn")
    return ("fbgemm",) if fbgemm else ("onednn",) if dnn else ()


@functools.lru_cache(maxsize=None)
def onednn_int8_exact() -> bool:
    """Whether this torch's oneDNN int8 linear takes signed int8 inputs, as tfcli.generate.int8 gives it (older
    torch builds, 2.2 among them, take only uint8), and sums their products exactly: on an x86 CPU without VNNI
    or AMX it shifts the inputs to uint8 (+128) and adds pairs of products in 16 bits, which saturate. Tried once
    on a 1 x 8 product whose exact sums are +-8 * 63 * 127 (pairs of 191 * 127 after the shift: past 2^15)."""
    try:
        w = torch.ops.onednn.qlinear_prepack(torch.tensor([[127] * 8, [-127] * 8], dtype=torch.int8), None)
        y = torch.ops.onednn.qlinear_pointwise(torch.full((1, 8), 63, dtype=torch.int8), 1.0, 0, w, torch.ones(2),
                                               torch.zeros(2, dtype=torch.long), None, 1.0, 0, torch.float32,
                                               "none", [], "")
        return bool(torch.equal(y, torch.tensor([[8.0 * 63 * 127, -8.0 * 63 * 127]])))
    except (RuntimeError, AttributeError):
        return False


def int8_available() -> bool:
    """Whether this torch has an int8 linear layer that --dtype int8 runs on (`int8_engines`)."""
    return bool(int8_engines())


_NEVER_CHOSEN: dict[tuple[torch.device, bool], torch.Tensor] = {}


def never_chosen(device: torch.device, eos: bool = False) -> torch.Tensor:
    """The ids no decoder ever emits, <pad> and <s> (and </s> with `eos`), as a tensor on `device`, made once: a
    tensor copied from the host at every step would make every step wait for the GPU."""
    ids = _NEVER_CHOSEN.get((device, eos))
    if ids is None:
        ids = _NEVER_CHOSEN[device, eos] = torch.tensor([PAD_ID, BOS_ID, EOS_ID] if eos else [PAD_ID, BOS_ID],
                                                        device=device)
    return ids


def to_device(values: list, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on `device`, copied without waiting for the work queued there (a plain
    torch.tensor(..., device=...) from the host waits for the GPU's queue to empty; so may a copy from pageable
    memory: on CUDA it is staged in pinned memory, which the copy holds until it is done)."""
    x = torch.tensor(values)
    return (x.pin_memory() if device.type == "cuda" else x).to(device, non_blocking=True)
