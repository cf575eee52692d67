"""The two model types: an encoder-decoder for translation and a decoder-only language model."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.config import ModelConfig
from tfcli.model.dropout import Dropout
from tfcli.model.layers import DecoderLayer, EncoderLayer, Sublayers
from tfcli.model.norm import norm_layer
from tfcli.model.linear import Linear
from tfcli.model.positional import LearnedPositions, RotaryEmbedding, SinusoidalPositions
from tfcli.specials import PAD_ID


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap): x kept within (-cap, cap), near-linear well inside (Gemma 2's logits); None: x."""
    return x if cap is None else cap * torch.tanh(x / cap)


class Embeddings(nn.Module):
    """Token embedding (times sqrt(d_model) if `scale_embedding`) plus absolute positions, then dropout:
    x = tok(ids) * scale + pos(positions), where `pos` is None with RoPE (positions enter in the attention)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, tok: nn.Embedding | None = None):
        super().__init__()
        self.tok = tok if tok is not None else nn.Embedding(vocab_size, cfg.d_model, padding_idx=PAD_ID)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        if cfg.positions in ("sinusoidal", "fairseq"):
            self.pos = SinusoidalPositions(cfg.d_model, cfg.max_len, cfg.positions)
        elif cfg.positions == "learned":
            self.pos = LearnedPositions(cfg.d_model, cfg.max_len)
        else:  # rope: positions enter inside attention
            self.pos = None
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, end: int | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """`end`: the largest position + 1 if the caller knows it (no read from the GPU; see positional.py). `rows`:
        tok(ids), looked up by the caller (decoding reads a mapped checkpoint's table from the file)."""
        x = (self.tok(ids) if rows is None else rows) * self.scale
        if self.pos is not None:
            x = x + self.pos(pos, end)
        return self.dropout(x)


@dataclass(frozen=True)
class Stack:
    """An encoder's or a decoder's parts, for code that runs them its own way (the incremental decoder,
    tfcli.generate.step) through this interface rather than attribute names:
        x = embed(ids, positions);  x = each layer, as its Sublayers say;  out = norm(x)
    `rope`: the rotary embedding the self-attention applies to q and k (None: positions are in `embed`); a layer
    with `local_rope` applies `rope_local` instead."""

    embed: Embeddings
    layers: tuple[Sublayers, ...]
    norm: nn.Module
    rope: RotaryEmbedding | None = None
    rope_local: RotaryEmbedding | None = None  # the sliding layers' RoPE where its base differs (Sublayers.local_rope)


@dataclass(frozen=True)
class Parts:
    """A model's parts for decoding: logits = lm_head(decoder output); `encoder` is None for a language model."""

    encoder: Stack | None
    decoder: Stack
    lm_head: nn.Linear


def _final_norm(cfg: ModelConfig) -> nn.Module:
    # pre-norm (and sandwich) stacks end with a norm; post-norm stacks are already normalised after each sublayer
    return norm_layer(cfg) if cfg.norm != "post" else nn.Identity()


def _layer(layer: nn.Module, recompute: bool, *args) -> torch.Tensor:
    """layer(*args); with `recompute` (training under train.activation_checkpointing) its activations are not kept
    but computed again in the backward (torch.utils.checkpoint, the random stream replayed: the same dropout)."""
    if recompute and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        return checkpoint(layer, *args, use_reentrant=False)
    return layer(*args)


def recompute_activations(model: nn.Module, on: bool = True) -> None:
    """Keep only each layer's input for the backward and recompute the rest there: a layer's activations in memory
    instead of all of them, for about a third more compute."""
    for m in model.modules():
        if isinstance(m, (Encoder, Decoder)):
            m.recompute = on


class Encoder(nn.Module):
    recompute = False  # (recompute_activations)

    def __init__(self, cfg: ModelConfig, embed: Embeddings):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.norm = _final_norm(cfg)

    def parts(self) -> Stack:
        return Stack(self.embed, tuple(layer.sublayers() for layer in self.layers), self.norm)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, attn_out: list | None = None) -> torch.Tensor:
        """src: (B, S) token ids; src_mask: (B, 1, 1, S) True at real tokens."""
        x = self.embed(src, torch.arange(src.size(1), device=src.device), src.size(1))
        for layer in self.layers:
            x = _layer(layer, self.recompute and self.training, x, src_mask, attn_out)
        return self.norm(x)


class Decoder(nn.Module):
    recompute = False  # (recompute_activations)

    def __init__(self, cfg: ModelConfig, embed: Embeddings, n_layers: int, cross: bool):
        super().__init__()
        self.cfg = cfg
        self.embed = embed
        rope = cfg.positions == "rope"
        self.rope = RotaryEmbedding(cfg.rope_dim, cfg.max_len, cfg.rope_theta, cfg.rope_scaling) if rope else None
        local = rope and cfg.rope_local_theta is not None
        self.rope_local = RotaryEmbedding(cfg.rope_dim, cfg.max_len, cfg.rope_local_theta) if local else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross, cfg.window(i), local and cfg.window(i) is not None)
                                    for i in range(n_layers))
        self.norm = _final_norm(cfg)

    def parts(self) -> Stack:
        return Stack(self.embed, tuple(layer.sublayers() for layer in self.layers), self.norm, self.rope,
                     self.rope_local)

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        attn_out: dict | None = None,
        prefix: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tgt: (B, T) ids; each position sees itself and those before it (the fused causal kernel), and with
        `prefix` (B,) (a prefix LM's: model.prefix_attention) the first prefix[b] positions of row b also see each
        other. is_causal is a constant True, also for T = 1 (one query, one key: the same): a test on T would be a
        symbolic bool under torch.compile's dynamic shapes, which SDPA refuses (a graph break per layer)."""
        x, pos = self._inputs(tgt)
        for layer in self.layers:
            x = _layer(layer, self.recompute and self.training, x, *self._attention(layer, tgt.size(1), prefix),
                       memory, memory_mask, self._rope(layer, tgt.size(1)), pos, attn_out)
        return self.norm(x)

    def cross_weights(self, tgt: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor,
                      layer: int) -> torch.Tensor:
        """The cross-attention weights (B, n_head, T, S) of the 1-based decoder layer `layer` under teacher forcing
        on `tgt`, the same as `forward(attn_out=...)` gives, from the layers before it and its own attention only."""
        x, pos = self._inputs(tgt)
        T = tgt.size(1)
        for lay in self.layers[: layer - 1]:
            x = lay(x, *self._attention(lay, T), memory, memory_mask, self._rope(lay, T), pos)
        last = self.layers[layer - 1]
        return last.cross_weights(x, memory, memory_mask, self._rope(last, T), pos)

    def self_weights(self, tgt: torch.Tensor, layer: int, prefix: torch.Tensor | None = None) -> torch.Tensor:
        """The self-attention weights (B, n_head, T, T) of the 1-based layer `layer` on `tgt` (`prefix` as
        `forward`'s), from the layers before it and its own attention only: a decoder-only model's alignment."""
        x, pos = self._inputs(tgt)
        T = tgt.size(1)
        for lay in self.layers[: layer - 1]:
            x = lay(x, *self._attention(lay, T, prefix), rope=self._rope(lay, T), pos=pos)
        last = self.layers[layer - 1]
        return last.self_weights(x, *self._attention(last, T, prefix), self._rope(last, T), pos)

    def _inputs(self, tgt: torch.Tensor):
        """The embedded `tgt` and its positions, as every layer takes them."""
        T = tgt.size(1)
        pos = torch.arange(T, device=tgt.device)
        return self.embed(tgt, pos, T), pos

    def _rope(self, layer: DecoderLayer, T: int):
        """The RoPE function `layer` applies to q and k (None: positions are in the embeddings)."""
        rope = self.rope_local if layer.local_rope else self.rope
        # (a closure, not functools.partial: Dynamo before torch 2.3 cannot trace a partial of a module)
        return (lambda x, p: rope(x, p, T)) if rope is not None else None

    def _attention(self, layer: DecoderLayer, T: int, prefix: torch.Tensor | None = None):
        """(mask, is_causal) of `layer`'s self-attention over T positions: the fused causal kernel, or a mask (True:
        seen): with `prefix` (B,), (B, 1, T, T), each row's first prefix[b] positions seeing each other too; where
        a sliding window binds, none sees the positions `window` or more before its own."""
        windowed = layer.window is not None and T > layer.window
        if prefix is None and not windowed:
            return None, True
        device = self.embed.tok.weight.device
        ones = torch.ones(T, T, dtype=torch.bool, device=device)
        seen = ones.tril()
        if prefix is not None:
            inside = torch.arange(T, device=device)[None, :] < prefix.to(device)[:, None]  # (B, T)
            seen = (seen | (inside[:, :, None] & inside[:, None, :]))[:, None]
        if windowed:
            seen = seen & ~ones.tril(-layer.window)
        return seen, False


class EncoderDecoder(nn.Module):
    """The 2017 Transformer for translation: p(y_t | y_<t, x) = softmax(Decoder(y_<t, Encoder(x)) W_out)."""

    def __init__(self, cfg: ModelConfig, init: bool = True):
        super().__init__()
        assert cfg.kind == "seq2seq"
        self.cfg = cfg
        src_embed = Embeddings(cfg, cfg.src_vocab_size)
        tgt_embed = Embeddings(cfg, cfg.tgt_vocab_size, tok=src_embed.tok if cfg.share_embeddings else None)
        self.encoder = Encoder(cfg, src_embed)
        self.decoder = Decoder(cfg, tgt_embed, cfg.n_decoder_layers, cross=True)
        self.lm_head = Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)
        if init:  # (before the tie: a tied table keeps the embedding's initialisation)
            init_weights(self, cfg)
        if cfg.tie_output:
            self.lm_head.weight = tgt_embed.tok.weight

    def parts(self) -> Parts:
        return Parts(self.encoder.parts(), self.decoder.parts(), self.lm_head)

    @staticmethod
    def src_mask(src: torch.Tensor) -> torch.Tensor:
        return (src != PAD_ID)[:, None, None, :]

    def encode(self, src: torch.Tensor, attn_out: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        mask = self.src_mask(src)
        return self.encoder(src, mask, attn_out["encoder"] if attn_out is not None else None), mask

    def decode(self, tgt, memory, memory_mask, attn_out: dict | None = None):
        """Logits (B, T, V) for target prefix `tgt`."""
        return self.logits(self.decoder(tgt, memory, memory_mask, attn_out=attn_out))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The output layer on the decoder's `features`."""
        return self.lm_head(features)

    def features(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """The decoder's output (B, T, d_model) under teacher forcing; logits = logits(features)."""
        memory, mask = self.encode(src)
        return self.decoder(tgt_in, memory, mask)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) = <s> y_1 .. y_{T-1}; returns logits (B, T, V)."""
        return self.logits(self.features(src, tgt_in))


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: p(x_t | x_<t) = softmax(Decoder(x_<t) W_out)."""

    def __init__(self, cfg: ModelConfig, init: bool = True):
        super().__init__()
        assert cfg.kind == "lm"
        self.cfg = cfg
        embed = Embeddings(cfg, cfg.tgt_vocab_size)
        self.decoder = Decoder(cfg, embed, cfg.n_decoder_layers, cross=False)
        self.lm_head = Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)
        if init:
            init_weights(self, cfg)
        if cfg.tie_output:
            self.lm_head.weight = embed.tok.weight

    def parts(self) -> Parts:
        return Parts(None, self.decoder.parts(), self.lm_head)

    def features(self, ids: torch.Tensor, prefix: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder's output (B, T, d_model); logits = logits(features). `prefix` (B,): each row's prefix length,
        seen both ways where the model has prefix_attention (ignored otherwise)."""
        return self.decoder(ids, prefix=self._prefix(prefix))

    def forward(self, ids: torch.Tensor, attn_out: dict | None = None,
                prefix: torch.Tensor | None = None) -> torch.Tensor:
        """ids: (B, T); returns logits (B, T, V)."""
        return self.logits(self.decoder(ids, attn_out=attn_out, prefix=self._prefix(prefix)))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The output layer on the decoder's `features`, soft-capped where the model says (final_softcap): the cap
        on x W^T, the output bias added after it (an imported family's -1e9 on the specials it lacks stays -1e9)."""
        if self.cfg.final_softcap is None:
            return self.lm_head(features)
        capped = softcap(F.linear(features, self.lm_head.weight), self.cfg.final_softcap)
        return capped if self.lm_head.bias is None else capped + self.lm_head.bias

    def _prefix(self, prefix: torch.Tensor | None) -> torch.Tensor | None:
        return prefix if self.cfg.prefix_attention else None


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    """Initialisation that trains stably.

    With scaled embeddings (the paper's recipe, as in fairseq): Xavier-uniform linears, embeddings N(0, d^-1/2) so
    that sqrt(d)-scaled embeddings have unit variance. Without (GPT-2 style): N(0, 0.02) everywhere. Pre-norm stacks
    also shrink each residual branch's output projection by 1/sqrt(2 * layers), so the residual stream's variance
    does not grow with depth; `zero_init_residual` starts them at zero (modded-nanogpt): each block begins as the
    identity; those projections get gradients at once, the weights before them from the second step on.
    """
    n_layers = cfg.n_encoder_layers + cfg.n_decoder_layers if cfg.kind == "seq2seq" else cfg.n_decoder_layers
    residual_scale = 1.0 / math.sqrt(2 * n_layers) if cfg.norm != "post" else 1.0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if cfg.scale_embedding:
                nn.init.xavier_uniform_(module.weight)
            else:
                nn.init.normal_(module.weight, std=0.02)
            if name.endswith(("out_proj", "w2")):
                module.weight.data.mul_(0.0 if cfg.zero_init_residual else residual_scale)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = cfg.d_model**-0.5 if cfg.scale_embedding and name.endswith("tok") else 0.02
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()


def build_model(cfg: ModelConfig, init: bool = True) -> EncoderDecoder | DecoderOnlyLM:
    """The model of `cfg`, its weights drawn by `init_weights` (`init`), or left as torch's modules make them, for
    a caller that replaces them (tfcli.checkpoint.load)."""
    return EncoderDecoder(cfg, init) if cfg.kind == "seq2seq" else DecoderOnlyLM(cfg, init)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once by parameters()
