"""Positional information: sinusoidal tables, learned embeddings, and rotary embeddings (RoPE)."""

from __future__ import annotations

import math

import torch
from torch import nn

from tfcli.errors import TfcliError
from tfcli.torch_compat import is_compiling


FAIRSEQ_OFFSET = 2  # fairseq numbers a sequence's positions from its padding id + 1 (<pad> is 1 there)


def sinusoidal_table(max_len: int, d_model: int, style: str = "sinusoidal") -> torch.Tensor:
    """The paper's table: PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d)).

    style "fairseq" (tensor2tensor's frequencies, as fairseq, M2M-100 and NLLB have them): the angle of pair i is
    pos / 10000^(i/(d/2 - 1)), and row p holds position p + FAIRSEQ_OFFSET. (fairseq writes the sines in the first
    half of the dimensions, the cosines in the second; here, as in the paper, they are interleaved: the import and
    export permute the model dimension, tfcli/interop/hf.py.)"""
    half = d_model // 2
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
    if style == "fairseq":
        pos = pos + FAIRSEQ_OFFSET
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float64) / max(half - 1, 1))
    else:
        inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq[: d_model - half])
    pe[:, 1::2] = torch.cos(pos * inv_freq[:half])
    return pe.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal positions (`sinusoidal_table` of `style`); the table grows on demand, so any length works."""

    def __init__(self, d_model: int, max_len: int, style: str = "sinusoidal"):
        super().__init__()
        self.d_model, self.style = d_model, style
        self.register_buffer("pe", sinusoidal_table(max_len, d_model, style), persistent=False)

    def forward(self, pos: torch.Tensor, end: int | None = None) -> torch.Tensor:
        """`end`: the largest position + 1, where the caller knows it (a full forward: the length). Else growing the
        table reads the largest position from `pos`, which waits for the GPU; under torch.compile that read would
        split the graph, so compiled training relies on the trainer keeping lengths within max_len."""
        if not is_compiling():
            need = _end(pos, end)
            if need > self.pe.size(0):
                grown = sinusoidal_table(max(need, 2 * self.pe.size(0)), self.d_model, self.style)
                self.pe = grown.to(self.pe.device, self.pe.dtype)
        return self.pe[pos]


class LearnedPositions(nn.Module):
    """A learned embedding per absolute position (BERT/GPT-2 style); cannot go past max_len."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.emb = nn.Embedding(max_len, d_model)

    def forward(self, pos: torch.Tensor, end: int | None = None) -> torch.Tensor:
        """`end` as in SinusoidalPositions."""
        if not is_compiling() and _end(pos, end) > self.emb.num_embeddings:
            raise TfcliError(
                f"sequence longer than the model's max_len ({self.emb.num_embeddings} positions, learned); "
                "shorten the input or lower --max-len"
            )
        return self.emb(pos)


def rope_frequencies(d_head: int, theta: float = 10000.0, scaling=None, long: bool = False) -> torch.Tensor:
    """RoPE's (d_head/2,) angular frequencies theta^(-2i/d_head) in fp32, stretched as `scaling` (a
    ModelConfig.RopeScaling, or None) says; `long`: longrope's long factors (else its short ones)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head))
    if scaling is None:
        return inv_freq
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    if scaling.type == "longrope":
        factors = torch.tensor(scaling.long_factor if long else scaling.short_factor, dtype=torch.float32)
        return 1.0 / (factors * theta ** (torch.arange(0, d_head, 2, dtype=torch.float32) / d_head))
    # llama3: long wavelengths slowed by `factor`, short ones kept, those between interpolated
    long_wave = scaling.original_max_len / scaling.low_freq_factor
    short_wave = scaling.original_max_len / scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > long_wave, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_len / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    between = (1 - smooth) * slowed / scaling.factor + smooth * slowed
    middle = ~(wavelength < short_wave) * ~(wavelength > long_wave)
    return torch.where(middle, between, slowed)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021): rotate each (x_i, x_{i+d/2}) pair of q and k by angle pos * theta_i, over a head's
    first d_rot dimensions (all of them but where the model says: Phi-4-mini's 3/4), the rest passed through.

    theta_i = rope_theta^(-2i/d_rot) (`rope_frequencies`); q.k then depends only on the relative position. With
    longrope, a sequence past its original_max_len positions turns by the long factors' frequencies (a row of a
    batch by its own positions; transformers decides for the whole batch, which equals this at batch 1).
    """

    def __init__(self, d_rot: int, max_len: int, theta: float = 10000.0, scaling=None):
        super().__init__()
        self.d_rot, self.scaling = d_rot, scaling
        self.longrope = scaling is not None and scaling.type == "longrope"
        # (plain attributes, not buffers: a model cast to bf16 keeps its frequencies in fp32)
        self.inv_freq = rope_frequencies(d_rot, theta, scaling)
        self.inv_freq_long = rope_frequencies(d_rot, theta, scaling, long=True) if self.longrope else None
        self._build(max_len)

    def _build(self, n: int, device=None):
        scale = 1.0 if self.scaling is None else self.scaling.scale
        steps = torch.arange(n, dtype=torch.float32, device=device)
        angles = torch.outer(steps, self.inv_freq.to(device))  # (n, d_rot/2)
        self.register_buffer("cos", angles.cos() * scale, persistent=False)
        self.register_buffer("sin", angles.sin() * scale, persistent=False)
        if self.longrope:
            angles = torch.outer(steps, self.inv_freq_long.to(device))
            self.register_buffer("cos_long", angles.cos() * scale, persistent=False)
            self.register_buffer("sin_long", angles.sin() * scale, persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, end: int | None = None) -> torch.Tensor:
        """x: (B, H, T, d_head); pos: (T,) or (B, T) absolute positions; `end` as in SinusoidalPositions."""
        if not is_compiling():
            need = _end(pos, end)
            if need > self.cos.size(0):
                self._build(max(need, 2 * self.cos.size(0)), self.cos.device)
        cos, sin = self.cos[pos], self.sin[pos]  # (T, d/2) or (B, T, d/2)
        if self.longrope:  # (past original_max_len: the long factors, for the whole row; on the device, no sync)
            past = (pos.amax(-1, keepdim=True) >= self.scaling.original_max_len)[..., None]
            cos, sin = torch.where(past, self.cos_long[pos], cos), torch.where(past, self.sin_long[pos], sin)
        if cos.dim() == 3:
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        half = self.d_rot // 2
        x1, x2 = x[..., :half], x[..., half : self.d_rot]
        turned = [x1 * cos - x2 * sin, x1 * sin + x2 * cos]
        return torch.cat(turned if self.d_rot == x.size(-1) else [*turned, x[..., self.d_rot :]], dim=-1)


def _end(pos: torch.Tensor, end: int | None) -> int:
    """The largest position + 1 (0 for none): `end` where the caller gave it, else a read from the device."""
    if end is not None:
        return end
    return int(pos.max()) + 1 if pos.numel() else 0
