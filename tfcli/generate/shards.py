"""One file over many processes (`torchrun --nproc_per_node N $(which tfcli) translate IN -o OUT`), and
translation that an interruption does not lose (`--resume`).

The input's lines are cut into parts of `cfg.part_lines` lines; part p goes to rank p mod N. Each rank reads the
input, translates its parts and writes each one atomically into OUT.parts/; when every rank is done, rank 0 joins the
parts in input order into OUT (atomically) and removes OUT.parts/. A sentence's translation does not depend on the
other sentences of its batch, so the result is byte for byte what one process writes. A killed run keeps the parts it
finished: run the same command with `--resume` and only the missing parts are translated. OUT.parts/manifest.json
records what the parts were made from (input files, checkpoint, output-changing settings); a run that differs is
refused instead of mixing outputs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from tfcli import checkpoint_meta, distributed
from tfcli.console import Progress
from tfcli.errors import TfcliError
from tfcli.generate.config import TranslateConfig
from tfcli.io import atomic_open, atomic_write_json, read_inputs

# settings that do not change a line's translation (batch composition, speed, where it runs)
_NOT_IN_OUTPUT = {"batch_size", "max_tokens", "buffer_size", "device", "threads", "part_lines"}


def parts_dir(output: str) -> Path:
    return Path(f"{output}.parts")


def translate_in_parts(checkpoints: list[str], inputs: list[str], output: str, cfg: TranslateConfig, resume: bool,
                       progress: bool | None, make_translator, read, side_files: list[str] = ()) -> int:
    """Translate `inputs` into `output` part by part, this process's share of the parts when launched by torchrun;
    `make_translator(device)` builds the Translator; `read(items)` makes the Requests of read_inputs' items (each
    line's own fields from its JSON or from `side_files`, which the manifest records beside the inputs). Returns
    the number of lines this process translated."""
    if any(p == "-" for p in inputs):
        raise TfcliError("--resume and several processes read their input more than once: give files, not stdin")
    info, device = distributed.setup(cfg.device)
    try:
        work = parts_dir(output)
        manifest = _manifest(checkpoints, inputs + list(side_files), cfg)
        if info.is_main:
            _prepare(work, manifest, resume)
        distributed.barrier(info)  # the parts directory is ready (or the main process has failed, and so do we)
        translator = make_translator(device)
        done = 0
        lines = read(_lines(inputs))
        n_parts = 0
        with Progress("translating", None, "sent", progress if info.is_main else False) as bar:
            for part, texts in _parts(lines, cfg.part_lines):
                n_parts = part + 1
                path = work / f"part-{part:07d}.txt"
                if part % info.world_size != info.rank or path.exists():
                    continue
                translator.index = part * cfg.part_lines  # --nbest line numbers count from the file's start
                with atomic_open(path, "w") as f:
                    for text in translator.run(texts):
                        f.write(text + "\n")
                bar.advance(len(texts))
                done += len(texts)
        distributed.barrier(info)  # every part is written
        if info.is_main:
            _join(work, n_parts, output)
        return done
    finally:
        distributed.teardown()


def _manifest(checkpoints: list[str], inputs: list[str], cfg: TranslateConfig) -> dict:
    """What the parts are made of: the input files (size and modification time), the checkpoints' weights, the
    settings that change the output, and the part size."""
    def identity(path: Path) -> dict:
        st = path.stat()
        return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    weights = [checkpoint_meta.resolve(c) / checkpoint_meta.WEIGHTS for c in checkpoints]
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_IN_OUTPUT}
    return {"inputs": [identity(Path(p)) for p in inputs], "checkpoints": [identity(w) for w in weights],
            "settings": settings, "part_lines": cfg.part_lines}


def _prepare(work: Path, manifest: dict, resume: bool) -> None:
    found = work / "manifest.json"
    if work.exists() and resume:
        try:
            same = json.loads(found.read_text(encoding="utf-8")) == manifest
        except (OSError, json.JSONDecodeError):
            same = False
        if not same:
            raise TfcliError(f"{work}: holds parts of another translation (other input, checkpoint or settings); "
                             "run it again without --resume to start over")
        return
    if work.exists():  # a run without --resume starts over
        shutil.rmtree(work)
    work.mkdir(parents=True)
    atomic_write_json(found, manifest)


def _lines(inputs: list[str]):
    return (item for item in read_inputs(inputs) if item is not None)


def _parts(lines, size: int):
    """(part number, its lines) for consecutive parts of `size` lines."""
    part, chunk = 0, []
    for item in lines:
        chunk.append(item)
        if len(chunk) == size:
            yield part, chunk
            part, chunk = part + 1, []
    if chunk:
        yield part, chunk


def _join(work: Path, n_parts: int, output: str) -> None:
    """The parts, in order, into `output` (atomically); then the parts directory goes."""
    missing = [p for p in range(n_parts) if not (work / f"part-{p:07d}.txt").exists()]
    if missing:
        raise TfcliError(f"{work}: part {missing[0]} is missing after every process finished; run again with --resume")
    with atomic_open(output, "wb", encoding=None) as out:
        for p in range(n_parts):
            with open(work / f"part-{p:07d}.txt", "rb") as f:
                shutil.copyfileobj(f, out)
    shutil.rmtree(work)
    if os.path.exists(work):
        raise TfcliError(f"{work}: could not be removed after joining the parts into {output}")
