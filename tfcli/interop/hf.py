"""tfcli <-> Hugging Face `transformers`: one weight mapping, used in both directions.

    tfcli model                                      transformers class
    seq2seq, post-norm, sinusoidal positions         MarianMTModel  (shared or separate embeddings)
    seq2seq, pre-norm, sinusoidal, shared embeddings PegasusForConditionalGeneration (M2M100's pre-norm layout, with
                                                     Marian's sinusoids; M2M100's own table differs from the paper's)
    lm, pre-norm, learned positions, no scaling      GPT2LMHeadModel

Marian's and Pegasus' sinusoidal tables hold the sines in the first half of the model dimension and the cosines in
the second, where tfcli (as the paper) interleaves them. Permuting the model dimension the same way in every weight
that reads or writes the residual stream (embeddings, LayerNorms, the input columns of q/k/v/FFN-in, the output
rows of attention-out/FFN-out) turns one network into the other exactly: LayerNorm and the residual additions do
not care about the order of the dimensions. GPT-2 needs no permutation; its Conv1D weights are transposed.

tfcli's special tokens have fixed ids (<pad>=0, <s>=1, </s>=2, <unk>=3). A model whose vocabulary puts them
elsewhere (Marian's </s> is 0, GPT-2 has only <|endoftext|>) is imported with its vocabulary reordered: the
specials first, then the other tokens in their order; embedding rows move with their tokens. A special the model
lacks gets a new row whose output logit is pushed to -1e9 (an output bias), so the distribution over the model's
own tokens is unchanged.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

import torch

from tfcli.config import to_dict
from tfcli.errors import TfcliError
from tfcli.model.config import ModelConfig
from tfcli.data.vocab import reorder_vocabulary, vocab_list
from tfcli.io import refuse_overwriting_inputs
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID

ABSENT_LOGIT = -1e9  # output bias of a special token the imported model did not have
LAYER_NORM_EPS = 1e-5  # Marian's and Pegasus' LayerNorms (not configurable there)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise TfcliError("Hugging Face export/import needs the transformers package: pip install transformers") from None
    return transformers


@contextlib.contextmanager
def _no_progress_bars(tr):
    """transformers' progress bars off while tfcli calls it, and back as they were after (the caller's setting)."""
    logging = tr.utils.logging
    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


# --- which class, and the refusals ----------------------------------------------------------------------------


def hf_arch(cfg: ModelConfig) -> str:
    """"marian", "pegasus" or "gpt2" for `cfg`, or a one-line error naming the option no class can express."""
    def refuse(option: str, why: str):
        raise TfcliError(f"--to hf: {option} is not supported ({why}); export with --to ctranslate2 instead")

    if cfg.rms_norm:
        refuse("model.rms_norm true", "GPT-2, Marian and Pegasus have LayerNorms")
    if cfg.qk_norm:
        refuse("model.qk_norm true", "GPT-2, Marian and Pegasus have no QK-norm")
    if cfg.n_kv_head is not None and cfg.n_kv_head != cfg.n_head:
        refuse(f"model.n_kv_head {cfg.n_kv_head}", "GPT-2, Marian and Pegasus have as many key/value heads as query heads")
    if cfg.activation == "relu2":
        raise TfcliError("--to hf: model.activation relu2 is not supported (no transformers class of GPT-2, Marian "
                         "or Pegasus has ReLU^2, nor has --to ctranslate2); a model to export trains with relu or gelu")
    if cfg.activation in ("swiglu", "geglu"):
        refuse(f"model.activation {cfg.activation}", "GPT-2, Marian and Pegasus have ungated ReLU/GELU FFNs")
    if cfg.kind == "lm":
        if cfg.positions != "learned":
            refuse(f"model.positions {cfg.positions}", "the decoder-only target, GPT-2, has learned positions")
        if cfg.norm != "pre":
            refuse("model.norm post", "GPT-2 is pre-norm")
        if cfg.scale_embedding:
            refuse("model.scale_embedding true", "GPT-2 does not scale its embeddings")
        if cfg.output_bias:
            refuse("model.output_bias true", "GPT-2's output projection has no bias")
        return "gpt2"
    if cfg.positions != "sinusoidal":
        refuse(f"model.positions {cfg.positions}", "Marian and Pegasus have sinusoidal positions only")
    if cfg.layer_norm_eps != LAYER_NORM_EPS:
        refuse(f"model.layer_norm_eps {cfg.layer_norm_eps:g}", f"Marian and Pegasus use {LAYER_NORM_EPS:g}")
    if cfg.activation == "gelu_tanh":
        refuse("model.activation gelu_tanh", "exported translation models use relu or gelu")
    if cfg.norm == "post":
        return "marian"
    if not cfg.share_embeddings:
        refuse("model.share_embeddings false with model.norm pre",
               "Pegasus, the pre-norm target, has one embedding table for source and target")
    return "pegasus"


# --- the mapping ------------------------------------------------------------------------------------------------

# layouts: how a tfcli tensor becomes the HF one (`perm`: the model-dimension permutation, or None for GPT-2)
#   in    reads the residual stream: permute the columns      out   writes it: permute the rows (and the bias)
#   plain unchanged                                            conv  GPT-2's Conv1D: transposed
#   bias  the output bias, HF's (1, V) final_logits_bias


def _pairs(cfg: ModelConfig, arch: str) -> Iterator[tuple[str, tuple[int, int] | None, str, str]]:
    """(tfcli name, (chunk i, of n) along dim 0 or None, HF name, layout) for every weight tfcli has, biases
    included even where tfcli has none (they are exported as zeros)."""
    if arch == "gpt2":
        yield from _gpt2_pairs(cfg)
        return

    def linear(t, h, layout, part=None):
        yield f"{t}.weight", part, f"{h}.weight", layout
        yield f"{t}.bias", part, f"{h}.bias", "out" if layout == "out" else "plain"

    def norm(t, h):
        yield f"{t}.weight", None, f"{h}.weight", "out"
        yield f"{t}.bias", None, f"{h}.bias", "out"

    def self_attn(t, h):
        for j, name in enumerate("qkv"):
            yield from linear(f"{t}.qkv_proj", f"{h}.{name}_proj", "in", (j, 3))
        yield from linear(f"{t}.out_proj", f"{h}.out_proj", "out")

    def ffn(t, h):
        yield from linear(f"{t}.ffn.w1", f"{h}.fc1", "in")
        yield from linear(f"{t}.ffn.w2", f"{h}.fc2", "out")

    m = "model"
    if cfg.share_embeddings:
        yield "encoder.embed.tok.weight", None, f"{m}.shared.weight", "in"
    else:
        yield "encoder.embed.tok.weight", None, f"{m}.encoder.embed_tokens.weight", "in"
        yield "decoder.embed.tok.weight", None, f"{m}.decoder.embed_tokens.weight", "in"
    if not cfg.tie_output:
        yield "lm_head.weight", None, "lm_head.weight", "in"
    if cfg.output_bias:
        yield "lm_head.bias", None, "final_logits_bias", "bias"
    for i in range(cfg.n_encoder_layers):
        t, h = f"encoder.layers.{i}", f"{m}.encoder.layers.{i}"
        yield from self_attn(f"{t}.self_attn", f"{h}.self_attn")
        yield from norm(f"{t}.res_attn.norm", f"{h}.self_attn_layer_norm")
        yield from ffn(t, h)
        yield from norm(f"{t}.res_ffn.norm", f"{h}.final_layer_norm")
    for i in range(cfg.n_decoder_layers):
        t, h = f"decoder.layers.{i}", f"{m}.decoder.layers.{i}"
        yield from self_attn(f"{t}.self_attn", f"{h}.self_attn")
        yield from norm(f"{t}.res_self.norm", f"{h}.self_attn_layer_norm")
        yield from linear(f"{t}.cross_attn.q_proj", f"{h}.encoder_attn.q_proj", "in")
        for j, name in enumerate("kv"):
            yield from linear(f"{t}.cross_attn.kv_proj", f"{h}.encoder_attn.{name}_proj", "in", (j, 2))
        yield from linear(f"{t}.cross_attn.out_proj", f"{h}.encoder_attn.out_proj", "out")
        yield from norm(f"{t}.res_cross.norm", f"{h}.encoder_attn_layer_norm")
        yield from ffn(t, h)
        yield from norm(f"{t}.res_ffn.norm", f"{h}.final_layer_norm")
    if arch == "pegasus":
        yield from norm("encoder.norm", f"{m}.encoder.layer_norm")
        yield from norm("decoder.norm", f"{m}.decoder.layer_norm")


def _gpt2_pairs(cfg: ModelConfig):
    def conv(t, h):
        yield f"{t}.weight", None, f"{h}.weight", "conv"
        yield f"{t}.bias", None, f"{h}.bias", "plain"

    def norm(t, h):
        yield f"{t}.weight", None, f"{h}.weight", "plain"
        yield f"{t}.bias", None, f"{h}.bias", "plain"

    yield "decoder.embed.tok.weight", None, "transformer.wte.weight", "plain"
    yield "decoder.embed.pos.emb.weight", None, "transformer.wpe.weight", "plain"
    if not cfg.tie_output:
        yield "lm_head.weight", None, "lm_head.weight", "plain"
    for i in range(cfg.n_decoder_layers):
        t, h = f"decoder.layers.{i}", f"transformer.h.{i}"
        yield from norm(f"{t}.res_self.norm", f"{h}.ln_1")
        yield from conv(f"{t}.self_attn.qkv_proj", f"{h}.attn.c_attn")  # q, k, v stacked, as GPT-2's c_attn
        yield from conv(f"{t}.self_attn.out_proj", f"{h}.attn.c_proj")
        yield from norm(f"{t}.res_ffn.norm", f"{h}.ln_2")
        yield from conv(f"{t}.ffn.w1", f"{h}.mlp.c_fc")
        yield from conv(f"{t}.ffn.w2", f"{h}.mlp.c_proj")
    yield from norm("decoder.norm", "transformer.ln_f")


def _perm(d: int) -> torch.Tensor:
    """HF model dimension j is tfcli dimension perm[j]: the even (sine) dimensions first, then the odd (cosine)."""
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def _to_hf(w: torch.Tensor, layout: str, perm: torch.Tensor | None) -> torch.Tensor:
    if layout == "conv":
        return w.t().contiguous()
    if layout == "bias":
        return w[None]
    if perm is None or layout == "plain":
        return w
    return w[:, perm] if layout == "in" else w[perm]


def _from_hf(w: torch.Tensor, layout: str, perm: torch.Tensor | None) -> torch.Tensor:
    if layout == "conv":
        return w.t().contiguous()
    if layout == "bias":
        return w[0]
    if perm is None or layout == "plain":
        return w
    inv = torch.argsort(perm)
    return w[:, inv] if layout == "in" else w[inv]


def to_hf_state(model, cfg: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """The HF state dict computing the same function as `model` (tfcli's missing biases become zeros)."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    perm = _perm(cfg.d_model) if arch != "gpt2" else None
    out = {}
    for t, part, h, layout in _pairs(cfg, arch):
        w = sd.get(t)
        if w is None:  # a bias tfcli does not have (model.bias false)
            w = torch.zeros(sd[t.removesuffix(".bias") + ".weight"].shape[0])
        if part is not None:
            w = w.chunk(part[1])[part[0]]
        out[h] = _to_hf(w, layout, perm).contiguous()
    return out


def from_hf_state(hf: dict[str, torch.Tensor], cfg: ModelConfig, arch: str) -> dict[str, torch.Tensor]:
    """The tfcli state dict (aliases of shared/tied weights included) from an HF one, in tfcli's vocabulary order
    only if the HF model already is (`import_model` reorders)."""
    perm = _perm(cfg.d_model) if arch != "gpt2" else None
    out: dict[str, torch.Tensor] = {}
    chunks: dict[str, dict[int, torch.Tensor]] = {}
    for t, part, h, layout in _pairs(cfg, arch):
        if h not in hf:
            raise TfcliError(f"the Hugging Face weights lack {h}")
        w = _from_hf(hf[h].float(), layout, perm)
        if part is None:
            out[t] = w
        else:
            chunks.setdefault(t, {})[part[0]] = w
    for t, parts in chunks.items():
        out[t] = torch.cat([parts[i] for i in range(len(parts))])
    if cfg.kind == "seq2seq" and cfg.share_embeddings:
        out["decoder.embed.tok.weight"] = out["encoder.embed.tok.weight"]
    if cfg.tie_output:
        out["lm_head.weight"] = out["decoder.embed.tok.weight"]
    if not cfg.bias:
        out = {k: v for k, v in out.items() if not _linear_bias(k)}
    return out


def _linear_bias(name: str) -> bool:
    """A bias of a linear layer inside the stack (`model.bias`), not of a LayerNorm or the output projection."""
    return name.endswith(".bias") and not name.endswith("norm.bias") and name != "lm_head.bias"


# --- export -----------------------------------------------------------------------------------------------------


def hf_config(cfg: ModelConfig, arch: str):
    tr = _transformers()
    act = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}[cfg.activation]
    common = dict(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=cfg.tie_output)
    if arch == "gpt2":
        return tr.GPT2Config(
            vocab_size=cfg.tgt_vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model, n_layer=cfg.n_decoder_layers,
            n_head=cfg.n_head, n_inner=cfg.d_ff, activation_function=act, resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout, attn_pdrop=cfg.attn_dropout, layer_norm_epsilon=cfg.layer_norm_eps, **common,
        )
    seq2seq = dict(
        vocab_size=cfg.src_vocab_size, d_model=cfg.d_model, encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers, encoder_attention_heads=cfg.n_head, decoder_attention_heads=cfg.n_head,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=act, dropout=cfg.dropout,
        attention_dropout=cfg.attn_dropout, activation_dropout=0.0, max_position_embeddings=max(cfg.max_len, 1024),
        scale_embedding=cfg.scale_embedding, decoder_start_token_id=BOS_ID, forced_eos_token_id=None, **common,
    )
    if arch == "marian":
        return tr.MarianConfig(decoder_vocab_size=cfg.tgt_vocab_size,
                               share_encoder_decoder_embeddings=cfg.share_embeddings, **seq2seq)
    return tr.PegasusConfig(**seq2seq)


def _model_class(arch: str):
    tr = _transformers()
    return {"marian": tr.MarianMTModel, "pegasus": tr.PegasusForConditionalGeneration,
            "gpt2": tr.GPT2LMHeadModel}[arch]


def to_hf_model(model, cfg: ModelConfig):
    """A `transformers` model computing the same function as the tfcli `model` (see the module docstring)."""
    arch = hf_arch(cfg)
    hf = _model_class(arch)(hf_config(cfg, arch)).eval()
    state = to_hf_state(model, cfg, arch)
    missing, unexpected = hf.load_state_dict(state, strict=False)
    computed = ("embed_positions", "final_logits_bias", "attn.bias", "attn.masked_bias")  # tables, buffers
    tied = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    left = [k for k in missing if k not in tied and not any(c in k for c in computed)]
    if left or unexpected:
        raise TfcliError(f"internal error: the {arch} mapping left {left[:3]} unset and {unexpected[:3]} unknown")
    return hf


def _hf_tokenizer_json(tok_path: Path, add_eos: bool) -> str:
    """tfcli's tokenizer.json for AutoTokenizer: with `add_eos`, a post-processor appends </s> as tfcli does to
    every source (so `tokenizer(text)` gives the ids the model was trained on)."""
    data = json.loads(tok_path.read_text(encoding="utf-8"))
    if add_eos:
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [EOS_ID], "tokens": ["</s>"]}},
        }
    return json.dumps(data, ensure_ascii=False)


def save_hf(model, cfg: ModelConfig, tokenizers: dict[str, Path], out_dir: Path) -> str:
    """Write the `transformers` model directory (config, safetensors weights, tokenizer) into `out_dir`; returns
    the class name. The tokenizer AutoTokenizer loads is the source side's; where the target's differs (no joint
    vocabulary) it is saved beside it as target_tokenizer.json."""
    tr = _transformers()
    hf = to_hf_model(model, cfg)
    hf.config.tfcli_model = to_dict(cfg)  # so that `tfcli import` restores this config exactly (extra key: ignored)
    hf.generation_config.suppress_tokens = [PAD_ID, BOS_ID]  # never output, as in tfcli's decoders
    hf.generation_config.forced_eos_token_id = None
    with _no_progress_bars(tr):  # transformers' own "Writing model shards" bar: tfcli's stderr is its own
        hf.save_pretrained(out_dir)
    seq2seq = cfg.kind == "seq2seq"
    main = tokenizers["src" if seq2seq else "tgt"]
    (out_dir / "tokenizer.json").write_text(_hf_tokenizer_json(main, add_eos=seq2seq), encoding="utf-8")
    fast = tr.PreTrainedTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"), pad_token=SPECIAL_TOKENS[PAD_ID],
                                      bos_token=SPECIAL_TOKENS[BOS_ID], eos_token=SPECIAL_TOKENS[EOS_ID],
                                      unk_token=SPECIAL_TOKENS[UNK_ID])
    fast.save_pretrained(out_dir)
    if seq2seq and tokenizers["tgt"].read_bytes() != tokenizers["src"].read_bytes():
        (out_dir / "target_tokenizer.json").write_text(_hf_tokenizer_json(tokenizers["tgt"], add_eos=False),
                                                       encoding="utf-8")
    return type(hf).__name__


# --- import -----------------------------------------------------------------------------------------------------

SUPPORTED = {"marian": "marian", "pegasus": "pegasus", "gpt2": "gpt2"}
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


_OPENED = ("config.json", "tokenizer.json", "target_tokenizer.json", "source.spm", "target.spm", "vocab.json")


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
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TfcliError(f"{path}: unreadable ({e})") from None
    if not isinstance(config, dict):
        raise TfcliError(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


# the integer sizes each architecture's config.json must give, and the optional ones
_SIZES = {
    "gpt2": (("n_embd", "n_head", "n_layer", "n_positions", "vocab_size"), ("n_inner",)),
    "seq2seq": (("d_model", "encoder_attention_heads", "decoder_attention_heads", "encoder_layers", "decoder_layers",
                 "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size"), ("decoder_vocab_size", "max_position_embeddings")),
}
_RATES = {"gpt2": ("resid_pdrop", "attn_pdrop", "embd_pdrop"), "seq2seq": ("dropout", "attention_dropout")}


def _check_config(config: dict, arch: str, hf_dir: Path) -> None:
    """The keys tfcli reads, with the right types and possible values, checked before anything is allocated; an
    error names the key."""
    where = f"{hf_dir / 'config.json'}"
    kind = "gpt2" if arch == "gpt2" else "seq2seq"
    required, optional = _SIZES[kind]
    for key in required + optional:
        value = config.get(key)
        if value is None and key in optional:
            continue
        if key not in config:
            raise TfcliError(f"{where}: no '{key}', which a {arch} config holds")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TfcliError(f"{where}: {key} is {value!r}; expected a positive integer")
    for key in _RATES[kind]:
        value = config.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise TfcliError(f"{where}: {key} is {value!r}; expected a probability in [0, 1)")
    eps = config.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise TfcliError(f"{where}: layer_norm_epsilon is {eps!r}; expected a small positive number")
    d, heads = ("n_embd", "n_head") if kind == "gpt2" else ("d_model", "encoder_attention_heads")
    if config[d] % config[heads]:
        raise TfcliError(f"{where}: {d} {config[d]} is not divisible by {heads} {config[heads]}")


_FLOATS = ("F16", "BF16", "F32", "F64")


def _weight_headers(hf_dir: Path) -> dict[str, tuple[str, tuple[int, ...], Path]]:
    """name -> (dtype, shape, file) of every tensor in the safetensors files, from their headers alone; integer or
    boolean tensors are refused (weights are floating point)."""
    from safetensors import safe_open

    files = sorted(hf_dir.glob("model*.safetensors"))
    if not files:
        pickled = [p.name for p in hf_dir.glob("*.bin")]
        hint = f" ({pickled[0]} is a pickle, which tfcli never loads: re-save with safe_serialization)" if pickled else ""
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


def _layer_count(headers: dict, prefix: str) -> int:
    """How many layers the weights hold under `prefix` (e.g. transformer.h.): the distinct layer numbers."""
    return len({name[len(prefix):].split(".", 1)[0] for name in headers if name.startswith(prefix)})


def _check_sizes(config: dict, arch: str, headers: dict, hf_dir: Path) -> None:
    """The config's sizes against the weights' own: layer counts, embedding rows and width. Past this, every size
    the model is built with is one the weights file holds, however large the config claims."""
    where = f"{hf_dir / 'config.json'}"
    if arch == "gpt2":
        layers = {"n_layer": _layer_count(headers, "transformer.h.")}
        embedding, rows, width = "transformer.wte.weight", "vocab_size", "n_embd"
    else:
        layers = {"encoder_layers": _layer_count(headers, "model.encoder.layers."),
                  "decoder_layers": _layer_count(headers, "model.decoder.layers.")}
        embedding = next((n for n in ("model.shared.weight", "model.encoder.embed_tokens.weight") if n in headers),
                         "model.shared.weight")
        rows, width = "vocab_size", "d_model"
    if embedding not in headers:
        raise TfcliError(f"{hf_dir}: the weights lack {embedding}: not a {arch} model (model_type "
                         f"'{config.get('model_type')}' in config.json)?")
    for key, found in layers.items():
        if config[key] != found:
            raise TfcliError(f"{where}: {key} is {config[key]}, but the weights hold {found} layers")
    shape = headers[embedding][1]
    if len(shape) != 2 or (shape[0], shape[1]) != (config[rows], config[width]):
        raise TfcliError(f"{where}: {rows} {config[rows]} and {width} {config[width]}, but {embedding} is "
                         f"{'x'.join(map(str, shape))}")


# tensors a transformers file may hold that tfcli computes itself: GPT-2's causal-mask buffers, the sinusoidal
# position tables of Marian and Pegasus
_DERIVED = (".attn.bias", ".attn.masked_bias", "embed_positions.weight")


def _check_weights(headers: dict, cfg: ModelConfig, arch: str, hf_dir: Path) -> None:
    """Every tensor maps onto the model of the config with its exact shape, and none is left over, checked on
    torch's meta device: nothing is allocated before the weights are known to fit."""
    from tfcli.model.transformer import build_model

    meta = {name: torch.empty(shape, device="meta") for name, (_, shape, _) in headers.items()}
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_model(cfg).state_dict().items()}
        state = from_hf_state(meta, cfg, arch) if arch == "gpt2" else _seq2seq_state(meta, cfg, arch)
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
        raise TfcliError(f"{headers[unused[0]][2]}: tensor {unused[0]}{more} is not part of a {arch} model of this "
                         "config.json; refusing to drop weights")


def _arch_of(config: dict, hf_dir: Path) -> str:
    kind = config.get("model_type")
    if kind in SUPPORTED:
        return SUPPORTED[kind]
    if kind is None:
        if config.get("format") == "tfcli-checkpoint":
            what = "is a tfcli checkpoint already (use it as it is: tfcli translate -m DIR)"
        elif (hf_dir / "model.bin").exists():
            what = "is a CTranslate2 model directory (tfcli exports to CTranslate2, and imports transformers models)"
        else:
            what = "is not a transformers model directory (its config.json has no model_type)"
        raise TfcliError(f"{hf_dir}: {what}; tfcli import takes a Hugging Face transformers directory "
                         f"(save_pretrained) of model_type {', '.join(SUPPORTED)}")
    why = {"m2m_100": " (its sinusoidal table is fairseq's, with other frequencies and positions offset by the "
                      "padding id, which no tfcli option reproduces)"}.get(kind, "")
    raise TfcliError(f"{hf_dir}: model_type '{kind}' cannot be imported{why}; supported: "
                     f"{', '.join(SUPPORTED)}")


def model_config_from_hf(config: dict, arch: str, hf_dir: Path) -> ModelConfig:
    """tfcli's ModelConfig for an HF config (vocabulary sizes as HF has them; biases assumed present)."""
    def need(cond: bool, what: str):
        if not cond:
            raise TfcliError(f"{hf_dir}/config.json: {what}, which tfcli models cannot express")

    act = config.get("activation_function", "gelu_new" if arch == "gpt2" else "relu")
    need(act in _ACTIVATIONS, f"activation_function '{act}'")
    if arch == "gpt2":
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
    share = True if arch == "pegasus" else config.get("share_encoder_decoder_embeddings", True)
    src_v = config["vocab_size"]
    return ModelConfig(
        kind="seq2seq", src_vocab_size=src_v, tgt_vocab_size=src_v if share else config.get("decoder_vocab_size") or src_v,
        d_model=config["d_model"], n_head=config["encoder_attention_heads"], n_encoder_layers=config["encoder_layers"],
        n_decoder_layers=config["decoder_layers"], d_ff=config["encoder_ffn_dim"], dropout=config.get("dropout", 0.1),
        attn_dropout=config.get("attention_dropout", 0.0), activation=_ACTIVATIONS[act],
        norm="post" if arch == "marian" else "pre", positions="sinusoidal",
        max_len=config.get("max_position_embeddings", 1024), scale_embedding=config.get("scale_embedding", False),
        share_embeddings=share, tie_output=config.get("tie_word_embeddings", True), output_bias=True,
        layer_norm_eps=LAYER_NORM_EPS,
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
    vocab.json, converted (tfcli/data/spm.py)."""
    def read(path: Path) -> dict:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TfcliError(f"{path}: unreadable tokenizer ({e})") from None

    src = hf_dir / "tokenizer.json"
    if src.is_file():
        tgt = hf_dir / "target_tokenizer.json"
        tgt = tgt if tgt.is_file() else src
        return (src, read(src)), (tgt, read(tgt))
    spm_src, spm_tgt, vocab = hf_dir / "source.spm", hf_dir / "target.spm", hf_dir / "vocab.json"
    if spm_src.is_file() and vocab.is_file():
        from tfcli.data.spm import marian_tokenizer

        pieces = read(vocab)
        spm_tgt = spm_tgt if spm_tgt.is_file() else spm_src
        return (spm_src, marian_tokenizer(spm_src, pieces)), (spm_tgt, marian_tokenizer(spm_tgt, pieces))
    raise TfcliError(f"{hf_dir}: no tokenizer.json (nor Marian's source.spm and vocab.json)")


# special role -> the HF config key naming its id (the decoder start is tfcli's <s>)
def _special_ids(config: dict, tok: dict, arch: str) -> dict[int, int | None]:
    unk = None
    model = tok.get("model", {})
    vocab = vocab_list(tok)
    unk_token = model.get("unk_token") or ("<unk>" if "<unk>" in vocab else None)
    if model.get("type") == "Unigram" and model.get("unk_id") is not None:
        unk = model["unk_id"]
    elif unk_token in vocab:
        unk = vocab.index(unk_token)
    start = config.get("decoder_start_token_id") if arch != "gpt2" else config.get("bos_token_id")
    return {PAD_ID: config.get("pad_token_id"), BOS_ID: start, EOS_ID: config.get("eos_token_id"), UNK_ID: unk}


def _rows(w: torch.Tensor, order: list[int]) -> torch.Tensor:
    idx = torch.tensor([max(h, 0) for h in order])
    out = w[idx].clone()
    out[torch.tensor([h < 0 for h in order])] = 0.0
    return out


def _output_bias(b: torch.Tensor | None, order: list[int]) -> torch.Tensor:
    """HF's output bias in tfcli's order; a row the model lacks, or a second copy of a row (Marian's decoder start
    is its <pad>), gets ABSENT_LOGIT, so the softmax over the model's own tokens is unchanged."""
    out = torch.full((len(order),), ABSENT_LOGIT)
    seen = set()
    first = [EOS_ID, UNK_ID, *range(len(SPECIAL_TOKENS), len(order)), PAD_ID, BOS_ID]  # never-output ones last
    for i in first:
        h = order[i]
        if h >= 0 and h not in seen:
            out[i] = b[h] if b is not None else 0.0
            seen.add(h)
    return out


def import_model(hf_dir: str | Path, out: str | Path, force: bool = False) -> dict:
    """`tfcli import`: a local `transformers` Marian, Pegasus or GPT-2 directory (or a hub name, for users online)
    -> a tfcli checkpoint directory that translate/lm-generate/eval/attention use. Returns a summary."""
    import dataclasses
    import tempfile

    from tfcli import checkpoint
    from tfcli.data.tokenizer import load_tokenizer
    from tfcli.model.transformer import build_model

    hf_dir = _local(hf_dir)
    out = Path(out)
    refuse_overwriting_inputs([out], [hf_dir], "choose another -o")
    if out.exists() and not force:
        raise TfcliError(f"{out}: already exists; pass --force to replace it, or choose another -o")
    _refuse_special_files(hf_dir)
    config = _read_config(hf_dir)
    arch = _arch_of(config, hf_dir)
    _check_config(config, arch, hf_dir)
    headers = _weight_headers(hf_dir)  # names, dtypes and shapes, read before any tensor is
    _check_sizes(config, arch, headers, hf_dir)
    cfg = model_config_from_hf(config, arch, hf_dir)
    cfg_in = dataclasses.replace(cfg, bias=True)
    _check_weights(headers, cfg_in, arch, hf_dir)  # every tensor used, every shape right, on the meta device
    weights = _read_weights(hf_dir)
    state = from_hf_state(weights, cfg_in, arch) if arch == "gpt2" else _seq2seq_state(weights, cfg_in, arch)
    src, tgt = _tokenizers(hf_dir)
    sides = {"tgt": tgt} if cfg.kind == "lm" else {"src": src, "tgt": tgt}
    for side, (path, data) in sides.items():
        rows = cfg.src_vocab_size if side == "src" else cfg.tgt_vocab_size
        if len(vocab_list(data)) > rows:
            raise TfcliError(f"{path}: {len(vocab_list(data))} tokens, more than the {rows} embedding rows of the "
                             "model's config.json; this tokenizer does not belong to these weights")
    toks, orders = {}, {}
    for side, (path, data) in sides.items():
        toks[side], orders[side] = reorder_vocabulary(data, _special_ids(config, data, arch), path)
    if cfg.kind == "seq2seq" and cfg.share_embeddings and orders["src"] != orders["tgt"]:
        raise TfcliError(f"{hf_dir}: shared embeddings, but the source and target tokenizers number tokens differently")

    # rows follow their tokens into tfcli's order
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
    bias = _output_bias(hf_bias, tgt_order)
    linear_biases = [k for k in state if _linear_bias(k)]
    cfg = dataclasses.replace(
        cfg, src_vocab_size=len(orders["src"]) if "src" in orders else 0, tgt_vocab_size=len(tgt_order),
        bias=any(bool(state[k].any()) for k in linear_biases), output_bias=bool(bias.any()),
    )
    if "tfcli_model" in config:  # a tfcli export: its own config, which the weights must fit
        cfg = _saved_config(config["tfcli_model"], cfg, hf_dir)
    if cfg.output_bias:
        state["lm_head.bias"] = bias
    if not cfg.bias:
        for k in linear_biases:
            del state[k]
    model = build_model(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise TfcliError(f"{hf_dir}: the weights do not fit a {arch} model of its config.json "
                         f"({str(e).strip().splitlines()[-1].strip()})") from None

    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for side, data in toks.items():
            files[side] = Path(tmp) / f"tokenizer.{side}.json"
            files[side].write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
            load_tokenizer(files[side])  # tfcli's own check of the specials
        meta = {"model": to_dict(cfg), "step": 0, "imported_from": {"path": str(hf_dir), "model_type": arch}}
        checkpoint.save(out, model, meta, files)  # a new directory, or (force) one swapped in whole
    return {"arch": arch, "kind": cfg.kind, "parameters": sum(p.numel() for p in model.parameters()),
            "vocab": {side: len(o) for side, o in orders.items()}}


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


def _seq2seq_state(weights: dict, cfg: ModelConfig, arch: str) -> dict:
    """from_hf_state for Marian/Pegasus, where final_logits_bias is the output bias (zeros if absent)."""
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
