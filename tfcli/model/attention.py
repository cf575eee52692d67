"""Multi-head scaled dot-product attention with a key/value cache for incremental decoding."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class KVCache:
    """Keys and values of the positions seen so far, each (B, n_head, T, d_head).

    Self-attention appends one step at a time; cross-attention fills it once from the encoder output and reuses it.
    `select` keeps rows (beam reordering, dropping finished sentences). It is applied lazily: the next `append`
    gathers the kept rows straight into the grown tensor, one copy instead of two per decoding step.
    """

    def __init__(self):
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None  # a pending `select`

    @property
    def k(self) -> torch.Tensor | None:
        self._apply_select()
        return self._k

    @property
    def v(self) -> torch.Tensor | None:
        self._apply_select()
        return self._v

    def __len__(self) -> int:
        return 0 if self._k is None else self._k.size(2)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._k is None:
            self._k, self._v = k, v
        elif self._rows is not None:
            self._k, self._v = _select_cat(self._k, self._rows, k), _select_cat(self._v, self._rows, v)
            self._rows = None
        else:
            self._k = torch.cat([self._k, k], dim=2)
            self._v = torch.cat([self._v, v], dim=2)
        return self._k, self._v

    def select(self, idx: torch.Tensor) -> None:
        if self._k is not None:
            self._rows = idx if self._rows is None else self._rows[idx]

    def _apply_select(self) -> None:
        if self._rows is not None:
            self._k, self._v = self._k.index_select(0, self._rows), self._v.index_select(0, self._rows)
            self._rows = None


def _select_cat(old: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """torch.cat([old[rows], new], dim=2) with a single copy of `old`."""
    T = old.size(2)
    out = old.new_empty(new.size(0), old.size(1), T + new.size(2), old.size(3))
    torch.index_select(old, 0, rows, out=out[:, :, :T])
    out[:, :, T:] = new
    return out


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,  head_i = softmax(Q_i K_i^T / sqrt(d_k) + mask) V_i.

    Heads are a batch axis: (B, T, d_model) -> (B, n_head, T, d_head). Self-attention uses one fused QKV projection;
    cross-attention projects queries from the decoder and keys/values (fused) from the encoder output.
    The product itself is `F.scaled_dot_product_attention`, so fused/flash kernels run where available.
    """

    def __init__(self, d_model: int, n_head: int, attn_dropout: float = 0.0, bias: bool = True, cross: bool = False):
        super().__init__()
        assert d_model % n_head == 0
        self.d_model, self.n_head, self.d_head = d_model, n_head, d_model // n_head
        self.cross = cross
        self.attn_dropout = attn_dropout
        if cross:
            self.q_proj = nn.Linear(d_model, d_model, bias=bias)
            self.kv_proj = nn.Linear(d_model, 2 * d_model, bias=bias)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, self.d_head).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: KVCache | None = None,
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
            if cache is not None and cache.k is not None:
                k, v = cache.k, cache.v  # encoder keys/values, computed once per batch
            else:
                k, v = (self._heads(t) for t in self.kv_proj(memory).chunk(2, dim=-1))
                if cache is not None:  # contiguous once, so the attention of every later step reads them directly
                    k, v = cache.append(k.contiguous(), v.contiguous())
        else:
            q, k, v = (self._heads(t) for t in self.qkv_proj(x).split(self.d_model, dim=-1))
            if rope is not None:
                q, k = rope(q, pos), rope(k, pos)
            if cache is not None:
                k, v = cache.append(k, v)
        dropout_p = self.attn_dropout if self.training else 0.0
        weights = None
        if T == 1 and not need_weights and dropout_p == 0.0:
            y = _attend_few_queries(q, k, v, mask)  # an incremental decoding step
        else:
            # softmax(Q K^T / sqrt(d_head) + mask) V
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
            if need_weights:
                # The weights from the very same kernel: with V = I, softmax(QK^T/sqrt(d) + mask) I is the weights.
                eye = torch.eye(k.size(2), dtype=q.dtype, device=q.device).expand(q.size(0), self.n_head, -1, -1)
                weights = F.scaled_dot_product_attention(q, k, eye, attn_mask=mask, is_causal=is_causal)
        y = y.transpose(1, 2).reshape(B, T, self.d_model)
        return self.out_proj(y), weights


def _attend_few_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_head) + mask) V with plain batched matmuls. For the one new query per row of a decoding
    step this is several times faster on CPUs than the fused SDPA kernels, which are tiled for long query blocks."""
    scores = (q @ k.transpose(-2, -1)) * (q.size(-1) ** -0.5)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v
