"""Training curves from the metrics log: loss, perplexity, BLEU, learning rate, tokens/s and gradient norm per step.

The log is RUN/metrics.jsonl, one JSON object per line, written by `tfcli train`:
    {"step": 200, "epoch": 1, "time": 61.2, "split": "train", "loss": 4.1, "nll": 3.9, "ppl": 49.4, "lr": 0.0007,
     "src_tokens_per_s": 9100, "tgt_tokens_per_s": 9800, "padding_fraction": 0.08, "grad_norm": 1.3}
    {"step": 200, "epoch": 1, "time": 64.0, "split": "valid", "loss": 3.7, "ppl": 40.2, "bleu": 12.3}
Several runs go on one figure, one colour each: train as solid lines, validation dashed with dots.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from tfcli.errors import InputError, TfcliError
from tfcli.io import iter_lines, refuse_overwriting_inputs

METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Curve:
    split: str  # "train" | "valid"
    key: str  # the field in the metrics log


@dataclass(frozen=True)
class Panel:
    title: str
    curves: tuple[Curve, ...]
    log_y: bool = False
    better: str | None = "min"  # which extreme is best ("min"/"max"), for the terminal summary
    from_zero: bool = False  # y axis starts at 0, so runs compare by ratio


PANELS = (
    Panel("loss", (Curve("train", "loss"), Curve("valid", "loss"))),
    Panel("perplexity", (Curve("train", "ppl"), Curve("valid", "ppl")), log_y=True),
    Panel("BLEU (valid)", (Curve("valid", "bleu"),), better="max"),
    Panel("learning rate", (Curve("train", "lr"),), better=None),
    Panel("target tokens/s", (Curve("train", "tgt_tokens_per_s"),), better="max", from_zero=True),
    Panel("gradient norm", (Curve("train", "grad_norm"),)),
)
NUMERIC = {c.key for p in PANELS for c in p.curves}


@dataclass
class Run:
    name: str
    path: Path  # the metrics file
    records: list[dict]

    def series(self, split: str, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric, in log order, skipping lines without it."""
        points = [(r["step"], r[key]) for r in self.records if r["split"] == split and r.get(key) is not None]
        steps = np.array([p[0] for p in points], dtype=np.int64)
        values = np.array([p[1] for p in points], dtype=np.float64)
        return steps, values


def metrics_path(path: os.PathLike | str) -> Path:
    """A run directory's metrics log, or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
        if not path.exists():
            raise TfcliError(f"{path}: no metrics log; is {path.parent} a run directory written by `tfcli train`?")
    elif not path.exists():
        raise TfcliError(f"{path}: no such run directory or metrics file")
    return path


def read_metrics(path: os.PathLike | str) -> list[dict]:
    """The records of one metrics log, checked line by line (errors name the file and line)."""
    import json

    path = metrics_path(path)
    lines = list(iter_lines(path))
    ends_with_newline = path.stat().st_size == 0 or _last_byte(path) == b"\n"
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines) and not ends_with_newline:
                continue  # the line a running training is writing right now
            msg = f"not valid JSON ({e.msg} at column {e.colno}); is the metrics log corrupt?"
            raise InputError(path, lineno, msg) from None
        if not isinstance(record, dict):
            raise InputError(path, lineno, "expected a JSON object per line")
        step = record.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise InputError(path, lineno, "missing or non-integer 'step'")
        if not isinstance(record.get("split"), str):
            raise InputError(path, lineno, "missing 'split' (\"train\" or \"valid\")")
        for key in NUMERIC & record.keys():
            value = record[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(path, lineno, f"'{key}' is not a number: {value!r}")
        records.append(record)
    if not records:
        raise TfcliError(f"{path}: the metrics log is empty; has the run logged a step yet?")
    return records


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def load_runs(paths: Sequence[os.PathLike | str]) -> list[Run]:
    """Read every run; names are the run directories' names, made longer where two would be equal."""
    if not paths:
        raise TfcliError("no runs given: pass one or more run directories (or metrics.jsonl files)")
    files = [metrics_path(p) for p in paths]
    runs = [Run(_run_name(f, 1), f, read_metrics(f)) for f in files]
    depth = 1
    while len({r.name for r in runs}) < len(runs) and depth < 6:
        depth += 1
        for r in runs:
            r.name = _run_name(r.path, depth)
    return runs


def _run_name(metrics: Path, depth: int) -> str:
    run_dir = metrics.parent if metrics.name == METRICS_FILE else metrics.with_suffix("")
    parts = run_dir.resolve().parts
    return "/".join(parts[-depth:])


def panels_with_data(runs: Sequence[Run]) -> list[Panel]:
    """The panels some run has data for (a language model logs no BLEU)."""
    return [p for p in PANELS if any(len(r.series(c.split, c.key)[0]) for r in runs for c in p.curves)]


# --- PNG --------------------------------------------------------------------------------------------------------


def plot_runs(runs: Sequence[Run], path: os.PathLike | str, title: str | None = None) -> None:
    """All panels on one figure, against the training step; runs overlaid, one colour each."""
    from tfcli.viz.mpl import new_figure, save_png

    refuse_overwriting_inputs([path], [r.path for r in runs], "choose another -o")
    panels = panels_with_data(runs)
    if not panels:
        raise TfcliError(f"{runs[0].path}: no plottable metrics (loss, ppl, bleu, lr, tgt_tokens_per_s, grad_norm)")
    cols = 3 if len(panels) > 4 else 2
    rows = math.ceil(len(panels) / cols)
    fig = new_figure("tfcli plot", figsize=(cols * 4.6, rows * 3.4 + 0.5), layout="constrained")
    from matplotlib.lines import Line2D

    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    style = {
        "train": dict(linestyle="-", linewidth=1.4),
        "valid": dict(linestyle="--", marker="o", markersize=3.5, linewidth=1.2),
    }
    for ax, panel in zip(axes, panels):
        for i, run in enumerate(runs):
            for curve in panel.curves:
                steps, values = run.series(curve.split, curve.key)
                if len(steps):
                    ax.plot(steps, values, color=f"C{i % 10}", **style[curve.split])
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        if panel.log_y:
            ax.set_yscale("log")
        if panel.from_zero:
            ax.set_ylim(0, ax.dataLim.ymax * 1.08)
        ax.grid(True, alpha=0.3)
    handles = [Line2D([], [], color=f"C{i % 10}", linewidth=2.5, label=run.name) for i, run in enumerate(runs)]
    splits = {c.split for p in panels for c in p.curves}
    handles += [Line2D([], [], color="0.3", label=s, **style[s]) for s in ("train", "valid") if s in splits]
    axes[0].legend(handles=handles, fontsize=8, loc="best")
    fig.suptitle(title or ("training curves: " + ", ".join(r.name for r in runs)), fontsize=12)
    save_png(fig, path, dpi=110)


# --- terminal ---------------------------------------------------------------------------------------------------

BLOCKS = "▁▂▃▄▅▆▇█"
SHORT = {"tgt_tokens_per_s": "tgt tok/s", "grad_norm": "grad norm"}


def sparkline(values: np.ndarray, width: int = 32) -> str:
    """The curve in one line of block characters; long curves are averaged into `width` buckets."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) > width:
        values = np.array([np.nanmean(b) if np.isfinite(b).any() else np.nan for b in np.array_split(values, width)])
    finite = values[np.isfinite(values)]
    if not len(finite):
        return " " * len(values)
    lo, hi = finite.min(), finite.max()
    scale = (len(BLOCKS) - 1) / (hi - lo) if hi > lo else 0.0
    return "".join(" " if not np.isfinite(v) else BLOCKS[int(round((v - lo) * scale))] for v in values)


def print_summary(runs: Sequence[Run], console) -> None:
    """Per run, a table: metric, first, last and best value, and the curve as a sparkline (log for ppl)."""
    from rich.table import Table

    for run in runs:
        table = Table(title=f"{run.name} ({run.path})", title_justify="left", box=None, padding=(0, 1))
        table.add_column("metric")
        for name in ("steps", "first", "last", "best"):
            table.add_column(name, justify="right")
        table.add_column("curve")
        for panel in PANELS:
            for curve in panel.curves:
                steps, values = run.series(curve.split, curve.key)
                finite = values[np.isfinite(values)]
                if not len(finite):
                    continue
                best = {"min": finite.min(), "max": finite.max(), None: None}[panel.better]
                label = f"{curve.split} {SHORT.get(curve.key, curve.key)}"
                table.add_row(
                    label, f"{steps[0]}-{steps[-1]}", _fmt(values[0]), _fmt(values[-1]),
                    "-" if best is None else _fmt(best), sparkline(np.log(values) if panel.log_y else values),
                )
        console.print(table)
        console.print()


def _fmt(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 1e3:
        return f"{v:,.0f}"
    if 0 < abs(v) < 1e-3:
        return f"{v:.2e}"
    return f"{v:.4g}"
