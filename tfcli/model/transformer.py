"""The two model types: an encoder-decoder for translation and a decoder-only language model."""

from __future__ import annotations

import math

import torch
from torch import nn

from tfcli.model.config import PAD_ID, ModelConfig
from tfcli.model.dropout import Dropout
from tfcli.model.layers import DecoderLayer, EncoderLayer, LayerCache
from tfcli.model.positional import LearnedPositions, RotaryEmbedding, SinusoidalPositions


class Embeddings(nn.Module):
    """Token embedding (times sqrt(d_model) if `scale_embedding`) plus absolute positions, then dropout."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, tok: nn.Embedding | None = None):
        super().__init__()
        self.tok = tok if tok is not None else nn.Embedding(vocab_size, cfg.d_model, padding_idx=PAD_ID)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0
        if cfg.positions == "sinusoidal":
            self.pos = SinusoidalPositions(cfg.d_model, cfg.max_len)
        elif cfg.positions == "learned":
            self.pos = LearnedPositions(cfg.d_model, cfg.max_len)
        else:  # rope: positions enter inside attention
            self.pos = None
        self.dropout = Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) * self.scale
        if self.pos is not None:
            x = x + self.pos(pos)
        return self.dropout(x)


class DecoderCache:
    """Everything incremental decoding keeps between steps: per-layer key/value caches and, for left-padded LM
    prompts, which of the positions so far are real tokens."""

    def __init__(self, n_layers: int):
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.valid: torch.Tensor | None = None  # (B, T_so_far) bool, only for padded prompts

    def __len__(self) -> int:
        return len(self.layers[0].self_kv)

    def select(self, idx: torch.Tensor) -> None:
        """Keep/reorder batch rows (beam search reordering, finished sentences leaving the batch)."""
        for layer in self.layers:
            layer.select(idx)
        if self.valid is not None:
            self.valid = self.valid.index_select(0, idx)


def _final_norm(cfg: ModelConfig) -> nn.Module:
    # pre-norm stacks end with a LayerNorm; post-norm stacks are already normalised after each sublayer
    return nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else nn.Identity()


class Encoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed: Embeddings):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.norm = _final_norm(cfg)

    def forward(self, src: torch.Tensor, src_mask: torch.Tensor, attn_out: list | None = None) -> torch.Tensor:
        """src: (B, S) token ids; src_mask: (B, 1, 1, S) True at real tokens."""
        x = self.embed(src, torch.arange(src.size(1), device=src.device))
        for layer in self.layers:
            x = layer(x, src_mask, attn_out)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed: Embeddings, n_layers: int, cross: bool):
        super().__init__()
        self.cfg = cfg
        self.embed = embed
        self.rope = RotaryEmbedding(cfg.d_head, cfg.max_len) if cfg.positions == "rope" else None
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross) for _ in range(n_layers))
        self.norm = _final_norm(cfg)

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: DecoderCache | None = None,
        valid: torch.Tensor | None = None,
        attn_out: dict | None = None,
    ) -> torch.Tensor:
        """tgt: (B, T) ids of the new positions. `valid` (B, T) marks real tokens of left-padded inputs."""
        B, T = tgt.shape
        start = len(cache) if cache is not None else 0
        device = tgt.device
        if valid is not None or (cache is not None and cache.valid is not None):
            # Left-padded rows: each row counts positions from its first real token, and nobody attends to padding.
            if valid is None:
                valid = torch.ones(B, T, dtype=torch.bool, device=device)
            all_valid = valid if cache is None or cache.valid is None else torch.cat([cache.valid, valid], 1)
            if cache is not None:
                cache.valid = all_valid
            pos = (all_valid.long().cumsum(1) - 1).clamp(min=0)[:, start:]
            q_idx = torch.arange(start, start + T, device=device)
            k_idx = torch.arange(start + T, device=device)
            causal = k_idx[None, :] <= q_idx[:, None]  # (T, T_k)
            mask = causal[None] & all_valid[:, None, :]
            mask = mask | (k_idx[None, :] == q_idx[:, None])[None]  # a padded query sees itself: no empty softmax row
            self_mask, is_causal = mask.unsqueeze(1), False
        else:
            pos = torch.arange(start, start + T, device=device)
            if start == 0:
                self_mask, is_causal = None, T > 1  # fast path: the fused causal kernel
            elif T == 1:
                self_mask, is_causal = None, False  # one new token may see every cached one
            else:
                q_idx = torch.arange(start, start + T, device=device)
                self_mask = (torch.arange(start + T, device=device)[None, :] <= q_idx[:, None])[None, None]
                is_causal = False
        x = self.embed(tgt, pos)
        for i, layer in enumerate(self.layers):
            x = layer(
                x, self_mask, is_causal, memory, memory_mask,
                cache.layers[i] if cache is not None else None, self.rope, pos, attn_out,
            )
        return self.norm(x)


class EncoderDecoder(nn.Module):
    """The 2017 Transformer for translation: p(y_t | y_<t, x) = softmax(Decoder(y_<t, Encoder(x)) W_out)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.kind == "seq2seq"
        self.cfg = cfg
        src_embed = Embeddings(cfg, cfg.src_vocab_size)
        tgt_embed = Embeddings(cfg, cfg.tgt_vocab_size, tok=src_embed.tok if cfg.share_embeddings else None)
        self.encoder = Encoder(cfg, src_embed)
        self.decoder = Decoder(cfg, tgt_embed, cfg.n_decoder_layers, cross=True)
        self.lm_head = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        init_weights(self, cfg)
        if cfg.tie_output:
            self.lm_head.weight = tgt_embed.tok.weight

    @staticmethod
    def src_mask(src: torch.Tensor) -> torch.Tensor:
        return (src != PAD_ID)[:, None, None, :]

    def encode(self, src: torch.Tensor, attn_out: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        mask = self.src_mask(src)
        return self.encoder(src, mask, attn_out["encoder"] if attn_out is not None else None), mask

    def decode(self, tgt, memory, memory_mask, cache: DecoderCache | None = None, attn_out: dict | None = None):
        """Logits (B, T, V) for target prefix `tgt`; with a cache, `tgt` holds only the new positions."""
        return self.lm_head(self.decoder(tgt, memory, memory_mask, cache, attn_out=attn_out))

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) = <s> y_1 .. y_{T-1}; returns logits (B, T, V)."""
        memory, mask = self.encode(src)
        return self.decode(tgt_in, memory, mask)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(self.cfg.n_decoder_layers)


class DecoderOnlyLM(nn.Module):
    """A GPT-style language model: p(x_t | x_<t) = softmax(Decoder(x_<t) W_out)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        assert cfg.kind == "lm"
        self.cfg = cfg
        embed = Embeddings(cfg, cfg.tgt_vocab_size)
        self.decoder = Decoder(cfg, embed, cfg.n_decoder_layers, cross=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        init_weights(self, cfg)
        if cfg.tie_output:
            self.lm_head.weight = embed.tok.weight

    def forward(
        self,
        ids: torch.Tensor,
        cache: DecoderCache | None = None,
        valid: torch.Tensor | None = None,
        attn_out: dict | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """ids: (B, T); returns logits (B, T, V), or (B, 1, V) for the last position only with `last_only` (all that
        generation needs: the output layer is then not run over the whole prompt). With a cache, `ids` holds only
        the new positions."""
        h = self.decoder(ids, cache=cache, valid=valid, attn_out=attn_out)
        return self.lm_head(h[:, -1:] if last_only else h)

    def new_cache(self) -> DecoderCache:
        return DecoderCache(self.cfg.n_decoder_layers)


def init_weights(model: nn.Module, cfg: ModelConfig) -> None:
    """Initialisation that trains stably.

    With scaled embeddings (the paper's recipe, as in fairseq): Xavier-uniform linears, embeddings N(0, d^-1/2) so
    that sqrt(d)-scaled embeddings have unit variance. Without (GPT-2 style): N(0, 0.02) everywhere. Pre-norm stacks
    also shrink each residual branch's output projection by 1/sqrt(2 * layers), so the residual stream's variance
    does not grow with depth.
    """
    n_layers = cfg.n_encoder_layers + cfg.n_decoder_layers if cfg.kind == "seq2seq" else cfg.n_decoder_layers
    residual_scale = 1.0 / math.sqrt(2 * n_layers) if cfg.norm == "pre" else 1.0
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            if cfg.scale_embedding:
                nn.init.xavier_uniform_(module.weight)
            else:
                nn.init.normal_(module.weight, std=0.02)
            if name.endswith(("out_proj", "w2")):
                module.weight.data.mul_(residual_scale)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = cfg.d_model**-0.5 if cfg.scale_embedding and name.endswith("tok") else 0.02
            nn.init.normal_(module.weight, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()


def build_model(cfg: ModelConfig) -> EncoderDecoder | DecoderOnlyLM:
    return EncoderDecoder(cfg) if cfg.kind == "seq2seq" else DecoderOnlyLM(cfg)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once by parameters()
