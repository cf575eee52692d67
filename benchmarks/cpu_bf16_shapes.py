"""bf16 CPU training with and without the rows of every linear layer padded to a multiple of 64 (tfcli/model/linear.py),
side by side: the same `tfcli train` run (a recipe's config, the same seed and steps, validations included) twice.

    .venv/bin/python benchmarks/cpu_bf16_shapes.py PREP [--config recipes/multi30k-cpu-long.yaml] [--steps 750]
        [--valid-every 250]

Without padding, oneDNN builds a kernel for each new row count, and the runs of 2026-11-24 slowed from 6.2k to 4.8k
target tokens/s over 45 minutes while their memory grew to 6.6 GB. Reported per variant: the trainer's logged target
tokens/s at every logged step, and the process's resident memory (sampled every 5 s) at its peak.
Results: benchmarks/results/cpu_bf16_shapes.{json,md}, with the CPU named.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
# the unpadded variant: the same command with tfcli.model.linear.CPU_BF16_ROWS = 1 (a multiple of 1: no padding)
LAUNCH = {
    "padded to 64 rows": "import runpy; runpy.run_module('tfcli', run_name='__main__')",
    "unpadded": "import tfcli.model.linear as m; m.CPU_BF16_ROWS = 1; import runpy; runpy.run_module('tfcli', run_name='__main__')",
}


def run(prep: str, config: str, steps: int, valid_every: int, code: str, out: Path) -> tuple[list[dict], int]:
    """(metrics.jsonl rows, peak RSS in MB sampled every 5 s) of one `tfcli train` run."""
    args = [sys.executable, "-c", code, "train", prep, "-o", str(out), "--config", config, "--seed", "1",
            "--set", "train.max_minutes=0", "--set", f"train.max_steps={steps}",
            "--set", f"train.valid_every={valid_every}", "--set", "train.log_every=50", "--dtype", "native-bf16"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, int(Path(f"/proc/{proc.pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
        except (OSError, ValueError):
            pass
        time.sleep(5)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr.read()}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return rows, peak >> 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prep", help="a prepared directory (tfcli prepare)")
    p.add_argument("--config", default="recipes/multi30k-cpu-long.yaml")
    p.add_argument("--steps", type=int, default=750)
    p.add_argument("--valid-every", type=int, default=250)
    p.add_argument("--out", default=str(RESULTS / "cpu_bf16_shapes"))
    args = p.parse_args()
    res = {"cpu": cpu_name(), "threads": os.cpu_count(), "prep": args.prep, "config": args.config,
           "steps": args.steps, "valid_every": args.valid_every, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, code) in enumerate(LAUNCH.items()):
            rows, peak_mb = run(args.prep, args.config, args.steps, args.valid_every, code, Path(tmp) / str(i))
            train = [r for r in rows if r["split"] == "train"]
            res["runs"][name] = {"peak_rss_mb": peak_mb,
                                 "tgt_tokens_per_s": {r["step"]: r["tgt_tokens_per_s"] for r in train},
                                 "valid": {r["step"]: r.get("bleu") for r in rows if r["split"] == "valid"}}
    res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    names = list(LAUNCH)
    steps = sorted(res["runs"][names[0]]["tgt_tokens_per_s"])
    md = [
        "# bf16 CPU training: linear-layer rows padded to a multiple of 64, or not", "",
        f"`benchmarks/cpu_bf16_shapes.py {args.prep} --config {args.config} --steps {args.steps} --valid-every "
        f"{args.valid_every}`: {res['cpu']}, {res['threads']} threads, {res['date']}; `--dtype native-bf16`, "
        "validation (loss and greedy BLEU) at every multiple of --valid-every, run one after the other.", "",
        "| | " + " | ".join(names) + " |", "| --- | ---: | ---: |",
        "| peak resident memory | " + " | ".join(f"{res['runs'][n]['peak_rss_mb']:,} MB" for n in names) + " |",
        *(f"| target tokens/s, steps to {s} | " + " | ".join(f"{res['runs'][n]['tgt_tokens_per_s'][s]:,.0f}"
                                                           for n in names) + " |" for s in steps),
        "", f"Load average at start {res['load_average_at_start']}, at end {res['load_average_at_end']}.", "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
