"""CPU training with glibc's default allocator settings and with the memory `tfcli train` keeps (its
keep_freed_memory: freed blocks stay in the heap for the next step), side by side: the same `tfcli train` command,
seed and steps, once each per round (the order alternating by round); the "glibc default" runs replace that one
call with a no-op, in their own process.

    .venv/bin/python benchmarks/train_allocator.py PREP [--config recipes/multi30k-cpu-long.yaml] [--steps 300]
        [--rounds 2]

Reported per variant: target tokens/s (the median over rounds of the trainer's own logged rate, steps after warmup
only), the process's minor page faults (first touches of fresh memory, start-up included), its peak RSS, and
whether the training losses of the two are identical at every logged step (they must be: the allocator changes
where tensors live, not what is computed). Results: benchmarks/results/train_allocator.{json,md} (--out: elsewhere).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_name, train_steps, trained_precision, write_results

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
DEFAULT = "glibc default"
KEPT = "kept (tfcli train)"
# `python -m tfcli` with the allocator call made a no-op: everything else is the command as shipped
UNTUNED = [sys.executable, "-c", "import sys; import tfcli.cli.process as p; p.keep_freed_memory = lambda: False; "
           "from tfcli.cli import main; sys.argv[0] = 'tfcli'; main()"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prep", help="a prepared directory (tfcli prepare)")
    p.add_argument("--config", default="recipes/multi30k-cpu-long.yaml")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=50, help="steps left out of the rate (and the lr warmup)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "train_allocator"))
    args = p.parse_args()
    res = {"cpu": cpu_name(), "threads": os.cpu_count(), "prep": args.prep, "config": args.config,
           "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    variants = {DEFAULT: UNTUNED, KEPT: None}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    faults: dict[str, list[int]] = {v: [] for v in variants}
    rss: dict[str, list[int]] = {v: [] for v in variants}
    losses: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                out = Path(tmp) / f"{len(losses)}-{r}-{name[:4]}"
                rows, use = train_steps(args.prep, args.config, args.steps, args.warmup, out, launcher=variants[name])
                res["precision"] = trained_precision(out)
                rates[name].append(statistics.median(row["tgt_tokens_per_s"] for row in rows if row["step"] > args.warmup))
                faults[name].append(use["minor_faults"])
                rss[name].append(use["peak_rss"])
                losses.setdefault(name, {row["step"]: row["loss"] for row in rows})
    speed = {v: statistics.median(x) for v, x in rates.items()}
    same = losses[DEFAULT] == losses[KEPT]
    res.update(tgt_tokens_per_s=speed, rounds_tgt_tokens_per_s=rates, minor_faults=faults, peak_rss=rss,
               ratio=speed[KEPT] / speed[DEFAULT], identical_losses=same, train_loss=losses,
               load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    md = [
        "# CPU training: glibc's default allocator settings and the memory `tfcli train` keeps", "",
        f"`benchmarks/train_allocator.py {args.prep} --config {args.config} --steps {args.steps} --rounds "
        f"{args.rounds}`: {res['cpu']}, {res['threads']} threads, trained in {res['precision']}, {res['date']}.", "",
        "| variant | target tokens/s (median of rounds) | rounds | minor page faults a run | peak RSS |",
        "| --- | ---: | --- | ---: | ---: |",
        *(f"| {v} | {speed[v]:,.0f} | {', '.join(f'{x:,.0f}' for x in rates[v])} | "
          f"{statistics.median(faults[v]):,.0f} | {statistics.median(rss[v]) / 2**20:,.0f} MiB |" for v in variants), "",
        f"kept / default: **{res['ratio']:.2f}x** target tokens/s; training losses at every logged step "
        f"{'identical' if same else 'DIFFERENT'}.", "",
        "Page faults and RSS are the whole process's (start-up, data loading and the final validation included).",
        "Written by `benchmarks/train_allocator.py`.", "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
