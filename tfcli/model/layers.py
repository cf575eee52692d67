"""Transformer blocks: residual sublayers with LayerNorm or RMSNorm (pre- or post-norm) and the position-wise FFN."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.attention import MultiHeadAttention
from tfcli.model.config import ModelConfig
from tfcli.model.dropout import Dropout
from tfcli.model.linear import Linear
from tfcli.model.norm import norm_layer


ACTIVATIONS = {
    "relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu2": lambda x: F.relu(x).square(), "silu": F.silu,
}
GATED = {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}  # a gated FFN's activation -> the one applied to its gate, w1 x


def gate_activation(activation: str) -> str:
    """The key of ACTIVATIONS that w1's output goes through (`activation` itself unless it names a gated FFN)."""
    return GATED.get(activation, activation)


@dataclass(frozen=True)
class Sublayers:
    """One layer's weights in the order its forward applies them: what code that runs a layer its own way (the
    incremental decoder, tfcli.generate.step) reads, instead of the modules' attribute names.

    With N(x) = LN(x) before each sublayer under pre-norm (`pre_norm`), LN after its residual sum under post-norm:
        self-attention:   [q; k; v] = qkv(N(x));                        x = x + self_out(attention(q, k, v))
        cross-attention:  q = cross_q(N(x)), [k; v] = cross_kv(memory);   x = x + cross_out(attention(q, k, v))
        feed-forward:     x = x + w2(act(w1(N(x))))                      (act: `activation`, a key of ACTIVATIONS)
                          x = x + w2(act(w1(N(x))) * w3(N(x)))           (gated: act = gate_activation(activation))
    with the norms self_norm, cross_norm, ffn_norm (LayerNorm or RMSNorm), and under sandwich norms (`pre_norm`
    too) x = x + self_post_norm(self_out(...)), and so on. An encoder layer (and a language
    model's) has no cross_*; only a gated FFN has w3; with QK-norm, q = q_norm(q) and k = k_norm(k) per head
    (cross_q_norm, cross_k_norm in the cross-attention) before RoPE and the product. With grouped-query attention
    (n_kv_head key/value heads) qkv's output is [q; k; v] of n_head * d_head, n_kv_head * d_head, n_kv_head * d_head, and
    cross_kv's [k; v] of n_kv_head * d_head each."""

    pre_norm: bool
    activation: str
    self_norm: nn.Module
    qkv: nn.Linear
    self_out: nn.Linear
    ffn_norm: nn.Module
    w1: nn.Linear
    w2: nn.Linear
    cross_norm: nn.Module | None = None
    cross_q: nn.Linear | None = None
    cross_kv: nn.Linear | None = None
    cross_out: nn.Linear | None = None
    w3: nn.Linear | None = None
    q_norm: nn.Module | None = None  # QK-norm (`qk_norm`): on each head's q and k, before RoPE
    k_norm: nn.Module | None = None
    cross_q_norm: nn.Module | None = None
    cross_k_norm: nn.Module | None = None
    # sandwich norms (`norm: sandwich`): on a sublayer's output before its residual addition, x = x + N'(f(N(x)))
    self_post_norm: nn.Module | None = None
    cross_post_norm: nn.Module | None = None
    ffn_post_norm: nn.Module | None = None
    window: int | None = None  # sliding-window attention: the positions a token sees (itself included); None: all
    local_rope: bool = False  # the self-attention's RoPE is the Stack's `rope_local` (the sliding layers' base)


def _attention(cfg: ModelConfig, cross: bool = False) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.d_model, cfg.n_head, cfg.attn_dropout, cfg.bias, cross=cross,
                              qk_norm_eps=cfg.layer_norm_eps if cfg.qk_norm else None, n_kv_head=cfg.n_kv_head,
                              d_head=cfg.d_head, qkv_bias=cfg.attn_qkv_bias, scale=cfg.attn_scale,
                              softcap=cfg.attn_softcap)


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, or gated (swiglu, geglu) (act(x W_1 + b_1) * (x W_3 + b_3)) W_2 + b_2,
    applied to each position alone."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.w2 = Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.w3 = Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.activation in GATED else None
        self.act = ACTIVATIONS[gate_activation(cfg.activation)]
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.w1(x))
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(self.dropout(h))


class Residual(nn.Module):
    """A sublayer wrapped with dropout, the residual connection and the norm (LN: LayerNorm or RMSNorm).

    post-norm (2017 paper): LN(x + Dropout(f(x)));  pre-norm (modern default): x + Dropout(f(LN(x)));
    sandwich: x + Dropout(LN'(f(LN(x)))).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre = cfg.norm in ("pre", "sandwich")
        self.norm = norm_layer(cfg)
        self.post_norm = norm_layer(cfg) if cfg.norm == "sandwich" else None
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, f) -> torch.Tensor:
        if self.post_norm is not None:
            return x + self.dropout(self.post_norm(f(self.norm(x))))
        if self.pre:
            return x + self.dropout(f(self.norm(x)))
        return self.norm(x + self.dropout(f(x)))


class EncoderLayer(nn.Module):
    """Bidirectional self-attention, then FFN."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.self_attn = _attention(cfg)
        self.ffn = FeedForward(cfg)
        self.res_attn, self.res_ffn = Residual(cfg), Residual(cfg)

    def sublayers(self) -> Sublayers:
        return Sublayers(
            self.res_attn.pre, self.cfg.activation, self.res_attn.norm, self.self_attn.qkv_proj,
            self.self_attn.out_proj, self.res_ffn.norm, self.ffn.w1, self.ffn.w2, w3=self.ffn.w3,
            q_norm=self.self_attn.q_norm, k_norm=self.self_attn.k_norm, self_post_norm=self.res_attn.post_norm,
            ffn_post_norm=self.res_ffn.post_norm,
        )

    def forward(self, x, mask, attn_out: list | None = None):
        def attn(h):
            y, w = self.self_attn(h, mask=mask, need_weights=attn_out is not None)
            if attn_out is not None:
                attn_out.append(w)
            return y

        x = self.res_attn(x, attn)
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output (encoder-decoder only), then FFN."""

    def __init__(self, cfg: ModelConfig, cross: bool, window: int | None = None, local_rope: bool = False):
        """`window`: sliding-window self-attention over that many positions; `local_rope`: its RoPE is the
        decoder's local one (cfg.rope_local_theta)."""
        super().__init__()
        self.window, self.local_rope = window, local_rope
        self.self_attn = _attention(cfg)
        self.cross_attn = _attention(cfg, cross=True) if cross else None
        self.ffn = FeedForward(cfg)
        self.cfg = cfg
        self.res_self = Residual(cfg)
        self.res_cross = Residual(cfg) if cross else None
        self.res_ffn = Residual(cfg)

    def sublayers(self) -> Sublayers:
        cross = self.cross_attn
        return Sublayers(
            self.res_self.pre, self.cfg.activation, self.res_self.norm, self.self_attn.qkv_proj,
            self.self_attn.out_proj, self.res_ffn.norm, self.ffn.w1, self.ffn.w2,
            *((self.res_cross.norm, cross.q_proj, cross.kv_proj, cross.out_proj) if cross is not None else ()),
            w3=self.ffn.w3, q_norm=self.self_attn.q_norm, k_norm=self.self_attn.k_norm,
            cross_q_norm=cross.q_norm if cross is not None else None,
            cross_k_norm=cross.k_norm if cross is not None else None,
            self_post_norm=self.res_self.post_norm,
            cross_post_norm=self.res_cross.post_norm if cross is not None else None,
            ffn_post_norm=self.res_ffn.post_norm, window=self.window, local_rope=self.local_rope,
        )

    def forward(
        self,
        x,
        self_mask=None,
        is_causal=False,
        memory=None,
        memory_mask=None,
        rope=None,
        pos=None,
        attn_out: dict | None = None,
    ):
        want = attn_out is not None

        def self_attn(h):
            y, w = self.self_attn(
                h, mask=self_mask, is_causal=is_causal, rope=rope, pos=pos, need_weights=want
            )
            if want:
                attn_out["self"].append(w)
            return y

        x = self.res_self(x, self_attn)
        if self.cross_attn is not None:

            def cross_attn(h):
                y, w = self.cross_attn(h, memory=memory, mask=memory_mask, need_weights=want)
                if want:
                    attn_out["cross"].append(w)
                return y

            x = self.res_cross(x, cross_attn)
        return self.res_ffn(x, self.ffn)

    def self_weights(self, x, self_mask=None, is_causal=False, rope=None, pos=None) -> torch.Tensor:
        """The self-attention weights (B, n_head, T, T) this layer computes on x (forward's, without the rest)."""
        h = self.res_self.norm(x) if self.res_self.pre else x
        return self.self_attn(h, mask=self_mask, is_causal=is_causal, rope=rope, pos=pos, need_weights=True)[1]

    def cross_weights(self, x, memory, memory_mask, rope=None, pos=None) -> torch.Tensor:
        """The cross-attention weights (B, n_head, T, S) this layer computes on x: its causal self-attention, then
        only the weights of its cross-attention (MultiHeadAttention.cross_weights)."""
        x = self.res_self(x, lambda h: self.self_attn(h, is_causal=True, rope=rope, pos=pos)[0])
        return self.cross_attn.cross_weights(self.res_cross.norm(x) if self.res_cross.pre else x, memory, memory_mask)
