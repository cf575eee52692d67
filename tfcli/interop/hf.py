"""tfcli <-> Hugging Face `transformers`: one weight mapping, used in both directions (`hf_export`, `hf_import`).

    tfcli model                                      transformers class
    seq2seq, post-norm, sinusoidal positions         MarianMTModel  (shared or separate embeddings)
    seq2seq, pre-norm, sinusoidal, shared embeddings PegasusForConditionalGeneration (M2M-100's pre-norm layout, with
                                                     the paper's sinusoids)
    seq2seq, pre-norm, fairseq positions, shared     M2M100ForConditionalGeneration (M2M-100, NLLB-200; no output
                                                     bias; fairseq's vocabulary layout on export: `hf_export`)
    lm, pre-norm, learned positions, no scaling      GPT2LMHeadModel

Marian's, Pegasus' and M2M-100's sinusoidal tables hold the sines in the first half of the model dimension and the cosines in
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
import dataclasses
from dataclasses import dataclass
from typing import Iterator

import torch

from tfcli.errors import TfcliError
from tfcli.model.config import ModelConfig
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ABSENT_LOGIT = -1e9  # output bias of a special token the imported model did not have
# where two of tfcli's specials are one row of an imported model, the first of these holds the row (the never-output
# ones last) and the other gets ABSENT_LOGIT; export gives the row back from it
ROW_HOLDERS = (EOS_ID, UNK_ID, PAD_ID, BOS_ID)
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


# --- the architectures -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """One transformers architecture tfcli imports and exports, and what sets it apart: the one record import,
    export and an imported checkpoint's metadata read (never its name)."""

    name: str  # its model_type
    kind: str  # "seq2seq" or "lm"
    norm: str  # "post" or "pre" (a pre-norm translation model has the stacks' final LayerNorms)
    positions: str  # "sinusoidal", "fairseq" (M2M-100's table, from position 2) or "learned"
    one_table: bool  # source and target embeddings always one table (else as share_encoder_decoder_embeddings)
    logits_bias: bool  # final_logits_bias: the output bias
    language_tokens: bool  # the source's language token first in the source, the target's forced first (M2M-100)
    on_sentences: bool  # a translation model learnt from sentence pairs (translate's --split-sentences auto)
    model_class: str  # the transformers class
    config_class: str  # and its config's

    @property
    def final_norms(self) -> bool:
        return self.kind == "seq2seq" and self.norm == "pre"

    @property
    def auto_class(self) -> str:
        return "AutoModelForCausalLM" if self.kind == "lm" else "AutoModelForSeq2SeqLM"


ARCHS = {a.name: a for a in (
    Arch("marian", "seq2seq", "post", "sinusoidal", False, True, False, True, "MarianMTModel", "MarianConfig"),
    Arch("pegasus", "seq2seq", "pre", "sinusoidal", True, True, False, False, "PegasusForConditionalGeneration",
         "PegasusConfig"),
    Arch("m2m_100", "seq2seq", "pre", "fairseq", True, False, True, True, "M2M100ForConditionalGeneration",
         "M2M100Config"),
    Arch("gpt2", "lm", "pre", "learned", False, False, False, False, "GPT2LMHeadModel", "GPT2Config"),
    # the Llama layout (RMSNorm, SwiGLU, RoPE, grouped-query attention): Qwen 2 adds q/k/v biases, Qwen 3 QK-norm
    *(Arch(name, "lm", "pre", "rope", False, False, False, False, f"{cls}ForCausalLM", f"{cls}Config")
      for name, cls in (("llama", "Llama"), ("mistral", "Mistral"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3"),
                        ("phi3", "Phi3"))),
    # Gemma 2 and 3 (text): Llama's names, a norm before and after each sublayer (RMSNorm over 1 + weight)
    Arch("gemma2", "lm", "sandwich", "rope", False, False, False, False, "Gemma2ForCausalLM", "Gemma2Config"),
    Arch("gemma3_text", "lm", "sandwich", "rope", False, False, False, False, "Gemma3ForCausalLM",
         "Gemma3TextConfig"),
)}
# the weights `_llama_pairs` names (Phi-3's q, k, v and gate, up projections each fused into one)
LLAMA_LAYOUT = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")


# --- which class, and the refusals ----------------------------------------------------------------------------


def hf_arch(cfg: ModelConfig, family: str | None = None) -> Arch:
    """The architecture (ARCHS) that expresses `cfg`, or a one-line error naming the option none can express;
    `family`: an imported model's own model_type, chosen where it expresses `cfg` too (Mistral and Phi-3, whose
    models Llama's layout expresses where they have no sliding window)."""
    arch = _hf_arch(cfg)
    if family in ("mistral", "phi3") and arch.name in ("llama", "mistral") and not cfg.bias:
        return ARCHS[family]
    return arch


def _phi3_only(cfg: ModelConfig) -> bool:
    """RoPE over part of each head, or longrope: of the RoPE targets only Phi-3 has them."""
    return cfg.rotary_dim not in (None, cfg.d_head) or (cfg.rope_scaling is not None and
                                                        cfg.rope_scaling.type == "longrope")


def _hf_arch(cfg: ModelConfig) -> Arch:
    def refuse(option: str, why: str):
        raise TfcliError(f"--to hf: {option} is not supported ({why}); export with --to ctranslate2 instead")

    if cfg.prefix_attention:
        refuse("model.prefix_attention true", "their decoder-only classes attend causally everywhere")
    if cfg.kind == "lm" and cfg.positions == "rope":
        return _llama_arch(cfg, refuse)
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
        return ARCHS["gpt2"]
    if cfg.positions == "fairseq":
        if cfg.norm != "pre" or not cfg.share_embeddings or not cfg.tie_output:
            refuse("model.positions fairseq with post-norm or separate embeddings",
                   "M2M100, the class with fairseq's positions, is pre-norm with one tied table")
    elif cfg.positions != "sinusoidal":
        refuse(f"model.positions {cfg.positions}", "Marian and Pegasus have sinusoidal positions only")
    if cfg.layer_norm_eps != LAYER_NORM_EPS:
        refuse(f"model.layer_norm_eps {cfg.layer_norm_eps:g}", f"Marian and Pegasus use {LAYER_NORM_EPS:g}")
    if cfg.activation == "gelu_tanh":
        refuse("model.activation gelu_tanh", "exported translation models use relu, gelu or silu")
    if cfg.positions == "fairseq":
        return ARCHS["m2m_100"]
    if cfg.norm == "post":
        return ARCHS["marian"]
    if not cfg.share_embeddings:
        refuse("model.share_embeddings false with model.norm pre",
               "Pegasus, the pre-norm target, has one embedding table for source and target")
    return ARCHS["pegasus"]


def _llama_arch(cfg: ModelConfig, refuse) -> Arch:
    """A decoder-only model with RoPE: Llama's layout (Qwen 2's with q/k/v biases alone, Qwen 3's with QK-norm,
    Mistral's with a sliding window on every layer), or with sandwich norms Gemma 3's (QK-norm) or Gemma 2's."""
    if cfg.norm == "sandwich":
        wanted = dict(rms_norm=True, activation="geglu_tanh", scale_embedding=True, bias=False, qkv_bias=None,
                      output_bias=False)
        for key, value in wanted.items():
            if getattr(cfg, key) != value:
                refuse(f"model.norm sandwich with model.{key} {getattr(cfg, key)}",
                       "the sandwich-norm targets, Gemma 2 and 3, have RMSNorm, GeGLU (tanh), scaled embeddings "
                       "and no biases")
        if cfg.qk_norm:
            return ARCHS["gemma3_text"]
        if cfg.rope_local_theta is not None or (cfg.sliding_window is not None and cfg.global_every != 2):
            refuse("model.norm sandwich without qk_norm, with a sliding window on other than every other layer or "
                   "a RoPE base of its own", "the sandwich-norm target without QK-norm, Gemma 2, slides on every "
                   "other layer with one RoPE base")
        return ARCHS["gemma2"]
    for key in ("attn_scale", "attn_softcap", "final_softcap"):
        if getattr(cfg, key) is not None:
            refuse(f"model.{key} {getattr(cfg, key)}", "of the RoPE targets only Gemma's scale or cap attention")
    wanted = dict(rms_norm=True, activation="swiglu", norm="pre", scale_embedding=False)
    for key, value in wanted.items():
        if getattr(cfg, key) != value:
            shown = str(getattr(cfg, key)).lower() if isinstance(value, bool) else getattr(cfg, key)
            refuse(f"model.positions rope with model.{key} {shown}",
                   "the RoPE target, Llama's layout, has RMSNorm, SwiGLU, pre-norm and unscaled embeddings")
    if cfg.output_bias:
        refuse("model.output_bias true", "Llama's output projection has no bias")
    if _phi3_only(cfg):
        if cfg.global_every or cfg.qk_norm or cfg.bias or cfg.attn_qkv_bias or cfg.rope_local_theta is not None:
            refuse(f"model.rotary_dim {cfg.rotary_dim} or longrope with full-attention layers, QK-norm, biases or a "
                   "second RoPE base", "the RoPE target with them, Phi-3, has none of those")
        return ARCHS["phi3"]
    if cfg.sliding_window is not None:
        if cfg.global_every or cfg.qk_norm or cfg.bias or cfg.attn_qkv_bias or cfg.rope_local_theta is not None:
            refuse(f"model.sliding_window {cfg.sliding_window} with full-attention layers, QK-norm, biases or a "
                   "second RoPE base", "the sliding-window target of Llama's layout, Mistral, slides on every "
                   "layer and has none of them")
        return ARCHS["mistral"]
    if cfg.qk_norm:
        if cfg.bias or cfg.attn_qkv_bias:
            refuse("model.bias true with QK-norm", "Qwen 3's attention and FFN have no biases")
        return ARCHS["qwen3"]
    if cfg.attn_qkv_bias and not cfg.bias:
        return ARCHS["qwen2"]
    if cfg.attn_qkv_bias != cfg.bias:
        refuse("model.qkv_bias false with model.bias true", "Llama's attention_bias covers q, k, v and the output")
    return ARCHS["llama"]


# --- the mapping ------------------------------------------------------------------------------------------------

# layouts: how a tfcli tensor becomes the HF one (`perm`: the model-dimension permutation, or None for GPT-2)
#   in    reads the residual stream: permute the columns      out   writes it: permute the rows (and the bias)
#   plain unchanged                                            conv  GPT-2's Conv1D: transposed
#   gain-1 a Gemma RMSNorm gain, stored less 1
#   half0, half1  the first / second half of the rows of a tensor HF fuses (Phi-3's gate_up_proj)
#   bias  the output bias, HF's (1, V) final_logits_bias


def _pairs(cfg: ModelConfig, arch: Arch) -> Iterator[tuple[str, tuple[int, tuple[int, ...]] | None, str, str]]:
    """(tfcli name, (part j, the parts' sizes along dim 0) or None, HF name, layout) for every weight tfcli has,
    biases included even where tfcli has none (they are exported as zeros)."""
    if arch.name in LLAMA_LAYOUT:
        yield from _llama_pairs(cfg, arch.name == "phi3")
        return
    if arch.kind == "lm":
        yield from _gpt2_pairs(cfg)
        return
    d = cfg.d_model

    def linear(t, h, layout, part=None):
        yield f"{t}.weight", part, f"{h}.weight", layout
        yield f"{t}.bias", part, f"{h}.bias", "out" if layout == "out" else "plain"

    def norm(t, h):
        yield f"{t}.weight", None, f"{h}.weight", "out"
        yield f"{t}.bias", None, f"{h}.bias", "out"

    def self_attn(t, h):
        for j, name in enumerate("qkv"):
            yield from linear(f"{t}.qkv_proj", f"{h}.{name}_proj", "in", (j, (d, d, d)))
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
    if cfg.output_bias and arch.logits_bias:  # (M2M100 has none: hf_export checks it is not needed)
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
            yield from linear(f"{t}.cross_attn.kv_proj", f"{h}.encoder_attn.{name}_proj", "in", (j, (d, d)))
        yield from linear(f"{t}.cross_attn.out_proj", f"{h}.encoder_attn.out_proj", "out")
        yield from norm(f"{t}.res_cross.norm", f"{h}.encoder_attn_layer_norm")
        yield from ffn(t, h)
        yield from norm(f"{t}.res_ffn.norm", f"{h}.final_layer_norm")
    if arch.final_norms:
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


def _llama_pairs(cfg: ModelConfig, fused: bool = False):
    """LlamaForCausalLM's names (Mistral's, Qwen 2's, Qwen 3's and Gemma's are the same): q, k, v stacked into
    tfcli's one projection, gate/up/down as w1/w3/w2; biases only where the model has them (Qwen 2's on q, k, v);
    Gemma's norms before and after each sublayer, their gains stored less 1 ("gain-1"). `fused` (Phi-3): one
    qkv_proj as tfcli's, and gate_up_proj the gate's rows (w1) over the up projection's (w3)."""
    def linear(t, h, bias, part=None):
        yield f"{t}.weight", part, f"{h}.weight", "plain"
        if bias:
            yield f"{t}.bias", part, f"{h}.bias", "plain"

    sizes = (cfg.n_head * cfg.d_head, cfg.kv_heads * cfg.d_head, cfg.kv_heads * cfg.d_head)
    gain = "gain-1" if cfg.norm == "sandwich" else "plain"  # Gemma's RMSNorm multiplies by 1 + its weight
    yield "decoder.embed.tok.weight", None, "model.embed_tokens.weight", "plain"
    if not cfg.tie_output:
        yield "lm_head.weight", None, "lm_head.weight", "plain"
    for i in range(cfg.n_decoder_layers):
        t, h = f"decoder.layers.{i}", f"model.layers.{i}"
        yield f"{t}.res_self.norm.weight", None, f"{h}.input_layernorm.weight", gain
        if fused:
            yield from linear(f"{t}.self_attn.qkv_proj", f"{h}.self_attn.qkv_proj", cfg.attn_qkv_bias)
        for j, name in enumerate("qkv" if not fused else ""):
            yield from linear(f"{t}.self_attn.qkv_proj", f"{h}.self_attn.{name}_proj", cfg.attn_qkv_bias, (j, sizes))
        yield from linear(f"{t}.self_attn.out_proj", f"{h}.self_attn.o_proj", cfg.bias)
        if cfg.qk_norm:
            yield f"{t}.self_attn.q_norm.weight", None, f"{h}.self_attn.q_norm.weight", gain
            yield f"{t}.self_attn.k_norm.weight", None, f"{h}.self_attn.k_norm.weight", gain
        if cfg.norm == "sandwich":  # (Gemma's four norms a layer)
            yield f"{t}.res_self.post_norm.weight", None, f"{h}.post_attention_layernorm.weight", gain
            yield f"{t}.res_ffn.norm.weight", None, f"{h}.pre_feedforward_layernorm.weight", gain
            yield f"{t}.res_ffn.post_norm.weight", None, f"{h}.post_feedforward_layernorm.weight", gain
        else:
            yield f"{t}.res_ffn.norm.weight", None, f"{h}.post_attention_layernorm.weight", gain
        if fused:
            yield f"{t}.ffn.w1.weight", None, f"{h}.mlp.gate_up_proj.weight", "half0"
            yield f"{t}.ffn.w3.weight", None, f"{h}.mlp.gate_up_proj.weight", "half1"
        for tname, hname in (("w1", "gate_proj"), ("w3", "up_proj"))[: 0 if fused else 2] + (("w2", "down_proj"),):
            yield from linear(f"{t}.ffn.{tname}", f"{h}.mlp.{hname}", cfg.bias)
    yield "decoder.norm.weight", None, "model.norm.weight", gain


def _perm(d: int) -> torch.Tensor:
    """HF model dimension j is tfcli dimension perm[j]: the even (sine) dimensions first, then the odd (cosine)."""
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def _to_hf(w: torch.Tensor, layout: str, perm: torch.Tensor | None) -> torch.Tensor:
    if layout == "gain-1":
        return w - 1.0
    if layout == "conv":
        return w.t().contiguous()
    if layout == "bias":
        return w[None]
    if perm is None or layout == "plain":
        return w
    return w[:, perm] if layout == "in" else w[perm]


def _from_hf(w: torch.Tensor, layout: str, perm: torch.Tensor | None) -> torch.Tensor:
    if layout == "gain-1":  # (in fp32, as Gemma computes 1 + weight)
        return 1.0 + w
    if layout in ("half0", "half1"):
        return w.chunk(2)[int(layout[-1])]
    if layout == "conv":
        return w.t().contiguous()
    if layout == "bias":
        return w[0]
    if perm is None or layout == "plain":
        return w
    inv = torch.argsort(perm)
    return w[:, inv] if layout == "in" else w[inv]


def to_hf_state(model, cfg: ModelConfig, arch: Arch) -> dict[str, torch.Tensor]:
    """The HF state dict computing the same function as `model` (tfcli's missing biases become zeros)."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    perm = _perm(cfg.d_model) if arch.kind == "seq2seq" else None
    out = {}
    for t, part, h, layout in _pairs(cfg, arch):
        w = sd.get(t)
        if w is None:  # a bias tfcli does not have (model.bias false)
            w = torch.zeros(sd[t.removesuffix(".bias") + ".weight"].shape[0])
        if part is not None:
            w = w.split(part[1])[part[0]]
        if layout == "half1":  # (its half0 came first: the two stacked)
            out[h] = torch.cat([out[h], w])
            continue
        out[h] = _to_hf(w, layout, perm).contiguous()
    return out


def to_peft_state(adapters: dict, cfg: ModelConfig, arch: Arch) -> dict[str, torch.Tensor]:
    """LoRA `adapters` ({tfcli module name: tfcli.model.lora.Adapter}) as PEFT names them on the HF model
    (`base_model.model.<module>.lora_A.weight`, `lora_B`): a layer HF splits (q, k, v; k, v) gets the shared A and
    its rows of B, which is the same product; the input (A) and output (B) dimensions permuted as the weight's."""
    perm = _perm(cfg.d_model) if arch.kind == "seq2seq" else None
    out = {}
    for t, part, h, layout in _pairs(cfg, arch):
        adapter = adapters.get(t.removesuffix(".weight")) if t.endswith(".weight") else None
        if adapter is None:
            continue
        if layout in ("half0", "half1"):
            raise TfcliError(f"--to peft: {t.removesuffix('.weight')}'s adapter cannot be written on {h}, which "
                             "fuses it with another layer's (PEFT's LoRA takes one A per layer); train LoRA on "
                             "other layers (--lora-targets)")
        A, B = adapter.A.detach().float(), adapter.B.detach().float()
        if part is not None:
            B = B.split(part[1])[part[0]]
        if layout == "in" and perm is not None:
            A = A[:, perm]
        elif layout == "out" and perm is not None:
            B = B[perm]
        module = f"base_model.model.{h.removesuffix('.weight')}"
        out[f"{module}.lora_A.weight"], out[f"{module}.lora_B.weight"] = A.clone(), B.clone()  # (each its own)
    return out


def from_hf_state(hf: dict[str, torch.Tensor], cfg: ModelConfig, arch: Arch) -> dict[str, torch.Tensor]:
    """The tfcli state dict (aliases of shared/tied weights included) from an HF one, in tfcli's vocabulary order
    only if the HF model already is (`import_model` reorders)."""
    perm = _perm(cfg.d_model) if arch.kind == "seq2seq" else None
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
    if not cfg.bias and arch.name not in LLAMA_LAYOUT:  # (those name only the biases they have)
        out = {k: v for k, v in out.items() if not _linear_bias(k)}
    return out


def _linear_bias(name: str) -> bool:
    """A bias of a linear layer inside the stack (`model.bias`), not of a LayerNorm or the output projection."""
    return name.endswith(".bias") and not name.endswith("norm.bias") and name != "lm_head.bias"


# --- export -----------------------------------------------------------------------------------------------------


def hf_config(cfg: ModelConfig, arch: Arch, ids: dict | None = None):
    """The transformers config; `ids`: {vocab_size, pad/bos/eos/decoder_start_token_id} where the export's
    vocabulary is not tfcli's (M2M100's: `hf_export.fairseq_layout`)."""
    tr = _transformers()
    act = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "silu": "swish"}.get(cfg.activation)
    common = dict(pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=cfg.tie_output)
    if arch.name in LLAMA_LAYOUT:  # (`ids`: an imported family's own)
        ids = dict(ids or {})
        if "vocab_size" in ids:
            cfg = dataclasses.replace(cfg, tgt_vocab_size=ids.pop("vocab_size"))
        return _llama_config(tr, cfg, arch, {**common, **ids})
    if arch.kind == "lm":
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
    if not arch.one_table:  # (Marian's: a target vocabulary of its own where the tables are separate)
        seq2seq.update(decoder_vocab_size=cfg.tgt_vocab_size, share_encoder_decoder_embeddings=cfg.share_embeddings)
    return getattr(tr, arch.config_class)(**{**seq2seq, **(ids or {})})


def _llama_config(tr, cfg: ModelConfig, arch: Arch, common: dict):
    """LlamaConfig (Qwen2Config, Qwen3Config) of a Llama-layout `cfg`: RoPE's base and scaling as this
    transformers version spells them (`rope_parameters` from 5, `rope_theta` and `rope_scaling` before)."""
    rope = {"rope_type": "default"}
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        rope = {"rope_type": s.type, "factor": s.factor}
        if s.type == "llama3":
            rope.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                        original_max_position_embeddings=s.original_max_len)
        if s.type == "longrope":
            rope.update(short_factor=list(s.short_factor), long_factor=list(s.long_factor),
                        original_max_position_embeddings=s.original_max_len, attention_factor=s.scale)
    partial = {"partial_rotary_factor": cfg.rope_dim / cfg.d_head} if arch.name == "phi3" else {}
    cls = getattr(tr, arch.config_class)
    if "rope_parameters" in cls().to_dict():
        rope_args = {"rope_parameters": {**rope, **partial, "rope_theta": cfg.rope_theta}}
    else:
        rope_args = {"rope_theta": cfg.rope_theta, "rope_scaling": rope if cfg.rope_scaling is not None else None,
                     **partial}
    if arch.name in ("gemma2", "gemma3_text"):
        return _gemma_config(cls, cfg, rope_args, common)
    bias = {} if arch.name == "qwen2" else {"attention_bias": cfg.bias}
    if arch.name == "llama":
        bias["mlp_bias"] = cfg.bias
    if arch.name in ("mistral", "phi3"):
        bias["sliding_window"] = cfg.sliding_window
    return cls(vocab_size=cfg.tgt_vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.n_decoder_layers, num_attention_heads=cfg.n_head,
               num_key_value_heads=cfg.kv_heads, head_dim=cfg.d_head, max_position_embeddings=cfg.max_len,
               rms_norm_eps=cfg.layer_norm_eps, attention_dropout=cfg.attn_dropout, hidden_act="silu",
               **rope_args, **bias, **common)


def _gemma_config(cls, cfg: ModelConfig, rope_args: dict, common: dict):
    """Gemma3TextConfig or Gemma2Config (`cls`) of a sandwich-norm `cfg`: its sliding and full layers, each kind's
    RoPE base (Gemma 3), the attention's scale and the caps."""
    types = ["sliding_attention" if cfg.window(i) is not None else "full_attention"
             for i in range(cfg.n_decoder_layers)]
    local = cfg.rope_local_theta if cfg.rope_local_theta is not None else cfg.rope_theta
    scalar = cfg.d_head if cfg.attn_scale is None else cfg.attn_scale**-2
    if abs(scalar - round(scalar)) < 1e-6:  # (the integer it was read from)
        scalar = round(scalar)
    if cfg.qk_norm and "rope_parameters" in rope_args:  # (Gemma 3: a RoPE base per kind of layer; Gemma 2: one)
        rope_args = {"rope_parameters": {"full_attention": rope_args["rope_parameters"],
                                         "sliding_attention": {"rope_type": "default", "rope_theta": local}}}
    elif cfg.qk_norm:
        rope_args = {**rope_args, "rope_local_base_freq": local}
    return cls(vocab_size=cfg.tgt_vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
               num_hidden_layers=cfg.n_decoder_layers, num_attention_heads=cfg.n_head,
               num_key_value_heads=cfg.kv_heads, head_dim=cfg.d_head, query_pre_attn_scalar=scalar,
               max_position_embeddings=cfg.max_len, rms_norm_eps=cfg.layer_norm_eps,
               attention_dropout=cfg.attn_dropout, hidden_activation="gelu_pytorch_tanh",
               sliding_window=cfg.sliding_window or cfg.max_len, layer_types=types,
               attn_logit_softcapping=cfg.attn_softcap, final_logit_softcapping=cfg.final_softcap, **rope_args,
               **common)


def _model_class(arch: Arch):
    return getattr(_transformers(), arch.model_class)
