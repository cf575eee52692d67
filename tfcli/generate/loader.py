"""A checkpoint loaded for inference: the model, its config and tokenizers, and its decoder arranged for decoding."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli import checkpoint
from tfcli.errors import CheckpointError
from tfcli.generate.step import StepModel
from tfcli.model.config import ModelConfig


@dataclass
class Loaded:
    model: torch.nn.Module  # in eval mode, otherwise as trained: it can still be trained, saved or moved
    cfg: ModelConfig
    meta: dict  # the checkpoint's config.json, with "dir"
    src_tok: object | None  # tokenizers.Tokenizer; None for a language model
    tgt_tok: object
    steps: StepModel  # its decoder arranged for decoding (fp32 on the CPU: weights packed for oneDNN; or int8)


def load(path: str, device: torch.device, kind: str | None, dtype: str = "fp32") -> Loaded:
    """Load a checkpoint and its tokenizers, ready for inference; `kind` ("seq2seq" or "lm") is the one expected,
    None for either. config.json is read once. The process is left as it was (threads, allocator, random stream)."""
    meta = checkpoint.read_meta(path)
    cfg = checkpoint.model_config(meta)
    if kind is not None and cfg.kind != kind:
        want = "a translation (seq2seq)" if kind == "seq2seq" else "a language model (lm)"
        hint = "tfcli lm-generate" if cfg.kind == "lm" else "tfcli translate"
        raise CheckpointError(f"{meta['dir']}: is a {cfg.kind} model, not {want}; use `{hint}`")
    model, meta = checkpoint.load(meta, device)
    toks = {side: checkpoint.tokenizer(meta, side) for side in (("src", "tgt") if cfg.kind == "seq2seq" else ("tgt",))}
    steps = StepModel(model, pack=dtype == "fp32", int8=dtype == "int8")
    return Loaded(model, cfg, meta, toks.get("src"), toks["tgt"], steps)
