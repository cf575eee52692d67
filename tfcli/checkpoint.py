"""Loading and saving checkpoints (see tfcli/checkpoint_meta.py for the format): the weights in safetensors files
(read into memory, or mapped copy-on-write), never a pickle, and the tokenizers checked against the model they
belong to."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
import sys
import weakref
from collections import Counter
from contextlib import contextmanager, suppress
from pathlib import Path

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

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
    text = meta.get("text") or {}
    tok = load_tokenizer(path, any_names="text" in meta, specials_in_text=bool(text.get("specials_in_text")))
    cfg = model_config(meta)
    model_vocab = cfg.src_vocab_size if side == "src" else cfg.tgt_vocab_size
    if tok.get_vocab_size() != model_vocab:
        raise CheckpointError(
            f"{path}: has {tok.get_vocab_size()} tokens but the model's {side} vocabulary has {model_vocab}; "
            f"this tokenizer does not belong to the model in {CONFIG}"
        )
    return tok


def load(path: os.PathLike | str | dict, device: str | torch.device = "cpu",
         mapped: bool = False, merge: bool = True) -> tuple[torch.nn.Module, dict]:
    """Build the model from the checkpoint's config and load its weights; returns (model in eval mode, meta).
    `path` may be the meta that `read_meta` returned, so that a caller who looked first reads config.json once.
    `mapped`: on the CPU the weights are the file's pages, mapped copy-on-write (`read_weights`), not a copy read
    into memory: what a caller that only reads them wants (nothing is read until touched; `paged`). On another
    device they are copied there from the mapped file either way. A LoRA run's checkpoint (adapters alone) loads its
    base model, checked by fingerprint, with the adapters merged into it, or with `merge` false attached to it
    (to train on)."""
    meta = path if isinstance(path, dict) else read_meta(path)
    if meta.get("adapter"):
        return _load_adapted(meta, device, mapped, merge)
    cfg = model_config(meta)
    weights = Path(meta["dir"]) / WEIGHTS
    if not weights.exists():
        raise CheckpointError(f"{weights}: missing")
    try:
        model, missing, unexpected = _load_weights(cfg, weights, mapped or torch.device(device).type != "cpu")
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


def _load_adapted(meta: dict, device, mapped: bool, merge: bool) -> tuple[torch.nn.Module, dict]:
    from tfcli.model import lora

    record, here = meta["adapter"], Path(meta["dir"])
    try:
        base = read_meta(record["base"])
    except CheckpointError as e:
        raise CheckpointError(f"{here}: holds LoRA adapters for the model in {record['base']}, which cannot be "
                              f"loaded ({e})") from None
    model, _ = load({**base, "model": meta["model"]}, "cpu", mapped)  # (the run's dropout, the base's weights)
    if model_fingerprint(model) != record["fingerprint"]:
        raise CheckpointError(f"{here}: its adapters were trained on other weights than {record['base']} holds now; "
                              "give them the model they were trained on")
    lora.attach(model, lora.LoraConfig.from_dict(record), draw=False)
    state = dict(read_weights(here / WEIGHTS))
    expected = lora.adapter_state(model)
    if state.keys() != expected.keys() or any(state[k].shape != expected[k].shape for k in state):
        raise CheckpointError(f"{here / WEIGHTS}: does not hold the adapters its {CONFIG} describes")
    model.load_state_dict(state, strict=False)
    if merge:
        lora.merge(model)
    return model.to(device).eval(), meta


def _load_weights(cfg, weights: Path, mapped: bool) -> tuple[torch.nn.Module, list[str], list[str]]:
    """The model of `cfg` holding the file's tensors, with (missing, unexpected) names. Built without drawing its
    random initial weights (memory allocated and never touched: no pages) and given the tensors read, not copied into
    the model's own; a parameter known by several names (tied output layer, shared embeddings) stays one."""
    model = build_empty(cfg)
    own = dict(model.named_parameters(remove_duplicate=False))
    names: dict[int, list[str]] = {}  # (each parameter's names: a tied one has several)
    for name, p in own.items():
        names.setdefault(id(p), []).append(name)
    state = {k: t.to(own[k].dtype) if k in own and t.dtype != own[k].dtype else t if mapped else t.clone()
             for k, t in read_weights(weights).items()}  # (clones: memory of their own, the map let go)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    for group in names.values():  # (the file holds one name of each tied group: the others are made that one)
        held = [n for n in group if n in state]
        if held and len(group) > 1:
            value = model.get_parameter(held[0])
            for n in group:
                owner, _, attr = n.rpartition(".")
                setattr(model.get_submodule(owner), attr, value)
            missing = [m for m in missing if m not in group]
    return model, missing, unexpected


def build_empty(cfg) -> torch.nn.Module:
    """The model of `cfg` with its memory allocated and nothing drawn into it: for a caller that loads every weight
    (torch's own initialisers, run for nothing, take seconds on a large vocabulary)."""
    with _Uninitialised():
        return build_model(cfg, init=False)


class _Uninitialised(TorchFunctionMode):
    """torch's modules' random initialisers do nothing (the weights they would draw are replaced at once)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


_INITIALISERS = {getattr(torch.nn.init, f) for f in ("normal_", "uniform_", "trunc_normal_", "xavier_uniform_",
                                                     "xavier_normal_", "kaiming_uniform_", "kaiming_normal_")}
_INITIALISERS |= {torch.Tensor.normal_, torch.Tensor.uniform_}


_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_MAPPED: "weakref.WeakValueDictionary[int, _Map]" = weakref.WeakValueDictionary()  # address -> live map
_LINUX = sys.platform.startswith("linux")
_POPULATE_READ = 22  # madvise(2): fault the pages in, one call (Linux 5.14+)


class _Map(mmap.mmap):
    """A checkpoint file mapped copy-on-write, with a descriptor of the file kept open for `rows_reader`'s reads
    (closed with the map)."""

    fd: int


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file (8 bytes of header length, a JSON header naming each tensor's dtype, shape
    and byte range, then the data) as views of the file mapped copy-on-write: writing to one changes this process's
    copy, never the file. CheckpointError where the file is not whole."""

    def corrupt(why: str):
        return CheckpointError(f"{path}: corrupt or truncated safetensors file ({why})")

    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = int.from_bytes(f.read(8), "little")
        if size < 8 or n > size - 8:
            raise corrupt("no header")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise corrupt(f"unreadable header: {e}") from None
        if not isinstance(header, dict):
            raise corrupt("unreadable header")
        m = _Map(f.fileno(), 0, access=mmap.ACCESS_COPY)
        m.fd = os.dup(f.fileno())
        weakref.finalize(m, os.close, m.fd)
    data = torch.frombuffer(m, dtype=torch.uint8)
    _MAPPED[data.data_ptr()] = m
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, (start, end) = _DTYPES[entry["dtype"]], entry["data_offsets"]
            shape = torch.Size(entry["shape"])
            start, end = start + 8 + n, end + 8 + n
        except (KeyError, TypeError, ValueError):
            raise corrupt(f"{name}: unreadable entry {entry!r}") from None
        itemsize = dtype.itemsize
        if not 8 + n <= start <= end <= size or end - start != itemsize * shape.numel() or min(shape, default=0) < 0:
            raise corrupt(f"{name}: its bytes are not in the file")
        raw = data[start:end] if start % itemsize == 0 else data[start:end].clone()  # (views need aligned starts)
        out[name] = raw.view(dtype).view(shape)
    return out


@contextmanager
def paged(t: torch.Tensor):
    """For code that reads `t` once to make a copy of its own (packed or int8 decoding): where `t` is a mapped
    checkpoint's (`load(mapped=True)`), its pages are faulted in at once on entry (one call, not a fault a page)
    and given back to the OS on exit, those that are still the file's: they stay in the page cache, and are read
    from there again when next touched; pages this process wrote to are its own, and kept. Elsewhere, nothing."""
    pages = _pages(t) if _LINUX else None
    if pages is not None:
        m, _, first, last = pages
        with suppress(OSError):  # (a kernel without it: faults as usual)
            m.madvise(_POPULATE_READ, first, last - first)
    try:
        yield t
    finally:
        if pages is not None:
            _give_back(*pages)


READ_ROWS_MIN = 64 * 2**20  # tables smaller than this are looked up in the map (a few pages; no system calls)


def rows_reader(table: torch.Tensor):
    """ids -> table[ids] (`ids` of any shape, rows stacked after it), the same bytes as F.embedding. Where `table`
    is a mapped checkpoint's (`load(mapped=True)`) of at least READ_ROWS_MIN bytes and this process has written to
    none of its pages, the rows are read from the file (pread), so that a lookup never maps the file's pages: the
    kernel maps a faulted page's neighbours with it, and NLLB's 1 GB embedding table held 700 MB of a process's
    memory after 32 sentences. Decoding takes the table as it is when decoding is set up, as it copies every other
    weight then. Elsewhere, a lookup in the tensor."""
    nbytes = table.numel() * table.element_size()
    pages = _pages(table) if _LINUX and table.dim() == 2 and nbytes >= READ_ROWS_MIN else None
    if pages is None:
        return lambda ids: torch.nn.functional.embedding(ids, table)
    m, base = pages[:2]
    V, d = table.shape
    size, start = d * table.element_size(), table.data_ptr() - base
    page = mmap.PAGESIZE
    if _written(base, start // page * page, -(-(start + nbytes) // page) * page):
        return lambda ids: torch.nn.functional.embedding(ids, table)

    def read(ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).tolist()
        out = torch.empty(len(flat), d, dtype=table.dtype)
        view = memoryview(out.numpy()).cast("B") if len(flat) else None
        for i, row in enumerate(flat):
            if not 0 <= row < V:
                raise IndexError(f"index {row} is out of range for an embedding table of {V} rows")
            if os.preadv(m.fd, [view[i * size : (i + 1) * size]], start + row * size) != size:
                raise CheckpointError("a mapped checkpoint file was cut short while in use")
        return out.view(*ids.shape, d)

    return read


def fingerprint(tensors: list[torch.Tensor], samples: int = 32, run: int = 64) -> str:
    """A hash of each tensor's dtype, shape and `samples` evenly spaced runs of `run` bytes (its first and last
    among them): what tells, without reading them all, that a file made from some weights (`tfcli quantize`'s int8
    copy) was made from these. Any training or fine-tuning changes every run. A mapped checkpoint's tensors are
    read from its file (pread), so that no page of the map is faulted in."""
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        h.update(f"{t.dtype} {tuple(t.shape)}".encode())
        nbytes = t.numel() * t.element_size()
        n = min(run, nbytes)
        starts = sorted({(nbytes - n) * i // max(samples - 1, 1) for i in range(samples)})
        pages = _pages(t)
        if pages is not None:
            m, base = pages[:2]
            for start in starts:
                h.update(os.pread(m.fd, n, t.data_ptr() - base + start))
        else:
            raw = t.detach().cpu().contiguous().view(-1).view(torch.uint8)
            for start in starts:
                h.update(raw[start : start + n].numpy().tobytes())
    return h.hexdigest()


def model_fingerprint(model: torch.nn.Module) -> str:
    """`fingerprint` of every tensor of `model`'s state: what ties a LoRA run's adapters to the weights they were
    trained on."""
    state = model.state_dict()
    return fingerprint([state[k] for k in sorted(state)])


def _written(base: int, first: int, last: int) -> bool:
    """Whether this process wrote to any page in [first, last) of the map at `base` (/proc/self/pagemap: present
    and not the file's, or swapped out), or cannot tell."""
    flags = _page_flags(base, first, last)
    if flags is None:
        return True
    one = np.uint64(1)
    anon = (flags >> np.uint64(63)) & ~(flags >> np.uint64(61)) & one
    return bool((anon | (flags >> np.uint64(62)) & one).any())


def _page_flags(base: int, first: int, last: int):
    """/proc/self/pagemap's entries for the pages in [first, last) of the map at `base`, or None."""
    n = (last - first) // mmap.PAGESIZE
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek((base + first) // mmap.PAGESIZE * 8)
            flags = np.frombuffer(f.read(n * 8), dtype=np.uint64)
    except OSError:
        return None
    return flags if len(flags) == n else None


def _pages(t: torch.Tensor):
    """(map, its address, first, last): the whole pages of `t` within the mapped checkpoint it is a view of (offsets
    in the map), or None."""
    base = t.untyped_storage().data_ptr() if t.device.type == "cpu" else None
    m = _MAPPED.get(base) if base is not None else None
    if m is None or not t.numel() or not t.is_contiguous():
        return None
    offset = t.data_ptr() - base
    first = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
    last = (offset + t.numel() * t.element_size()) // mmap.PAGESIZE * mmap.PAGESIZE
    return (m, base, first, last) if last > first else None


def _give_back(m: mmap.mmap, base: int, first: int, last: int) -> None:
    """Unmap the pages in [first, last) of `m` (at address `base`) that are still the file's (/proc/self/pagemap:
    present and file-backed); MADV_DONTNEED on a page this process wrote to would drop what it wrote."""
    flags = _page_flags(base, first, last)
    if flags is None:
        return
    ours = ((flags >> np.uint64(63)) & (flags >> np.uint64(61)) & np.uint64(1)).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], ours, [0]))))  # starts and ends of runs of file pages
    for a, b in zip(edges[::2].tolist(), edges[1::2].tolist()):
        m.madvise(mmap.MADV_DONTNEED, first + a * mmap.PAGESIZE, (b - a) * mmap.PAGESIZE)


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.int8: "I8", torch.float16: "F16",
                       torch.bfloat16: "BF16", torch.int64: "I64", torch.uint8: "U8"}


def write_tensors(f, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """`tensors` to the open binary file `f` in the safetensors format (`read_weights`, safetensors' own readers),
    a tensor at a time: no copy of the whole file in memory (a 256k-word output layer's fp32 blocks are 1 GB)."""
    header, offset = {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # (the data starts 8-byte aligned)
    f.write(len(raw).to_bytes(8, "little") + raw)
    for name in sorted(tensors):
        f.write(memoryview(tensors[name].detach().contiguous().view(-1).view(torch.uint8).numpy()))


def save(
    path: os.PathLike | str,
    model: torch.nn.Module,
    meta: dict,
    tokenizer_files: dict[str, os.PathLike | str],
    trainer_tensors: dict[str, torch.Tensor] | None = None,
    trainer_json: dict | None = None,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a checkpoint directory atomically. `meta` holds the resolved configs (model/train/data), step, metrics;
    `state`, where given, is the model's state dict (an FSDP model's, gathered whole)."""
    path = Path(path)
    model = getattr(model, "module", model)  # DDP
    model = getattr(model, "_orig_mod", model)  # torch.compile
    if meta.get("adapter"):  # a LoRA run's: the adapters alone (`load` finds the base model they belong to)
        from tfcli.model import lora

        adapters = lora.adapter_state(model) if state is None else {k: v for k, v in state.items() if ".lora." in k}
        weights, metadata = {k: v.detach().contiguous() for k, v in adapters.items()}, None
    else:
        weights, metadata = _state_to_save(model.state_dict() if state is None else state)
    tensors = [*weights.values(), *(trainer_tensors or {}).values()]
    needs = sum({t.data_ptr(): t.numel() * t.element_size() for t in tensors}.values())  # tied weights once
    with atomic_dir(path, overwrite=True, needs=needs) as tmp:
        try:
            fault_point(WEIGHTS)
            save_file(weights, str(tmp / WEIGHTS), metadata=metadata)
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
            try:
                save_file({k: v.contiguous() for k, v in trainer_tensors.items()}, str(tmp / "trainer_state.safetensors"))
            except SafetensorError as e:
                raise CheckpointError(f"{path}: cannot write: {e}{space_needed(needs)}") from None
            atomic_write_text(tmp / "trainer_state.json", json.dumps(trainer_json or {}, indent=2) + "\n")
    return path


def _state_to_save(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) for safetensors' save_file, as its save_model writes them: a tensor known by several
    names (tied weights) once, under the first name in sorted order, the metadata naming it for each other name.
    A tensor that shares its memory with other tensors (a mapped checkpoint's weights share the file's) is copied:
    safetensors writes each tensor's storage whole."""
    groups: dict[tuple, list[str]] = {}
    for name, t in state.items():
        groups.setdefault((t.data_ptr(), t.dtype, tuple(t.shape), t.stride()), []).append(name)
    kept = {min(names): names for names in groups.values()}
    storages = Counter(state[name].untyped_storage().data_ptr() for name in kept)
    tensors, metadata = {}, {}
    for name, names in kept.items():
        t = state[name]
        tensors[name] = t.clone() if storages[t.untyped_storage().data_ptr()] > 1 else t.contiguous()
        metadata.update({other: name for other in names if other != name})
    return tensors, metadata or None


def load_trainer_state(path: os.PathLike | str) -> tuple[dict[str, torch.Tensor], dict]:
    d = resolve(path)
    t, j = d / "trainer_state.safetensors", d / "trainer_state.json"
    if not t.exists() or not j.exists():
        raise CheckpointError(f"{d}: has no trainer state to resume from (weights-only checkpoint)")
    try:
        return load_file(str(t)), json.loads(j.read_text())
    except (SafetensorError, json.JSONDecodeError, OSError) as e:
        raise CheckpointError(f"{d}: corrupt trainer state ({e})") from None
