"""Low-rank adapters (LoRA, Hu et al. 2021) on a frozen model's linear layers: y = W x + (alpha / r) B A dropout(x),
with A (r x d_in) drawn as PEFT draws it and B (d_out x r) zero, so that training starts from the model as it was.

An adapter is a submodule `lora` of the linear layer it adapts, added to its output by a forward hook: training,
checkpoints (only the adapters' tensors, tfcli/checkpoint.py) and the PEFT export (tfcli/interop/hf.py) find it
there. Decoding never sees one: `merge` folds W + (alpha / r) B A into the weight and removes the adapter, and the
merged model runs as any other.

Targets are named as the layers' Sublayers fields: qkv (the self-attention's fused q, k, v), self_out, cross_q,
cross_kv, cross_out, w1, w2, w3 (the FFN; w3 only in a gated one).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.errors import ConfigError
from tfcli.model.config import LORA_TARGETS as TARGETS
from tfcli.model.dropout import Dropout


@dataclass(frozen=True)
class LoraConfig:
    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = TARGETS

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout, "targets": list(self.targets)}

    @classmethod
    def from_dict(cls, d: dict) -> "LoraConfig":
        return cls(int(d["rank"]), float(d["alpha"]), float(d.get("dropout", 0.0)), tuple(d["targets"]))


class Adapter(nn.Module):
    """(alpha / r) B A dropout(x): what LoRA adds to one linear layer's output."""

    def __init__(self, d_in: int, d_out: int, cfg: LoraConfig, draw: bool = True):
        super().__init__()
        self.A = nn.Parameter(torch.empty(cfg.rank, d_in))
        self.B = nn.Parameter(torch.zeros(d_out, cfg.rank))
        if draw:
            nn.init.kaiming_uniform_(self.A, a=math.sqrt(5))  # (nn.Linear's and PEFT's draw for lora_A)
        self.scale = cfg.scale
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(self.dropout(x), self.A), self.B) * self.scale

    def delta(self) -> torch.Tensor:
        """The change to the weight: (alpha / r) B A, in fp32."""
        return (self.B.float() @ self.A.float()) * self.scale


def _add(module: nn.Linear, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
    return output + module.lora(inputs[0]).to(output.dtype)


def target_layers(model: nn.Module, targets=TARGETS) -> dict[str, nn.Linear]:
    """{module name: linear layer} of every layer's `targets` (those a layer has: an encoder has no cross_*)."""
    names = {id(m): n for n, m in model.named_modules()}
    found = {}
    for module in model.modules():
        if not hasattr(module, "sublayers"):
            continue
        parts = module.sublayers()
        for t in targets:
            layer = getattr(parts, t, None)
            if layer is not None:
                found[names[id(layer)]] = layer
    return found


def check_targets(targets) -> tuple[str, ...]:
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets:
        raise ConfigError(f"train.lora_targets: {', '.join(unknown) or 'none given'}: expected some of "
                          f"{', '.join(TARGETS)}")
    return tuple(dict.fromkeys(targets))


def attach(model: nn.Module, cfg: LoraConfig, draw: bool = True) -> dict[str, Adapter]:
    """Freeze every parameter of `model` and give each target layer an adapter (A drawn from torch's global
    generator, in the order of the model's modules; left as allocated without `draw`, for a caller that loads
    them); returns {module name: adapter}."""
    layers = target_layers(model, check_targets(cfg.targets))
    if not layers:
        raise ConfigError(f"train.lora_targets: {', '.join(cfg.targets)}: the model has none of these layers")
    for name, layer in layers.items():
        d_out, d_in = layer.weight.shape
        if cfg.rank > min(d_in, d_out):
            raise ConfigError(f"train.lora_rank: {cfg.rank} is more than {name} ({d_in} -> {d_out}) can use; "
                              f"give at most {min(d_in, d_out)}")
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = {}
    for name, layer in layers.items():
        d_out, d_in = layer.weight.shape
        adapter = Adapter(d_in, d_out, cfg, draw).to(layer.weight.device)
        layer.lora = adapter
        layer._lora_hook = layer.register_forward_hook(_add)
        adapters[name] = adapter
    return adapters


def adapters(model: nn.Module) -> dict[str, Adapter]:
    """{module name: adapter} of the layers that have one."""
    return {n: m.lora for n, m in model.named_modules() if isinstance(getattr(m, "lora", None), Adapter)}


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' tensors under the model's state-dict names ("…qkv_proj.lora.A")."""
    return {f"{n}.lora.{k}": v for n, a in adapters(model).items() for k, v in a.state_dict().items()}


@contextmanager
def merged(model: nn.Module):
    """`model` with each adapted layer's weight replaced by W + (alpha / r) B A (a new tensor) and its adapter off,
    for code that reads the weights (decoding, while training validates); on exit the frozen weights (never
    written) and the adapters are back as they were. Costs a copy of the adapted layers, not of the model."""
    held = {}
    with torch.no_grad():
        for name, adapter in adapters(model).items():
            layer = model.get_submodule(name)
            held[name] = layer.weight
            layer._lora_hook.remove()
            layer.weight = nn.Parameter((layer.weight.float() + adapter.delta()).to(layer.weight.dtype),
                                        requires_grad=False)
    try:
        yield model
    finally:
        for name, weight in held.items():
            layer = model.get_submodule(name)
            layer.weight = weight
            layer._lora_hook = layer.register_forward_hook(_add)


@torch.no_grad()
def merge(model: nn.Module) -> nn.Module:
    """Fold every adapter into its layer's weight (W + (alpha / r) B A, in fp32, then the weight's dtype) and remove
    it: the plain model that decodes at the speed of any other."""
    for name, adapter in adapters(model).items():
        layer = model.get_submodule(name)
        layer.weight.copy_((layer.weight.float() + adapter.delta()).to(layer.weight.dtype))
        layer._lora_hook.remove()
        del layer.lora, layer._lora_hook
    return model
