"""Incremental decoding: the one path by which translate (greedy and beam search), lm-generate and the attention
pictures' generated text run a model's decoder one position at a time. Tests check it against the model's full
forward (`EncoderDecoder.forward`, `DecoderOnlyLM.forward`), which training uses.

`StepModel(model)` arranges a loaded model's decoder for stepping, once per model; `StepModel.start` begins one
batch (`IncrementalDecoder`): n sentences (or prompts) with k beams each (k = 1 for greedy decoding, sampling, and
the first step of beam search). Arranged for inference speed:
- Self-attention keys/values are written once, each beam's at a slot of its own (position s, beam j: slot s*K + j),
  and never copied when beams are reordered. A beam's history is a mask over the slots, (n, k, t*K): reordering
  beams gathers that small mask instead of copying every layer's (n*K, H, t, d_head) keys and values.
- The queries of a sentence's beams attend together: (n*H) products of k x d_head by d_head x t*K for the
  self-attention, and by the d_head x S source keys/values that the sentence holds once, instead of n*k*H products
  of a single query row. With grouped-query attention (H query heads, H_kv key/value heads, g = H / H_kv) the g
  query heads that share a key/value head attend together too: (n*H_kv) products of g*k x d_head, and the memory
  holds H_kv heads.
- With `pack=True` on the CPU in fp32, linear layers use weights pre-packed for oneDNN, held here beside the
  model's own (which stay as they are), and run with the ReLU/GELU and the residual addition fused into the layer
  before them. Where torch lacks those private ops, plain `F.linear` does the same work. The decoder's layers and
  the output layer, which a step calls with few rows, run instead on a small C kernel where it is built
  (`tfcli.generate.native.RowLinear`, AVX-512 or AVX2: a fifth to a half of oneDNN's time a call on few rows, about
  as long on many); the encoder stays on oneDNN.
- On the CPU in fp32 the attention (a step's, to itself and to the source, and the encoder's) is one C call a layer
  for all rows and heads where it is built (`tfcli.generate.native.attention_kernel`), instead of seven small torch
  operators; its sums run in an order that no batch's shape changes, so a sentence's encoder output and logits are
  the same alone and in any batch. Where every layer runs on those kernels (LayerNorm, a ReLU, ReLU^2, GELU or SiLU
  FFN, no RoPE), a step's layers are one C call (`tfcli.generate.native.layers_kernel`: the same kernels in the
  same order, without the hundred-odd Python-level operators around them).
- With `int8=True` (CPU), every linear layer of the encoder and the decoder and the output projection run in int8:
  weights quantised once, one scale per output row; activations at each call, one scale per row
  (tfcli.generate.int8), so that a row's result never depends on the other rows.
- The key/value memory is allocated once per batch and reused by the next batch (`release`), not grown step by step.
- On CUDA, a batch decodes through `StaticDecoder`: the same interface and arithmetic with shapes fixed for the
  batch, so that its step is captured once as a CUDA graph and replayed.
Which of these run for a model is decided once, from its config, device, dtype and shape mode, by
`tfcli.generate.backend.choose` (its table says which config values each implements); this module builds what the
plan names.

Language-model prompts of different lengths are left-padded: `prefill` runs them in one pass, each row numbering
its positions from its first real token, and nobody attends to the padding.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.checkpoint import paged, rows_reader
from tfcli.generate import backend, native
from tfcli.generate.int8 import Int8Linear
from tfcli.generate.stored import StoredWeights
from tfcli.generate.schedule import StepGraph
from tfcli.model.layers import ACTIVATIONS, Sublayers, gate_activation
from tfcli.model.norm import RMSNorm
from tfcli.model.transformer import softcap
from tfcli.torch_compat import cpu_autocast_dtype

# oneDNN's fused linear + activation: (attr, algorithm)
# the activations oneDNN applies in the linear layer's call; not ReLU, whose post-op turns NaN into 0 (F.relu keeps
# it: a model whose weights hold NaN must compute NaN, and decoding then says so, tfcli.errors.NotANumber)
_ONEDNN_ACTIVATIONS = {None: ("none", ""), "gelu": ("gelu", "none"), "gelu_tanh": ("gelu", "tanh")}


class StepModel:
    """A model's decoder as the functions an incremental step calls (built from the weights as they are now), and
    the key/value memory it reuses from batch to batch."""

    def __init__(self, model: nn.Module, pack: bool = False, int8: bool = False, static: bool | None = None,
                 allow: tuple[str, ...] = backend.BACKENDS, stored: StoredWeights | None = None):
        """`pack`: pre-pack the linear weights for oneDNN and run the decoder on rows.c's kernels (fp32 on the CPU
        only; elsewhere, or where torch lacks the ops, it is ignored). `int8`: run the linear layers in int8 (CPU;
        see `tfcli.device.int8_available`). `static`: batches step through a `StaticDecoder` (fixed shapes, on
        CUDA replayed as a CUDA graph); None: on CUDA only. `allow`: the backends that may run; which do is
        `tfcli.generate.backend.choose`'s decision (`self.plan`). `stored` (tfcli.generate.stored): where the
        linear layers read their weights already in the layout they run on (int8, or fp32 on the row kernel), and
        put those they make; a store of the other dtype is not read."""
        self.model, self.cfg = model, model.cfg
        parts = model.parts()  # the interface the model documents (tfcli.model.transformer.Parts)
        weight = parts.lm_head.weight
        # weights already in bf16/fp16 (a GPU's decoding copy, tfcli.generate.loader): run without autocast
        self.half = weight.dtype in (torch.bfloat16, torch.float16)
        self.plan = plan = backend.choose(model.cfg, weight.device, weight.dtype, pack, int8, static, allow)
        self.static = plan.static
        if stored is not None and {"int8": "int8", "rows": "fp32"}.get(plan.linear) != stored.dtype:
            stored = None
        # (weights read from a store that holds them, `tfcli quantize`'s file: not made now)
        self.stored = stored is not None and bool(stored.tensors)
        self.attend_rows = native.attention_kernel() if plan.attention == "c" else None
        decoder = parts.decoder
        self.embed, self.rope, self.rope_local = decoder.embed, decoder.rope, decoder.rope_local
        self.tok = rows_reader(decoder.embed.tok.weight)  # (lookups that map none of a checkpoint file's pages)
        self.layers = [_Layer(layer, plan.linear, stored) for layer in decoder.layers]
        self.final_norm = _norm(decoder.norm)
        head, self.logits_bias = parts.lm_head, None
        if self.cfg.final_softcap is not None and head.bias is not None:  # (the cap before the bias, as the model)
            head, self.logits_bias, stored_head = _WeightOnly(head.weight), head.bias.detach(), None
        else:
            stored_head = stored
        self.lm_head = _linear(head, plan.linear, store=stored_head)
        self.layer_args, self.decode_layers = None, None  # rows.c's decode_layers: every layer in one call
        if plan.whole:
            args = [layer.kernel_args() for layer in self.layers]
            self.layer_args, self.decode_layers = (native.LayerArgs * len(args))(*args), native.layers_kernel()
            cfg = self.cfg  # the call's scratch a row: rows.c's layers_run
            self.work_per_row = 4 * cfg.d_model + 2 * cfg.kv_heads * cfg.d_head + cfg.d_ff
        self.encoder = parts.encoder
        self.encoder_layers = None  # the model's own encoder
        if self.encoder is not None and plan.encoder != "model":
            self.encoder_layers = [_Layer(layer, plan.encoder, stored) for layer in self.encoder.layers]
            table = self.encoder.embed.tok.weight
            self.src_tok = self.tok if table is decoder.embed.tok.weight else rows_reader(table)
            self.encoder_norm = _norm(self.encoder.norm)
        self._workspace: torch.Tensor | None = None

    def c_attention(self) -> bool:
        """Whether attention runs on rows.c's attend_rows now: built, and fp32 activations (no CPU autocast)."""
        return self.attend_rows is not None and cpu_autocast_dtype() is None

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder output (n, S, d_model) and the source mask (n, 1, 1, S), True at real tokens: the model's
        own `encode`, or with packed or int8 weights the same layers through this model's linear layers."""
        if self.encoder_layers is None:
            return self.model.encode(src)
        mask = self.model.src_mask(src)
        n, S = src.shape
        H, H_kv, dh = self.cfg.n_head, self.cfg.kv_heads, self.cfg.d_head
        D = H * dh  # the queries' width
        x = self.encoder.embed(src, torch.arange(S, device=src.device), S, self.src_tok(src)).reshape(n * S, -1)
        real = _real_rows(mask)  # the rows the linear layers and norms run on: the real tokens'
        if real is not None:
            x = x[real]
        c = self.c_attention()
        if c:  # (n, S): 0 at real tokens, -inf at padding
            bias = torch.zeros(n, S).masked_fill_(~mask.view(n, S), float("-inf"))
        for layer in self.encoder_layers:
            qkv = _padded(layer.qkv(layer.norm_self_in(x)), real, n * S)
            if c:  # each row's queries against its keys, its padding masked, whatever the batch's width
                q = layer.q_norm(qkv[:, :D].view(n, S, H, dh))
                k, v = qkv[:, D:].view(n, S, 2, H_kv, dh).unbind(2)
                k = layer.k_norm(k)
                y = _attend_rows(self.attend_rows, q, k, (k.stride(0), k.stride(2), k.stride(1), 1), v,
                                 (v.stride(0), v.stride(2), v.stride(1)), bias, (S, 0, 0), H_kv, S, dh**-0.5)
            else:
                # softmax(Q K^T / sqrt(d_head) + mask) V, all heads at once: q (n, H_kv, g*S, d_head), the g query
                # heads of each key/value head stacked; k, v (n, H_kv, S, d_head)
                q = layer.q_norm(qkv[:, :D].view(n, S, H, dh)).transpose(1, 2).reshape(n, H_kv, -1, dh)
                k, v = qkv[:, D:].view(n, S, 2, H_kv, dh).permute(2, 0, 3, 1, 4)
                y = F.scaled_dot_product_attention(q, layer.k_norm(k), v, attn_mask=mask)
                y = y.view(n, H, S, dh).transpose(1, 2).reshape(n * S, D)
            x = layer.norm_self_out(layer.self_out(y if real is None else y[real], x))
            x = layer.norm_ffn_out(layer.w2(layer.ffn_hidden(layer.norm_ffn_in(x)), x))
        return _padded(self.encoder_norm(x), real, n * S).view(n, S, -1), mask

    def start(
        self, n: int, beam_size: int, max_steps: int, memory: torch.Tensor | None = None,
        mem_mask: torch.Tensor | None = None,
    ) -> "IncrementalDecoder":
        """A decoder for n rows of `beam_size` beams and at most `max_steps` positions; `memory` (n, S, d_model)
        and `mem_mask` (n, 1, 1, S), True at real source tokens, for an encoder-decoder."""
        if self.static:
            return StaticDecoder(self, n, beam_size, max_steps, memory, mem_mask)
        return IncrementalDecoder(self, n, beam_size, max_steps, memory, mem_mask)

    def free_memory(self) -> None:
        """Drop the key/value memory kept for the next batch."""
        self._workspace = None

    def _take_workspace(self, numel: int, dtype, device) -> torch.Tensor:
        """A flat tensor of at least `numel` elements: the one the last decoder released, if it fits (fresh memory
        would page-fault on first use: a large share of a step on the CPU)."""
        ws, self._workspace = self._workspace, None
        if ws is None or ws.numel() < numel or ws.dtype != dtype or ws.device != device:
            ws = torch.empty(numel, dtype=dtype, device=device)
        return ws

    def _return_workspace(self, ws: torch.Tensor) -> None:
        if self._workspace is None or self._workspace.numel() < ws.numel():
            self._workspace = ws


def step_model(model) -> StepModel:
    """`model` itself if it is a StepModel (or serves as one: an ensemble), else a plain (unpacked) one over it."""
    return model if hasattr(model, "start") else StepModel(model)


class IncrementalDecoder:
    """Decoder state for one batch. `step` feeds one token per beam and returns the next-token logits; `prefill`
    feeds whole prompts (one beam); `select` drops rows and reorders beams between steps."""

    def __init__(self, sm: StepModel, n: int, beam_size: int, max_steps: int, memory, mem_mask):
        cfg = sm.cfg
        self.sm = sm
        self.K, self.H, self.dh = beam_size, cfg.n_head, cfg.d_head
        self.H_kv = cfg.kv_heads  # key/value heads, each shared by g = H / H_kv query heads
        self.scale, self.softcap = cfg.q_scale, cfg.attn_softcap
        self.max_steps = max_steps
        self.n, self.k, self.t = n, 1, 0  # rows, beams per row, positions so far
        weight = sm.embed.tok.weight
        device, dtype = weight.device, weight.dtype  # dtype: fp32, or a GPU's bf16/fp16 decoding copy
        n_layers = len(sm.layers)
        self.mem_kv: list | None = None
        self.mem_all: tuple[torch.Tensor, torch.Tensor] | None = None
        if memory is not None:
            # the source side, once per batch: per layer the cross-attention keys, transposed, (n*H_kv, d_head, S),
            # and values (n*H_kv, S, d_head), all layers' in two tensors (rows leave all layers in one copy)
            S, real = memory.size(1), _real_rows(mem_mask)
            self.mem_all = (memory.new_empty(n_layers, n, self.H_kv, self.dh, S, dtype=dtype),
                            memory.new_empty(n_layers, n, self.H_kv, S, self.dh, dtype=dtype))
            for layer, kt, v in zip(sm.layers, *self.mem_all):
                self._cross_kv(layer, memory, real, kt.flatten(0, 1), v.flatten(0, 1))
            self.mem_bias = self._source_bias(mem_mask, dtype)  # (n*H_kv, 1, S): -inf at source padding
        embed = sm.embed
        self.steps = torch.arange(max_steps, device=device)
        # RoPE: positions enter in attention
        no_positions = torch.zeros(max_steps, cfg.d_model, device=device, dtype=dtype)
        self.positions = embed.pos(self.steps, max_steps) if embed.pos is not None else no_positions
        self.pad: torch.Tensor | None = None  # (n,) left padding of each row (prefill), None: none anywhere
        # the slots of one position, seen by the k beams that write it: beam j sees slot j (k = 1 or K)
        own = torch.full((beam_size, beam_size), float("-inf"), device=device, dtype=dtype).fill_diagonal_(0.0)
        self.own = {1: own[:1], beam_size: own}
        # (n, k, t*K): 0 at the slots beam j descends from
        self.history = torch.zeros(n, 1, 0, device=device, dtype=dtype)
        # per layer (n, H_kv, max_steps*K, 2*d_head): slot s*K + j, key | value; carved out of one allocation, in
        # the model's dtype (under autocast, writes are cast to it)
        shape = (n, self.H_kv, max_steps * beam_size, 2 * self.dh)
        size = shape[0] * shape[1] * shape[2] * shape[3]
        self._workspace: torch.Tensor | None = sm._take_workspace(n_layers * size, weight.dtype, device)
        self.kv_all = self._workspace[: n_layers * size].view(n_layers, *shape)
        # unused slots are masked out, but must hold numbers (0 * NaN would still be NaN)
        self.kv_all[:, :, :, :beam_size].zero_()
        self._views()
        # rows.c's decode_layers: the model's layer descriptions, with this batch's memory filled in (rows leave in
        # place: the addresses hold for the batch)
        self.layer_args = None if sm.layer_args is None else type(sm.layer_args).from_buffer_copy(sm.layer_args)
        if self.layer_args is not None:  # (each row at the stride of the batch's first shape)
            for i, args in enumerate(self.layer_args):
                args.kv = self.kv[i].data_ptr()
                if self.mem_kv is not None:
                    args.mem_kt, args.mem_v = (m.data_ptr() for m in self.mem_kv[i])
        self._work = torch.empty(0)  # its scratch

    fixed = False  # rows leave the batch (`select`); no new row joins it

    def _views(self) -> None:
        """Per layer, views of the first n rows of the key/value memory (n, H_kv, slots, 2*d_head) and of the
        source's (n*H_kv, d_head, S) and (n*H_kv, S, d_head); the views a step by operators reads are made when it
        first needs them (`_cache`)."""
        n = self.n
        self.kv = self.kv_all[:, :n].unbind(0)
        if self.mem_all is not None:
            kt, v = (m[:, :n].flatten(1, 2).unbind(0) for m in self.mem_all)
            self.mem_kv = list(zip(kt, v))
        self.cache = None

    def _cache(self) -> list:
        """Per layer, its key/value memory as a step by operators reads and writes it: by slot
        (n, H_kv, slots, 2, d_head), the keys transposed (n*H_kv, d_head, slots) and the values
        (n*H_kv, slots, d_head)."""
        if self.cache is None:
            n, H_kv, dh = self.n, self.H_kv, self.dh
            self.cache = [(kv.view(n, H_kv, -1, 2, dh), kv[..., :dh].reshape(n * H_kv, -1, dh).transpose(1, 2),
                           kv[..., dh:].reshape(n * H_kv, -1, dh)) for kv in self.kv]
        return self.cache

    def _cross_kv(self, layer, memory: torch.Tensor, real: torch.Tensor | None, kt: torch.Tensor, v: torch.Tensor):
        """One layer's cross-attention keys, transposed, into `kt` (m*H_kv, d_head, S), and values into `v`
        (m*H_kv, S, d_head), both contiguous, of the encoder output `memory` (m, S, d_model), computed at its real
        tokens' rows `real` (`_real_rows`; zeros at the padding, which attention masks)."""
        m, S = memory.shape[:2]
        rows = memory.reshape(m * S, -1)
        kv = _padded(layer.cross_kv(rows if real is None else rows[real]), real, m * S)
        k, v_new = kv.view(m, S, 2, self.H_kv, self.dh).unbind(2)
        # (rows.c's attend_rows reads source keys in one layout, d_head-major)
        kt.view(m, self.H_kv, self.dh, S).copy_(layer.cross_k_norm(k).permute(0, 2, 3, 1))
        v.view(m, self.H_kv, S, self.dh).copy_(v_new.transpose(1, 2))

    def _source_bias(self, mem_mask: torch.Tensor, dtype) -> torch.Tensor:
        """(m, 1, 1, S) source mask -> (m*H_kv, 1, S) attention bias: 0 at real tokens, -inf at padding."""
        m, S = mem_mask.size(0), mem_mask.size(-1)
        bias = torch.zeros(m, 1, S, device=mem_mask.device, dtype=dtype)
        bias.masked_fill_(~mem_mask.view(m, 1, S), float("-inf"))
        return bias[:, None].expand(m, self.H_kv, 1, S).reshape(m * self.H_kv, 1, S).clone()  # (a tensor of its own)

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok: (n*k,) the last token of each beam (row-major); returns logits (n*k, V) for the next one."""
        n, k, K, t = self.n, self.k, self.K, self.t
        if t == self.max_steps:
            raise RuntimeError(f"decoded past the {self.max_steps} positions this decoder was made for")
        # this position's slots: beam j writes slot t*K + j and sees it (and, through `history`, its ancestors')
        self.history = torch.cat([self.history, self.own[k].expand(n, k, K)], dim=2)
        L = (t + 1) * K
        pos = None if self.pad is None else (t - self.pad)[:, None].expand(n, k)
        x = self._embed(tok, t if pos is None else pos.reshape(-1))
        logits = self._layers(x, t * K, k, L, self.history, self.steps[t : t + 1] if pos is None else pos)
        self.t += 1
        return logits

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Feed whole prompts at the start: ids (n, T), left-padded where `valid` (n, T) is False (a prefix LM's
        prompts are its prefix, their positions seeing each other both ways). Returns the
        logits after each row's last token, (n, V). With K beams a row (a prompted beam search) position p goes to
        slot p * K, which every beam sees, and the beams go on from one (`select` with parents)."""
        n, T = ids.shape
        K = self.K
        if self.t or self.k != 1 or n != self.n or T > self.max_steps:
            raise RuntimeError("prefill comes first, with one beam, n rows and at most max_steps positions")
        device = ids.device
        causal = torch.ones(T, T, dtype=torch.bool, device=device)
        if not self.sm.cfg.prefix_attention:  # (a prefix LM's prompt is its prefix: seen both ways)
            causal = causal.tril()
        if valid is None:  # (a `valid` given is used as it is: reading whether it is all True would wait for a GPU)
            pos = torch.arange(T, device=device)
            mask = causal.expand(n, T, T)
        else:
            self.pad = (~valid).sum(1)
            pos = (valid.long().cumsum(1) - 1).clamp(min=0)
            # nobody attends to padding; a padding query sees itself, so that no softmax row is empty
            mask = (causal & valid[:, None, :]) | torch.eye(T, dtype=torch.bool, device=device)
        bias = torch.zeros(mask.shape, device=device, dtype=self.history.dtype).masked_fill_(~mask, float("-inf"))
        start = 0
        if K > 1:  # (the prompt's slots p * K; those of the other beams unseen, zeroed: 0 * NaN would be NaN)
            self.kv_all[:, :n, :, : T * K].zero_()
            wide = torch.full((n, T, T * K), float("-inf"), device=device, dtype=bias.dtype)
            wide[:, :, ::K] = bias
            bias, start = wide, torch.arange(T, device=device) * K
        self.history = bias[:, -1:, :]  # what the next position sees: every real token
        x = self._embed(ids.reshape(-1), pos.reshape(-1) if pos.dim() == 2 else pos.repeat(n))
        logits = self._layers(x, start, T, T * K, bias, pos, last_only=True)
        self.t = T
        return logits

    def _head_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """(n, r, L) per row -> (n*H_kv, g*r, L): the same for each key/value head and each of its g query heads."""
        n, r, L = bias.shape
        g = self.H // self.H_kv
        return bias[:, None, None].expand(n, self.H_kv, g, r, L).reshape(n * self.H_kv, g * r, L)

    def _embed(self, tok: torch.Tensor, pos) -> torch.Tensor:
        embed = self.sm.embed
        return torch.add(self.positions[pos], self.sm.tok(tok), alpha=embed.scale)

    def _layers(self, x, start, r: int, L: int, self_bias, pos, last_only: bool = False) -> torch.Tensor:
        """x: (n*r, d_model), r new positions (or beams) per row written from slot `start` (an int, or a (r,) tensor
        of slots on the device: `StaticDecoder`); L slots in view, `self_bias` (n, r, L) what each sees (0, or
        -inf). `pos`: their positions for RoPE, (r,) or (n, r). Returns the logits (n*r, V), or (n, V) of each row's
        last position with `last_only`."""
        c = self.sm.c_attention()
        if c and self.layer_args is not None and isinstance(start, int):  # (fixed shapes: `start` a tensor)
            x = self._c_layers(x, start, r, L, self_bias)
        else:
            x = self._op_layers(x, start, r, L, self_bias, pos, c)
        if last_only:
            x = x.view(self.n, r, -1)[:, -1]
        logits = softcap(self.sm.lm_head(self.sm.final_norm(x)), self.sm.cfg.final_softcap)
        return logits if self.sm.logits_bias is None else logits + self.sm.logits_bias

    def _c_layers(self, x, start: int, r: int, L: int, self_bias) -> torch.Tensor:
        """`_layers`' layers as one call of rows.c's decode_layers, on x in place."""
        M = x.size(0)
        if self._work.numel() < M * self.sm.work_per_row:
            self._work = torch.empty(M * self.sm.work_per_row)
        if self_bias.stride(2) != 1:
            self_bias = self_bias.contiguous()
        mem, S = (None, 0) if self.mem_kv is None else (self.mem_bias.data_ptr(), self.mem_bias.size(-1))
        self.sm.decode_layers(self.layer_args, len(self.layer_args), x.data_ptr(), self._work.data_ptr(), self.n, r,
                              self.H, self.H_kv, self.dh, self.kv[0].size(2), start, L, self_bias.data_ptr(),
                              self_bias.stride(0), self_bias.stride(1), mem, S, self.scale)
        return x

    def _op_layers(self, x, start, r: int, L: int, self_bias, pos, c: bool) -> torch.Tensor:
        """`_layers`' layers one operator (or kernel call) at a time; `self_bias` (n, r, L) per row."""
        n, H, H_kv, dh = self.n, self.H, self.H_kv, self.dh
        D = H * dh
        biases = {}  # window -> the bias as `_attend` takes it (sliding layers see the last `window` positions)

        def seen(window):
            if window not in biases:
                bias = self_bias if window is None else self_bias + self._window_bias(window, start, r, L)
                biases[window] = bias if c else self._head_bias(bias)
            return biases[window]

        for i, (layer, (slots, keys_t, values)) in enumerate(zip(self.sm.layers, self._cache())):
            rope = self.sm.rope_local if layer.local_rope else self.sm.rope
            # self-attention: softmax(q K^T / sqrt(d_head) + history) V over this row's slots
            qkv = layer.qkv(layer.norm_self_in(x))
            q = layer.q_norm(qkv[:, :D].view(n, r, H, dh))
            new_kv = qkv[:, D:].view(n, r, 2, H_kv, dh)
            if layer.k_norm is not _identity:
                new_kv = torch.stack([layer.k_norm(new_kv[:, :, 0]), new_kv[:, :, 1]], dim=2)
            if rope is not None:  # rotate q and k by their positions (rope works on (B, H, T, d_head)); every
                # position is below max_steps, so the table's size is checked without reading `pos` from the device
                q = rope(q.transpose(1, 2), pos, self.max_steps).transpose(1, 2)
                new_k = rope(new_kv[:, :, 0].transpose(1, 2), pos, self.max_steps).transpose(1, 2)
                new_kv = torch.stack([new_k, new_kv[:, :, 1]], dim=2)
            if isinstance(start, int):
                slots.narrow(2, start, r).copy_(new_kv.permute(0, 3, 1, 2, 4))
            else:
                # (under autocast new_kv is bf16 while the cache keeps the weights' dtype: copy_ casts, this does not)
                slots.index_copy_(2, start, new_kv.permute(0, 3, 1, 2, 4).to(slots.dtype))
            x = layer.norm_self_out(layer.self_out(self._attend(q, keys_t, values, seen(layer.window), L, c), x))
            if self.mem_kv is not None:  # cross-attention to the source
                mem_kt, mem_v = self.mem_kv[i]
                q = layer.cross_q_norm(layer.cross_q(layer.norm_cross_in(x)).view(n, r, H, dh))
                y = self._attend(q, mem_kt, mem_v, self.mem_bias, mem_v.size(1), c)
                x = layer.norm_cross_out(layer.cross_out(y, x))
            # position-wise FFN
            x = layer.norm_ffn_out(layer.w2(layer.ffn_hidden(layer.norm_ffn_in(x)), x))
        return x

    def _window_bias(self, window: int, start: int, r: int, L: int) -> torch.Tensor:
        """(r, L): -inf at the slots a sliding-window layer's queries do not see, those `window` positions or more
        before their own (a prefill's query i is position i; a step's beams share position start // K; slot s holds
        position s // K). Slots are counted from each row's first slot, so a row's left padding moves both alike."""
        K = self.K
        device = self.history.device
        if torch.is_tensor(start):  # (a prompted beam search's prefill: query i at slot start[i])
            query = start // K
        else:
            query = start // K + (torch.arange(r, device=device) if r > 1 and K == 1 else
                                  torch.zeros(r, dtype=torch.long, device=device))
        slot = torch.arange(L, device=device) // K
        far = slot[None, :] <= query[:, None] - window
        return torch.zeros(r, L, device=device, dtype=self.history.dtype).masked_fill_(far, float("-inf"))

    def _attend(self, q, keys_t, values, bias, L: int, c: bool) -> torch.Tensor:
        """q: (n, r, H, d_head); keys_t (n*H_kv, d_head, >= L), values (n*H_kv, >= L, d_head), of which the first L
        slots are in view; bias what each query sees: (n, r, L) per row on rows.c's attend_rows (`c`), else
        broadcastable to (n*H_kv, g*r, L), the g query heads of a key/value head stacked (self-attention:
        `_head_bias`); or (n*H_kv, 1, L) per key/value head (the source). -> (n*r, d_model)"""
        n, r, H, dh = q.shape
        H_kv = self.H_kv
        if c:  # (keys and values: the first dimension is (row, key/value head) merged)
            kg, vg = keys_t.stride(0), values.stride(0)
            head = bias.size(0) == n * H_kv  # a bias per key/value head (the same indexing when H_kv is 1)
            return _attend_rows(
                self.sm.attend_rows, q, keys_t, (H_kv * kg, kg, keys_t.stride(2), keys_t.stride(1)), values,
                (H_kv * vg, vg, values.stride(1)), bias,
                (H_kv * bias.stride(0) if head else bias.stride(0), bias.stride(0) if head else 0,
                 bias.stride(1) if bias.size(1) > 1 else 0), H_kv, L, self.scale)
        if values.size(1) != L:
            keys_t, values = keys_t[..., :L], values[:, :L]
        if r > 1:
            q = q.transpose(1, 2)
        q = q.reshape(n * H_kv, H // H_kv * r, dh)
        if self.softcap is None:
            scores = torch.baddbmm(bias, q, keys_t, alpha=self.scale)
        else:  # the scores capped before the mask (Gemma 2)
            scores = softcap(torch.bmm(q, keys_t) * self.scale, self.softcap) + bias
        y = torch.bmm(scores.softmax(-1), values)
        if r == 1:  # (one query a row: the heads are already in place)
            return y.view(n, H * dh)
        return y.view(n, H, r, dh).transpose(1, 2).reshape(n * r, H * dh)

    def release(self) -> None:
        """Hand the key/value memory back to the StepModel for the next batch."""
        if self._workspace is not None:
            self.sm._return_workspace(self._workspace)
            self._workspace = None
        self.kv_all, self.kv, self.cache = None, [], None

    def select(self, keep: torch.Tensor | None, parent: torch.Tensor | None = None) -> None:
        """Before the next step: keep the rows `keep` (indices, or None for all), then let beam j of each row
        continue beam parent[s, j] of the same row ((n_kept, K') indices; None: beam j continues beam j)."""
        if keep is not None:
            n_old, n = self.n, keep.numel()
            self.history = self.history.index_select(0, keep)
            if self.pad is not None:
                self.pad = self.pad.index_select(0, keep)
            # rows leave in place: only the kept rows that change places are copied, and of the self-attention
            # memory only the written slots (those past them are written before they are read).
            # `schedule.keep_order` makes that the few rows that fill the places of those that left.
            dst = (keep != torch.arange(n, device=keep.device)).nonzero().flatten()
            src = keep[dst]
            used = self.t * self.K
            if dst.numel():  # (every layer's in one copy)
                self.kv_all[:, dst, :, :used] = self.kv_all[:, src, :, :used]
                for m in self.mem_all or ():
                    m[:, dst] = m[:, src]
            self.n = n
            if self.mem_all is not None:
                self.mem_bias = _move_rows(self.mem_bias, n_old, n, dst, src)
            self._views()
        if parent is not None:
            self.history = self.history.gather(1, parent[:, :, None].expand(-1, -1, self.history.size(2)))
            self.k = parent.size(1)


class StaticDecoder(IncrementalDecoder):
    """The incremental decoder with shapes that never change within a batch, for a step replayed as a CUDA graph.

    The search sees the same interface (`step`, `select` to reorder beams), and one more call: `admit`, which puts
    a new sentence in the place of one that has finished (continuous batching: the batch stays full to the end of a
    file). The tensors the step works on keep the batch's first shape: every place keeps its K beams (a finished
    sentence, or beams not yet split at the first step, still compute, and nobody reads them); the step attends
    over all max_steps * K key/value slots under the history mask (-inf where a beam does not look). The slots are
    a ring: step t writes slots (t mod max_steps) * K + j, so a sentence that joins at step t0 writes its position
    p at step t0 + p, and an admitted sentence starts with a history of nothing. Each row's position, t less the
    step it began at (its `offset`), and the step itself are read from tensors on the device. On CUDA the step is
    captured once as a CUDA graph (`schedule.StepGraph`, after one eager warm-up step) and replayed: one launch
    instead of one per operation, which on a GPU is where a small model's step spends its time. Elsewhere (and in
    tests) the same fixed-shape step runs eagerly. Language-model prompts are prefilled as `IncrementalDecoder` does
    (once, eagerly); a row's offset is then its left padding.

    The caller keeps each row within max_steps positions; a row past them (one that finished and runs on, unread,
    until the search looks) computes at its last position, and what it computes is never read."""

    fixed = True

    def __init__(self, sm: StepModel, n: int, beam_size: int, max_steps: int, memory, mem_mask):
        super().__init__(sm, n, beam_size, max_steps, memory, mem_mask)
        K, device, dtype = self.K, self.history.device, self.history.dtype
        self.rows = torch.arange(n, device=device)  # the live rows (all of them, unless the search drops some)
        self.history = torch.full((n, K, max_steps * K), float("-inf"), device=device, dtype=dtype)
        self.tok = torch.zeros(n * K, dtype=torch.long, device=device)
        self.now = torch.zeros(1, dtype=torch.long, device=device)  # this step, t
        self.offset = torch.zeros(n, dtype=torch.long, device=device)  # the step each row began at
        self.beam_slots = torch.arange(K, device=device)
        self.kv_all.zero_()  # every slot is in view (masked until written): each must hold a number
        self._cache()  # (made before a step is traced: the views never change in a batch)
        self.logits: torch.Tensor | None = None
        # the one runner of this batch's steps: on CUDA a CUDA graph (under autocast, whose weight casts a captured
        # graph would cache, eagerly); a search whose whole step it runs (schedule.search_graph) steps this one
        # plainly inside it
        self.graph = StepGraph(device.type == "cuda" and not torch.is_autocast_enabled())

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """tok: (n*k,) the last token of each live beam; returns their logits (n*k, V)."""
        n, k, K = self.rows.numel(), self.k, self.K
        self.tok.view(-1, K)[self.rows] = tok.view(n, k).expand(n, K) if k == 1 else tok.view(n, K)
        self.graph(self._logits)
        self.now.add_(1)  # (counted on the device only: a replayed graph runs no host code)
        return self.logits.view(-1, K, self.logits.size(-1))[self.rows, :k].reshape(n * k, -1)

    def _static_step(self) -> torch.Tensor:
        """One position for every place and beam: (n0*K, V) logits, from `self.tok` at step `self.now`."""
        n, K, M = self.n, self.K, self.max_steps
        slots = self.now % M * K + self.beam_slots  # beam j writes slot (t mod M)*K + j and sees it
        self.history.index_copy_(2, slots, self.own[K].expand(n, K, K))
        pos = (self.now - self.offset).clamp_(max=M - 1)[:, None].expand(n, K)
        x = self._embed(self.tok, pos.reshape(-1))
        return self._layers(x, slots, K, self.history.size(2), self.history, pos)

    def _logits(self) -> None:
        self.logits = self._static_step()

    def prefill(self, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """As `IncrementalDecoder.prefill` (eagerly); the prompts' history mask then fills the first of all the
        slots in view, and each row's offset is its left padding."""
        if self.K != 1:
            raise RuntimeError("a fixed-shape decoder prefills prompts with one beam a row")
        history = self.history
        logits = super().prefill(ids, valid)
        history[:, :, : ids.size(1)] = self.history
        self.history = history
        self.now.fill_(self.t)
        if self.pad is not None:
            self.offset.copy_(self.pad)
        return logits

    def admit(self, places: torch.Tensor, memory: torch.Tensor, mem_mask: torch.Tensor) -> None:
        """Before the next step: the sentences whose encoder output is `memory` (m, S, d_model) (`mem_mask`
        (m, 1, 1, S): True at real tokens; S the batch's source width) take the places `places` (m,), whatever
        was there. Each starts at position 0 with a history of nothing; its beams' tokens are the search's
        business. Everything is written in place, so a captured step stays valid."""
        n, H, dh, S = self.n, self.H_kv, self.dh, memory.size(1)
        real, m = _real_rows(mem_mask), memory.size(0)
        new_kt, new_v = (self.mem_all[0].new_empty(m * H, *shape) for shape in ((dh, S), (S, dh)))
        for layer, kt, v in zip(self.sm.layers, *self.mem_all):
            self._cross_kv(layer, memory, real, new_kt, new_v)
            kt[places] = new_kt.view(m, H, dh, S)
            v[places] = new_v.view(m, H, S, dh)
        self.mem_bias.view(n, H, 1, S)[places] = self._source_bias(mem_mask, self.mem_bias.dtype).view(-1, H, 1, S)
        self.history[places] = float("-inf")
        self.offset[places] = self.now

    def admit_prompts(self, places: torch.Tensor, ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Before the next step: language-model prompts `ids` (m, P), left-padded where `valid` is False, take the
        places `places` (m,) (one beam each), whatever was there; returns the logits after each prompt's last token,
        (m, V). The prompts are prefilled in one eager pass of their own, and their keys/values copied into the
        ring slots just before this step's, (t - P .. t - 1) mod max_steps, so that each row's next position is its
        prompt's length. P must leave room: at most max_steps."""
        m, P = ids.shape
        M = self.max_steps
        if self.K != 1 or P > M:
            raise RuntimeError("admit_prompts: one beam a row, and prompts of at most max_steps tokens")
        fresh = IncrementalDecoder(self.sm, m, 1, P, None, None)
        logits = fresh.prefill(ids, valid)
        cols = (self.now - P + torch.arange(P, device=ids.device)) % M
        for new, kv in zip(fresh.kv, self.kv):  # (m, H_kv, P, 2*d_head) -> (n, H_kv, M, 2*d_head) at the ring's cols
            kv[places[:, None], :, cols] = new.permute(0, 2, 1, 3)
        fresh.release()
        self.history[places] = float("-inf")
        self.history[places[:, None], 0, cols] = fresh.history[:, 0]  # 0 at each prompt's real tokens
        length = P if valid is None else valid.sum(1)
        self.offset[places] = self.now - length
        return logits

    def select(self, keep: torch.Tensor | None, parent: torch.Tensor | None = None) -> None:
        """As `IncrementalDecoder.select`, but nothing moves: a sentence that leaves keeps its place, unread, and
        reordering beams rewrites the live sentences' history masks."""
        if keep is not None:
            self.rows = self.rows[keep]
        if parent is not None:
            history = self.history[self.rows]
            k = parent.size(1)
            self.history[self.rows, :k] = history.gather(1, parent[:, :, None].expand(-1, -1, history.size(2)))
            self.k = k

    def release(self) -> None:
        self.graph.graph = self.logits = None
        super().release()


def _real_rows(mask: torch.Tensor) -> torch.Tensor | None:
    """The flat indices of the real tokens of a source mask (n, 1, 1, S) (True at real tokens), or None where there
    is no padding, or off the CPU (reading the mask there would wait for the device). The encoder's linear layers
    and norms, and the cross-attention keys and values, run on these rows only: no real token reads a padding
    row's result (attention masks them), and a linear layer's row does not depend on the other rows, so nothing
    changes but the work (a batch of sentences of unequal lengths is a fifth padding or more)."""
    if mask.device.type != "cpu":
        return None
    flat = mask.reshape(-1)
    real = flat.nonzero().squeeze(1)
    return None if real.numel() == flat.numel() else real


def _padded(x: torch.Tensor, real: torch.Tensor | None, rows: int) -> torch.Tensor:
    """x (len(real), C), the real tokens' rows, back in place among `rows` rows, zeros at the padding."""
    return x if real is None else x.new_zeros(rows, x.size(1)).index_copy_(0, real, x)


def _attend_rows(kernel, q, k, k_strides, v, v_strides, bias, bias_strides, H_kv: int, L: int, scale: float):
    """rows.c's attend_rows: q (n, r, H, d_head), d_head contiguous; keys at `k_strides` (row, key/value head, slot,
    d), values at `v_strides` (row, key/value head, slot; d contiguous), the bias at `bias_strides` (row, key/value
    head, query; slots contiguous), L slots. -> (n*r, H*d_head)"""
    n, r, H, dh = q.shape
    y = torch.empty(n * r, H * dh)
    kernel(q.data_ptr(), q.stride(0), q.stride(1), q.stride(2), k.data_ptr(), *k_strides, v.data_ptr(), *v_strides,
           bias.data_ptr(), *bias_strides, n, H_kv, H // H_kv, r, L, dh, scale, y.data_ptr())
    return y


def _move_rows(x: torch.Tensor, n: int, n_new: int, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Of a (n*H, ...) tensor seen as n rows: copy rows `src` to `dst`, then keep the first n_new."""
    rows = x.view(n, -1, *x.shape[1:])
    rows[dst] = rows[src]
    return rows[:n_new].flatten(0, 1)


class _Layer:
    """One decoder (or encoder) layer as the functions a step calls: LayerNorms where the norm placement puts them
    (identity elsewhere), and linear layers with the activation or the residual addition fused in."""

    def __init__(self, layer: Sublayers, mode: str, store: StoredWeights | None = None):
        pre = layer.pre_norm
        self.window, self.local_rope = layer.window, layer.local_rope
        linear = functools.partial(_linear, mode=mode, store=store)
        self.norm_self_in, self.norm_self_out, first, last = _placed(layer.self_norm, pre, mode)
        self.qkv = linear(layer.qkv, norm_in=first)
        self.q_norm, self.k_norm = layer.q_norm or _identity, layer.k_norm or _identity
        self.cross_q_norm, self.cross_k_norm = layer.cross_q_norm or _identity, layer.cross_k_norm or _identity
        self.self_out = _out(linear, layer.self_out, layer.self_post_norm, last)
        if layer.cross_q is not None:
            self.norm_cross_in, self.norm_cross_out, first, last = _placed(layer.cross_norm, pre, mode)
            self.cross_q = linear(layer.cross_q, norm_in=first)
            self.cross_kv = linear(layer.cross_kv)
            self.cross_out = _out(linear, layer.cross_out, layer.cross_post_norm, last)
        gated = layer.w3 is not None  # (two layers read the normed input: it is normed once, apart)
        self.norm_ffn_in, self.norm_ffn_out, first, last = _placed(layer.ffn_norm, pre, mode, gated)
        w1 = linear(layer.w1, act=gate_activation(layer.activation), norm_in=first)
        if layer.w3 is None:
            self.ffn_hidden = w1
        else:  # gated: act(w1 x) * w3 x
            w3 = linear(layer.w3)
            self.ffn_hidden = lambda x: w1(x).mul_(w3(x))
        self.w2 = _out(linear, layer.w2, layer.ffn_post_norm, last)

    def kernel_args(self) -> native.LayerArgs:
        """This layer as rows.c's decode_layers runs it (the batch's memory for the decoder to fill in), where the
        plan has it run there (tfcli.generate.backend: ReLU, ReLU^2, GELU or SiLU, LayerNorms folded into the row
        kernel's calls, QK-norm's RMSNorm gains in the call)."""
        cross = hasattr(self, "cross_q")
        w1, act = self.ffn_hidden, None
        if isinstance(w1, _Activated):
            w1, act = w1.linear, _C_ACTIVATIONS.get(w1.act)
        linears = [self.qkv, self.self_out, w1, self.w2] + ([self.cross_q, self.cross_out] if cross else [])
        norms = [self.norm_self_in, self.norm_self_out, self.norm_ffn_in, self.norm_ffn_out]
        norms += [self.norm_cross_in, self.norm_cross_out] if cross else []
        qk = [self.q_norm, self.k_norm, self.cross_q_norm]
        if (not all(isinstance(f, native.RowLinear) for f in linears) or any(f is not _identity for f in norms)
                or (isinstance(self.ffn_hidden, _Activated) and act is None)):
            raise RuntimeError("internal error: tfcli.generate.backend's table lets decode_layers run a layer it "
                               "cannot")
        gains = [None if f is _identity else f.weight.data_ptr() for f in qk]
        eps = next((f.eps for f in qk if f is not _identity), 0.0)
        none, w1_args = native.LinearArgs(), w1.args()
        if act is not None:
            w1_args.act = act
        return native.LayerArgs(self.qkv.args(), self.self_out.args(), self.cross_q.args() if cross else none,
                                self.cross_out.args() if cross else none, w1_args, self.w2.args(), *gains, eps)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _out(linear, module: nn.Linear, post_norm: nn.Module | None, norm_out):
    """A sublayer's last linear layer with its residual addition: (y, x) -> x + y W^T + b in one call, or under
    sandwich norms x + post_norm(y W^T + b)."""
    if post_norm is None:
        return linear(module, residual=True, norm_out=norm_out)
    plain, post = linear(module), _norm(post_norm)
    return lambda y, x: x + post(plain(y))


_C_ACTIVATIONS = {"relu2": 2, **native.ACTIVATIONS}  # what decode_layers applies after w1 (rows.c's linear_t.act)


class _Activated:
    """act(linear(x)) after a row-kernel or int8 layer (`linear`): by rows.c where it has `act` and its kernels run
    (native.activate_: the bits decode_layers gives, the same on every CPU), else in torch; decode_layers applies
    those in _C_ACTIVATIONS in its call."""

    def __init__(self, linear, act: str):
        self.linear, self.act, self.f = linear, act, ACTIVATIONS[act]
        if act in native.ACTIVATIONS and native.fp32_kernel() is not None:
            self.f = functools.partial(native.activate_, act=act)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self.linear(x))


def _placed(module: nn.Module, pre: bool, mode: str, gated: bool = False):
    """A sublayer's norm -> (before, after, first, last): what a step calls on the sublayer's input and on its output
    (pre-norm: x + f(LN(x)); post-norm: LN(x + f(x))), and the LayerNorm its first linear layer runs on its input
    or its last on its output in the same call (mode "rows": native.RowLinear; None elsewhere)."""
    norm = _norm(module)
    if mode != "rows" or type(module) is not nn.LayerNorm or (pre and gated):
        return (norm, _identity, None, None) if pre else (_identity, norm, None, None)
    return (_identity, _identity, module, None) if pre else (_identity, _identity, None, module)


def _norm(module: nn.Module):
    if isinstance(module, RMSNorm):
        return module
    if not isinstance(module, nn.LayerNorm):
        return _identity
    shape, weight, bias, eps = module.normalized_shape, module.weight, module.bias, module.eps
    return lambda x: torch.layer_norm(x, shape, weight, bias, eps)


class _WeightOnly(nn.Module):
    """A linear layer's weight without its bias (the output layer of a model whose logits are capped before it)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight, self.bias = weight, None


def _linear(module: nn.Linear, mode: str, act: str | None = None, residual: bool = False,
            norm_in: nn.LayerNorm | None = None, norm_out: nn.LayerNorm | None = None,
            store: StoredWeights | None = None):
    """x -> act(x W^T + b), or with `residual` (x, r) -> x W^T + b + r, for 2-d x; in mode "rows" with `norm_in`
    x normed first, with `norm_out` the result normed last.

    mode "packed": the weights reordered for oneDNN once (a plain GEMM re-packs them on every call; a decoding step
    calls each layer with few rows, so that is a large share of its work), and each layer one fused call. "rows":
    `tfcli.generate.native.RowLinear`. "int8": see `tfcli.generate.int8`. "plain": F.linear. Where a mode copies
    the weights, a mapped checkpoint's own pages are given back once read (tfcli.checkpoint.paged; RowLinear and
    Int8Linear a block at a time). `store`: RowLinear's and Int8Linear's (modes "rows" and "int8")."""
    if mode != "plain":
        return _copied(module, mode, act, residual, norm_in, norm_out, store)
    w, b = module.weight, module.bias

    def base(x):
        return F.linear(x, w, b)

    if residual:
        return lambda x, r: base(x) + r
    f = ACTIVATIONS.get(act)
    if f is None:
        return base
    return lambda x: f(base(x))


def _copied(module: nn.Linear, mode: str, act: str | None, residual: bool, norm_in, norm_out, store):
    """`_linear` in the modes that run on a copy of the weights: "packed", "rows" and "int8"."""
    if mode == "packed":
        with paged(module.weight.detach()) as w:
            weight = torch.ops.mkldnn._reorder_linear_weight(w, 64)
        bias = module.bias.detach() if module.bias is not None else None
        if residual:
            binary = torch.ops.mkldnn._linear_pointwise.binary
            return lambda x, r: binary(x, r, weight, bias, "add")
        linear = torch.ops.mkldnn._linear_pointwise.default
        if act == "relu":
            return lambda x: linear(x, weight, bias, "none", [], "").relu_()
        if act not in _ONEDNN_ACTIVATIONS:  # one oneDNN does not fuse
            f = ACTIVATIONS[act]
            return lambda x: f(linear(x, weight, bias, "none", [], ""))
        attr, algorithm = _ONEDNN_ACTIVATIONS[act]
        return lambda x: linear(x, weight, bias, attr, [], algorithm)
    if mode in ("int8", "rows"):  # the residual and a ReLU applied in their last pass
        if mode == "int8":
            linear = Int8Linear(module, relu=act == "relu", store=store)
        else:
            norm = norm_in if norm_in is not None else norm_out
            linear = native.RowLinear(module, relu=act == "relu", norm=norm, norm_input=norm_in is not None,
                                      store=store)
        if residual or act in (None, "relu"):
            return linear
        return _Activated(linear, act)
    raise ValueError(f"unknown linear mode {mode!r}")
