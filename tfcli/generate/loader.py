"""A checkpoint loaded for inference: the model, its config and tokenizers, and its decoder arranged for decoding."""

from __future__ import annotations

import copy
import filecmp
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcli import checkpoint

from tfcli import checkpoint_meta
from tfcli.device import DTYPES, precision
from tfcli.data.languages import Languages
from tfcli.errors import CheckpointError, NotANumber
from tfcli.generate import stored
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
    languages: Languages  # where its language tokens go (a multilingual or an M2M-100-style model's; none)


def half_weights(device: torch.device, dtype: str) -> bool:
    """Whether bf16/fp16 decoding runs on a copy of the weights in that dtype (a GPU: no casts in a step, the
    key/value memory in half the bytes) rather than under autocast from the fp32 weights (the CPU)."""
    return device.type == "cuda" and dtype in ("bf16", "fp16")


def load(path: str, device: torch.device, kind: str | None, dtype: str = "fp32", half: bool | None = None) -> Loaded:
    """Load a checkpoint and its tokenizers, ready for inference; `kind` ("seq2seq" or "lm") is the one expected,
    None for either. config.json is read once. The process is left as it was (threads, allocator, random stream).
    `half`: decode from a bf16/fp16 copy of the weights (default: `half_weights`); the returned `model` stays fp32."""
    meta = checkpoint_meta.read_meta(path)
    cfg = checkpoint_meta.model_config(meta)
    if kind is not None and cfg.kind != kind:
        want = "a translation (seq2seq)" if kind == "seq2seq" else "a language model (lm)"
        hint = "tfcli lm-generate" if cfg.kind == "lm" else "tfcli translate"
        raise CheckpointError(f"{meta['dir']}: is a {cfg.kind} model, not {want}; use `{hint}`")
    model, meta = checkpoint.load(meta, device, mapped=True)
    toks = {"tgt": checkpoint.tokenizer(meta, "tgt")}
    if cfg.kind == "seq2seq":
        toks["src"] = toks["tgt"] if _shared_tokenizer(meta) else checkpoint.tokenizer(meta, "src")
    if half is None:
        half = half_weights(device, dtype)
    decoding = copy.deepcopy(model).to(DTYPES[dtype]) if half else model
    store = stored.read(meta, model, dtype) if dtype in stored.FORMATS and device.type == "cpu" else None
    steps = _steps(decoding, meta, pack=dtype == "fp32", int8=dtype == "int8", stored=store)
    return Loaded(model, cfg, meta, toks.get("src"), toks["tgt"], steps, Languages(toks.get("src"), meta))


def _steps(model: torch.nn.Module, meta: dict, **options) -> StepModel:
    """StepModel(model, **options), where a layer's weights hold NaN or inf (found where decoding copies them: int8)
    one line naming the checkpoint's tensor."""
    try:
        return StepModel(model, **options)
    except NotANumber as e:
        name = next((n for n, m in model.named_modules() if m is e.module), None)
        if name is None:
            raise
        raise CheckpointError(f"{Path(meta['dir']) / checkpoint_meta.WEIGHTS}: {name}.weight holds NaN or inf: a "
                              "model that computes no numbers (a diverged run's? use an earlier checkpoint)") from None


def _shared_tokenizer(meta: dict) -> bool:
    """Whether the source and target tokenizer files are the same bytes (a shared vocabulary: M2M-100, NLLB and
    joint-vocabulary models), so that one Tokenizer serves both sides (parsing NLLB's is a fifth of a second)."""
    src, tgt = (checkpoint_meta.tokenizer_path(meta, side) for side in ("src", "tgt"))
    try:
        return src is not None and tgt is not None and filecmp.cmp(src, tgt, shallow=False)
    except OSError:
        return False  # (checkpoint.tokenizer names the missing file)


def load_ensemble(paths: list[str], device: torch.device, dtype: str = "fp32", half: bool | None = None) -> Loaded:
    """Several translation checkpoints decoding as one (tfcli/generate/ensemble.py): they must share their
    tokenizers. The first one's model, config and metadata stand for the ensemble; one path is a plain `load`."""
    from tfcli.generate.ensemble import EnsembleStepModel

    members = [load(p, device, "seq2seq" if len(paths) > 1 else None, dtype, half) for p in paths]
    if len(members) == 1:  # (a language model translates through a prompt: tfcli.generate.prompting)
        return members[0]
    first = members[0]
    for path, other in zip(paths[1:], members[1:]):
        for side in ("src", "tgt"):
            if getattr(other, f"{side}_tok").to_str() != getattr(first, f"{side}_tok").to_str():
                raise CheckpointError(f"{path}: its {side} tokenizer is not the one of {paths[0]}; the models of "
                                      "an ensemble must share their tokenizers (prepare with --tokenizer-from)")
    steps = EnsembleStepModel([m.steps for m in members])
    return Loaded(first.model, first.cfg, first.meta, first.src_tok, first.tgt_tok, steps, first.languages)


def quantize(path: str, dtype: str = "int8") -> Path:
    """Write the checkpoint's linear layers as `--dtype dtype` decodes them on the CPU (int8: quantised; fp32: the
    decoder's in the row kernel's layout) beside its weights (tfcli.generate.stored, atomically), so that decoding
    maps them instead of making them at every load: the same outputs, a faster start. Returns the file's path."""
    if dtype not in stored.FORMATS:
        raise ValueError(f"dtype {dtype!r}: quantize stores {' or '.join(stored.FORMATS)}")
    cpu = torch.device("cpu")
    precision(cpu, dtype)  # (int8 missing from this torch build: the one line --dtype int8 gives)
    meta = checkpoint_meta.read_meta(path)
    model, meta = checkpoint.load(meta, cpu, mapped=True)
    store = stored.StoredWeights(dtype, model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (said below, as an error)
        steps = _steps(model, meta, pack=dtype == "fp32", int8=dtype == "int8", stored=store)
    if not store.tensors:
        why = "; ".join(steps.plan.declined)
        if dtype == "int8":
            raise CheckpointError(f"{meta['dir']}: int8 is not implemented for this model ({why}); nothing written")
        why = f"this model ({why})" if why else ("here (rows.c unbuilt: no C compiler; a CPU without AVX2 and FMA; "
                                                 "or ATEN_CPU_CAPABILITY=default)")
        raise CheckpointError(f"{meta['dir']}: the fp32 row kernel does not run {why}; nothing written")
    return stored.write(store, model, meta)
