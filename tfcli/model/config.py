"""One dataclass describes a Transformer architecture; presets name common sizes."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

from tfcli.errors import ConfigError


@dataclass(frozen=True)
class RopeScaling:
    """RoPE's frequencies stretched for contexts past the trained one (a published config's `rope_scaling`).

    linear: every frequency divided by `factor`. llama3 (Llama 3.1+): wavelengths longer than
    original_max_len / low_freq_factor divided by `factor`, shorter than original_max_len / high_freq_factor kept,
    those between interpolated. longrope (Phi-3.5, Phi-4-mini): frequency i divided by short_factor[i], or by
    long_factor[i] in a sequence past original_max_len positions (from the call that takes it past them, as
    transformers does), the rotation's cos and sin times attention_factor (None: sqrt(1 + ln(factor) /
    ln(original_max_len)), 1 where factor <= 1)."""

    type: Literal["linear", "llama3", "longrope"] = "linear"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only, as the next two
    high_freq_factor: float = 4.0
    original_max_len: int = 8192
    short_factor: tuple[float, ...] = ()  # longrope only, as the next two: a factor per frequency
    long_factor: tuple[float, ...] = ()
    attention_factor: float | None = None

    def __post_init__(self):
        for key in ("short_factor", "long_factor"):  # (a config's lists, kept hashable)
            object.__setattr__(self, key, tuple(float(v) for v in getattr(self, key)))

    @property
    def scale(self) -> float:
        """What longrope multiplies cos and sin by (1 for the others)."""
        if self.type != "longrope":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return 1.0 if self.factor <= 1.0 else math.sqrt(1 + math.log(self.factor) / math.log(self.original_max_len))

    def validate(self) -> None:
        if self.factor <= 0 or (self.type == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor):
            raise ConfigError("model.rope_scaling: factor must be positive, and 0 < low_freq_factor < "
                              "high_freq_factor")
        factors = self.short_factor + self.long_factor
        if self.type == "longrope" and (not self.short_factor or len(self.short_factor) != len(self.long_factor)
                                        or min(factors) <= 0 or self.original_max_len < 1):
            raise ConfigError("model.rope_scaling: longrope needs short_factor and long_factor, positive, one per "
                              "frequency, and original_max_len")


@dataclass
class ModelConfig:
    """Architecture of an encoder-decoder (`seq2seq`) or decoder-only (`lm`) Transformer.

    Names follow "Attention Is All You Need": d_model, n_head, d_ff (the FFN inner size), N layers.
    """

    kind: Literal["seq2seq", "lm"] = "seq2seq"
    src_vocab_size: int = 0  # seq2seq only; filled from the prepared data
    tgt_vocab_size: int = 0  # the output vocabulary (the LM's only vocabulary)
    d_model: int = 512  # the width of every layer's input and output
    n_head: int = 8  # attention heads (d_model / n_head each, unless head_dim says)
    head_dim: int | None = None  # each head's width; None: d_model / n_head (Gemma's and Qwen 3's differ)
    # grouped-query attention: key/value heads, each shared by n_head / n_kv_head query heads (1: multi-query
    # attention); None: n_head (multi-head attention). Shrinks the key/value projections and the decoder's memory
    n_kv_head: int | None = None
    n_encoder_layers: int = 6  # N, the encoder's layers (seq2seq)
    n_decoder_layers: int = 6  # N, the decoder's layers
    d_ff: int = 2048  # the inner size of the position-wise FFN
    dropout: float = 0.1  # on embeddings, sublayer outputs (before the residual add) and inside the FFN
    attn_dropout: float = 0.0  # on the attention weights
    # the FFN's activation. gelu_tanh: GELU's tanh approximation (GPT-2); relu2: ReLU(x)^2 (Primer, modded-nanogpt);
    # silu: x * sigmoid(x), "swish" (classic OPUS-MT); swiglu / geglu: gated, w2(act(w1 x) * w3 x) with SiLU / GELU
    # (Shazeer 2020; three d_model x d_ff matrices)
    # geglu_tanh: GeGLU with GELU's tanh approximation (Gemma)
    activation: Literal["relu", "gelu", "gelu_tanh", "relu2", "silu", "swiglu", "geglu", "geglu_tanh"] = "relu"
    # post: LN(x + sublayer(x)) as in 2017; pre: x + sublayer(LN(x)); sandwich: x + LN'(sublayer(LN(x))), a norm
    # before and after each sublayer (CogView; Gemma 2 and 3)
    norm: Literal["pre", "post", "sandwich"] = "pre"
    rms_norm: bool = False  # RMSNorm (x / rms(x) * g: no mean, no bias; Zhang & Sennrich 2019) for every LayerNorm
    zero_init_residual: bool = False  # attention-out and FFN-out projections start at zero (each block the identity)
    qk_norm: bool = False  # RMSNorm over each head's queries and keys before their product (and before RoPE)
    # fairseq: its sinusoidal table (other frequencies; positions counted from 2), M2M-100's and NLLB's; rope:
    # decoder-only models
    positions: Literal["sinusoidal", "fairseq", "learned", "rope"] = "sinusoidal"
    rope_theta: float = 10000.0  # RoPE's base: pair i of a head turns by pos * rope_theta^(-2i/d_head)
    rope_scaling: RopeScaling | None = None  # RoPE frequencies stretched for long contexts (Llama 3.1+)
    rotary_dim: int | None = None  # RoPE on each head's first rotary_dim dimensions (Phi-4-mini: 3/4); None: all
    # sliding-window attention: a token sees itself and the sliding_window - 1 tokens before it (Mistral 7B v0.1,
    # Gemma); None: every token before it
    sliding_window: int | None = None
    # with sliding_window: every global_every-th layer (the global_every-th, 2 * global_every-th, ...) sees every
    # token before it instead (Gemma 2: 2, Gemma 3: 6); 0: every layer slides
    global_every: int = 0
    rope_local_theta: float | None = None  # RoPE's base on the sliding layers (Gemma 3: 10000); None: rope_theta
    # q.k multiplied by attn_scale before the softmax; None: 1 / sqrt(d_head) (Gemma 2 27B: 1 / sqrt(144), its
    # query_pre_attn_scalar)
    attn_scale: float | None = None
    # soft-capping (Gemma 2): attention scores cap * tanh(score / cap) before the mask and softmax, and the output
    # logits the same with their own cap; None: uncapped. These three: decoder-only models
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # a decoder-only translator's source, and a prompt, seen whole: attention within the prefix runs both ways,
    # causal after it (a prefix LM, Raffel et al. 2020; Wang et al. 2022); False: causal everywhere
    prefix_attention: bool = False
    max_len: int = 1024  # longest sequence (learned positions table / RoPE cache size)
    scale_embedding: bool = True  # multiply token embeddings by sqrt(d_model), as the paper does
    share_embeddings: bool = False  # one embedding table for source and target (needs a joint vocabulary)
    tie_output: bool = True  # output projection = target embedding matrix (Press & Wolf 2017)
    output_bias: bool = False  # a bias on the output projection (Marian models have one: kept on import)
    bias: bool = True  # biases in the linear layers of the stack
    qkv_bias: bool | None = None  # biases on the q, k and v projections alone (Qwen 2); None: as `bias`
    layer_norm_eps: float = 1e-5  # added to the variance (RMSNorm: to the mean square) in every norm

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.n_head

    @property
    def attn_qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    def window(self, layer: int) -> int | None:
        """The attention window of layer `layer` (0-based): sliding_window, or None where it sees every token."""
        if self.sliding_window is None or (self.global_every and (layer + 1) % self.global_every == 0):
            return None
        return self.sliding_window

    @property
    def rope_dim(self) -> int:
        """The dimensions of a head that RoPE turns."""
        return self.rotary_dim or self.d_head

    @property
    def q_scale(self) -> float:
        """What q.k is multiplied by before the softmax."""
        return self.attn_scale if self.attn_scale is not None else self.d_head**-0.5

    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_head, or n_head where it is not set."""
        return self.n_kv_head or self.n_head

    def validate(self) -> None:
        if self.d_model <= 0 or self.n_head <= 0 or self.d_ff <= 0:
            raise ConfigError("model: d_model, n_head and d_ff must be positive")
        if self.head_dim is not None and self.head_dim <= 0:
            raise ConfigError(f"model: head_dim must be positive, got {self.head_dim}")
        if self.head_dim is None and self.d_model % self.n_head:
            raise ConfigError(f"model: d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.n_kv_head is not None and not (0 < self.n_kv_head <= self.n_head and self.n_head % self.n_kv_head == 0):
            raise ConfigError(f"model: n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): each key/value "
                              "head serves the same number of query heads")
        if self.positions == "rope" and self.rope_dim % 2:
            raise ConfigError(f"model: rope needs an even head size (or rotary_dim), got {self.rope_dim}")
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.d_head and self.positions == "rope"):
            raise ConfigError(f"model: rotary_dim ({self.rotary_dim}) is RoPE's share of a head: positive, at most "
                              f"the head's {self.d_head}, with positions rope")
        scaling = self.rope_scaling
        if scaling is not None and scaling.type == "longrope" and len(scaling.short_factor) * 2 != self.rope_dim:
            raise ConfigError(f"model.rope_scaling: longrope has {len(scaling.short_factor)} factors; RoPE turns "
                              f"{self.rope_dim} dimensions, {self.rope_dim // 2} frequencies")
        if self.sliding_window is not None and (self.sliding_window < 1 or self.kind != "lm"):
            raise ConfigError("model: sliding_window must be positive, in a decoder-only model (kind: lm)")
        if self.global_every < 0 or (self.rope_local_theta is not None and self.rope_local_theta <= 0):
            raise ConfigError("model: global_every must not be negative, rope_local_theta must be positive")
        for key in ("attn_scale", "attn_softcap", "final_softcap"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"model: {key} must be positive, got {value}")
        if (self.attn_scale, self.attn_softcap, self.final_softcap) != (None,) * 3 and self.kind != "lm":
            raise ConfigError("model: attn_scale, attn_softcap and final_softcap are for decoder-only models (kind: lm)")
        if self.rope_theta <= 0:
            raise ConfigError(f"model: rope_theta must be positive, got {self.rope_theta}")
        if self.positions == "fairseq" and self.d_model % 2:
            raise ConfigError(f"model: fairseq positions need an even d_model, got {self.d_model}")
        if self.prefix_attention and self.kind != "lm":
            raise ConfigError("model: prefix_attention is for decoder-only models (kind: lm)")
        if self.positions == "rope" and self.kind != "lm":
            raise ConfigError("model: positions 'rope' is for decoder-only models (kind: lm)")
        if self.n_decoder_layers < 1 or (self.kind == "seq2seq" and self.n_encoder_layers < 1):
            raise ConfigError("model: needs at least one layer in each stack")
        if not (0.0 <= self.dropout < 1.0 and 0.0 <= self.attn_dropout < 1.0):
            raise ConfigError("model: dropout must be in [0, 1)")
        if self.max_len < 2:
            raise ConfigError("model: max_len must be at least 2")
        if self.share_embeddings and self.kind == "seq2seq" and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                f"model: share_embeddings needs one joint vocabulary, but source has {self.src_vocab_size} "
                f"and target {self.tgt_vocab_size} tokens; prepare with --joint-vocab or set share_embeddings: false"
            )


# Presets fix the shapes; vocab sizes come from the prepared data. Their table (layers, widths, parameters, what
# each is for) is in docs/training.md, checked against these by the tests. No name here means another shape in
# fairseq: its `transformer_tiny` (4+4 x 128) is what recipes/multi30k-cpu.yaml trains.
PRESETS: dict[str, dict] = {
    # for tests and smoke runs: trains in seconds on a CPU
    "toy": dict(d_model=32, n_head=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0),
    # Multi30k-sized: 6+6 layers, d_model 256 (about 10M parameters plus embeddings)
    "small": dict(d_model=256, n_head=4, n_encoder_layers=6, n_decoder_layers=6, d_ff=1024, dropout=0.1),
    # the 2017 paper's base model
    "base": dict(d_model=512, n_head=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048, dropout=0.1),
    # the 2017 paper's big model
    "big": dict(d_model=1024, n_head=16, n_encoder_layers=6, n_decoder_layers=6, d_ff=4096, dropout=0.3),
    # decoder-only: nanoGPT's shapes
    "lm-toy": dict(kind="lm", d_model=32, n_head=4, n_decoder_layers=2, d_ff=128, dropout=0.0, max_len=256),
    "lm-cpu": dict(kind="lm", d_model=128, n_head=4, n_decoder_layers=4, d_ff=512, dropout=0.0, max_len=64),
    "baby-gpt": dict(kind="lm", d_model=384, n_head=6, n_decoder_layers=6, d_ff=1536, dropout=0.2, max_len=256),
    "gpt2-small": dict(kind="lm", d_model=768, n_head=12, n_decoder_layers=12, d_ff=3072, dropout=0.0, max_len=1024),
}
# names a preset had before: a run saved with one resumes under the new name; given anew, it is refused with the new
# name (`tiny` read as fairseq's transformer_tiny by those who know fairseq)
RENAMED = {"tiny": "toy", "lm-tiny": "lm-toy"}
# the linear layers LoRA can adapt (tfcli/model/lora.py), by their names in tfcli.model.layers.Sublayers: the
# self-attention's fused q, k, v and its output, the cross-attention's, the FFN's
LORA_TARGETS = ("qkv", "self_out", "cross_q", "cross_kv", "cross_out", "w1", "w2", "w3")
_LM_DEFAULTS = dict(
    n_encoder_layers=0, activation="gelu", positions="learned", scale_embedding=False, norm="pre", tie_output=True
)


def renamed_message(name: str) -> str:
    """What a preset's earlier name is now called."""
    return (f"--arch {name} is now {RENAMED[name]} (2+2 layers x 32, for tests); fairseq's transformer_tiny shape "
            "(4+4 x 128) is recipes/multi30k-cpu.yaml's model: section")


def preset(name: str, **overrides) -> ModelConfig:
    """A `ModelConfig` for a named preset, with field overrides."""
    if name in RENAMED:
        raise ConfigError(renamed_message(name))
    if name not in PRESETS:
        raise ConfigError(f"unknown architecture preset '{name}'; choose from: {', '.join(PRESETS)}")
    fields = dict(PRESETS[name])
    if fields.get("kind") == "lm":
        fields = {**_LM_DEFAULTS, **fields}
    fields.update(overrides)
    from tfcli.config import from_dict

    return from_dict(ModelConfig, fields, "model")


def model_config_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(ModelConfig)]
