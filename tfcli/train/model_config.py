"""The model a run trains: a preset with the run's overrides, fitted to its prepared data; on --resume the run's own
architecture, which may not change; with --init-from the checkpoint's, whose tokenizers the data must use."""

from __future__ import annotations

import dataclasses
import json

from tfcli import checkpoint_meta
from tfcli.config import to_dict
from tfcli.errors import ConfigError
from tfcli.model.config import PRESETS, RENAMED, ModelConfig, preset
from tfcli.train.config import TrainConfig, differences


def run_model_config(cfg: TrainConfig, data, overrides: dict, saved: dict | None) -> ModelConfig:
    """`data`: the run's PreparedData; `saved`: the resumed checkpoint's config.json (None for a new run)."""
    if cfg.init_from:  # a fine-tuning run, new or resumed: the architecture is the checkpoint's
        return _fine_tune_config(saved or checkpoint_meta.read_meta(cfg.init_from), data, overrides)
    if cfg.arch not in PRESETS:
        preset(cfg.arch)  # raises the "unknown preset" message
    kind = PRESETS[cfg.arch].get("kind", "seq2seq")
    if kind == "lm" and data.kind == "parallel" and not data.meta.get("joint_vocab"):
        raise ConfigError(f"{data.path}: a decoder-only translator reads source and target with one vocabulary, "
                          "and this data has one a side: prepare it with --joint-vocab")
    if kind == "seq2seq" and data.kind != "parallel":
        what = "monolingual (language-model) data" if data.kind == "mono" else "parallel (translation) data"
        presets = [n for n, p in PRESETS.items() if p.get("kind", "seq2seq") == kind]
        others = [n for n in PRESETS if n not in presets]
        model = "an encoder-decoder" if kind == "seq2seq" else "a decoder-only language model"
        raise ConfigError(f"{data.path}: holds {what}, but --arch {cfg.arch} is {model}; "
                          f"use one of: {', '.join(others)}")
    vocab = {"tgt_vocab_size": data.vocab_size("tgt")}
    if kind == "seq2seq":
        vocab["src_vocab_size"] = data.vocab_size("src")
        if data.meta.get("joint_vocab") and "share_embeddings" not in overrides:
            overrides = {**overrides, "share_embeddings": True}  # one vocabulary: one embedding table
        elif not data.meta.get("joint_vocab") and overrides.get("share_embeddings"):
            # two vocabularies of one size would pass the model's size check and tie unrelated tokens' rows
            raise ConfigError(f"{data.path}: prepared with one vocabulary a side (--separate-vocab), but "
                              "model.share_embeddings is true, which needs one joint vocabulary; set "
                              "model.share_embeddings=false or prepare with --joint-vocab")
    model_cfg = preset(cfg.arch, **{**overrides, **vocab})
    if saved is None:
        return model_cfg
    old = checkpoint_meta.model_config(saved)
    old_arch = saved.get("train", {}).get("arch")
    old_arch = RENAMED.get(old_arch, old_arch)
    if old_arch != cfg.arch:
        raise ConfigError(f"--resume: the run was trained with --arch {old_arch}; it cannot change to {cfg.arch}")
    wanted = checkpoint_meta.model_config({**saved, "model": {**to_dict(old), **overrides}})
    diff = differences(old, wanted)
    if diff:
        raise ConfigError(f"--resume: the architecture cannot change ({'; '.join(diff)})")
    if (old.src_vocab_size, old.tgt_vocab_size) != (model_cfg.src_vocab_size, model_cfg.tgt_vocab_size):
        raise ConfigError(f"--resume: {data.path} has other vocabulary sizes than the run's model "
                          f"({model_cfg.src_vocab_size}/{model_cfg.tgt_vocab_size} vs "
                          f"{old.src_vocab_size}/{old.tgt_vocab_size}); resume with the same data")
    return old


def _same_tokenizer(theirs: dict, ours: dict, added: set[str]) -> bool:
    """Whether a prepared directory's tokenizer.json is the checkpoint's, but for the language tokens `added`
    after its own (prepare --add-language; each side read back through the library, which wrote ours)."""
    if not added:
        return theirs == ours
    from tokenizers import Tokenizer

    extra = [t for t in ours.get("added_tokens", []) if t["content"] in added]
    ours = {**ours, "added_tokens": [t for t in ours.get("added_tokens", []) if t["content"] not in added]}
    before, after = (Tokenizer.from_str(json.dumps(d)) for d in (theirs, ours))
    size = before.get_vocab_size(with_added_tokens=True)
    return len(extra) == len(added) and all(t["id"] >= size for t in extra) and before.to_str() == after.to_str()


def _fine_tune_config(meta: dict, data, overrides: dict) -> ModelConfig:
    """--init-from: the checkpoint's architecture (regularisation may change), if its tokenizers are the data's."""
    cfg = checkpoint_meta.model_config(meta)
    if cfg.kind == "seq2seq" and data.kind != "parallel":
        raise ConfigError(f"--init-from {meta['dir']}: a {cfg.kind} model cannot train on {data.kind} data")
    added = {a["token"] for a in (data.meta.get("new_languages") or {}).values()}
    for side, path in data.tokenizer_files().items():  # (a language model's one vocabulary reads both sides)
        theirs = checkpoint_meta.tokenizer_path(meta, side if cfg.kind == "seq2seq" else "tgt")
        if theirs is None or not _same_tokenizer(json.loads(theirs.read_text("utf-8")),
                                                 json.loads(path.read_text("utf-8")), added):
            raise ConfigError(f"{data.path}: its {side} tokenizer is not the one of --init-from {meta['dir']}; "
                              f"prepare the data with: tfcli prepare ... --tokenizer-from {meta['dir']}")
    if added:  # (the new languages' rows: tfcli.train.adapt.grown)
        sizes = {f"{side}_vocab_size": max(getattr(cfg, f"{side}_vocab_size"), data.vocab_size(side))
                 for side in data.tokenizer_files() if cfg.kind == "seq2seq" or side == "tgt"}
        cfg = dataclasses.replace(cfg, **sizes)
    changeable = {"dropout", "attn_dropout"}
    fixed = sorted(k for k, v in overrides.items() if k not in changeable and getattr(cfg, k) != v)
    if fixed:
        raise ConfigError(f"--init-from: model.{fixed[0]} comes from the checkpoint; only "
                          f"{' and '.join(sorted(changeable))} can change when fine-tuning")
    return dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if k in changeable})
