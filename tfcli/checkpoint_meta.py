"""The checkpoint format, without torch: where a checkpoint is, its config.json, the tokenizer files it names.
Loading and saving weights: tfcli/checkpoint.py.

    CKPT/
      model.safetensors          the weights (tied matrices stored once)
      model.int8.safetensors     its linear layers in int8 as decoding runs them (optional: `tfcli quantize`;
                                 tfcli.generate.stored), with a fingerprint of the weights they were made from
      model.fp32.safetensors     its decoder's linear layers in the fp32 row kernel's layout (optional: `tfcli
                                 quantize --dtype fp32`), the same way
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
from pathlib import Path

import tfcli
from tfcli.config import from_dict
from tfcli.errors import CheckpointError, ConfigError
from tfcli.model.config import ModelConfig

FORMAT = "tfcli-checkpoint"
FORMAT_VERSION = 1
WEIGHTS = "model.safetensors"
STORED_WEIGHTS = {"int8": "model.int8.safetensors", "fp32": "model.fp32.safetensors"}  # tfcli.generate.stored
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
    if (path / "meta.json").is_file() and list(path.glob("*.src.bin")) + list(path.glob("*.tgt.bin")):
        raise CheckpointError(f"{path}: a prepared directory (tfcli prepare's output), not a model; train one on it "
                              f"(tfcli train {path} -o RUN) and pass the run directory (-m RUN)")
    if (path / "checkpoints").is_dir():
        raise CheckpointError(f"{path}: a run directory without a saved checkpoint yet (no checkpoints/BEST or "
                              "LATEST); train it (on) with tfcli train --resume, or pass another run")
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
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # (JSONDecodeError is a ValueError)
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
