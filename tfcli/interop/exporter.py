"""`tfcli export`: a checkpoint -> a CTranslate2 or Hugging Face model directory, or a LoRA run's adapters in PEFT's
layout, written whole or not at all."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tfcli
from tfcli import checkpoint
from tfcli import checkpoint_meta
from tfcli.errors import TfcliError
from tfcli.interop import ct2, hf, hf_export
from tfcli.io import atomic_dir, refuse_overwriting_inputs

TARGETS = ("ctranslate2", "hf", "peft")


def export(path: str | Path, to: str, out: str | Path, quantization: str | None = None) -> dict:
    """Export the checkpoint (or run directory) at `path` to `out`; returns a summary for the CLI to print.
    Everything that can be refused (target, quantisation, options the target cannot express, a missing package or
    tokenizer, an existing `out`) is refused before anything is written."""
    if to not in TARGETS:
        raise TfcliError(f"--to {to}: unknown target; choose from {', '.join(TARGETS)}")
    if quantization is not None and to != "ctranslate2":
        raise TfcliError("--quantization applies to --to ctranslate2 only")
    if quantization is not None and quantization not in ct2.QUANTIZATIONS:
        raise TfcliError(f"--quantization {quantization}: choose from {', '.join(ct2.QUANTIZATIONS)}")
    out = Path(out)
    refuse_overwriting_inputs([out], checkpoint_meta.input_paths(path), "choose another -o")
    if out.exists():
        raise TfcliError(f"{out}: already exists; remove it or choose another -o")
    meta = checkpoint_meta.read_meta(path)
    if to == "peft" and not meta.get("adapter"):
        raise TfcliError(f"--to peft: {meta['dir']} holds a whole model, not a LoRA run's adapters (train with "
                         "--lora-rank); export it with --to hf")
    model, meta = checkpoint.load(meta, mapped=True, merge=to != "peft")
    cfg = checkpoint_meta.model_config(meta)
    sides = ("src", "tgt") if cfg.kind == "seq2seq" else ("tgt",)
    toks = {side: checkpoint.tokenizer(meta, side) for side in sides}  # checked against the model
    files = {side: checkpoint_meta.tokenizer_path(meta, side) for side in sides}
    if to in ("hf", "peft"):
        arch = hf_export.target_arch(cfg, meta).model_class
        hf._transformers()
    else:
        arch = "TransformerSpec" if cfg.kind == "seq2seq" else "TransformerDecoderModelSpec"
        ct2._ctranslate2()
    with atomic_dir(out) as tmp:
        try:
            if to == "ctranslate2":
                ct2.convert(model, cfg, toks.get("src"), toks["tgt"], str(tmp), quantization)
                for side, f in files.items():
                    shutil.copyfile(f, tmp / f"tokenizer.{side}.json")
            elif to == "peft":
                arch = hf_export.save_peft(model, cfg, meta, tmp)
            else:
                arch = hf_export.save_hf(model, cfg, files, tmp, meta)
            info = {"exported_by": f"tfcli {tfcli.__version__}", "from": meta["dir"], "to": to, "class": arch,
                    "quantization": quantization, "kind": cfg.kind}
            (tmp / "tfcli_export.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        except (TfcliError, KeyboardInterrupt):
            raise
        except Exception as e:
            if not _write_failure(e):
                raise
            raise TfcliError(f"{out}: cannot write: {_first_line(e)}") from e
    return {**info, "out": str(out)}


def _write_failure(e: BaseException) -> bool:
    """An error from writing the exported files (a full disk, a file-size limit, permissions), whichever library
    raised it: an OSError, or safetensors'/CTranslate2's own exception wrapping one."""
    if isinstance(e, OSError):
        return True
    text = str(e)
    return any(word in text for word in ("IoError", "Os {", "No space", "too large", "Permission denied",
                                         "Errno", "cannot write", "failed to write", "Unable to open"))


def _first_line(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
