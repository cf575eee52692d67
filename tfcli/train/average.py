"""Checkpoint averaging: the element-wise mean of the last K checkpoints' weights (Vaswani et al. 2017 averaged the
last 5 for base models), usually a little better than any single one of them."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from tfcli import checkpoint

from tfcli import checkpoint_meta
from tfcli.errors import CheckpointError, TfcliError
from tfcli.io import refuse_overwriting_inputs
from tfcli.train.checkpoints import CHECKPOINTS, step_dirs


def available_checkpoints(run_dir: os.PathLike | str) -> int:
    """How many step-N checkpoints a run directory holds (an error when it holds none)."""
    return len(_step_checkpoints(run_dir))


def _step_checkpoints(run_dir: os.PathLike | str) -> list[Path]:
    ckpts = Path(run_dir) / CHECKPOINTS
    if not ckpts.is_dir():
        raise CheckpointError(f"{run_dir}: not a run directory (no {CHECKPOINTS}/)")
    found = step_dirs(ckpts)
    if not found:
        raise CheckpointError(f"{ckpts}: no step-N checkpoints to average")
    return found


def last_checkpoints(run_dir: os.PathLike | str, k: int) -> list[Path]:
    """The last `k` step-N checkpoints of a run directory, oldest first."""
    found = _step_checkpoints(run_dir)
    ckpts = Path(run_dir) / CHECKPOINTS
    if k < 1:
        raise TfcliError(f"--last {k}: average at least one checkpoint")
    if len(found) < k:
        raise CheckpointError(f"{ckpts}: asked to average the last {k} checkpoints, but there are {len(found)} "
                              f"(keep more with --keep-last)")
    return found[-k:]


def average_checkpoints(
    source: os.PathLike | str | list, k: int, out: os.PathLike | str, overwrite: bool = False
) -> Path:
    """Average the last `k` checkpoints of run directory `source` (or the checkpoint directories in a list) into a
    new weights-only checkpoint `out` (config and tokenizers from the newest)."""
    dirs = [checkpoint_meta.resolve(d) for d in source] if isinstance(source, list) else last_checkpoints(source, k)
    if len(dirs) < 1:
        raise TfcliError("nothing to average")
    out = Path(out)
    inputs = [p for d in dirs for p in checkpoint_meta.input_paths(d)]
    refuse_overwriting_inputs([out], inputs, "choose another --output")
    if out.exists() and not overwrite:
        raise TfcliError(f"{out}: already exists (pass --force to replace it)")
    total: dict[str, torch.Tensor] = {}
    first_cfg = None
    model = meta = None
    for d in dirs:
        model, meta = checkpoint.load(d, "cpu", mapped=True)
        cfg = checkpoint_meta.model_config(meta)
        if first_cfg is None:
            first_cfg = cfg
        elif cfg != first_cfg:
            raise CheckpointError(f"{d}: another architecture than {dirs[0]}; only checkpoints of one run average")
        for name, value in model.state_dict().items():
            if value.is_floating_point():
                total[name] = total[name] + value.double() if name in total else value.double()
    state = model.state_dict()
    for name, value in total.items():
        state[name].copy_((value / len(dirs)).to(state[name].dtype))
    tokenizers = {side: checkpoint_meta.tokenizer_path(meta, side) for side in meta.get("tokenizers", {})}
    meta = {k: v for k, v in meta.items() if k not in ("dir", "tokenizers", "format", "format_version", "tfcli_version")}
    meta["averaged_from"] = [str(d) for d in dirs]
    checkpoint.save(out, model, meta, tokenizers)
    return out
