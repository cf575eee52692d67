"""`tfcli import`: a `transformers` Marian, Pegasus, M2M-100 (M2M-100, NLLB-200) or GPT-2 directory as a tfcli
checkpoint, checked before anything is written (the mapping: `hf`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from tfcli.config import to_dict
from tfcli.data.languages import LANGUAGE_TOKENS, m2m_language_tokens
from tfcli.data.vocab import reorder_vocabulary, vocab_list
from tfcli.errors import ConfigError, TfcliError
from tfcli.interop.hf import (ABSENT_LOGIT, ARCHS, LAYER_NORM_EPS, LLAMA_LAYOUT, ROW_HOLDERS, Arch, _linear_bias,
                              _pairs, _transformers, from_hf_state)
from tfcli.io import refuse_overwriting_inputs
from tfcli.model.config import ModelConfig, RopeScaling
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID

_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                "swish": "silu", "silu": "silu"}


_OPENED = ("config.json", "tokenizer.json", "target_tokenizer.json", "source.spm", "target.spm", "vocab.json",
           "sentencepiece.bpe.model", "tokenizer_config.json")


def _refuse_special_files(hf_dir: Path) -> None:
    """Every file import may open must be a regular file: opening a FIFO blocks (until a writer comes, and signals
    wait with it), and a device (/dev/zero, /dev/urandom) reads forever."""
    import stat

    if not hf_dir.is_dir():
        raise TfcliError(f"{hf_dir}: not a directory")
    for path in [*(hf_dir / n for n in _OPENED), *hf_dir.glob("model*.safetensors")]:
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as e:
            raise TfcliError(f"{path}: cannot read: {e.strerror or e}") from None
        if not stat.S_ISREG(mode):
            raise TfcliError(f"{path}: not a regular file (a pipe, device or directory); refusing to open it")


def _read_config(hf_dir: Path) -> dict:
    path = hf_dir / "config.json"
    if not path.is_file():
        raise TfcliError(f"{hf_dir}: not a Hugging Face model directory (no config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TfcliError(f"{path}: unreadable ({e})") from None
    if not isinstance(config, dict):
        raise TfcliError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


# the integer sizes each kind's config.json must give, and the optional ones
_SIZES = {
    "lm": (("n_embd", "n_head", "n_layer", "n_positions", "vocab_size"), ("n_inner",)),
    "seq2seq": (("d_model", "encoder_attention_heads", "decoder_attention_heads", "encoder_layers", "decoder_layers",
                 "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size"), ("decoder_vocab_size", "max_position_embeddings")),
}
_FLAGS = ("scale_embedding", "tie_word_embeddings", "share_encoder_decoder_embeddings", "layernorm_embedding",
          "scale_attn_weights", "scale_attn_by_inverse_layer_idx")  # the true/false keys tfcli reads
_RATES = {"lm": ("resid_pdrop", "attn_pdrop", "embd_pdrop"), "seq2seq": ("dropout", "attention_dropout")}


def _check_config(config: dict, arch: Arch, hf_dir: Path) -> None:
    """The keys tfcli reads, with the right types and possible values, checked before anything is allocated; an
    error names the key."""
    where = f"{hf_dir / 'config.json'}"
    if arch.name in LLAMA_LAYOUT:
        return _check_llama_config(config, where)
    kind = arch.kind
    _check_sizes_given(config, *_SIZES[kind], where, arch.name)
    for key in _RATES[kind]:
        value = config.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise TfcliError(f"{where}: {key} is {value!r}; expected a probability in [0, 1)")
    for key in _FLAGS:
        if key in config and config[key] is not None and not isinstance(config[key], bool):
            raise TfcliError(f"{where}: {key} is {config[key]!r}; expected true or false")
    if not isinstance(config.get("activation_function", ""), str):
        raise TfcliError(f"{where}: activation_function is {config['activation_function']!r}; expected a name")
    eps = config.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise TfcliError(f"{where}: layer_norm_epsilon is {eps!r}; expected a small positive number")
    if arch.positions == "fairseq" and config.get("pad_token_id") != 1:  # (tfcli's table starts at position 2)
        raise TfcliError(f"{where}: pad_token_id is {config.get('pad_token_id')!r}; M2M-100 numbers its positions "
                         "from <pad> + 1, and tfcli's table of them from fairseq's <pad>, 1")
    d, heads = ("n_embd", "n_head") if kind == "lm" else ("d_model", "encoder_attention_heads")
    if config[d] % config[heads]:
        raise TfcliError(f"{where}: {d} {config[d]} is not divisible by {heads} {config[heads]}")


_FLOATS = ("F16", "BF16", "F32", "F64")


def _weight_headers(hf_dir: Path, arch: Arch) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """name -> (dtype, shape, file) of every tensor in the safetensors files, from their headers alone; integer or
    boolean tensors are refused (weights are floating point)."""
    from safetensors import safe_open

    files = sorted(hf_dir.glob("model*.safetensors"))
    _check_index(hf_dir)
    if not files:
        pickled = [p.name for p in hf_dir.glob("*.bin")]
        hint = (f" ({pickled[0]} is a pickle, which tfcli never loads; write safetensors beside it with transformers: "
                f"python -c \"import transformers as t; t.{arch.auto_class}"
                f".from_pretrained('{hf_dir}').save_pretrained('{hf_dir}', safe_serialization=True)\")"
                if pickled else "")
        raise TfcliError(f"{hf_dir}: no model.safetensors{hint}")
    out: dict[str, tuple[str, tuple[int, ...], Path]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():
                    part = st.get_slice(name)
                    out[name] = (part.get_dtype(), tuple(part.get_shape()), f)
        except Exception as e:  # SafetensorError and OSError alike
            raise TfcliError(f"{f}: unreadable safetensors file ({e})") from None
    for name, (dtype, _, f) in out.items():
        if dtype not in _FLOATS:
            raise TfcliError(f"{f}: tensor {name} is {dtype}; model weights are floating point")
    return out


def _check_index(hf_dir: Path) -> None:
    """A sharded model's index (model.safetensors.index.json): every shard it names is there."""
    index = hf_dir / "model.safetensors.index.json"
    if not index.is_file():
        return
    data = _read_json(index)
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise TfcliError(f"{index}: no weight_map (tensor -> shard file)")
    for shard in sorted(set(map(str, weight_map.values()))):
        if "/" in shard or not (hf_dir / shard).is_file():
            name = next(k for k, v in weight_map.items() if v == shard)
            raise TfcliError(f"{hf_dir / shard}: missing, a shard {index.name} names (for {name} and others); "
                             "download every shard")


def _layer_count(headers: dict, prefix: str) -> int:
    """How many layers the weights hold under `prefix` (e.g. transformer.h.): the distinct layer numbers."""
    return len({name[len(prefix):].split(".", 1)[0] for name in headers if name.startswith(prefix)})


def _check_sizes(config: dict, arch: Arch, headers: dict, hf_dir: Path) -> None:
    """The config's sizes against the weights' own: layer counts, embedding rows and width. Past this, every size
    the model is built with is one the weights file holds, however large the config claims."""
    where = f"{hf_dir / 'config.json'}"
    if arch.name in LLAMA_LAYOUT:
        layers = {"num_hidden_layers": _layer_count(headers, "model.layers.")}
        embedding, rows, width = "model.embed_tokens.weight", "vocab_size", "hidden_size"
    elif arch.kind == "lm":
        layers = {"n_layer": _layer_count(headers, "transformer.h.")}
        embedding, rows, width = "transformer.wte.weight", "vocab_size", "n_embd"
    else:
        layers = {"encoder_layers": _layer_count(headers, "model.encoder.layers."),
                  "decoder_layers": _layer_count(headers, "model.decoder.layers.")}
        embedding = next((n for n in ("model.shared.weight", "model.encoder.embed_tokens.weight") if n in headers),
                         "model.shared.weight")
        rows, width = "vocab_size", "d_model"
    if embedding not in headers:
        raise TfcliError(f"{hf_dir}: the weights lack {embedding}: not a {arch.name} model (model_type "
                         f"'{config.get('model_type')}' in config.json)?")
    for key, found in layers.items():
        if config[key] != found:
            raise TfcliError(f"{where}: {key} is {config[key]}, but the weights hold {found} layers")
    shape = headers[embedding][1]
    if len(shape) != 2 or (shape[0], shape[1]) != (config[rows], config[width]):
        raise TfcliError(f"{where}: {rows} {config[rows]} and {width} {config[width]}, but {embedding} is "
                         f"{'x'.join(map(str, shape))}")


# tensors a transformers file may hold that tfcli computes itself: GPT-2's causal-mask buffers, the sinusoidal
# position tables of Marian, Pegasus and M2M-100
_DERIVED = (".attn.bias", ".attn.masked_bias", "embed_positions.weight", "embed_positions.weights")


def _check_weights(headers: dict, cfg: ModelConfig, arch: Arch, hf_dir: Path) -> None:
    """Every tensor maps onto the model of the config with its exact shape, and none is left over, checked on
    torch's meta device: nothing is allocated before the weights are known to fit."""
    from tfcli.model.transformer import build_model

    meta = {name: torch.empty(shape, device="meta") for name, (_, shape, _) in headers.items()}
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
        state = _hf_state(meta, cfg, arch)
    for name, value in state.items():
        if name in expected and tuple(value.shape) != expected[name]:
            raise TfcliError(f"{hf_dir}: a weight for tfcli's {name} has shape {'x'.join(map(str, value.shape))}, "
                             f"the config.json's sizes give {'x'.join(map(str, expected[name]))}")
    missing = sorted(set(expected) - set(state) - {"lm_head.bias"})
    if missing:
        raise TfcliError(f"{hf_dir}: the weights give nothing for tfcli's {missing[0]}")
    used = {h for _, _, h, _ in _pairs(cfg, arch)} | {"final_logits_bias", "lm_head.weight", "model.shared.weight",
                                                       "model.encoder.embed_tokens.weight",
                                                       "model.decoder.embed_tokens.weight"}
    unused = sorted(n for n in headers if n not in used and not n.endswith(_DERIVED))
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise TfcliError(f"{headers[unused[0]][2]}: tensor {unused[0]}{more} is not part of a {arch.name} model of this "
                         "config.json; refusing to drop weights")


def _arch_of(config: dict, hf_dir: Path) -> Arch:
    kind = config.get("model_type")
    if kind in ARCHS:
        return ARCHS[kind]
    if kind is None:
        if config.get("format") == "tfcli-checkpoint":
            what = "is a tfcli checkpoint already (use it as it is: tfcli translate -m DIR)"
        elif (hf_dir / "model.bin").exists():
            what = "is a CTranslate2 model directory (tfcli exports to CTranslate2, and imports transformers models)"
        else:
            what = "is not a transformers model directory (its config.json has no model_type)"
        raise TfcliError(f"{hf_dir}: {what}; tfcli import takes a Hugging Face transformers directory "
                         f"(save_pretrained) of model_type {', '.join(ARCHS)}")
    raise TfcliError(f"{hf_dir}: model_type '{kind}' cannot be imported; supported: "
                     f"{', '.join(ARCHS)}")


def model_config_from_hf(config: dict, arch: Arch, hf_dir: Path) -> ModelConfig:
    """tfcli's ModelConfig for an HF config (vocabulary sizes as HF has them; biases assumed present)."""
    def need(cond: bool, what: str):
        if not cond:
            raise TfcliError(f"{hf_dir}/config.json: {what}, which tfcli models cannot express")

    if arch.name in LLAMA_LAYOUT:
        cfg = (_gemma_config if arch.name in ("gemma2", "gemma3_text") else _llama_config)(config, arch, need)
        try:
            cfg.validate()
        except ConfigError as e:
            raise TfcliError(f"{hf_dir}/config.json: {e}") from None
        return cfg
    act = config.get("activation_function", "gelu_new" if arch.kind == "lm" else "relu")
    need(act in _ACTIVATIONS, f"activation_function '{act}'")
    if arch.kind == "lm":
        need(config.get("scale_attn_weights", True), "scale_attn_weights false")
        need(not config.get("scale_attn_by_inverse_layer_idx", False), "scale_attn_by_inverse_layer_idx")
        d = config["n_embd"]
        return ModelConfig(
            kind="lm", tgt_vocab_size=config["vocab_size"], d_model=d, n_head=config["n_head"], n_encoder_layers=0,
            n_decoder_layers=config["n_layer"], d_ff=config.get("n_inner") or 4 * d, dropout=config.get("resid_pdrop", 0.0),
            attn_dropout=config.get("attn_pdrop", 0.0), activation=_ACTIVATIONS[act], norm="pre", positions="learned",
            max_len=config["n_positions"], scale_embedding=False, tie_output=config.get("tie_word_embeddings", True),
            layer_norm_eps=config.get("layer_norm_epsilon", 1e-5),
        )
    need(config["encoder_attention_heads"] == config["decoder_attention_heads"], "different encoder/decoder heads")
    need(config["encoder_ffn_dim"] == config["decoder_ffn_dim"], "different encoder/decoder FFN sizes")
    share = True if arch.one_table else config.get("share_encoder_decoder_embeddings", True)
    need(arch.positions != "fairseq" or not config.get("layernorm_embedding", False), "layernorm_embedding")
    src_v = config["vocab_size"]
    return ModelConfig(
        kind="seq2seq", src_vocab_size=src_v, tgt_vocab_size=src_v if share else config.get("decoder_vocab_size") or src_v,
        d_model=config["d_model"], n_head=config["encoder_attention_heads"], n_encoder_layers=config["encoder_layers"],
        n_decoder_layers=config["decoder_layers"], d_ff=config["encoder_ffn_dim"], dropout=config.get("dropout", 0.1),
        attn_dropout=config.get("attention_dropout", 0.0), activation=_ACTIVATIONS[act],
        norm=arch.norm, positions=arch.positions,
        max_len=config.get("max_position_embeddings", 1024), scale_embedding=config.get("scale_embedding", False),
        share_embeddings=share, tie_output=config.get("tie_word_embeddings", True), output_bias=True,
        layer_norm_eps=LAYER_NORM_EPS,
    )


_LLAMA_SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size")
_LLAMA_OPTIONAL = ("num_key_value_heads", "head_dim", "max_position_embeddings")


def _check_sizes_given(config: dict, required: tuple, optional: tuple, where: str, name: str) -> None:
    """Each size key positive integer: every `required` one, and each `optional` one that is not null."""
    for key in required + optional:
        value = config.get(key)
        if value is None and key in optional:
            continue
        if key not in config:
            raise TfcliError(f"{where}: no '{key}', which a {name} config holds")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TfcliError(f"{where}: {key} is {value!r}; expected a positive integer")


_POSITIVE_OR_NULL = ("sliding_window", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping")


def _check_llama_config(config: dict, where: str) -> None:
    """The Llama-layout keys tfcli reads, with the right types: sizes positive integers, the norm's eps and RoPE's
    base positive numbers."""
    _check_sizes_given(config, _LLAMA_SIZES, _LLAMA_OPTIONAL, where, str(config.get("model_type")))
    for key in ("rms_norm_eps", "rope_theta", *_POSITIVE_OR_NULL):
        value = config.get(key, 1e-6)
        if value is None and key in _POSITIVE_OR_NULL:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise TfcliError(f"{where}: {key} is {value!r}; expected a positive number")
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    if heads % kv:
        raise TfcliError(f"{where}: num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    if config.get("head_dim") is None and config["hidden_size"] % heads:
        raise TfcliError(f"{where}: hidden_size {config['hidden_size']} is not divisible by num_attention_heads {heads}")


def _rope(config: dict, need) -> tuple[float, RopeScaling | None]:
    """RoPE's base and scaling, from `rope_theta` and `rope_scaling` (transformers 4) or `rope_parameters` (5)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        theta, scaling = params["rope_theta"], params
    else:
        theta, scaling = config.get("rope_theta", 10000.0), config.get("rope_scaling")
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    kind = "longrope" if kind == "su" else kind  # (Phi-3's first name for it)
    need(kind in ("default", "linear", "llama3", "longrope"), f"rope_scaling of type '{kind}'")
    if kind == "default":
        return float(theta), None
    try:
        if kind == "linear":
            return float(theta), RopeScaling("linear", float(scaling["factor"]))
        if kind == "longrope":
            original = int(scaling.get("original_max_position_embeddings") or config["original_max_position_embeddings"])
            factor = scaling.get("factor") or config.get("max_position_embeddings", original) / original
            attention = scaling.get("attention_factor")
            return float(theta), RopeScaling("longrope", float(factor), original_max_len=original,
                                             short_factor=tuple(scaling["short_factor"]),
                                             long_factor=tuple(scaling["long_factor"]),
                                             attention_factor=None if attention is None else float(attention))
        return float(theta), RopeScaling("llama3", float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                         float(scaling["high_freq_factor"]),
                                         int(scaling["original_max_position_embeddings"]))
    except (KeyError, TypeError, ValueError) as e:
        need(False, f"rope_scaling {scaling!r} ({type(e).__name__}: {e})")


def _rotary_dim(config: dict, need) -> int | None:
    """RoPE's share of a head (`partial_rotary_factor`, at the top or in `rope_parameters`); None: all of it."""
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    factor = config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if factor == 1.0:
        return None
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rotary = int(head_dim * factor)
    need(0 < factor < 1 and rotary > 0 and rotary % 2 == 0, f"partial_rotary_factor {factor} ({rotary} of a head's {head_dim})")
    return rotary


def _llama_config(config: dict, arch: Arch, need) -> ModelConfig:
    """The ModelConfig of a Llama, Mistral, Qwen 2, Qwen 3 or Phi-3 config.json; a value tfcli would have to
    approximate is refused by `need`, naming the key. Mistral's and Phi-3's sliding_window binds on every layer
    (Qwen's only with use_sliding_window, from its max_window_layers-th layer: refused)."""
    name = arch.name
    act = config.get("hidden_act", "silu")
    need(act == "silu", f"hidden_act '{act}' (the Llama layout's gated FFN is SwiGLU: silu)")
    window = config.get("sliding_window") if name in ("mistral", "phi3") else None
    types = set(config.get("layer_types") or ())
    need(types <= {"full_attention"} or (window is not None and types == {"sliding_attention"}),
         f"layer_types {sorted(types)} (full attention on some layers, a sliding window on others)")
    need(not config.get("use_sliding_window", False) or name in ("mistral", "phi3"),
         f"use_sliding_window true with max_window_layers {config.get('max_window_layers')} (a sliding window on "
         "the layers from that one on)")
    attention_bias = bool(config.get("attention_bias", False)) and name != "mistral"
    mlp_bias = bool(config.get("mlp_bias", False)) and name == "llama"  # (the others' FFNs have none)
    need(attention_bias == mlp_bias, f"attention_bias {str(attention_bias).lower()} with mlp_bias "
         f"{str(mlp_bias).lower()} (tfcli's `bias` is the attention output's and the FFN's together)")
    theta, scaling = _rope(config, need)
    rotary = _rotary_dim(config, need)
    need(rotary is None or name == "phi3", f"partial_rotary_factor {config.get('partial_rotary_factor')} in a "
         f"{name} model (its attention turns every dimension)")
    return ModelConfig(
        **_llama_sizes(config), activation="swiglu", norm="pre", qk_norm=name == "qwen3", rope_theta=theta,
        rope_scaling=scaling, max_len=config.get("max_position_embeddings") or 2048, scale_embedding=False,
        tie_output=bool(config.get("tie_word_embeddings", False)), bias=attention_bias,
        qkv_bias=True if name == "qwen2" else None, sliding_window=window, rotary_dim=rotary,
    )


def _llama_sizes(config: dict) -> dict:
    """The ModelConfig fields every Llama-layout config gives alike: sizes, heads, RMSNorm, RoPE."""
    kv = config.get("num_key_value_heads") or config["num_attention_heads"]
    return dict(
        kind="lm", tgt_vocab_size=config["vocab_size"], d_model=config["hidden_size"],
        n_head=config["num_attention_heads"], head_dim=config.get("head_dim"),
        n_kv_head=kv if kv != config["num_attention_heads"] else None, n_encoder_layers=0,
        n_decoder_layers=config["num_hidden_layers"], d_ff=config["intermediate_size"], dropout=0.0,
        attn_dropout=float(config.get("attention_dropout", 0.0)), rms_norm=True, positions="rope",
        layer_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
    )


def _gemma_config(config: dict, arch: Arch, need) -> ModelConfig:
    """The ModelConfig of a Gemma 2 or Gemma 3 text model's config.json: Llama's layout with a norm before and after
    each sublayer, embeddings times sqrt(d_model), GeGLU (tanh), attention scaled by query_pre_attn_scalar^-1/2, a
    sliding window on all but every N-th layer (Gemma 2: every other one), attention scores and logits soft-capped
    where the config says (Gemma 2); Gemma 3 has QK-norm and a RoPE base of its own on the sliding layers."""
    act = config.get("hidden_activation", "gelu_pytorch_tanh")
    need(act == "gelu_pytorch_tanh", f"hidden_activation '{act}'")
    need(not config.get("use_bidirectional_attention", False), "use_bidirectional_attention true")
    need(not config.get("attention_bias", False), "attention_bias true")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    scalar = config.get("query_pre_attn_scalar") or head_dim
    gemma2 = arch.name == "gemma2"
    types = config.get("layer_types") or (  # (Gemma 2's default: every other layer slides, the first one first)
        ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(config["num_hidden_layers"])]
        if gemma2 else [])
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    every = full[0] + 1 if full else 0
    need(all((t == "full_attention") == bool(every and (i + 1) % every == 0) for i, t in enumerate(types)),
         f"layer_types {types} (full attention on other layers than every N-th)")
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "sliding_attention" in params:  # (transformers 5: a RoPE per layer type)
        local = params["sliding_attention"]
        need(local.get("rope_type", "default") == "default", f"rope_parameters.sliding_attention {local}")
        local_theta = local.get("rope_theta", 10000.0)
        config = {**config, "rope_parameters": params.get("full_attention", {})}
    else:
        local_theta = config.get("rope_local_base_freq", 10000.0)
    theta, scaling = _rope(config, need)
    return ModelConfig(
        **_llama_sizes(config), activation="geglu_tanh", norm="sandwich", qk_norm=not gemma2, rope_theta=theta,
        rope_scaling=scaling, sliding_window=config.get("sliding_window"), global_every=every,
        rope_local_theta=None if gemma2 else float(local_theta), max_len=config.get("max_position_embeddings") or 8192,
        scale_embedding=True, tie_output=bool(config.get("tie_word_embeddings", True)), bias=False,
        attn_scale=None if scalar == head_dim else float(scalar) ** -0.5,
        attn_softcap=config.get("attn_logit_softcapping"), final_softcap=config.get("final_logit_softcapping"),
    )


def _read_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(hf_dir.glob("model*.safetensors")):  # (their headers were checked: _weight_headers)
        try:
            out.update(load_file(str(f)))
        except Exception as e:  # SafetensorError and OSError alike
            raise TfcliError(f"{f}: unreadable safetensors file ({e})") from None
    return out


def _tokenizers(hf_dir: Path) -> tuple[tuple[Path, dict], tuple[Path, dict]]:
    """((path, tokenizer.json data) of the source, of the target): tokenizer.json for both (and
    target_tokenizer.json for the target where tfcli's export wrote one), else Marian's source.spm/target.spm with
    vocab.json, or M2M-100's sentencepiece.bpe.model with vocab.json, converted (tfcli/data/spm.py)."""
    def read(path: Path) -> dict:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise TfcliError(f"{path}: unreadable tokenizer ({e})") from None

    src = hf_dir / "tokenizer.json"
    if src.is_file():
        tgt = hf_dir / "target_tokenizer.json"
        tgt = tgt if tgt.is_file() else src
        return (src, _current_format(src, read(src))), (tgt, _current_format(tgt, read(tgt)))
    spm_src, spm_tgt, vocab = hf_dir / "source.spm", hf_dir / "target.spm", hf_dir / "vocab.json"
    if spm_src.is_file() and vocab.is_file():
        from tfcli.data.spm import marian_tokenizer

        pieces = read(vocab)
        spm_tgt = spm_tgt if spm_tgt.is_file() else spm_src
        return (spm_src, marian_tokenizer(spm_src, pieces)), (spm_tgt, marian_tokenizer(spm_tgt, pieces))
    bpe = hf_dir / "sentencepiece.bpe.model"
    if bpe.is_file() and vocab.is_file():
        from tfcli.data.spm import m2m_tokenizer

        data = m2m_tokenizer(bpe, read(vocab), _m2m_appended(hf_dir, read))
        return (bpe, data), (bpe, data)
    raise TfcliError(f"{hf_dir}: no tokenizer.json (nor Marian's source.spm, nor M2M-100's sentencepiece.bpe.model, "
                     "with vocab.json)")


def _current_format(path: Path, data: dict) -> dict:
    """A tokenizer.json as the tokenizers library writes it now: the hub's older files (GPT-2's, from 2020: no
    `model.type`) read and written back by the library."""
    if isinstance(data.get("model"), dict) and "type" in data["model"]:
        return data
    from tokenizers import Tokenizer

    try:
        return json.loads(Tokenizer.from_str(json.dumps(data)).to_str())
    except Exception as e:  # the Rust library's errors are plain Exceptions
        raise TfcliError(f"{path}: not a tokenizer.json the tokenizers library reads ({e})") from None


def _m2m_appended(hf_dir: Path, read) -> list[str]:
    """The tokens M2M100Tokenizer numbers after vocab.json: a token per language of its list (tokenizer_config.json's
    `language_codes`, "m2m100" by default), then its "madeup words"."""
    config_path = hf_dir / "tokenizer_config.json"
    config = read(config_path) if config_path.is_file() else {}
    try:
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES
    except ImportError:
        raise TfcliError(f"{hf_dir}: an M2M-100 tokenizer's language tokens are numbered by transformers' list of "
                         "them: pip install transformers") from None
    which = config.get("language_codes", "m2m100")
    if which not in FAIRSEQ_LANGUAGE_CODES:
        raise TfcliError(f"{config_path}: language_codes '{which}' is none of {', '.join(FAIRSEQ_LANGUAGE_CODES)}")
    madeup = config.get("num_madeup_words", 8)
    return [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES[which]] + [f"madeupword{i:04d}" for i in range(madeup)]


# special role -> the HF config key naming its id (the decoder start is tfcli's <s>)
def _special_ids(config: dict, tok: dict, arch: Arch) -> dict[int, int | None]:
    unk = None
    model = tok.get("model", {})
    vocab = vocab_list(tok)
    unk_token = model.get("unk_token") or ("<unk>" if "<unk>" in vocab else None)
    if model.get("type") == "Unigram" and model.get("unk_id") is not None:
        unk = model["unk_id"]
    elif unk_token in vocab:
        unk = vocab.index(unk_token)
    start = config.get("decoder_start_token_id") if arch.kind == "seq2seq" else config.get("bos_token_id")
    eos = config.get("eos_token_id")
    if isinstance(eos, list):  # (Llama 3's three: the first at </s>, the others the text conventions' `ends`)
        eos = eos[0] if eos else None
    return {PAD_ID: config.get("pad_token_id"), BOS_ID: start, EOS_ID: eos, UNK_ID: unk}


def _rows(w: torch.Tensor, order: list[int]) -> torch.Tensor:
    order_t = torch.tensor(order)
    out = w[order_t.clamp(min=0)]
    out[order_t < 0] = 0.0
    return out


def _output_bias(b: torch.Tensor | None, order: list[int]) -> torch.Tensor:
    """HF's output bias in tfcli's order; a row the model lacks, or a second copy of a row (Marian's decoder start
    is its <pad>), gets ABSENT_LOGIT, so the softmax over the model's own tokens is unchanged. (The ordinary
    tokens' rows are each one of their own: only the specials can repeat a row.)"""
    out = torch.full((len(order),), ABSENT_LOGIT)
    n = len(SPECIAL_TOKENS)
    rest = torch.tensor(order[n:], dtype=torch.long)
    out[n:] = b[rest] if b is not None else 0.0
    seen = set()
    for i in ROW_HOLDERS:
        h = order[i]
        if h >= 0 and h not in seen:
            out[i] = b[h] if b is not None else 0.0
            seen.add(h)
    return out


def import_model(hf_dir: str | Path, out: str | Path, force: bool = False) -> dict:
    """`tfcli import`: a local `transformers` Marian, Pegasus or GPT-2 directory (or a hub name, for users online)
    -> a tfcli checkpoint directory that translate/lm-generate/eval/attention use. Returns a summary."""
    import dataclasses

    from tfcli.checkpoint import build_empty

    hf_dir = _local(hf_dir)
    out = Path(out)
    refuse_overwriting_inputs([out], [hf_dir], "choose another -o")
    if out.exists() and not force:
        raise TfcliError(f"{out}: already exists; pass --force to replace it, or choose another -o")
    _refuse_special_files(hf_dir)
    config = _read_config(hf_dir)
    arch = _arch_of(config, hf_dir)
    _check_config(config, arch, hf_dir)
    headers = _weight_headers(hf_dir, arch)  # names, dtypes and shapes, read before any tensor is
    _check_sizes(config, arch, headers, hf_dir)
    cfg = model_config_from_hf(config, arch, hf_dir)
    published = arch.name in LLAMA_LAYOUT  # its biases as its config says (the others': zeros are none)
    cfg_in = cfg if published else dataclasses.replace(cfg, bias=True)
    _check_weights(headers, cfg_in, arch, hf_dir)  # every tensor used, every shape right, on the meta device
    toks, orders, text = _tfcli_vocabularies(hf_dir, config, arch, cfg)
    weights = _read_weights(hf_dir)
    state = _hf_state(weights, cfg_in, arch)
    del weights
    tgt_order = orders["tgt"]
    bias = _reordered(state, cfg, orders)
    linear_biases = [k for k in state if _linear_bias(k)]
    cfg = dataclasses.replace(
        cfg, src_vocab_size=len(orders["src"]) if "src" in orders else 0, tgt_vocab_size=len(tgt_order),
        bias=cfg.bias if published else any(bool(state[k].any()) for k in linear_biases),
        output_bias=bool(bias.any()),
    )
    if "tfcli_model" in config:  # a tfcli export: its own config, which the weights must fit
        cfg = _saved_config(config["tfcli_model"], cfg, hf_dir)
    if cfg.output_bias:
        state["lm_head.bias"] = bias
    if not cfg.bias and not published:
        for k in linear_biases:
            del state[k]
    model = build_empty(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise TfcliError(f"{hf_dir}: the weights do not fit a {arch.name} model of its config.json "
                         f"({str(e).strip().splitlines()[-1].strip()})") from None

    _save(out, model, cfg, toks, hf_dir, arch, text)
    return {"arch": arch.name, "kind": cfg.kind, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab": {side: len(o) for side, o in orders.items()}}


def _tfcli_vocabularies(hf_dir: Path, config: dict, arch, cfg: ModelConfig) -> tuple[dict, dict, dict | None]:
    """Each side's tokenizer renumbered with tfcli's special tokens first, and its order (`reorder_vocabulary`),
    after checking that it fits the embedding rows; for a published language model, its text conventions
    (`_text_conventions`), else None."""
    published = arch.name in LLAMA_LAYOUT
    if published:
        path, data, family = _family_tokenizer(hf_dir)
        src = tgt = (path, data)
    else:
        src, tgt = _tokenizers(hf_dir)
    sides = {"tgt": tgt} if cfg.kind == "lm" else {"src": src, "tgt": tgt}
    if published:  # (Gemma 3's tokenizer names one token past its embedding rows: no text can use it here)
        data = _within_rows(data, cfg.tgt_vocab_size)
        sides = {"tgt": (path, data)}
    for side, (path, data) in sides.items():
        rows = cfg.src_vocab_size if side == "src" else cfg.tgt_vocab_size
        if len(vocab_list(data)) > rows:
            raise TfcliError(f"{path}: {len(vocab_list(data))} tokens, more than the {rows} embedding rows of the "
                             "model's config.json; this tokenizer does not belong to these weights")
    toks, orders = {}, {}
    for side, (_, data) in sides.items():
        special = _special_ids(config, data, arch)
        if published:
            toks[side], orders[side] = reorder_vocabulary(data, special, cfg.tgt_vocab_size, keep_names=True)
        else:
            toks[side], orders[side] = reorder_vocabulary(data, special)
    if cfg.kind == "seq2seq" and cfg.share_embeddings and orders["src"] != orders["tgt"]:
        raise TfcliError(f"{hf_dir}: shared embeddings, but the source and target tokenizers number tokens differently")
    text = _text_conventions(hf_dir, config, family, orders["tgt"]) if published else None
    return toks, orders, text and {**text, "family": arch.name, "family_ids": orders["tgt"][: len(SPECIAL_TOKENS)]}


def _within_rows(data: dict, rows: int) -> dict:
    """The tokenizer without the added tokens numbered past the model's embedding rows (which transformers cannot
    embed either)."""
    added = data.get("added_tokens", [])
    if all(a["id"] < rows for a in added):
        return data
    return {**data, "added_tokens": [a for a in added if a["id"] < rows]}


def _family_tokenizer(hf_dir: Path):
    """(path, tokenizer.json data, transformers' tokenizer) of a published language model, as transformers builds
    it from the directory's files (tokenizer.json, or vocab.json + merges.txt, tokenizer_config.json): the
    tokenizer its users compare with, special tokens and all."""
    tr = _transformers()
    try:
        family = tr.AutoTokenizer.from_pretrained(str(hf_dir))
    except Exception as e:  # transformers' own errors name the file
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TfcliError(f"{hf_dir}: transformers cannot read its tokenizer ({first})") from None
    backend = getattr(family, "backend_tokenizer", None)
    if backend is None:
        raise TfcliError(f"{hf_dir}: its tokenizer ({type(family).__name__}) has no tokenizers backend to import")
    path = hf_dir / "tokenizer.json" if (hf_dir / "tokenizer.json").is_file() else hf_dir / "tokenizer_config.json"
    return path, json.loads(backend.to_str()), family


def _text_conventions(hf_dir: Path, config: dict, family, order: list[int]) -> dict:
    """What an imported language model's text needs, in tfcli ids: the ids its tokenizer puts before a text
    (`start`: BOS or none), its end tokens besides the one at </s> (`ends`: config.json's and
    generation_config.json's eos_token_id lists), special tokens written in a text read as those tokens, its chat
    template, and generation_config.json's sampling defaults."""
    where = {h: i for i, h in reversed(list(enumerate(order)))}  # HF id -> tfcli id (the first, if twice)
    plain = family("a", add_special_tokens=False)["input_ids"]
    full = family("a")["input_ids"]
    start = [where[h] for h in full[: full.index(plain[0])]] if plain and plain[0] in full else []
    generation = _read_json(hf_dir / "generation_config.json")
    ends = []
    for value in (config.get("eos_token_id"), generation.get("eos_token_id")):
        for h in value if isinstance(value, list) else [value] if value is not None else []:
            if h in where and where[h] not in ends:
                ends.append(where[h])
    ends = [i for i in ends if i != EOS_ID]
    sampling = {k: generation[k] for k in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
                if generation.get(k) is not None}
    template = getattr(family, "chat_template", None)
    tokens = {k: v for k, v in family.special_tokens_map.items() if isinstance(v, str)}  # (what templates read)
    return {"start": start, "ends": ends, "specials_in_text": True,
            "chat_template": template if isinstance(template, str) else None, "template_tokens": tokens,
            "generation": sampling}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise TfcliError(f"{path}: unreadable ({e})") from None
    return data if isinstance(data, dict) else {}


def _save(out: Path, model, cfg: ModelConfig, toks: dict, hf_dir: Path, arch, text: dict | None = None) -> None:
    """The imported model and its tokenizers as a tfcli checkpoint (a new directory, or with --force one swapped in
    whole); `text`: a published language model's text conventions (meta "text", tfcli.checkpoint_meta)."""
    import tempfile

    from tfcli import checkpoint
    from tfcli.data.tokenizer import load_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for side, data in toks.items():
            files[side] = Path(tmp) / f"tokenizer.{side}.json"
            files[side].write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
            load_tokenizer(files[side], any_names=text is not None)  # tfcli's own check of the specials
        meta = {"model": to_dict(cfg), "step": 0, "imported_from": {"path": str(hf_dir), "model_type": arch.name}}
        if text is not None:
            meta["text"] = text
        if arch.language_tokens:  # the source's language first in the source, the target's forced first
            meta[LANGUAGE_TOKENS] = m2m_language_tokens(toks["src"])
        if arch.on_sentences:  # OPUS-MT, M2M-100 and NLLB: translate's --split-sentences auto splits every line
            meta["data"] = {"trained_on": "sentences"}  # of several sentences
        checkpoint.save(out, model, meta, files)


def _reordered(state: dict, cfg: ModelConfig, orders: dict[str, list[int]]) -> torch.Tensor:
    """Move the embedding and output rows of `state` (in place) to follow their tokens into tfcli's order; returns
    the output bias in that order (`_output_bias`)."""
    tgt_order = orders["tgt"]
    hf_bias = state.pop("lm_head.bias", None)
    if cfg.kind == "seq2seq":
        state["encoder.embed.tok.weight"] = _rows(state["encoder.embed.tok.weight"], orders["src"])
        if not cfg.share_embeddings:
            state["decoder.embed.tok.weight"] = _rows(state["decoder.embed.tok.weight"], tgt_order)
        else:
            state["decoder.embed.tok.weight"] = state["encoder.embed.tok.weight"]
    else:
        state["decoder.embed.tok.weight"] = _rows(state["decoder.embed.tok.weight"], tgt_order)
    state["lm_head.weight"] = (state["decoder.embed.tok.weight"] if cfg.tie_output
                               else _rows(state["lm_head.weight"], tgt_order))
    return _output_bias(hf_bias, tgt_order)


def _saved_config(saved: dict, derived: ModelConfig, hf_dir: Path) -> ModelConfig:
    from tfcli.config import from_dict

    try:
        cfg = from_dict(ModelConfig, saved, "tfcli_model")
    except Exception as e:
        raise TfcliError(f"{hf_dir}/config.json: bad tfcli_model entry ({e})") from None
    shape = ("kind", "src_vocab_size", "tgt_vocab_size", "d_model", "n_head", "n_encoder_layers", "n_decoder_layers",
             "d_ff", "norm", "share_embeddings", "tie_output")
    differ = [k for k in shape if getattr(cfg, k) != getattr(derived, k)]
    if differ:
        raise TfcliError(f"{hf_dir}/config.json: its tfcli_model entry does not match the model ({differ[0]})")
    return cfg


def _hf_state(weights: dict, cfg: ModelConfig, arch: Arch) -> dict:
    """from_hf_state; for a translation model, final_logits_bias is the output bias (zeros if absent)."""
    if arch.kind == "lm":
        return from_hf_state(weights, cfg, arch)
    if "final_logits_bias" not in weights:
        weights = {**weights, "final_logits_bias": torch.zeros(1, cfg.tgt_vocab_size)}
    if "model.shared.weight" not in weights and cfg.share_embeddings:
        weights = {**weights, "model.shared.weight": weights["model.encoder.embed_tokens.weight"]}
    if not cfg.tie_output and "lm_head.weight" not in weights:
        raise TfcliError("the Hugging Face weights lack lm_head.weight (tie_word_embeddings is false)")
    return from_hf_state(weights, cfg, arch)


def _local(name: str | Path) -> Path:
    """A local directory, or a hub name downloaded with huggingface_hub (for users online)."""
    path = Path(name)
    if path.exists():
        return path
    if "/" in str(name) and not str(name).startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(str(name), allow_patterns=["*.json", "*.safetensors", "*.spm", "*.model"]))
        except ImportError:
            raise TfcliError(f"{name}: not a local directory, and huggingface_hub is not installed") from None
        except Exception as e:
            raise TfcliError(f"{name}: not a local directory, and the hub download failed ({type(e).__name__})") from None
    raise TfcliError(f"{name}: no such directory")
