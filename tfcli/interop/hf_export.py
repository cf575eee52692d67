"""`tfcli export --to hf`: a tfcli model as a `transformers` model directory (the mapping: `hf`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcli.config import to_dict
from tfcli.data.vocab import permute_vocabulary, plain_name, vocab_list
from tfcli.errors import TfcliError
from tfcli.interop.hf import (
    _model_class, _no_progress_bars, _transformers, hf_arch, hf_config, to_hf_state, to_peft_state,
)
from tfcli.model.config import ModelConfig
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID


@dataclass
class Layout:
    """An export's vocabulary where it is not tfcli's: `rows[i]` is the tfcli id of its token i."""

    rows: list[int]
    ids: dict  # hf_config's vocab_size and special ids
    suppress: list[int]  # the tokens its generation config never outputs


def fairseq_layout(model, cfg: ModelConfig, tokens: list[str]) -> Layout:
    """M2M100's vocabulary: fairseq's <s>, <pad>, </s>, <unk> at 0-3 (its positions count from <pad> + 1 = 2, as
    tfcli's "fairseq" table does), then tfcli's other tokens in order. A model imported from M2M100 starts its
    decoder from its </s> (tfcli's <s> is a copy of that row, never output) and holds fairseq's own <s> as a plain
    row (`<s|0>`): that copy is left out and fairseq's <s> goes back to 0, which is the original's layout. M2M100
    has no output bias: one that does more than keep left-out or never-output tokens away is refused."""
    V = cfg.tgt_vocab_size
    emb = model.decoder.embed.tok.weight
    original = plain_name(SPECIAL_TOKENS[BOS_ID], 0)
    if original in tokens and torch.equal(emb[BOS_ID], emb[EOS_ID]):
        s = tokens.index(original)
        rows, start, suppress = [s, PAD_ID, EOS_ID, UNK_ID, *(i for i in range(4, V) if i != s)], 2, [1]
    else:
        rows, start, suppress = [BOS_ID, PAD_ID, EOS_ID, UNK_ID, *range(4, V)], 0, [1, 0]
    if cfg.output_bias:
        kept = model.lm_head.bias.detach()[rows]
        kept[suppress] = 0.0
        if kept.any():
            raise TfcliError("--to hf: the model has an output bias (model.output_bias), which M2M100 lacks; export "
                             "with --to ctranslate2")
    ids = dict(vocab_size=len(rows), pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=start)
    return Layout(rows, ids, suppress)


def to_hf_model(model, cfg: ModelConfig, layout: Layout | None = None):
    """A `transformers` model computing the same function as the tfcli `model` (see the module docstring), its
    vocabulary in `layout` where given."""
    arch = hf_arch(cfg)
    hf = _model_class(arch)(hf_config(cfg, arch, layout.ids if layout else None)).eval()
    state = to_hf_state(model, cfg, arch)
    if layout is not None:
        for name in ("model.shared.weight", "lm_head.weight"):
            if name in state:
                state[name] = state[name][layout.rows].contiguous()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    computed = ("embed_positions", "final_logits_bias", "attn.bias", "attn.masked_bias")  # tables, buffers
    tied = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    left = [k for k in missing if k not in tied and not any(c in k for c in computed)]
    if left or unexpected:
        raise TfcliError(f"internal error: the {arch.name} mapping left {left[:3]} unset and {unexpected[:3]} unknown")
    return hf


def _hf_tokenizer_json(tok_path: Path, add_eos: bool, layout: Layout | None = None) -> str:
    """tfcli's tokenizer.json for AutoTokenizer (in `layout`'s order where given): with `add_eos`, a post-processor
    appends </s> as tfcli does to every source (so `tokenizer(text)` gives the ids the model was trained on)."""
    data = json.loads(tok_path.read_text(encoding="utf-8"))
    if layout is not None:
        data = permute_vocabulary(data, layout.rows, {0: SPECIAL_TOKENS[BOS_ID]})
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
    seq2seq = cfg.kind == "seq2seq"
    main = tokenizers["src" if seq2seq else "tgt"]
    layout = None
    if hf_arch(cfg).positions == "fairseq":  # (M2M100's: fairseq's vocabulary layout)
        layout = fairseq_layout(model, cfg, vocab_list(json.loads(main.read_text(encoding="utf-8"))))
    hf = to_hf_model(model, cfg, layout)
    if layout is None or layout.ids["decoder_start_token_id"] == 0:  # (not an imported M2M100's layout)
        hf.config.tfcli_model = to_dict(cfg)  # so that `tfcli import` restores this config exactly (extra key)
    hf.generation_config.suppress_tokens = layout.suppress if layout else [PAD_ID, BOS_ID]  # as tfcli's decoders
    hf.generation_config.forced_eos_token_id = None
    with _no_progress_bars(tr):  # transformers' own "Writing model shards" bar: tfcli's stderr is its own
        hf.save_pretrained(out_dir)
    (out_dir / "tokenizer.json").write_text(_hf_tokenizer_json(main, seq2seq, layout), encoding="utf-8")
    fast = tr.PreTrainedTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"), pad_token=SPECIAL_TOKENS[PAD_ID],
                                      bos_token=SPECIAL_TOKENS[BOS_ID], eos_token=SPECIAL_TOKENS[EOS_ID],
                                      unk_token=SPECIAL_TOKENS[UNK_ID])
    fast.save_pretrained(out_dir)
    if seq2seq and tokenizers["tgt"].read_bytes() != tokenizers["src"].read_bytes():
        (out_dir / "target_tokenizer.json").write_text(_hf_tokenizer_json(tokenizers["tgt"], add_eos=False),
                                                       encoding="utf-8")
    return type(hf).__name__


def save_peft(model, cfg: ModelConfig, record: dict, out_dir: Path) -> str:
    """A LoRA run's adapters in the layout PEFT reads (adapter_config.json, adapter_model.safetensors), for the
    `transformers` export of the model they were trained on (`tfcli export BASE --to hf`); returns the class name
    of that export."""
    from safetensors.torch import save_file

    from tfcli.model import lora

    arch = hf_arch(cfg)
    state = to_peft_state(lora.adapters(model), cfg, arch)
    config = {
        "peft_type": "LORA", "task_type": "SEQ_2_SEQ_LM" if arch.kind == "seq2seq" else "CAUSAL_LM",
        "base_model_name_or_path": record["base"], "r": record["rank"], "lora_alpha": record["alpha"],
        "lora_dropout": record["dropout"], "bias": "none", "fan_in_fan_out": arch.name == "gpt2",  # (its Conv1D)
        "target_modules": sorted({k.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for k in state}),
        "inference_mode": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(state, str(out_dir / "adapter_model.safetensors"))
    return arch.model_class
