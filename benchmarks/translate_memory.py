"""`tfcli translate` of large files: peak memory against input size.

A tiny encoder-decoder (d_model 64) trained for a few seconds on a copy task (`tfcli prepare` and `tfcli train`), so
that its output ends; greedy search; input files of random lines of its words. Each size is translated by `tfcli translate FILE -o OUT`
in a process of its own, whose peak RSS comes from wait4(). Memory should be bounded by --buffer-size (lines read
ahead and sorted by length), not by the file.

    python benchmarks/translate_memory.py                           # 10k, 100k and 1M lines (4 minutes)
    python benchmarks/translate_memory.py --sizes 1000 20000 --out /tmp/x
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_name, run_tfcli_measured, write_results

ROOT = Path(__file__).resolve().parents[1]


def tiny_checkpoint(workdir: Path) -> Path:
    """A tiny model trained for a few seconds on a copy task through the command line (its outputs do not matter
    here, only the memory that translating a large file takes)."""
    rng = random.Random(0)
    lines = [" ".join(f"w{rng.randrange(20)}" for _ in range(rng.randint(3, 8))) for _ in range(2000)]
    for name in ("train.src", "train.tgt"):
        (workdir / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_tfcli_measured("prepare", ["--src", str(workdir / "train.src"), "--tgt", str(workdir / "train.tgt"),
                                   "--valid-ratio", "0.05", "-o", str(workdir / "prep")])
    run_tfcli_measured("train", [str(workdir / "prep"), "-o", str(workdir / "run"), "--arch", "toy",
                                 "--set", "model.d_model=64", "--set", "model.d_ff=128", "--max-steps", "300",
                                 "--valid-every", "300", "--no-valid-bleu", "--device", "cpu"])
    return workdir / "run"


def input_file(n: int, workdir: Path) -> Path:
    path = workdir / f"in-{n}.txt"
    rng = random.Random(n)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            f.write(" ".join(f"w{rng.randrange(20)}" for _ in range(rng.randint(3, 8))) + "\n")
    return path


def default_buffer_size() -> int:
    """`tfcli translate`'s --buffer-size default, as its --help states it."""
    help_text = subprocess.run([sys.executable, "-m", "tfcli", "translate", "--help"], capture_output=True, text=True,
                               env={**os.environ, "COLUMNS": "300"}, check=True).stdout
    return int(re.search(r"--buffer-size .*?\[default: (\d+)\]", help_text).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "translate_memory"))
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        ckpt = tiny_checkpoint(workdir)
        rows = []
        for n in args.sizes:
            src = input_file(n, workdir)
            out = workdir / f"out-{n}.txt"
            seconds, rss = run_tfcli_measured("translate", ["-m", str(ckpt), "--greedy", str(src), "-o", str(out)])
            lines = sum(1 for _ in open(out, encoding="utf-8"))
            assert lines == n, f"{out}: {lines} lines, expected {n}"
            rows.append({"lines": n, "seconds": round(seconds, 1), "lines_per_s": round(n / seconds),
                         "peak_rss_mb": round(rss / 2**20)})
            print(rows[-1], flush=True)

    buffer = default_buffer_size()
    first, last = rows[0], rows[-1]
    result = {
        "benchmark": "translate_memory", "machine": f"{os.cpu_count()}-core CPU ({cpu_name()})",
        "date": time.strftime("%Y-%m-%d %H:%M"), "buffer_size": buffer, "search": "greedy",
        "model": "tiny copy model (tests/helpers.py train_tiny_checkpoint, d_model 64)",
        "load_average": [round(x, 2) for x in os.getloadavg()], "rows": rows,
        "rss_ratio_largest_to_smallest": round(last["peak_rss_mb"] / first["peak_rss_mb"], 2),
    }
    lines = [
        "# `tfcli translate` of large files: peak memory", "",
        f"{result['model']}, greedy, --buffer-size {buffer} (the default), one process per size. "
        f"{result['machine']}, {result['date']}.", "",
        "| lines | time | lines/s | peak RSS |", "| ---: | ---: | ---: | ---: |",
        *[f"| {r['lines']:,} | {r['seconds']} s | {r['lines_per_s']:,} | {r['peak_rss_mb']} MB |" for r in rows],
        "", f"Peak RSS, largest over smallest input: {result['rss_ratio_largest_to_smallest']}x.", "",
    ]
    write_results(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()
