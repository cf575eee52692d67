"""Loading and saving checkpoints (see tfcli/checkpoint_meta.py for the format): the weights through safetensors,
never a pickle, and the tokenizers checked against the model they belong to."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_model

import tfcli
from tfcli.checkpoint_meta import CONFIG, FORMAT, FORMAT_VERSION, WEIGHTS, model_config, read_meta, resolve, tokenizer_path
from tfcli.data.tokenizer import load_tokenizer
from tfcli.errors import CheckpointError
from tfcli.io import atomic_dir, atomic_write_text, fault_point, space_needed
from tfcli.model.transformer import build_model


def tokenizer(meta: dict, side: str):
    """The checkpoint's `side` tokenizer, checked against its model: a tokenizer.json from another model would map
    ids to the wrong words, or to ids the model does not have."""
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


def load(path: os.PathLike | str | dict, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, dict]:
    """Build the model from the checkpoint's config and load its weights; returns (model in eval mode, meta).
    `path` may be the meta that `read_meta` returned, so that a caller who looked first reads config.json once."""
    meta = path if isinstance(path, dict) else read_meta(path)
    cfg = model_config(meta)
    weights = Path(meta["dir"]) / WEIGHTS
    if not weights.exists():
        raise CheckpointError(f"{weights}: missing")
    try:
        model, missing, unexpected = _load_weights(cfg, weights, str(device))
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


def _load_weights(cfg, weights: Path, device: str) -> tuple[torch.nn.Module, list[str], list[str]]:
    """The model of `cfg` holding the file's tensors, with (missing, unexpected) names. Built on the meta device and
    given the tensors read (not copied into freshly initialised ones: no random initialisation of weights the file
    replaces, and no second copy of the model while loading); a parameter known by several names (tied output
    layer, shared embeddings) stays one, and the buffers that are not saved (position tables) are computed."""
    with torch.device("meta"):
        model = build_model(cfg)
    own = dict(model.named_parameters(remove_duplicate=False))
    names: dict[int, list[str]] = {}  # (each parameter's names: a tied one has several)
    for name, p in own.items():
        names.setdefault(id(p), []).append(name)
    state = {k: t.to(own[k].dtype) if k in own and t.dtype != own[k].dtype else t
             for k, t in load_file(str(weights), device=device).items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    for group in names.values():  # (the file holds one name of each tied group: the others are made that one)
        held = [n for n in group if n in state]
        if held and len(group) > 1:
            value = model.get_parameter(held[0])
            for n in group:
                owner, _, attr = n.rpartition(".")
                setattr(model.get_submodule(owner), attr, value)
            missing = [m for m in missing if m not in group]
    for module in model.modules():
        if hasattr(module, "compute_buffers"):
            module.compute_buffers(device)
    return model, missing, unexpected


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
