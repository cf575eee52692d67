"""A model's linear layers stored as decoding reads them, beside its checkpoint's weights (`tfcli quantize`), so that
decoding maps them from the file instead of making them at every load: the same bytes, a faster start, and pages
that every process decoding the model shares (the page cache) rather than a copy each.

    int8  model.int8.safetensors  every linear layer as tfcli.generate.int8 runs it on rows.c's kernel: NAME.wp
                                  (blocks of 64 outputs x groups of 4 inputs), NAME.cs (each output's sum of
                                  weights) and NAME.scale (each output's), zero past the layer's outputs
    fp32  model.fp32.safetensors  the decoder's linear layers and the output layer as rows.c's row kernel reads
                                  them (tfcli.generate.native.RowLinear): NAME.wt, column blocks of 32 outputs, K x
                                  32 each, zero past the outputs (padded to 64); the encoder packs for oneDNN

Each file records a fingerprint of the weights it was made from (tfcli.checkpoint.fingerprint): made from other
weights, with layers the model lacks, or in a newer format, it is ignored with a warning and the layers are made at
load as before.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn

from tfcli import checkpoint, checkpoint_meta
from tfcli.errors import CheckpointError
from tfcli.generate.native import NB, PAD

FORMAT_VERSION = 1
FORMATS = {"int8": "tfcli-int8", "fp32": "tfcli-fp32-rows"}


def _int8_parts(N: int, K: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    blocks = -(-N // 64)
    return {"wp": ((blocks, -(-K // 4), 64, 4), torch.int8), "cs": ((blocks * 64,), torch.int32),
            "scale": ((blocks * 64,), torch.float32)}


def _fp32_parts(N: int, K: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {"wt": ((-(-N // PAD) * PAD // NB, K, NB), torch.float32)}


PARTS = {"int8": _int8_parts, "fp32": _fp32_parts}  # dtype -> (N, K) -> each part's shape and dtype


class StoredWeights:
    """The linear layers of a model in one dtype's decoding layout (`PARTS`), by module name: read from the file
    `tfcli quantize` writes (`read`), or filled as decoding makes them at load (to write that file)."""

    def __init__(self, dtype: str, model: nn.Module, tensors: dict[str, torch.Tensor] | None = None):
        self.dtype = dtype
        self.names: dict[int, str] = {}
        for name, m in model.named_modules(remove_duplicate=False):
            self.names.setdefault(id(m), name)
        self.tensors = dict(tensors or {})

    def get(self, module: nn.Linear) -> dict[str, torch.Tensor] | None:
        """The module's parts, or None where they are not held."""
        name = self.names.get(id(module))
        parts = PARTS[self.dtype](*module.weight.shape)
        if name is None or any(f"{name}.{p}" not in self.tensors for p in parts):
            return None
        return {p: self.tensors[f"{name}.{p}"] for p in parts}

    def put(self, module: nn.Linear, **parts: torch.Tensor) -> None:
        name = self.names[id(module)]
        self.tensors |= {f"{name}.{p}": t for p, t in parts.items()}

    def modules(self) -> list[str]:
        """The names of the modules held, in order."""
        return sorted({k.rsplit(".", 1)[0] for k in self.tensors})

    def mismatch(self, model: nn.Module) -> str | None:
        """Why these tensors cannot be `model`'s linear layers (a name it lacks, a shape it does not have), or None."""
        for name in self.modules():
            try:
                module = model.get_submodule(name)
            except AttributeError:
                return f"no layer {name}"
            if not isinstance(module, nn.Linear):
                return f"{name} is not a linear layer"
            for part, (shape, dtype) in PARTS[self.dtype](*module.weight.shape).items():
                t = self.tensors.get(f"{name}.{part}")
                if t is None or tuple(t.shape) != shape or t.dtype != dtype:
                    return f"{name}.{part} is not {dtype} of shape {shape}"
        return None

    def fingerprint(self, model: nn.Module) -> str:
        """What ties these layers to the weights they were made from (tfcli.checkpoint.fingerprint)."""
        return checkpoint.fingerprint([model.get_submodule(name).weight for name in self.modules()])


def path(meta: dict, dtype: str) -> Path:
    return Path(meta["dir"]) / checkpoint_meta.STORED_WEIGHTS[dtype]


def write(store: StoredWeights, model: nn.Module, meta: dict) -> Path:
    """`store` as its dtype's file beside the checkpoint's weights, atomically. Returns the file's path."""
    from tfcli.io import atomic_open, fault_point

    out = path(meta, store.dtype)
    header = {"format": FORMATS[store.dtype], "format_version": str(FORMAT_VERSION),
              "weights": store.fingerprint(model)}
    with atomic_open(out, "wb") as f:
        fault_point(out.name)
        checkpoint.write_tensors(f, store.tensors, header)
    return out


def read(meta: dict, model: nn.Module, dtype: str) -> StoredWeights | None:
    """The layers `tfcli quantize` stored in `dtype` beside the checkpoint's weights, mapped; None where there are
    none, or (with a warning) where they were not made from the weights the checkpoint holds now."""
    file = path(meta, dtype)
    if not file.is_file():
        return None
    from safetensors import SafetensorError, safe_open

    again = f"`tfcli quantize {meta['dir']}{'' if dtype == 'int8' else ' --dtype ' + dtype}`"
    try:
        with safe_open(str(file), "pt") as f:
            header = f.metadata() or {}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: unreadable ({e}); delete it, or write it again with {again}") from None
    if header.get("format") != FORMATS[dtype] or not str(header.get("format_version", "")).isdigit():
        raise CheckpointError(f"{file}: not a tfcli {dtype} weights file; delete it, or write it again with {again}")
    if int(header["format_version"]) > FORMAT_VERSION:
        why = f"written in {dtype} format {header['format_version']}, this tfcli reads up to {FORMAT_VERSION}"
    else:
        store = StoredWeights(dtype, model, checkpoint.read_weights(file))
        why = store.mismatch(model)
        if why is None and header.get("weights") != store.fingerprint(model):
            why = f"made from other weights than its {checkpoint_meta.WEIGHTS} holds now"
        if why is None:
            return store
    made = "quantising" if dtype == "int8" else "packing"
    warnings.warn(f"{file}: {why}; {made} at load instead (run {again} again)", RuntimeWarning, stacklevel=3)
    return None
