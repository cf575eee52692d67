"""Which way a model's decoder steps: chosen here, once per `StepModel`, from the model's config, the device, the
weights' dtype and the shape mode. tfcli.generate.step keeps the decoder's state (slots, masks, select, admit) and
builds what the `Plan` names; nothing else decides.

The backends, each a way to run part of a step (docs/architecture.md has this table with the conditions):
    eager        torch operators over the model's `Sublayers`: linear layers on oneDNN's pre-packed weights (fp32 on
                 the CPU, where torch has them) or F.linear, attention by torch. It implements every field: the
                 reference the others are held to (tests/test_backends.py, against the model's full forward).
    rows         the decoder's linear layers and the output layer on rows.c's row kernel (fp32 CPU, packing asked)
    c_attention  attention, the encoder's and the step's, on rows.c's attend_rows (fp32 CPU, shrinking shapes,
                 d_head a multiple of 8: its register tiles)
    whole        every layer of a step in one call of rows.c's decode_layers (where rows and c_attention run)
    int8         every linear layer in int8 (tfcli.generate.int8; the CPU)
    static       fixed shapes for the batch (StepModel's StaticDecoder: continuous batching; on CUDA one graph)

`IMPLEMENTS` says, for every ModelConfig field, which values each backend implements (ANY: all). A backend runs a
model only if it declares every field of the model's config with the model's value: a field it does not list (a
new one), or a value outside its set, sends its part of the step to the next way down (whole -> rows op by op ->
eager; int8 -> eager in fp32, with a warning; c_attention -> torch's attention; static -> shrinking shapes), never
to an approximation.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

import torch

from tfcli.device import onednn_available
from tfcli.generate import native

ANY = None  # every value of the field

BACKENDS = ("rows", "c_attention", "whole", "int8", "static")  # (eager: the fallback, always there)
_EVERY = dict.fromkeys(BACKENDS, ANY)

# field -> {backend: the values it implements, or ANY}. A backend missing from a row does not implement the field.
IMPLEMENTS: dict[str, dict[str, frozenset | None]] = {
    # sizes, read from the weights' shapes
    "kind": _EVERY,
    "src_vocab_size": _EVERY,
    "tgt_vocab_size": _EVERY,
    "d_model": _EVERY,
    "n_head": _EVERY,
    "head_dim": dict(_EVERY, whole=frozenset({None})),  # decode_layers' scratch assumes n_head * d_head = d_model
    "n_kv_head": _EVERY,  # grouped-query attention: rows.c's attend_rows shares heads
    "n_encoder_layers": _EVERY,
    "n_decoder_layers": _EVERY,
    "d_ff": _EVERY,
    "max_len": _EVERY,
    # training only: a step runs the model in eval mode
    "dropout": _EVERY,
    "attn_dropout": _EVERY,
    "zero_init_residual": _EVERY,
    # the layer's arithmetic
    "activation": dict(_EVERY, whole=frozenset({"relu", "relu2", "gelu", "silu"})),  # rows.c's linear_t.act
    "norm": dict(_EVERY, whole=frozenset({"pre", "post"})),  # RowLinear norms its input or its output rows
    "rms_norm": dict(_EVERY, whole=frozenset({False})),  # rows.c folds LayerNorm into the linear layers
    "qk_norm": _EVERY,  # decode_layers: the RMSNorm gains in its call
    "positions": dict(_EVERY, whole=frozenset({"sinusoidal", "fairseq", "learned"})),  # added before the layers; no RoPE
    "rope_theta": _EVERY,  # RoPE's tables are torch's, before the attention
    "rope_scaling": _EVERY,
    "rotary_dim": _EVERY,
    "rope_local_theta": _EVERY,
    # a bias by layer over the slots; the ring of fixed shapes (static) would need the slots' positions
    "sliding_window": dict(_EVERY, static=frozenset({None}), whole=frozenset({None})),
    "global_every": _EVERY,
    "attn_scale": _EVERY,  # the scale every attention kernel takes
    "attn_softcap": dict(_EVERY, c_attention=frozenset({None}), whole=frozenset({None})),  # torch's attention caps
    "final_softcap": _EVERY,  # on the logits, after the output layer
    "prefix_attention": _EVERY,  # the prefill's bias (IncrementalDecoder.prefill): what every backend reads
    "scale_embedding": _EVERY,  # the embedding and the output layer run outside the layers
    "share_embeddings": _EVERY,
    "tie_output": _EVERY,
    "output_bias": _EVERY,
    "bias": _EVERY,  # RowLinear and decode_layers take a bias or none
    "qkv_bias": dict(_EVERY, whole=frozenset({None})),
    "layer_norm_eps": _EVERY,
}


def unimplemented(backend: str, cfg) -> list[str]:
    """The fields of `cfg` (a ModelConfig) whose value `backend` does not implement, as "field=value"."""
    out = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        row = IMPLEMENTS.get(f.name, {})
        if backend not in row or (row[backend] is not ANY and value not in row[backend]):
            out.append(f"{f.name}={value!r}")
    return out


@dataclass(frozen=True)
class Plan:
    """How a StepModel runs (`choose`)."""

    linear: str  # the decoder's linear layers and the output layer: "rows", "int8", "packed" or "plain"
    encoder: str  # the encoder: "int8", "packed" (its layers through the step's linear layers), or "model" (its own)
    attention: str  # "c" (rows.c's attend_rows) or "torch"
    whole: bool  # every layer of a step in one call of rows.c's decode_layers
    static: bool  # fixed shapes (StaticDecoder)
    declined: tuple[str, ...] = ()  # "backend: field=value, ..." for each backend the config kept from running

    def describe(self) -> str:
        step = "decode_layers" if self.whole else f"{self.linear} linear layers, {self.attention} attention"
        return f"{step}{', fixed shapes' if self.static else ''}; encoder {self.encoder}"


def choose(cfg, device: torch.device, dtype: torch.dtype, pack: bool = False, int8: bool = False,
           static: bool | None = None, allow: tuple[str, ...] = BACKENDS) -> Plan:
    """The Plan for a model of config `cfg` whose weights are on `device` in `dtype`. `pack`: fp32 linear layers
    on the CPU may be pre-packed (oneDNN) and run on rows.c; `int8`: the linear layers in int8; `static`: fixed
    shapes (None: on CUDA). `allow`: the backends that may run (tests hold each to the eager path)."""
    declined = []

    def runs(backend: str, wanted: bool) -> bool:
        if not wanted or backend not in allow:
            return False
        missing = unimplemented(backend, cfg)
        if missing:
            declined.append(f"{backend}: {', '.join(missing)}")
        return not missing

    fp32_cpu = device.type == "cpu" and dtype == torch.float32
    static = runs("static", device.type == "cuda" if static is None else static)
    if int8 and not runs("int8", True):
        if declined:
            warnings.warn(f"--dtype int8 is not implemented for this model ({declined[-1]}): decoding in fp32",
                          RuntimeWarning, 2)
        int8 = False
    packed = not int8 and pack and fp32_cpu and onednn_available()
    rows = runs("rows", packed and native.fp32_kernel() is not None)
    c = runs("c_attention", fp32_cpu and not static and cfg.d_head % 8 == 0 and native.attention_kernel() is not None)
    whole = runs("whole", rows and c)
    return Plan(linear="int8" if int8 else "rows" if rows else "packed" if packed else "plain",
                encoder="int8" if int8 else "packed" if packed else "model", attention="c" if c else "torch",
                whole=whole, static=static, declined=tuple(declined))
