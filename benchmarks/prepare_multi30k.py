"""How long `tfcli prepare` takes on all of Multi30k de-en (29k train + 1014 valid + 1000 test pairs).

    .venv/bin/python benchmarks/prepare_multi30k.py [--data ../shared/data] [--repeats 3]

Measures, in one run:
  1. the whole command as a user runs it (`python -m tfcli prepare ...`, a subprocess, fresh output dir each time):
     reading, cleaning, BPE training (8000, joint), encoding, writing; Python start-up included;
  2. the same command again on the finished directory (the up-to-date no-op: hashing the inputs only);
  3. encoding alone, all 58k training sentences: tfcli.data.tokenizer.encode_batch (Rust encode_batch, parallel,
     in bounded batches) against a Python loop of Tokenizer.encode, one sentence at a time; the ratio is the speed-up.
Writes benchmarks/results/prepare_multi30k.json and .md. The machine may be shared: the load average before and
after is recorded next to the times, and so is the CPU time the command used (less affected by other jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import SHARED_DATA, portable

ROOT = Path(__file__).resolve().parents[1]

def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tokenizers

    return {
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tokenizers": tokenizers.__version__,
    }


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def children_cpu() -> float:
    """User + system CPU seconds of finished child processes: less sensitive to other jobs than wall time."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(SHARED_DATA))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    d = args.data / "multi30k"
    if not d.is_dir():
        sys.exit(f"{d}: not found (pass --data DIR holding multi30k/)")

    from tfcli.data import encode_batch, load_tokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    out = work / "m30k"
    files = [f"--src={d}/train.de", f"--tgt={d}/train.en", f"--valid-src={d}/valid.de", f"--valid-tgt={d}/valid.en",
             f"--test-src={d}/test2016.de", f"--test-tgt={d}/test2016.en"]
    cmd = [sys.executable, "-m", "tfcli", "prepare", *files, "--vocab-size", "8000", "--joint-vocab", "-o", str(out)]
    shown = "tfcli prepare " + " ".join(a.replace(str(d), "$DATA/multi30k") for a in cmd[4:-2]) + " -o prep/multi30k"
    load_before = loadavg()
    try:
        full, cpu = [], []
        for _ in range(args.repeats):
            shutil.rmtree(out, ignore_errors=True)
            c, t = children_cpu(), time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            full.append(time.perf_counter() - t)
            cpu.append(children_cpu() - c)
        t = time.perf_counter()
        r = subprocess.run(cmd, check=True, capture_output=True, text=True)
        noop = time.perf_counter() - t
        assert "up to date" in r.stderr, r.stderr
        meta = json.loads((out / "meta.json").read_text())

        tok = load_tokenizer(out / "tokenizer.src.json")
        lines = [line for lang in ("de", "en") for line in (d / f"train.{lang}").read_text(encoding="utf-8").splitlines()]
        batch, loop = [], []
        for _ in range(args.repeats):
            t = time.perf_counter()
            ids_batch = encode_batch(tok, lines)
            batch.append(time.perf_counter() - t)
            t = time.perf_counter()
            ids_loop = [tok.encode(line, add_special_tokens=False).ids for line in lines]
            loop.append(time.perf_counter() - t)
        assert ids_batch == ids_loop
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "command": shown,
        "machine": machine(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "repeats": args.repeats,
        "prepare_s": {"median": round(statistics.median(full), 2), "all": [round(x, 2) for x in full]},
        "prepare_cpu_s": {"median": round(statistics.median(cpu), 2), "all": [round(x, 2) for x in cpu]},
        "noop_rerun_s": round(noop, 2),
        "pairs": {split: meta["splits"][split]["src"]["count"] for split in meta["splits"]},
        "tokens": {split: meta["splits"][split]["src"]["tokens"] + meta["splits"][split]["tgt"]["tokens"]
                   for split in meta["splits"]},
        "encode_train_sentences": len(lines),
        "encode_batch_s": round(statistics.median(batch), 3),
        "encode_loop_s": round(statistics.median(loop), 3),
        "encode_speedup": round(statistics.median(loop) / statistics.median(batch), 2),
    }
    res_dir = ROOT / "benchmarks" / "results"
    res_dir.mkdir(parents=True, exist_ok=True)
    (res_dir / "prepare_multi30k.json").write_text(portable(json.dumps(result, indent=2)) + "\n")
    m = result["machine"]
    md = f"""# `tfcli prepare` on Multi30k de-en

Command (BPE, 8000 joint vocabulary; `$DATA` = `../shared/data`):

    {shown}

Machine: {m['nproc']} CPUs ({m['cpu']}), Python {m['python']}, tokenizers {m['tokenizers']}.
Load average before/after: {load_before} / {result['loadavg_after']} (a shared machine: other jobs ran alongside).

| what | time |
| --- | ---: |
| full `tfcli prepare`, fresh output dir, wall (median of {args.repeats}: {', '.join(f'{x:.2f}' for x in full)} s) | {result['prepare_s']['median']:.2f} s |
| the same, CPU time used (user + system, all threads) | {result['prepare_cpu_s']['median']:.2f} s |
| same command again (up to date, no-op) | {noop:.2f} s |
| encode {len(lines):,} train sentences: `encode_batch` (Rust, parallel) | {result['encode_batch_s']:.3f} s |
| encode {len(lines):,} train sentences: Python loop of `Tokenizer.encode` | {result['encode_loop_s']:.3f} s |
| speed-up of `encode_batch` over the loop | {result['encode_speedup']:.2f}x |

Pairs kept: {', '.join(f'{k} {v:,}' for k, v in result['pairs'].items())}; tokens (src + tgt):
{', '.join(f'{k} {v:,}' for k, v in result['tokens'].items())}.
Written by `benchmarks/prepare_multi30k.py`.
"""
    (res_dir / "prepare_multi30k.md").write_text(portable(md))
    print(md)


if __name__ == "__main__":
    main()
