"""`tfcli export --to hf`: a tfcli model as a `transformers` model directory (the mapping: `hf`)."""

from __future__ import annotations

import json
from pathlib import Path

from tfcli.config import to_dict
from tfcli.errors import TfcliError
from tfcli.interop.hf import _model_class, _no_progress_bars, _transformers, hf_arch, hf_config, to_hf_state
from tfcli.model.config import ModelConfig
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID


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
