"""Incremental decoding for search: an `EncoderDecoder`'s decoder run one position at a time over n sentences with
k beams each (k = 1 for greedy decoding, and at the first step of beam search).

It computes what `EncoderDecoder.decode` computes with a KV cache (tests check that), arranged for inference speed:
- Self-attention keys/values are written once, each beam's at a slot of its own (position s, beam j: slot s*K + j),
  and never copied when beams are reordered. A beam's history is a mask over the slots, (n, k, t*K): reordering
  beams gathers that small mask instead of copying every layer's (n*K, H, t, d_head) keys and values.
- The queries of a sentence's beams attend together: (n*H) products of k x d_head by d_head x t*K for the
  self-attention, and by the d_head x S source keys/values that the sentence holds once, instead of n*k*H products
  of a single query row.
- Linear layers packed for oneDNN on the CPU (runtime.pack_linear_weights) run with the ReLU/GELU and the residual
  addition fused into the layer before them.
- The key/value memory is allocated once per batch and reused by the next batch (`release`), not grown step by step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class IncrementalDecoder:
    """Decoder state for one batch of sentences. `step` feeds one token per beam and returns the next-token logits;
    `select` drops sentences and reorders beams between steps."""

    def __init__(self, model, memory: torch.Tensor, mem_mask: torch.Tensor, beam_size: int, max_steps: int):
        """memory: (n, S, d_model) encoder output; mem_mask: (n, 1, 1, S) True at real source tokens; `max_steps`:
        the most positions that will be decoded."""
        cfg = model.cfg
        self.model, self.decoder = model, model.decoder
        self.K, self.H, self.dh = beam_size, cfg.n_head, cfg.d_head
        self.scale = self.dh**-0.5
        self.layers = [_Layer(layer, cfg) for layer in self.decoder.layers]
        self.final_norm = _norm(self.decoder.norm)
        self.lm_head = _linear(model.lm_head)
        self.max_steps = max_steps
        n, S, _ = memory.shape
        device = memory.device
        self.n, self.k, self.t = n, 1, 0  # sentences, beams per sentence, positions so far
        # the source side, once per batch: per layer the cross-attention keys and values as (n*H, S, d_head)
        self.mem_kv = [
            tuple(
                kv.reshape(n, S, self.H, self.dh).transpose(1, 2).reshape(n * self.H, S, self.dh)
                for kv in layer.cross_attn.kv_proj(memory).chunk(2, dim=-1)
            )
            for layer in self.decoder.layers
        ]
        bias = torch.zeros(n, 1, S, device=device).masked_fill_(~mem_mask.view(n, 1, S), float("-inf"))
        self.mem_bias = bias.repeat_interleave(self.H, dim=0)  # (n*H, 1, S): -inf at source padding
        embed = self.decoder.embed
        steps = torch.arange(max_steps, device=device)
        no_positions = torch.zeros(max_steps, cfg.d_model, device=device)
        self.positions = embed.pos(steps) if embed.pos is not None else no_positions
        # the slots of one position, seen by the k beams that write it: beam j sees slot j (k = 1 or K)
        own = torch.full((beam_size, beam_size), float("-inf"), device=device).fill_diagonal_(0.0)
        self.own = {1: own[:1], beam_size: own}
        self.history = memory.new_zeros(n, 1, 0)  # (n, k, t*K): 0 at the slots beam j descends from, -inf elsewhere
        # per layer (n, H, max_steps*K, 2*d_head): slot s*K + j, key | value; carved out of one allocation that the
        # model keeps for the next batch (fresh memory would page-fault on first use: a large share of a step on the
        # CPU), in the model's dtype (under autocast, writes are cast to it)
        shape = (n, self.H, max_steps * beam_size, 2 * self.dh)
        size = shape[0] * shape[1] * shape[2] * shape[3]
        n_layers = len(self.layers)
        weight = embed.tok.weight
        self._workspace: torch.Tensor | None = _take_workspace(model, n_layers * size, weight.dtype, weight.device)
        self.kv = list(self._workspace[: n_layers * size].view(n_layers, *shape).unbind(0))
        for kv in self.kv:  # unused slots are masked out, but must hold numbers (0 * NaN would still be NaN)
            kv[:, :, :beam_size].zero_()

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok: (n*k,) the last token of each beam (sentence-major); returns logits (n*k, V) for the next one."""
        n, k, K, H, dh, t = self.n, self.k, self.K, self.H, self.dh, self.t
        if t == self.max_steps:
            raise RuntimeError(f"decoded past the {self.max_steps} positions this decoder was made for")
        embed = self.decoder.embed
        x = torch.add(self.positions[t], embed.tok(tok), alpha=embed.scale)
        # this position's slots: beam j writes slot t*K + j and sees it (and, through `history`, its ancestors')
        self.history = torch.cat([self.history, self.own[k].expand(n, k, K)], dim=2)
        L = (t + 1) * K
        self_bias = self.history[:, None].expand(n, H, k, L).reshape(n * H, k, L)
        for layer, kv, (mem_k, mem_v) in zip(self.layers, self.kv, self.mem_kv):
            # self-attention: softmax(q K^T / sqrt(d_head) + history) V over this sentence's slots
            qkv = layer.qkv(layer.norm_self_in(x)).view(n, k, 3, H, dh)
            kv.view(n, H, -1, 2, dh)[:, :, t * K : t * K + k] = qkv[:, :, 1:].permute(0, 3, 1, 2, 4)
            keys = kv[:, :, :L, :dh].reshape(n * H, L, dh)
            values = kv[:, :, :L, dh:].reshape(n * H, L, dh)
            x = layer.norm_self_out(layer.self_out(self._attend(qkv[:, :, 0], keys, values, self_bias), x))
            # cross-attention to the source
            q = layer.cross_q(layer.norm_cross_in(x)).view(n, k, H, dh)
            x = layer.norm_cross_out(layer.cross_out(self._attend(q, mem_k, mem_v, self.mem_bias), x))
            # position-wise FFN
            x = layer.norm_ffn_out(layer.w2(layer.w1(layer.norm_ffn_in(x)), x))
        self.t += 1
        return self.lm_head(self.final_norm(x))

    def _attend(self, q, keys, values, bias) -> torch.Tensor:
        """q: (n, k, H, d_head); keys/values (n*H, L, d_head); bias broadcastable to (n*H, k, L). -> (n*k, d_model)"""
        n, k, H, dh = q.shape
        q = q.transpose(1, 2).reshape(n * H, k, dh)
        scores = torch.baddbmm(bias, q, keys.transpose(1, 2), alpha=self.scale)
        y = torch.bmm(scores.softmax(-1), values)
        return y.view(n, H, k, dh).transpose(1, 2).reshape(n * k, H * dh)

    def release(self) -> None:
        """Hand the key/value memory back to the model for the next batch (until `free_memory(model)`)."""
        if self._workspace is not None:
            _return_workspace(self.model, self._workspace)
            self._workspace = None
        self.kv = []

    def select(self, keep: torch.Tensor | None, parent: torch.Tensor | None = None) -> None:
        """Before the next step: keep the sentences `keep` (indices, or None for all), then let beam j of each
        sentence continue beam parent[s, j] of the same sentence ((n_kept, K') indices; None: beam j continues
        beam j)."""
        if keep is not None:
            n_old = self.n
            self.n = keep.numel()
            self.history = self.history.index_select(0, keep)
            self.kv = [b.index_select(0, keep) for b in self.kv]
            self.mem_kv = [tuple(_rows(m, n_old, keep) for m in kv) for kv in self.mem_kv]
            self.mem_bias = _rows(self.mem_bias, n_old, keep)
        if parent is not None:
            self.history = self.history.gather(1, parent[:, :, None].expand(-1, -1, self.history.size(2)))
            self.k = parent.size(1)


def free_memory(model) -> None:
    """Drop the key/value memory that the model keeps for its next batch (training does after its validation BLEU,
    so the memory is not held while training goes on)."""
    model.__dict__.pop("_decode_workspace", None)


def _take_workspace(model, numel: int, dtype, device) -> torch.Tensor:
    """A flat tensor of at least `numel` elements: the one the model's last decoder released, if it fits."""
    ws = model.__dict__.pop("_decode_workspace", None)
    if ws is None or ws.numel() < numel or ws.dtype != dtype or ws.device != device:
        ws = torch.empty(numel, dtype=dtype, device=device)
    return ws


def _return_workspace(model, ws: torch.Tensor) -> None:
    old = model.__dict__.get("_decode_workspace")
    if old is None or old.numel() < ws.numel():
        model.__dict__["_decode_workspace"] = ws


def _rows(x: torch.Tensor, n: int, keep: torch.Tensor) -> torch.Tensor:
    """Keep sentences `keep` of a (n*H, ...) tensor."""
    return x.view(n, -1, *x.shape[1:]).index_select(0, keep).flatten(0, 1)


class _Layer:
    """One decoder layer as the functions a step calls: LayerNorms where the norm placement puts them (identity
    elsewhere), and linear layers with the activation or the residual addition fused in."""

    def __init__(self, layer, cfg):
        pre = cfg.norm == "pre"
        norms = {name: _norm(getattr(layer, name).norm) for name in ("res_self", "res_cross", "res_ffn")}
        same = _identity
        # pre-norm: x + f(LN(x)); post-norm: LN(x + f(x))
        self.norm_self_in, self.norm_self_out = (norms["res_self"], same) if pre else (same, norms["res_self"])
        self.norm_cross_in, self.norm_cross_out = (norms["res_cross"], same) if pre else (same, norms["res_cross"])
        self.norm_ffn_in, self.norm_ffn_out = (norms["res_ffn"], same) if pre else (same, norms["res_ffn"])
        self.qkv = _linear(layer.self_attn.qkv_proj)
        self.self_out = _linear(layer.self_attn.out_proj, residual=True)
        self.cross_q = _linear(layer.cross_attn.q_proj)
        self.cross_out = _linear(layer.cross_attn.out_proj, residual=True)
        self.w1 = _linear(layer.ffn.w1, act=cfg.activation)
        self.w2 = _linear(layer.ffn.w2, residual=True)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _norm(module: nn.Module):
    if not isinstance(module, nn.LayerNorm):
        return _identity
    shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
    return lambda x: torch.layer_norm(x, shape, weight, bias, eps)


def _linear(module: nn.Linear, act: str | None = None, residual: bool = False):
    """x -> act(x W^T + b), or with `residual` (x, r) -> x W^T + b + r, for 2-d x. Where the weights are packed for
    oneDNN (runtime.pack_linear_weights), one fused call."""
    packed = getattr(module, "packed", None)
    if packed is not None:
        weight, bias = packed
        if residual:
            binary = torch.ops.mkldnn._linear_pointwise.binary
            return lambda x, r: binary(x, r, weight, bias, "add")
        linear = torch.ops.mkldnn._linear_pointwise.default
        attr, algorithm = (act, "none") if act else ("none", "")
        return lambda x: linear(x, weight, bias, attr, [], algorithm)
    if residual:
        return lambda x, r: module(x) + r
    if act is not None:
        f = F.relu if act == "relu" else F.gelu
        return lambda x: f(module(x))
    return module
