"""What process- and step-level choices of `tfcli train` give on the CPU, side by side: the same `tfcli train`
command, seed and steps, once per variant per round (the order reversing by round), each in its own process:
  - "neither": glibc's default allocator settings and the unfused AdamW (a dozen element-wise ops a parameter);
  - "freed memory kept": the command's keep_freed_memory (a step's logits reuse the last step's pages instead of
    faulting in fresh ones), AdamW unfused;
  - "tfcli train": both that and the fused AdamW (one kernel a parameter; CPU from torch 2.4);
  - "R-Drop": the command with `train.rdrop` (each batch twice through the model): the cost of a step of it.
The first two replace the function that decides with one that declines, in their own process; the third is the
command as shipped.

    .venv/bin/python benchmarks/train_cpu_step.py PREP [--config recipes/multi30k-cpu-long.yaml] [--steps 300]
        [--rounds 2]

Reported per variant: target tokens/s (the median over rounds of the trainer's own logged rate, steps after warmup
only), the process's minor page faults (first touches of fresh memory, start-up included), its peak RSS, and the
training loss at every logged step against the last variant's (the allocator changes where tensors live, not what
is computed: identical; the fused AdamW rounds differently). Results: benchmarks/results/train_cpu_step.{json,md}
(--out: elsewhere).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from common import train_ab_setup, train_steps, trained_precision, write_results

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# `python -m tfcli` with the named choices declined: everything else is the command as shipped
NO_ALLOCATOR = "import tfcli.runtime as p; p.keep_freed_memory = lambda: False; "
UNFUSED = "import tfcli.train.trainer as t; t.fused_adamw = lambda device_type: device_type == 'cuda'; "
RUN_CLI = "import runpy, sys; sys.argv[0] = 'tfcli'; runpy.run_module('tfcli', run_name='__main__')"
PLAIN = ["--set", "train.rdrop=0"]  # (the cpu-long recipe trains with R-Drop: the plain step is measured without it)
# name: (launcher, extra arguments)
VARIANTS = {
    "neither": ([sys.executable, "-c", NO_ALLOCATOR + UNFUSED + RUN_CLI], PLAIN),
    "freed memory kept": ([sys.executable, "-c", UNFUSED + RUN_CLI], PLAIN),
    "tfcli train": (None, PLAIN),
    "R-Drop (train.rdrop 1)": (None, ["--set", "train.rdrop=1"]),
}
OTHER_OBJECTIVE = {"R-Drop (train.rdrop 1)"}  # its loss is another function: not compared


def main() -> None:
    args, res = train_ab_setup(__doc__, 300, str(RESULTS / "train_cpu_step"))
    names = list(VARIANTS)
    rates: dict[str, list[float]] = {v: [] for v in names}
    faults: dict[str, list[int]] = {v: [] for v in names}
    rss: dict[str, list[int]] = {v: [] for v in names}
    losses: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, name in enumerate(names if r % 2 == 0 else names[::-1]):
                out = Path(tmp) / f"round{r}-{i}"
                launcher, extra = VARIANTS[name]
                rows, use = train_steps(args.prep, args.config, args.steps, args.warmup, out, extra, launcher)
                res["precision"] = trained_precision(out)
                rates[name].append(statistics.median(row["tgt_tokens_per_s"] for row in rows if row["step"] > args.warmup))
                faults[name].append(use["minor_faults"])
                rss[name].append(use["peak_rss"])
                losses.setdefault(name, {row["step"]: row["loss"] for row in rows})
    speed = {v: statistics.median(x) for v, x in rates.items()}
    shipped = losses["tfcli train"]
    loss_diff = {v: max(abs(losses[v][s] - shipped[s]) for s in shipped) for v in names if v not in OTHER_OBJECTIVE}
    res.update(tgt_tokens_per_s=speed, rounds_tgt_tokens_per_s=rates, minor_faults=faults, peak_rss=rss,
               speedup_over_neither={v: speed[v] / speed["neither"] for v in names},
               max_loss_difference_to_shipped=loss_diff, train_loss=losses,
               load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    md = [
        "# CPU training: the allocator and the fused AdamW of `tfcli train`, and the cost of R-Drop", "",
        f"`benchmarks/train_cpu_step.py {args.prep} --config {args.config} --steps {args.steps} --rounds "
        f"{args.rounds}`: {res['cpu']}, {res['threads']} threads, trained in {res['precision']}, {res['date']}.", "",
        "| variant | target tokens/s (median of rounds) | rounds | over \"neither\" | minor page faults a run | "
        "peak RSS | largest logged-loss difference to `tfcli train` |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
        *(f"| {v} | {speed[v]:,.0f} | {', '.join(f'{x:,.0f}' for x in rates[v])} | "
          f"{res['speedup_over_neither'][v]:.2f}x | {statistics.median(faults[v]):,.0f} | "
          f"{statistics.median(rss[v]) / 2**20:,.0f} MiB | "
          f"{f'{loss_diff[v]:.2g}' if v in loss_diff else 'another objective'} |" for v in names), "",
        "Page faults and RSS are the whole process's (start-up, data loading and the final validation included).",
        "Written by `benchmarks/train_cpu_step.py`.", "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
