"""CPU training in fp32 and in `--dtype native-bf16`, side by side: `tfcli train` on a prepared corpus with a
recipe's config, the same seed and the same steps, once per precision per round (the order alternating by round).

    .venv/bin/python benchmarks/cpu_precision.py PREP [--config recipes/multi30k-cpu-long.yaml] [--steps 150]
        [--rounds 2]

Reported per precision: target tokens/s (the median over rounds of the trainer's own logged rate, steps after
warmup only), and the training loss at every logged step of the first round (the same batches: the runs differ only
in arithmetic). native-bf16 is bf16 only on a CPU with native bf16 products (AMX or AVX-512 BF16): the results
name the CPU and say which it ran. Results: benchmarks/results/cpu_precision.{json,md} (--out: elsewhere).
"""

from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path

from common import train_ab_setup, train_steps, trained_precision, write_results

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
PRECISIONS = ("fp32", "native-bf16")


def train(prep: str, config: str, precision: str, steps: int, warmup: int, out: Path) -> list[dict]:
    """The train lines of metrics.jsonl of one `tfcli train` run, and the precision it resolved (from its log)."""
    rows, _ = train_steps(prep, config, steps, warmup, out, ["--dtype", precision])
    resolved = trained_precision(out)
    return [dict(r, resolved=resolved) for r in rows]


def main() -> None:
    args, res = train_ab_setup(__doc__, 150, str(RESULTS / "cpu_precision"))
    rates: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    losses: dict[str, dict[int, float]] = {}
    resolved = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for precision in PRECISIONS if r % 2 == 0 else PRECISIONS[::-1]:
                rows = train(args.prep, args.config, precision, args.steps, args.warmup, Path(tmp) / f"{precision}-{r}")
                timed = [row["tgt_tokens_per_s"] for row in rows if row["step"] > args.warmup]
                rates[precision].append(statistics.median(timed))
                resolved[precision] = rows[0]["resolved"]
                losses.setdefault(precision, {row["step"]: row["loss"] for row in rows})
    speed = {p: statistics.median(v) for p, v in rates.items()}
    res.update(resolved=resolved, tgt_tokens_per_s=speed, rounds_tgt_tokens_per_s=rates, train_loss=losses,
               ratio=speed["native-bf16"] / speed["fp32"],
               load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    steps = sorted(losses["fp32"])
    md = [
        "# CPU training: fp32 and `--dtype native-bf16`", "",
        f"`benchmarks/cpu_precision.py {args.prep} --config {args.config} --steps {args.steps}`: {res['cpu']}, "
        f"{res['threads']} threads, {res['date']}. native-bf16 ran as **{resolved['native-bf16']}** on this CPU.", "",
        "| precision | target tokens/s (median of rounds) | rounds |", "| --- | ---: | --- |",
        *(f"| {p} | {speed[p]:,.0f} | {', '.join(f'{x:,.0f}' for x in rates[p])} |" for p in PRECISIONS), "",
        f"native-bf16 / fp32: **{res['ratio']:.2f}x**.", "",
        "Training loss at the logged steps (round 1; the same batches and initial weights):", "",
        "| step | " + " | ".join(PRECISIONS) + " |", "| ---: | ---: | ---: |",
        *(f"| {s} | " + " | ".join(f"{losses[p][s]:.4f}" for p in PRECISIONS) + " |" for s in steps), "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
