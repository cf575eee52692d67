"""Checkpoints: a directory of safetensors weights + JSON, never a pickle.

    CKPT/
      model.safetensors          the weights (tied matrices stored once)
      config.json                format version, tfcli version, resolved model/train/data config, step, metrics,
                                 and the tokenizer files below
      tokenizer.src.json         Hugging Face tokenizers files copied from the prepared directory, so
      tokenizer.tgt.json         translate/generate/eval need nothing but this directory (an LM has only tgt)
      trainer_state.safetensors  optimizer/scheduler/RNG tensors (optional: only to resume training)
      trainer_state.json         step, epoch, data position, scalar states (optional)

A run directory holds `checkpoints/step-XXXXXXX/` checkpoints plus `checkpoints/LATEST` and `checkpoints/BEST`
(text files naming one of them); anywhere a checkpoint is expected, a run directory works too (BEST, else LATEST).
Every checkpoint is written to a temp directory and renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_model

import tfcli
from tfcli.config import from_dict
from tfcli.errors import CheckpointError, ConfigError
from tfcli.io import atomic_dir, atomic_write_text, fault_point, space_needed
from tfcli.model.config import ModelConfig
from tfcli.model.transformer import build_model

FORMAT = "tfcli-checkpoint"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def resolve(path: os.PathLike | str) -> Path:
    """Find the checkpoint directory for `path`: a checkpoint itself, or a run directory (BEST, else LATEST)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint or run directory")
    if path.is_file():
        if path.name in (WEIGHTS, CONFIG):
            return resolve(path.parent)
        raise CheckpointError(
            f"{path}: not a tfcli checkpoint; pass the checkpoint directory (holding {WEIGHTS} and {CONFIG}) "
            "or the run directory. tfcli never loads pickled .pt/.bin files."
        )
    if (path / CONFIG).exists():
        return path
    ckpts = path / "checkpoints"
    for pointer in ("BEST", "LATEST"):
        p = ckpts / pointer
        if p.exists():
            return ckpts / p.read_text().strip()
    raise CheckpointError(f"{path}: not a checkpoint (no {CONFIG}) and not a run directory with checkpoints")


def input_paths(path: os.PathLike | str) -> list[Path]:
    """What loading `path` reads: the checkpoint directory and the files in it (for refusing an output that would
    replace one of them); just `path` when it is no checkpoint (loading it says why)."""
    try:
        d = resolve(path)
        return [d, *d.iterdir()]
    except (CheckpointError, OSError):
        return [Path(path)]


def read_meta(path: os.PathLike | str) -> dict:
    """The checkpoint's config.json, checked for format and version."""
    d = resolve(path)
    try:
        meta = json.loads((d / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{d / CONFIG}: unreadable or corrupt ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{d / CONFIG}: not a tfcli checkpoint config")
    if int(meta.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{d}: written by tfcli {meta.get('tfcli_version')} in checkpoint format {meta['format_version']}; "
            f"this tfcli ({tfcli.__version__}) reads up to format {FORMAT_VERSION}: upgrade tfcli"
        )
    meta["dir"] = str(d)
    return meta


def model_config(meta: dict) -> ModelConfig:
    try:
        return from_dict(ModelConfig, meta["model"], "model")
    except (KeyError, ConfigError) as e:
        raise CheckpointError(f"{meta.get('dir')}/{CONFIG}: bad model config: {e}") from None


def tokenizer_path(meta: dict, side: str) -> Path | None:
    name = meta.get("tokenizers", {}).get(side)
    return Path(meta["dir"]) / name if name else None


def tokenizer(meta: dict, side: str):
    """The checkpoint's `side` tokenizer, checked against its model: a tokenizer.json from another model would map
    ids to the wrong words, or to ids the model does not have."""
    from tfcli.data.tokenizer import load_tokenizer

    path = tokenizer_path(meta, side)
    if path is None:
        raise CheckpointError(f"{meta['dir']}: has no {side} tokenizer file")
    tok = load_tokenizer(path)
    cfg = model_config(meta)
    model_vocab = cfg.src_vocab_size if side == "src" else cfg.tgt_vocab_size
    if tok.get_vocab_size() != model_vocab:
        raise CheckpointError(
            f"{path}: has {tok.get_vocab_size()} tokens but the model's {side} vocabulary has {model_vocab}; "
            f"this tokenizer does not belong to the model in {CONFIG}"
        )
    return tok


def load(path: os.PathLike | str, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict]:
    """Build the model from the checkpoint's config and load its weights; returns (model in eval mode, meta)."""
    meta = read_meta(path)
    cfg = model_config(meta)
    with torch.random.fork_rng(devices=[]):  # the initial weights are overwritten: the caller's random stream stays
        model = build_model(cfg)
    weights = Path(meta["dir"]) / WEIGHTS
    if not weights.exists():
        raise CheckpointError(f"{weights}: missing")
    try:
        missing, unexpected = load_model(model, weights, strict=False, device=str(device))
    except SafetensorError as e:
        raise CheckpointError(f"{weights}: corrupt or truncated safetensors file ({e})") from None
    except RuntimeError as e:  # shape mismatch: weights from another architecture or vocabulary
        first = str(e).strip().splitlines()[-1].strip()
        raise CheckpointError(f"{weights}: does not match the model in {CONFIG}: {first}") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{weights}: does not match the model in {CONFIG} "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    model.to(device).eval()
    return model, meta


def save(
    path: os.PathLike | str,
    model: torch.nn.Module,
    meta: dict,
    tokenizer_files: dict[str, os.PathLike | str],
    trainer_tensors: dict[str, torch.Tensor] | None = None,
    trainer_json: dict | None = None,
) -> Path:
    """Write a checkpoint directory atomically. `meta` holds the resolved configs (model/train/data), step, metrics."""
    path = Path(path)
    model = getattr(model, "module", model)  # DDP
    model = getattr(model, "_orig_mod", model)  # torch.compile
    tensors = [*model.state_dict().values(), *(trainer_tensors or {}).values()]
    needs = sum({t.data_ptr(): t.numel() * t.element_size() for t in tensors}.values())  # tied weights once
    with atomic_dir(path, overwrite=True, needs=needs) as tmp:
        try:
            fault_point(WEIGHTS)
            save_model(model, str(tmp / WEIGHTS))
        except SafetensorError as e:  # the Rust writer's I/O errors (a full disk) are not OSErrors
            raise CheckpointError(f"{path}: cannot write: {e}{space_needed(needs)}") from None
        names = {}
        for side, src in tokenizer_files.items():
            names[side] = f"tokenizer.{side}.json"
            shutil.copyfile(src, tmp / names[side])
        full = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tfcli_version": tfcli.__version__,
            **{k: v for k, v in meta.items() if k != "dir"},
            "tokenizers": names,
        }
        atomic_write_text(tmp / CONFIG, json.dumps(full, indent=2, ensure_ascii=False) + "\n")
        if trainer_tensors is not None:
            from safetensors.torch import save_file

            try:
                save_file({k: v.contiguous() for k, v in trainer_tensors.items()}, str(tmp / "trainer_state.safetensors"))
            except SafetensorError as e:
                raise CheckpointError(f"{path}: cannot write: {e}{space_needed(needs)}") from None
            atomic_write_text(tmp / "trainer_state.json", json.dumps(trainer_json or {}, indent=2) + "\n")
    return path


def load_trainer_state(path: os.PathLike | str) -> tuple[dict[str, torch.Tensor], dict]:
    d = resolve(path)
    t, j = d / "trainer_state.safetensors", d / "trainer_state.json"
    if not t.exists() or not j.exists():
        raise CheckpointError(f"{d}: has no trainer state to resume from (weights-only checkpoint)")
    try:
        return load_file(str(t)), json.loads(j.read_text())
    except (SafetensorError, json.JSONDecodeError, OSError) as e:
        raise CheckpointError(f"{d}: corrupt trainer state ({e})") from None
