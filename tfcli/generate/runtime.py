"""What translate and lm-generate share: picking the device and precision, loading a checkpoint with its
tokenizers, the process tuning the command line asks for, and a progress display that appears only on a terminal."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

import torch

from tfcli import checkpoint
from tfcli.errors import CheckpointError, ConfigError, TfcliError, quiet_enabled, raise_if_interrupted
from tfcli.generate.step import StepModel, int8_available

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = (*DTYPES, "int8")


def resolve_device(name: str) -> torch.device:
    """`auto` is CUDA when a GPU is visible, else the CPU; also `cpu`, `cuda`, `cuda:N`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not (name == "cuda" or name.startswith("cuda:") and name[5:].isdigit()):
        raise ConfigError(f"--device {name}: expected auto, cpu, cuda or cuda:N")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TfcliError(f"--device {name}: no CUDA GPU is available to torch; use --device cpu")
    return torch.device(name)


def precision(device: torch.device, dtype: str):
    """A context for the forward passes: autocast to bf16/fp16, or nothing for fp32 and int8 (whose linear layers
    are quantised once, by StepModel)."""
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"--dtype {dtype}: choose from {', '.join(DTYPE_NAMES)}")
    if dtype == "fp32":
        return contextlib.nullcontext()
    if dtype == "int8":
        if device.type != "cpu":
            raise ConfigError("--dtype int8 is for the CPU; on a GPU use bf16 or fp16")
        if not int8_available():
            raise ConfigError("--dtype int8: this torch build has no quantised int8 linear layers; use fp32")
        return contextlib.nullcontext()
    if dtype == "fp16" and device.type != "cuda":
        raise ConfigError("--dtype fp16 needs a CUDA device; on the CPU use bf16 or fp32")
    return torch.autocast(device.type, dtype=DTYPES[dtype])


@dataclass
class Loaded:
    model: torch.nn.Module  # in eval mode, otherwise as trained: it can still be trained, saved or moved
    meta: dict
    src_tok: object | None  # tokenizers.Tokenizer; None for a language model
    tgt_tok: object
    steps: StepModel  # its decoder arranged for decoding (fp32 on the CPU: weights packed for oneDNN; or int8)


def load(path: str, device: torch.device, kind: str, dtype: str = "fp32") -> Loaded:
    """Load a checkpoint of the expected `kind` ("seq2seq" or "lm") and its tokenizers, ready for inference.
    Nothing outside the returned objects changes (threads and the allocator: `tune_process`)."""
    meta = checkpoint.read_meta(path)
    cfg = checkpoint.model_config(meta)
    if cfg.kind != kind:
        want = "a translation (seq2seq)" if kind == "seq2seq" else "a language model (lm)"
        hint = "tfcli lm-generate" if cfg.kind == "lm" else "tfcli translate"
        raise CheckpointError(f"{meta['dir']}: is a {cfg.kind} model, not {want}; use `{hint}`")
    model, meta = checkpoint.load(meta["dir"], device)
    toks = {side: checkpoint.tokenizer(meta, side) for side in (("src", "tgt") if kind == "seq2seq" else ("tgt",))}
    return Loaded(model, meta, toks.get("src"), toks["tgt"], StepModel(model, pack=dtype == "fp32", int8=dtype == "int8"))


def tune_process(device: torch.device, threads: int | None) -> None:
    """What `tfcli translate` and `tfcli lm-generate` do to their own process (a library caller decides for
    itself): use `threads` CPU threads, and on the CPU let glibc keep freed memory for reuse."""
    if threads:
        torch.set_num_threads(threads)
    if device.type == "cpu":
        keep_freed_memory()


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


class Progress:
    """A rich progress bar on stderr, only when stderr is a terminal; otherwise it does nothing.

    Its rate is everything done so far over the time since the start: output comes in bursts (a batch finishes many
    lines at once), which made rich's moving estimate report tens of thousands a second. Lines printed with `emit`
    go above the bar when stdout is the same terminal, instead of through it."""

    def __init__(self, description: str, total: int | None, unit: str, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty() and not quiet_enabled()
        self._bar = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                console=Console(stderr=True), transient=False,
            )
            self._unit = unit
            self._task = self._bar.add_task(description, total=total, rate="")

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self

    def advance(self, n: int) -> None:
        raise_if_interrupted()  # long loops pass here: one whose KeyboardInterrupt was lost in C code stops too
        if self._bar is not None:
            self._bar.advance(self._task, n)
            task = self._bar.tasks[0]
            if task.elapsed:
                self._bar.update(self._task, rate=f"{task.completed / task.elapsed:.1f} {self._unit}/s")

    def emit(self, out, text: str) -> None:
        """Write one output line to `out`; above the bar when `out` is stdout and both share the terminal."""
        if self._bar is not None and out is not None and _is_terminal_stdout(out):
            self._bar.console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
        else:
            out.write(text + "\n")
            out.flush()  # a pipeline's next stage sees each line as soon as it is ready

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()


def _is_terminal_stdout(out) -> bool:
    try:
        return out.fileno() == sys.stdout.fileno() and sys.stdout.isatty()
    except (OSError, ValueError, AttributeError):  # a file, a StringIO, a closed or replaced stdout
        return False


def keep_freed_memory() -> bool:
    """Let glibc keep freed memory for reuse instead of handing it back to the OS at once.

    Decoding allocates tensors of the same sizes every step (logits and log-probs: rows x vocabulary floats, MBs).
    By default glibc serves blocks above 128 KiB with fresh mmaps and returns them on free, so each step's tensors
    arrive as new pages that fault on first touch (measured: 6-8% of beam search at batch 64 on the CPU). A 32 MiB
    mmap threshold (glibc's largest) and no heap trimming below 512 MiB keep them in the heap. Returns False,
    changing nothing, where the C library is not glibc."""
    import ctypes
    import ctypes.util

    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(M_TRIM_THRESHOLD, 512 << 20))
