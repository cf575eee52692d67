"""`tfcli export --to hf`: a tfcli model as a `transformers` model directory (the mapping: `hf`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcli.config import to_dict
from tfcli.data.vocab import UNUSED_NAME, permute_vocabulary, plain_name, vocab_list
from tfcli.errors import TfcliError
from tfcli.interop.hf import (
    ROW_HOLDERS, _model_class, _no_progress_bars, _transformers, hf_arch, hf_config, to_hf_state, to_peft_state,
)
from tfcli.model.config import ModelConfig
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID


@dataclass
class Layout:
    """An export's vocabulary where it is not tfcli's: `rows[i]` is the tfcli id of its token i."""

    rows: list[int]
    ids: dict  # hf_config's vocab_size and special ids
    suppress: list[int]  # the tokens its generation config never outputs
    names: dict[int, str] = dataclasses.field(default_factory=dict)  # tokens renamed on the way out
    family: dict | None = None  # an imported language model's text conventions (checkpoint meta "text")


def family_layout(model, cfg: ModelConfig, text: dict) -> Layout:
    """An imported published language model's own vocabulary, for the export back to its family: the special
    tokens import moved to tfcli's ids go back to the family's (`text["family_ids"]`), the rows it added for the
    specials the family lacks are left out, every other token keeps its order (rows a fine-tune added, new
    language tokens, come last). The output bias import gave the rows left out is dropped; one that does more is
    refused."""
    heads = text.get("family_ids")
    if heads is None:
        raise TfcliError("--to hf: this model was imported by an earlier tfcli, which did not record its family's "
                         "special-token ids; import it again (tfcli import) and export that")
    row = {}  # the family's id -> the tfcli id whose row import filled (of two ids on one row: ROW_HOLDERS)
    for i in ROW_HOLDERS:
        if heads[i] >= 0:
            row.setdefault(heads[i], i)
    rest = iter(range(len(SPECIAL_TOKENS), cfg.tgt_vocab_size))
    rows = [row[h] if h in row else next(rest) for h in range(cfg.tgt_vocab_size - len(heads) + len(row))]
    if cfg.output_bias and model.lm_head.bias.detach()[rows].any():
        raise TfcliError("--to hf: the model's output bias (model.output_bias) holds more than import gave it, and "
                         "its family has none; export with --to ctranslate2")
    where = {t: h for h, t in enumerate(rows)}  # tfcli id -> the family's
    ends = [where[i] for i in [EOS_ID, *text.get("ends", [])] if i in where]
    ids = dict(vocab_size=len(rows), bos_token_id=where.get(BOS_ID), pad_token_id=where.get(PAD_ID),
               eos_token_id=ends[0] if len(ends) == 1 else ends or None)
    return Layout(rows, ids, [], family=text)


def target_arch(cfg: ModelConfig, meta: dict):
    """The transformers architecture the export writes (an imported family's own where it expresses the model)."""
    return hf_arch(exported_config(cfg, meta), (meta.get("text") or {}).get("family"))


def exported_config(cfg: ModelConfig, meta: dict) -> ModelConfig:
    """The config the export writes: an imported language model's without the output bias import added for the
    specials its family lacks (`family_layout` drops those rows)."""
    if cfg.kind == "lm" and "text" in meta:
        return dataclasses.replace(cfg, output_bias=False)
    return cfg


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
    return Layout(rows, ids, suppress, {0: SPECIAL_TOKENS[BOS_ID]})


def to_hf_model(model, cfg: ModelConfig, layout: Layout | None = None):
    """A `transformers` model computing the same function as the tfcli `model` (see the module docstring), its
    vocabulary in `layout` where given."""
    arch = hf_arch(cfg, layout.family.get("family") if layout and layout.family else None)
    hf = _model_class(arch)(hf_config(cfg, arch, layout.ids if layout else None)).eval()
    state = to_hf_state(model, cfg, arch)
    if layout is not None:
        for name in ("model.shared.weight", "model.embed_tokens.weight", "lm_head.weight"):
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
    appends </s> as tfcli does to every source (so `tokenizer(text)` gives the ids the model was trained on); for
    an imported family, one that puts its start (BOS) first, as its own did, and no name for the rows past its
    tokens."""
    data = json.loads(tok_path.read_text(encoding="utf-8"))
    if layout is not None:
        data = permute_vocabulary(data, layout.rows, layout.names)
    if layout is not None and layout.family is not None:
        tokens = vocab_list(data)
        for t in tokens:  # (BPE and WordLevel vocabularies: a token -> id map, which may skip ids)
            if t.startswith(UNUSED_NAME) and t in data["model"]["vocab"]:
                del data["model"]["vocab"][t]
        where = {t: h for h, t in enumerate(layout.rows)}
        names = {tokens[where[i]]: where[i] for i in layout.family["start"]}
        start = [{"SpecialToken": {"id": n, "type_id": 0}} for n in names]
        if start:
            data["post_processor"] = {
                "type": "TemplateProcessing", "single": [*start, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [*start, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {n: {"id": n, "ids": [i], "tokens": [n]} for n, i in names.items()},
            }
    if add_eos:
        data["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}},
                     {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "special_tokens": {"</s>": {"id": "</s>", "ids": [EOS_ID], "tokens": ["</s>"]}},
        }
    return json.dumps(data, ensure_ascii=False)


def save_hf(model, cfg: ModelConfig, tokenizers: dict[str, Path], out_dir: Path, meta: dict | None = None) -> str:
    """Write the `transformers` model directory (config, safetensors weights, tokenizer) into `out_dir`; returns
    the class name. The tokenizer AutoTokenizer loads is the source side's; where the target's differs (no joint
    vocabulary) it is saved beside it as target_tokenizer.json. An imported published language model (checkpoint
    `meta` with "text") goes back in its family's own vocabulary, special tokens, chat template and generation
    defaults (`family_layout`)."""
    tr = _transformers()
    seq2seq = cfg.kind == "seq2seq"
    main = tokenizers["src" if seq2seq else "tgt"]
    layout = None
    text = (meta or {}).get("text")
    if text is not None and not seq2seq:
        layout = family_layout(model, cfg, text)
        cfg = exported_config(cfg, meta)
    elif hf_arch(cfg).positions == "fairseq":  # (M2M100's: fairseq's vocabulary layout)
        layout = fairseq_layout(model, cfg, vocab_list(json.loads(main.read_text(encoding="utf-8"))))
    hf = to_hf_model(model, cfg, layout)
    if layout is None or layout.ids.get("decoder_start_token_id") == 0:  # (tfcli's layout, not an import's)
        hf.config.tfcli_model = to_dict(cfg)  # so that `tfcli import` restores this config exactly (extra key)
    _generation_config(hf.generation_config, layout)
    with _no_progress_bars(tr):  # transformers' own "Writing model shards" bar: tfcli's stderr is its own
        hf.save_pretrained(out_dir)
    (out_dir / "tokenizer.json").write_text(_hf_tokenizer_json(main, seq2seq, layout), encoding="utf-8")
    if text is not None and not seq2seq:
        names = {k: v for k, v in (text.get("template_tokens") or {}).items() if k.endswith("_token")}
        fast = tr.PreTrainedTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"), **names,
                                          chat_template=text.get("chat_template"))
    else:
        fast = tr.PreTrainedTokenizerFast(tokenizer_file=str(out_dir / "tokenizer.json"),
                                          pad_token=SPECIAL_TOKENS[PAD_ID], bos_token=SPECIAL_TOKENS[BOS_ID],
                                          eos_token=SPECIAL_TOKENS[EOS_ID], unk_token=SPECIAL_TOKENS[UNK_ID])
    fast.save_pretrained(out_dir)
    if seq2seq and tokenizers["tgt"].read_bytes() != tokenizers["src"].read_bytes():
        (out_dir / "target_tokenizer.json").write_text(_hf_tokenizer_json(tokenizers["tgt"], add_eos=False),
                                                       encoding="utf-8")
    return type(hf).__name__


def _generation_config(gen, layout: Layout | None) -> None:
    """What generate does by default: never output tfcli's <pad> and <s> (as tfcli's decoders), or an imported
    family's own end tokens and sampling defaults."""
    gen.forced_eos_token_id = None
    if layout is None or layout.family is None:
        gen.suppress_tokens = layout.suppress if layout else [PAD_ID, BOS_ID]
        return
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(gen, key, layout.ids[key])
    for key, value in (layout.family.get("generation") or {}).items():
        setattr(gen, key, value)


def save_peft(model, cfg: ModelConfig, meta: dict, out_dir: Path) -> str:
    """A LoRA run's adapters in the layout PEFT reads (adapter_config.json, adapter_model.safetensors), for the
    `transformers` export of the model they were trained on (`tfcli export BASE --to hf`); returns the class name
    of that export."""
    from safetensors.torch import save_file

    from tfcli.model import lora

    arch, record = target_arch(cfg, meta), meta["adapter"]
    state = to_peft_state(lora.adapters(model), exported_config(cfg, meta), arch)
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
