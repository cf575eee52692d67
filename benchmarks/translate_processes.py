"""One file over several processes: `torchrun --nproc_per_node N $(which tfcli) translate` against one process.

    .venv/bin/python benchmarks/translate_processes.py --checkpoint CKPT [--processes 2] [--threads 1]
        [--data ../shared/data] [--source test2016] [--limit N] [--repeats 2]

Multi30k German (test2016's 1,000 sentences, or the first --limit lines of another split: --source train) translated to English with beam 5 by `tfcli translate` in one process
with --threads T, and by torchrun (`python -m torch.distributed.run --standalone`) with N processes of T threads
each (gloo; each process translates its parts of the file, the first joins them). Reported: wall time of the whole
command (start-up, loading and joining included), best of --repeats with the two interleaved; the speed-up; and
whether the joined file is byte for byte the one-process file. Results: benchmarks/results/translate_processes.{json,md},
with the CPU named. Needs as many cores as processes x threads to show scaling.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a trained Multi30k de->en checkpoint or run directory")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per process, in both runs")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--source", default="test2016", help="the Multi30k split whose German side is translated")
    p.add_argument("--limit", type=int, default=0, help="its first N lines (0: all)")
    p.add_argument("--out", default=str(RESULTS / "translate_processes"))
    args = p.parse_args()

    full = Path(args.data) / "multi30k" / f"{args.source}.de"
    if not full.exists():
        raise SystemExit(f"{full}: not found; pass --data")
    tmpdir = tempfile.TemporaryDirectory()
    src = Path(tmpdir.name) / f"{args.source}.de"
    with open(full, encoding="utf-8") as f:
        kept = [line for i, line in enumerate(f) if not args.limit or i < args.limit]
    src.write_text("".join(kept), encoding="utf-8")
    lines = len(kept)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    common = ["-m", args.checkpoint, str(src), "--beam-size", str(args.beam), "--device", "cpu",
              "--threads", str(args.threads), "-q"]
    with tempfile.TemporaryDirectory() as tmp:
        one_out, many_out = Path(tmp) / "one.en", Path(tmp) / "many.en"
        one = [sys.executable, "-m", "tfcli", "translate", *common, "-o", str(one_out)]
        many = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                str(args.processes), "-m", "tfcli", "translate", *common, "-o", str(many_out),
                "--part-lines", str(-(-lines // (4 * args.processes)))]  # 4 parts a process
        times = {"one": [], "many": []}
        for r in range(args.repeats):
            print(f"round {r + 1}/{args.repeats} ...", file=sys.stderr)
            times["one"].append(timed(one, env))
            times["many"].append(timed(many, env))
        same = one_out.read_bytes() == many_out.read_bytes()
    best = {k: min(v) for k, v in times.items()}
    speedup = best["one"] / best["many"]
    result = {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["benchmarks/translate_processes.py", *sys.argv[1:]]),
        "source": args.source, "lines": lines, "beam": args.beam, "processes": args.processes, "threads_per_process": args.threads,
        "seconds": times, "best_seconds": best,
        "sentences_per_s": {k: lines / v for k, v in best.items()},
        "speedup": speedup, "same_output": same,
    }
    md = (
        "# One file over several processes (CPU)\n\n"
        f"Command: `.venv/bin/python {result['command']}`\n\n"
        f"Machine: {os.cpu_count()} CPUs ({cpu_name()}), torch {torch.__version__}. Measured {result['measured']}.\n\n"
        f"Multi30k {args.source}, {lines} German sentences to English, beam {args.beam}. Wall time of the whole command "
        f"(start-up, loading, joining), best of {args.repeats}, the two interleaved.\n\n"
        "| run | threads each | seconds | sent/s |\n| --- | ---: | ---: | ---: |\n"
        f"| `tfcli translate`, 1 process | {args.threads} | {best['one']:.1f} | {lines / best['one']:.1f} |\n"
        f"| `torchrun --nproc_per_node {args.processes} $(which tfcli) translate` | {args.threads} | "
        f"{best['many']:.1f} | {lines / best['many']:.1f} |\n\n"
        f"Speed-up: {speedup:.2f}x on {args.processes} processes. Joined output byte for byte the one-process "
        f"output: {'yes' if same else 'NO'}.\n\nWritten by `benchmarks/translate_processes.py`.\n"
    )
    tmpdir.cleanup()
    write_results(args.out, result, md)
    if not same:
        raise SystemExit("the outputs differ")


if __name__ == "__main__":
    main()
