"""Multi-head scaled dot-product attention (incremental decoding has its own arrangement: generate/step.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.linear import Linear
from tfcli.model.norm import RMSNorm


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,  head_i = softmax(Q_i K_i^T / sqrt(d_k) + mask) V_i.

    Heads are a batch axis: (B, T, d_model) -> (B, n_head, T, d_head). Self-attention uses one fused QKV projection;
    cross-attention projects queries from the decoder and keys/values (fused) from the encoder output.
    Grouped-query attention (Ainslie et al. 2023): `n_kv_head` key/value heads, each shared by n_head / n_kv_head
    consecutive query heads (query head i reads key/value head i // (n_head / n_kv_head)); the fused projections
    then stack [q; k; v] as n_head + n_kv_head + n_kv_head heads.
    The product itself is `F.scaled_dot_product_attention`, so fused/flash kernels run where available.
    """

    def __init__(self, d_model: int, n_head: int, attn_dropout: float = 0.0, bias: bool = True, cross: bool = False,
                 qk_norm_eps: float | None = None, n_kv_head: int | None = None, d_head: int | None = None,
                 qkv_bias: bool | None = None, scale: float | None = None, softcap: float | None = None):
        """`qk_norm_eps`: RMSNorm each head's q and k (a gain of d_head each) with this eps; None: no QK-norm.
        `n_kv_head`: key/value heads (None: n_head, plain multi-head attention). `d_head`: each head's width (None:
        d_model / n_head). `qkv_bias`: biases on the q, k, v projections (None: as `bias`, the output's). `scale`:
        what q.k is multiplied by (None: 1 / sqrt(d_head)); `softcap`: scores capped as cap * tanh(s / cap)."""
        super().__init__()
        n_kv_head = n_kv_head or n_head
        assert (d_head or d_model % n_head == 0) and n_head % n_kv_head == 0
        self.d_model, self.n_head, self.d_head = d_model, n_head, d_head or d_model // n_head
        self.d_q = n_head * self.d_head  # the queries' (and the attention output's) width
        self.n_kv_head, self.d_kv = n_kv_head, n_kv_head * self.d_head
        self.cross = cross
        self.attn_dropout = attn_dropout
        self.scale, self.softcap = scale if scale is not None else self.d_head**-0.5, softcap
        self.sdpa_scale = scale  # (None: SDPA's own 1 / sqrt(d_head), bit for bit what it computes by default)
        qkv_bias = bias if qkv_bias is None else qkv_bias
        if cross:
            self.q_proj = Linear(d_model, self.d_q, bias=qkv_bias)
            self.kv_proj = Linear(d_model, 2 * self.d_kv, bias=qkv_bias)
            self.fused_rows = (self.d_kv, self.d_kv)  # the projections the fused one stacks: [k; v]
        else:
            self.qkv_proj = Linear(d_model, self.d_q + 2 * self.d_kv, bias=qkv_bias)
            self.fused_rows = (self.d_q, self.d_kv, self.d_kv)  # [q; k; v]
        self.out_proj = Linear(self.d_q, d_model, bias=bias)
        self.q_norm = self.k_norm = None
        if qk_norm_eps is not None:
            self.q_norm, self.k_norm = RMSNorm(self.d_head, qk_norm_eps), RMSNorm(self.d_head, qk_norm_eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        return x.view(B, T, D // self.d_head, self.d_head).transpose(1, 2)

    def _share(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_kv_head, T, d_head) -> (B, n_head, T, d_head): each key/value head repeated for its query heads."""
        g = self.n_head // self.n_kv_head
        if g == 1:
            return x
        B, _, T, dh = x.shape
        return x[:, :, None].expand(B, self.n_kv_head, g, T, dh).reshape(B, self.n_head, T, dh)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        rope=None,
        pos: torch.Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x: (B, T, d_model). mask: bool, True = may attend, broadcastable to (B, n_head, T, T_k).

        Returns the output (B, T, d_model) and, if `need_weights`, the attention weights (B, n_head, T, T_k).
        """
        B, T, _ = x.shape
        if self.cross:
            q = self._heads(self.q_proj(x))
            k, v = (self._heads(t) for t in self.kv_proj(memory).split(self.fused_rows, dim=-1))
        else:
            q, k, v = (self._heads(t) for t in self.qkv_proj(x).split(self.fused_rows, dim=-1))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # self-attention only
            q, k = rope(q, pos), rope(k, pos)
        k, v = self._share(k), self._share(v)
        dropout_p = self.attn_dropout if self.training else 0.0
        weights = None
        # softmax(Q K^T / sqrt(d_head) + mask) V
        if self.softcap is not None:  # (no fused kernel caps the scores)
            weights = self._capped_weights(q, k, mask, is_causal)
            y = F.dropout(weights, dropout_p) @ v
        elif q.dtype == torch.bfloat16 and q.device.type == "cpu":
            # torch's CPU flash kernel is slower in bf16 than in fp32 at training sizes, backward included: the
            # product runs in fp32, the projections in bf16
            with torch.autocast("cpu", enabled=False):  # autocast would cast them back
                y = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                   dropout_p=dropout_p, is_causal=is_causal,
                                                   scale=self.sdpa_scale).to(q.dtype)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal,
                                               scale=self.sdpa_scale)
        if need_weights and self.softcap is None:
            # The weights from the very same kernel: with V = I, softmax(QK^T/sqrt(d) + mask) I is the weights.
            eye = torch.eye(k.size(2), dtype=q.dtype, device=q.device).expand(q.size(0), self.n_head, -1, -1)
            weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask, is_causal=is_causal,
                                                     scale=self.sdpa_scale)
        y = y.transpose(1, 2).reshape(B, T, self.d_q)
        return self.out_proj(y), weights if need_weights else None

    def _capped_weights(self, q, k, mask, is_causal: bool) -> torch.Tensor:
        """softmax(cap * tanh(Q K^T * scale / cap) + mask): the scores capped before the mask (Gemma 2)."""
        scores = (q @ k.transpose(-1, -2)) * self.scale
        scores = self.softcap * torch.tanh(scores / self.softcap)
        if is_causal:
            T, S = scores.shape[-2:]
            mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1)

    def cross_weights(self, x: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """softmax(Q K^T / sqrt(d_head) + mask) of a cross-attention, (B, n_head, T, S), without its product with V
        or the output projection: what word alignment reads."""
        assert self.cross
        q = self._heads(self.q_proj(x))
        k = self._heads(self.kv_proj(memory).split(self.fused_rows, dim=-1)[0])
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        scores = q.float() @ self._share(k).float().transpose(-1, -2) * self.scale
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1)

