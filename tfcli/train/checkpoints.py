"""A run's checkpoints, and what each holds beyond the weights.

RUN/checkpoints/step-NNNNNNN/ is one checkpoint (tfcli/checkpoint.py: weights, config, tokenizers, and here the
trainer state); LATEST and BEST are files naming one; avg-lastK is an average. The trainer state is everything a
step depends on besides the weights: the optimizer's moments, every process's RNG states, and the loop's counters
(step, epoch, position in the epoch's batch list), so that a resumed run reaches the same weights as an
uninterrupted one.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from tfcli import checkpoint, distributed
from tfcli.errors import CheckpointError

CHECKPOINTS = "checkpoints"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_name(step: int) -> str:
    return f"step-{step:07d}"


def step_dirs(ckpt_dir: Path) -> list[Path]:
    """The step-N checkpoints of a run's checkpoints/ directory, oldest first."""
    found = sorted((int(m.group(1)), d) for d in ckpt_dir.iterdir() if (m := STEP_DIR.match(d.name)) and d.is_dir())
    return [d for _, d in found]


def resume_point(run_dir: str | Path) -> Path:
    """The checkpoint `--resume` continues from: RUN/checkpoints/LATEST."""
    pointer = Path(run_dir) / CHECKPOINTS / "LATEST"
    if not pointer.exists():
        raise CheckpointError(f"{run_dir}: nothing to resume (no {CHECKPOINTS}/LATEST); start without --resume")
    return Path(run_dir) / CHECKPOINTS / pointer.read_text().strip()


def prune(ckpt_dir: Path, keep: int, protected: set[str]) -> None:
    """Delete all but the last `keep` step-N checkpoints, sparing the names in `protected` (the best one)."""
    for d in step_dirs(ckpt_dir)[:-keep]:
        if d.name not in protected:
            shutil.rmtree(d, ignore_errors=True)


def pack_state(optimizer, scaler, torch_states: list, cuda_states: list, counters: dict,
               moments: dict | None = None) -> tuple[dict, dict]:
    """(tensors, JSON state) for checkpoint.save: the optimizer's moments (`moments`: an FSDP run's, gathered
    whole), the RNG states (torch's and CUDA's of every process, numpy's, Python's) and the loop's `counters`."""
    tensors: dict[str, torch.Tensor] = {}
    extra: dict = {}
    for i, st in (optimizer.state_dict()["state"] if moments is None else moments).items():
        for key, value in st.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{i}.{key}"] = value.detach().cpu()
            else:
                extra[f"{i}.{key}"] = value
    for r, t in enumerate(torch_states):
        tensors[f"rng.torch.{r}"] = t
    for r, t in enumerate(cuda_states):
        tensors[f"rng.cuda.{r}"] = t
    np_state = np.random.get_state()
    tensors["rng.numpy"] = torch.from_numpy(np_state[1].astype(np.int64))
    py_state = random.getstate()
    state = {
        **counters,
        "optimizer_extra": extra,
        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
        "rng_numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "rng_python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    return tensors, state


def restore_state(path: Path, optimizer, scaler, rank: int, device: torch.device) -> dict:
    """Load a checkpoint's trainer state into `optimizer`, `scaler` and the RNGs (this process's, or rank 0's where
    the run had fewer processes); return the JSON state, the loop's counters included."""
    tensors, state = checkpoint.load_trainer_state(path)
    try:
        # optimizer: this run's param groups (from the config), the saved moments
        sd = optimizer.state_dict()
        params = [p for g in optimizer.param_groups for p in g["params"]]
        opt_state: dict = {}
        for key, value in tensors.items():
            if key.startswith("optimizer."):
                _, i, name = key.split(".", 2)
                opt_state.setdefault(int(i), {})[name] = value
        for key, value in state["optimizer_extra"].items():
            i, name = key.split(".", 1)
            opt_state.setdefault(int(i), {})[name] = value
        for i, st in opt_state.items():
            if i >= len(params) or any(
                torch.is_tensor(v) and v.dim() > 0 and v.shape != params[i].shape for v in st.values()
            ):
                raise CheckpointError(f"{path}: optimizer state does not match the model")
            st.update({k: distributed.shard_like(params[i], v) for k, v in st.items()  # (an FSDP run's shards)
                       if torch.is_tensor(v) and v.dim() > 0})
        sd["state"] = opt_state
        optimizer.load_state_dict(sd)
        if state.get("scaler") and scaler.is_enabled():
            scaler.load_state_dict(state["scaler"])
        rank = rank if f"rng.torch.{rank}" in tensors else 0
        torch.set_rng_state(tensors[f"rng.torch.{rank}"])
        if device.type == "cuda" and f"rng.cuda.{rank}" in tensors:
            torch.cuda.set_rng_state(tensors[f"rng.cuda.{rank}"], device)
        name, pos, has_gauss, cached = state["rng_numpy"]
        np.random.set_state((name, tensors["rng.numpy"].numpy().astype(np.uint32), pos, has_gauss, cached))
        version, internal, gauss = state["rng_python"]
        random.setstate((version, tuple(internal), gauss))
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt or incomplete trainer state ({type(e).__name__}: {e})") from None
    return state
