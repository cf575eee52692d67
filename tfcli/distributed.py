"""Several processes through `torchrun`: NCCL on GPUs, gloo on CPUs.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; without them a command runs as one process, without a process group.
Under torchrun a process group is joined even by a single process, so that `torchrun --nproc_per_node 1` runs the
code of N processes (DDP, NCCL) on a one-GPU machine. Training: every rank
builds the same deterministic batch list and takes its own share of each step's batches, gradients are summed by
DistributedDataParallel's all-reduce (or, with train.fsdp, each rank holds a shard of every parameter, its
gradient and its optimizer moments: torch's FSDP), and only rank 0 writes checkpoints, logs and the progress bar.
Translation:
each rank translates its parts of the file and rank 0 joins them (tfcli/generate/shards.py).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tfcli.device import resolve_device


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    enabled: bool = False  # in a process group (started by torchrun)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    """The device `name` means for the process with this LOCAL_RANK: on a GPU machine each process its own GPU."""
    device = resolve_device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device(f"cuda:{local_rank}")
    return device


def launched() -> DistInfo:
    """This process's place among the processes torchrun started (one process of one without torchrun)."""
    env = os.environ
    return DistInfo(int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")),
                    enabled="WORLD_SIZE" in env)


def setup(device_name: str) -> tuple[DistInfo, torch.device]:
    """Join the process group if launched by torchrun; pick this process's device."""
    info = launched()
    device = pick_device(device_name, info.local_rank)
    if info.enabled and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # the group's device, named where torch takes it (barrier() asks for it)
        bound = {"device_id": device} if device.type == "cuda" and "device_id" in inspect.signature(
            dist.init_process_group).parameters else {}
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", **bound)
    return info, device


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    if not info.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel

    # no buffer broadcast: the only buffers are position tables, which each rank may grow to its own lengths
    # (the keyword was renamed in torch 2.13)
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    no_sync_buffers = {"forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers": False}
    return DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, **no_sync_buffers
    )


def shard_model(root: torch.nn.Module, model: torch.nn.Module, device: torch.device) -> None:
    """FSDP (fully_shard): each encoder and decoder layer of `model` a unit whose parameters are gathered for its
    forward and backward and freed after, the rest (embeddings, final norms, output layer) the unit of `root`, the
    module whose forward training calls (the model with its loss); each process keeps 1/N of every parameter, of
    its gradient (reduce-scattered, averaged as DDP averages) and of its moments."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for stack in (getattr(model, "encoder", None), model.decoder):
        for layer in stack.layers if stack is not None else ():
            fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)


def whole(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor (FSDP's DTensor) gathered whole on every rank (every rank must call it); others as they
    are."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def shard_like(param: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """A whole tensor sharded as `param` is (an FSDP parameter's optimizer moment); as it is for a plain one."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(param, DTensor):
        return t
    return distribute_tensor(t.to(param.device), param.device_mesh, param.placements)


def gathered(model: torch.nn.Module, optimizer, info: DistInfo) -> tuple[dict | None, dict | None]:
    """(the model's state dict, the optimizer's state) of an FSDP model, whole on the CPU of rank 0 (None on the
    others), one tensor at a time; a tied weight is gathered once and shared by its names, as in the model."""
    from torch.distributed.tensor import DTensor

    done: dict[int, torch.Tensor] = {}
    state = {}
    for name, t in model.state_dict().items():
        key = (t._local_tensor if isinstance(t, DTensor) else t).data_ptr()
        if key not in done:
            full = whole(t)  # (a collective: on every rank)
            done[key] = full.detach().cpu() if info.is_main else None
        state[name] = done[key]
    moments = {}
    for i, st in optimizer.state_dict()["state"].items():
        full = {k: whole(v) if torch.is_tensor(v) else v for k, v in st.items()}
        moments[i] = {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in full.items()}
    return (state, moments) if info.is_main else (None, None)


def no_sync(model: torch.nn.Module, last: bool):
    """Skip the gradient reduction on all but the last micro-batch of an accumulated step: DDP's all-reduce, or
    an FSDP model's reduce-scatter (its gradients held whole until then)."""
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    if last or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def all_reduce_sum(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (one small all-reduce)."""
    if not info.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def gather_tensors(t: torch.Tensor, info: DistInfo, device: torch.device) -> list[torch.Tensor]:
    """Every rank's copy of a same-shaped tensor (e.g. RNG states), on the CPU."""
    if not info.enabled:
        return [t]
    local = t.to(device)
    out = [torch.empty_like(local) for _ in range(info.world_size)]
    dist.all_gather(out, local)
    return [o.cpu() for o in out]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shard(group: list, info: DistInfo) -> list:
    """This rank's micro-batches of one step's batches: rank r takes batches r, r + world, r + 2 world, ..."""
    return group[info.rank :: info.world_size]
