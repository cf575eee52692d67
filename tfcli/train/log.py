"""Where training reports go: metrics.jsonl (one JSON object per log step and per validation), stderr lines, a rich
progress bar when stderr is a terminal, and TensorBoard when it is installed.

metrics.jsonl keys (other tools, e.g. `tfcli plot`, read them):
  every line   step, epoch, time (seconds of training so far), split ("train" | "valid")
  train        loss (label-smoothed, per target token), nll (plain cross-entropy per target token), ppl, lr,
               src_tokens_per_s, tgt_tokens_per_s (non-padding tokens; 0 source tokens for a language model),
               padding_fraction, grad_norm, skipped (updates skipped since the last line: inf or NaN gradients;
               loss and nll are over the steps whose loss was finite, NaN where none was), and on a GPU mfu and
               max_mem_gib (peak allocated GPU memory so far)
  valid        loss, nll, ppl, and bleu for translation; a multilingual model's per direction under "directions"
               ({"de-en": {loss, nll, ppl, bleu}, ...}), the others their mean
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tfcli.console import quiet_enabled
from tfcli.io import atomic_write_text

PROGRESS_EVERY_S = 10.0  # without a progress bar (stderr not a terminal): a progress line at least this often


def ppl(nll: float) -> float:
    return math.exp(min(nll, 100.0))


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def format_record(r: dict) -> str:
    """One human line; says which tokens a rate counts. `loss` is what training minimises (label-smoothed), `nll`
    the plain cross-entropy that `tfcli eval` reports and ppl = exp(nll) is taken from."""
    if r["split"] == "train":
        parts = [
            f"step {r['step']}", f"epoch {r['epoch']}", f"loss {r['loss']:.3f}", f"nll {r['nll']:.3f}",
            f"ppl {r['ppl']:.2f}",
            f"lr {r['lr']:.2e}", f"|g| {r['grad_norm']:.2f}", f"tgt tok/s {_si(r['tgt_tokens_per_s'])}",
        ]
        if r["src_tokens_per_s"]:
            parts.append(f"src tok/s {_si(r['src_tokens_per_s'])}")
        parts.append(f"pad {100 * r['padding_fraction']:.1f}%")
        if r.get("skipped"):
            parts.append(f"{r['skipped']} updates skipped (inf/NaN gradients)")
        if "mfu" in r:
            parts.append(f"MFU {100 * r['mfu']:.1f}%")
        if "max_mem_gib" in r:
            parts.append(f"mem {r['max_mem_gib']:.1f} GiB")
        return " | ".join(parts)
    parts = [f"step {r['step']}", "valid", f"loss {r['loss']:.3f}", f"nll {r['nll']:.3f}", f"ppl {r['ppl']:.2f}"]
    if r.get("bleu") is not None:
        parts.append(f"BLEU {r['bleu']:.2f}" + (" (mean)" if "directions" in r else ""))
    if r.get("best"):
        parts.append("(best)")
    for name, m in r.get("directions", {}).items():  # a multilingual model's directions
        parts.append(f"{name} nll {m['nll']:.3f}" + (f" BLEU {m['bleu']:.2f}" if m.get("bleu") is not None else ""))
    return " | ".join(parts)


class MetricsLog:
    """Rank 0's reports. Other ranks get `enabled=False` and everything is a no-op."""

    def __init__(self, run_dir: Path, enabled: bool, resume_step: int | None, tensorboard: bool, total_steps: int):
        self.enabled = enabled
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.progress: Progress | None = None
        self.tb = None
        self.file = None
        self.text_log = None
        self.quiet = quiet_enabled()
        self.total_steps, self.last_line = total_steps, time.monotonic()
        if not enabled:
            return
        # what the console shows, kept beside the metrics (appended to on --resume)
        self.text_log = open(run_dir / "train.log", "a", encoding="utf-8")
        path = run_dir / "metrics.jsonl"
        if resume_step is not None and path.exists():
            # drop what an interrupted run logged after its last checkpoint: the resumed run logs those steps again
            kept = [ln for ln in path.read_text(encoding="utf-8").splitlines() if _step_of(ln) <= resume_step]
            atomic_write_text(path, "".join(ln + "\n" for ln in kept))
        elif path.exists():
            path.unlink()
        self.file = open(path, "a", encoding="utf-8")
        if tensorboard:  # asked for: Trainer checked first that the package is there
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        if self.console.is_terminal and not self.quiet:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(), console=self.console, transient=True,
            )
            self.task = self.progress.add_task("train", total=total_steps or None, info="")
            self.progress.start()

    def print(self, text: str, warning: bool = False, console: bool = True) -> None:
        """A line for the console (unless --quiet, which keeps warnings) and for RUN/train.log (always)."""
        if not self.enabled:
            return
        if console and (warning or not self.quiet):
            self.console.print(text, markup=False)
            self.last_line = time.monotonic()
        if self.text_log is not None:
            self.text_log.write(text + "\n")
            self.text_log.flush()

    def set_total(self, total_steps: int) -> None:
        self.total_steps = total_steps
        if self.progress is not None:
            self.progress.update(self.task, total=total_steps or None)

    def advance(self, step: int) -> None:
        """The step just done: on the progress bar, or without one (a log file, a pipe, `make demo`) a line when
        none has come for PROGRESS_EVERY_S, so that a slow run still shows it is alive."""
        if self.progress is not None:
            self.progress.update(self.task, completed=step)
        elif self.enabled and not self.quiet and time.monotonic() - self.last_line >= PROGRESS_EVERY_S:
            of = f"/{self.total_steps}" if self.total_steps else ""
            self.console.print(f"step {step}{of}", markup=False)
            self.last_line = time.monotonic()

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self.print(format_record(record))
        if self.progress is not None and record["split"] == "train":
            info = (f"loss {record['loss']:.3f} lr {record['lr']:.1e} tgt tok/s {_si(record['tgt_tokens_per_s'])}"
                    + (f" src tok/s {_si(record['src_tokens_per_s'])}" if record["src_tokens_per_s"] else ""))
            self.progress.update(self.task, info=info)
        if self.tb is not None:
            scalars = {**record, **{f"{d}/{k}": v for d, m in record.get("directions", {}).items() for k, v in m.items()}}
            for key, value in scalars.items():
                if key not in ("step", "epoch", "time", "split") and isinstance(value, (int, float)):
                    self.tb.add_scalar(f"{record['split']}/{key}", value, record["step"])

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.file is not None:
            self.file.close()
            self.file = None
        if self.text_log is not None:
            self.text_log.close()
            self.text_log = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a torn last line from a killed run: drop it
