"""The norms a model can have: LayerNorm (the 2017 paper) or RMSNorm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.config import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g over the last dimension (Zhang & Sennrich 2019)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.weight.dtype:  # a bf16/fp16 input under autocast (q and k of QK-norm): computed in the
            return self(x.to(self.weight.dtype)).to(x.dtype)  # weight's precision, rounded once, as torch would
        if hasattr(F, "rms_norm"):  # torch 2.4+
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def norm_layer(cfg: ModelConfig) -> nn.Module:
    """The model's norm: LayerNorm, or RMSNorm with `rms_norm`."""
    return RMSNorm(cfg.d_model, cfg.layer_norm_eps) if cfg.rms_norm else nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
