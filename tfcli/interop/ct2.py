"""tfcli -> CTranslate2, through CTranslate2's own model specs (`specs.TransformerSpec`,
`specs.TransformerDecoderModelSpec`) and its `converters.Converter` (validation, quantisation, saving).

Every tfcli configuration maps onto the spec: pre-/post-norm (`pre_norm`), sinusoidal or learned positions (the
table is written into the model, so tfcli's interleaved sin/cos layout is kept as it is), RoPE for language models
(`rotary_dim=0`, halves rotated: `rotary_interleave=False`; an imported family's theta, llama3 or linear scaling,
head width and sliding window), ReLU/GELU, gated FFNs (SwiGLU, GeGLU: `ffn_glu`),
LayerNorm or RMSNorm (`rms_norm`), scaled or unscaled embeddings, shared or separate embeddings, tied or separate
output projection, with or without biases, QK-norm (language models). ReLU^2 has no CTranslate2 activation, and
its translation models' cross-attention has no per-head QK-norm: both refused.

CTranslate2 reads token strings: the vocabularies are the tokenizers' tokens in id order, and the tokenizer files
are copied beside the model. A source gets </s> appended by CTranslate2 (`add_source_eos`), as tfcli does; the
decoder starts from <s>; a language model's text starts after </s>, as in tfcli's training streams (an imported
family's after its own start, BOS or none: the Generator's caller gives the prompt's tokens, and the config names the
family's own tokens at tfcli's special ids).
"""

from __future__ import annotations

import torch

from tfcli.errors import TfcliError
from tfcli.generate.alignment import default_layer
from tfcli.model.config import ModelConfig
from tfcli.model.layers import GATED
from tfcli.model.norm import RMSNorm
from tfcli.model.positional import sinusoidal_table
from tfcli.specials import BOS_ID, EOS_ID, UNK_ID

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")
SINUSOIDAL_ROWS = 1024  # rows of the position table written for sinusoidal models (CTranslate2 needs a fixed table)


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise TfcliError("--to ctranslate2 needs the ctranslate2 package: pip install ctranslate2") from None
    return ctranslate2


def vocabulary(tok) -> list[str]:
    """The tokenizer's tokens in id order."""
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [""] * len(vocab)
    for token, i in vocab.items():
        tokens[i] = token
    return tokens


def _np(t: torch.Tensor):
    return t.detach().to(torch.float32).cpu().contiguous().numpy()


def _linear(spec, linear: torch.nn.Linear) -> None:
    spec.weight = _np(linear.weight)
    if linear.bias is not None:
        spec.bias = _np(linear.bias)


def _norm(spec, norm: torch.nn.Module) -> None:
    spec.gamma = _np(norm.weight)
    if not isinstance(norm, RMSNorm):
        spec.beta = _np(norm.bias)


def _positions(spec, embed, cfg: ModelConfig) -> None:
    spec.scale_embeddings = cfg.scale_embedding
    if cfg.positions in ("sinusoidal", "fairseq"):
        rows = max(cfg.max_len, SINUSOIDAL_ROWS)
        spec.position_encodings.encodings = _np(sinusoidal_table(rows, cfg.d_model, cfg.positions))
    elif cfg.positions == "learned":
        spec.position_encodings.encodings = _np(embed.pos.emb.weight)


def _ffn(spec, layer) -> None:
    _norm(spec.layer_norm, layer.res_ffn.norm)
    _linear(spec.linear_0, layer.ffn.w1)  # gated: act(linear_0 x) * linear_0_noact x
    if layer.ffn.w3 is not None:
        _linear(spec.linear_0_noact, layer.ffn.w3)
    _linear(spec.linear_1, layer.ffn.w2)


def _self_attention(spec, attn, norm) -> None:
    _linear(spec.linear[0], attn.qkv_proj)  # q, k, v stacked, as CTranslate2 fuses them
    _linear(spec.linear[1], attn.out_proj)
    _norm(spec.layer_norm, norm)
    if attn.q_norm is not None:  # QK-norm: CTranslate2's q_norm/k_norm are RMSNorms, before the rotation
        _norm(spec.q_norm, attn.q_norm)
        _norm(spec.k_norm, attn.k_norm)


def _decoder(spec, decoder, lm_head, cross: bool) -> None:
    spec.embeddings.weight = _np(decoder.embed.tok.weight)
    _linear(spec.projection, lm_head)
    if hasattr(spec, "layer_norm"):
        _norm(spec.layer_norm, decoder.norm)
    for s, layer in zip(spec.layer, decoder.layers):
        _self_attention(s.self_attention, layer.self_attn, layer.res_self.norm)
        if cross:
            c = layer.cross_attn
            _linear(s.attention.linear[0], c.q_proj)
            _linear(s.attention.linear[1], c.kv_proj)  # k, v stacked
            _linear(s.attention.linear[2], c.out_proj)
            _norm(s.attention.layer_norm, layer.res_cross.norm)
        _ffn(s.ffn, layer)


def _activation(cfg: ModelConfig, common_spec):
    """CTranslate2's activation for `cfg`, or a one-line error naming what CTranslate2 cannot hold."""
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,
                  "gelu_tanh": common_spec.Activation.GELUTanh, "silu": common_spec.Activation.SWISH,
                  "swiglu": common_spec.Activation.SWISH,
                  "geglu": common_spec.Activation.GELU}.get(cfg.activation)
    if cfg.prefix_attention:
        raise TfcliError("--to ctranslate2: model.prefix_attention true is not supported (its Generator attends "
                         "causally everywhere)")
    if cfg.norm == "sandwich" or cfg.global_every:
        raise TfcliError("--to ctranslate2: Gemma's layout (model.norm sandwich, model.global_every) is not "
                         "supported by this export; CTranslate2's own converter reads the Hugging Face model")
    if cfg.rope_scaling is not None and cfg.rope_scaling.type == "longrope":
        raise TfcliError("--to ctranslate2: model.rope_scaling longrope is not supported by this export; "
                         "CTranslate2's own converter reads the Hugging Face model")
    for key in ("attn_scale", "attn_softcap", "final_softcap"):
        if getattr(cfg, key) is not None:
            raise TfcliError(f"--to ctranslate2: model.{key} {getattr(cfg, key)} is not supported by this export "
                             "(its spec scales attention by 1/sqrt(head width) and caps nothing)")
    if activation is None:
        raise TfcliError(f"--to ctranslate2: model.activation {cfg.activation} is not supported (CTranslate2 has no "
                         "such activation, nor has --to hf); a model to export trains with relu, gelu, silu, swiglu "
                         "or geglu")
    if cfg.qk_norm and cfg.kind == "seq2seq":
        # its spec takes qk_norm, but its cross-attention normalises each query over the whole width, not per head
        raise TfcliError("--to ctranslate2: model.qk_norm true is not supported for translation models (CTranslate2's "
                         "cross-attention has no per-head QK-norm); train with --set model.qk_norm=false to export")
    return activation


def build_spec(model, cfg: ModelConfig, src_tok, tgt_tok):
    """The CTranslate2 spec holding `model`'s weights (float32; the converter quantises)."""
    _ctranslate2()  # a clear error where it is missing
    from ctranslate2.specs import common_spec, transformer_spec

    activation = _activation(cfg, common_spec)
    tokens = vocabulary(tgt_tok)  # (an imported family's own names of tfcli's special ids: <|eot_id|>, ...)
    pre = cfg.norm == "pre"
    options = dict(pre_norm=pre, activation=activation, ffn_glu=cfg.activation in GATED, rms_norm=cfg.rms_norm)
    if cfg.n_kv_head is not None:  # grouped-query attention; [q; k; v] fused as CTranslate2 reads them
        options["num_heads_kv"] = cfg.kv_heads
    with torch.no_grad():
        if cfg.kind == "seq2seq":
            spec = transformer_spec.TransformerSpec(
                transformer_spec.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_head, **options),
                # return_attention gives what `tfcli translate --alignment` aligns with by default: the
                # penultimate decoder layer's cross-attention, every head averaged
                transformer_spec.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_head, **options,
                                                        alignment_layer=default_layer(cfg.n_decoder_layers) - 1,
                                                        alignment_heads=cfg.n_head),
            )
            enc = model.encoder
            spec.encoder.embeddings[0].weight = _np(enc.embed.tok.weight)
            _positions(spec.encoder, enc.embed, cfg)
            if pre:
                _norm(spec.encoder.layer_norm, enc.norm)
            for s, layer in zip(spec.encoder.layer, enc.layers):
                _self_attention(s.self_attention, layer.self_attn, layer.res_attn.norm)
                _ffn(s.ffn, layer)
            _positions(spec.decoder, model.decoder.embed, cfg)
            _decoder(spec.decoder, model.decoder, model.lm_head, cross=True)
            spec.config.add_source_eos = True  # tfcli's sources end with </s>
            spec.config.decoder_start_token = "<s>"
            spec.register_source_vocabulary(vocabulary(src_tok))
            spec.register_target_vocabulary(tokens)
        else:
            spec = _decoder_model_spec(model, cfg, options, transformer_spec)
            spec.register_vocabulary(tokens)
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = tokens[UNK_ID], tokens[BOS_ID], tokens[EOS_ID]
    return spec


def _decoder_model_spec(model, cfg: ModelConfig, options: dict, transformer_spec):
    """A language model's Generator spec: RoPE with its theta, llama3 or linear scaling, head width and sliding
    window as the imported families have them (Llama, Mistral, Qwen 2 and 3; Gemma's layout is refused in
    `_activation`)."""
    from ctranslate2.specs import attention_spec

    rope = cfg.positions == "rope"
    if rope:
        options.update(rotary_dim=cfg.rotary_dim or 0, rotary_interleave=False, rotary_base=cfg.rope_theta)
        if cfg.rope_scaling is not None:
            kind = {"linear": attention_spec.RotaryScalingType.Linear,
                    "llama3": attention_spec.RotaryScalingType.Llama3}[cfg.rope_scaling.type]
            options.update(rotary_scaling_type=kind, rotary_scaling_factor=cfg.rope_scaling.factor)
            if cfg.rope_scaling.type == "llama3":
                options["original_max_position_embeddings"] = cfg.rope_scaling.original_max_len
    if cfg.head_dim is not None:
        options["head_dim"] = cfg.head_dim
    if cfg.sliding_window is not None:
        options["sliding_window"] = cfg.sliding_window
    spec = transformer_spec.TransformerDecoderModelSpec.from_config(
        cfg.n_decoder_layers, cfg.n_head, **options, no_final_norm=cfg.norm != "pre", qk_norm=cfg.qk_norm)
    if rope and cfg.rope_scaling is not None and cfg.rope_scaling.type == "llama3":
        for layer in spec.decoder.layer:
            layer.self_attention.rotary_low_freq_factor = cfg.rope_scaling.low_freq_factor
            layer.self_attention.rotary_high_freq_factor = cfg.rope_scaling.high_freq_factor
    if not rope:
        _positions(spec.decoder, model.decoder.embed, cfg)
    else:
        spec.decoder.scale_embeddings = cfg.scale_embedding
    _decoder(spec.decoder, model.decoder, model.lm_head, cross=False)
    return spec


def convert(model, cfg: ModelConfig, src_tok, tgt_tok, out_dir: str, quantization: str | None) -> None:
    """Validate, quantise and save the spec into `out_dir` (which the caller renames into place)."""
    ct2 = _ctranslate2()
    spec = build_spec(model, cfg, src_tok, tgt_tok)

    class _Converter(ct2.converters.Converter):
        def _load(self):
            return spec

    _Converter().convert(out_dir, quantization=quantization, force=True)
