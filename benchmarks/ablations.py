"""Ablations on valid only: each model/optimiser option alone against the `cpu` recipe's configuration.

    .venv/bin/python benchmarks/ablations.py PREP --variants baseline,muon [--seed 1] [--runs DIR]
        [--config recipes/multi30k-cpu.yaml] [--data ../shared/data] [--pair de-en]

PREP: a Multi30k prepared directory as recipes/multi30k.sh makes it (joint BPE 8000). Each variant trains with
`tfcli train PREP --config CONFIG --seed N --set ...` (the recipe's wall-clock budget, so a slower option trains
fewer steps: what a user of the recipe gets), alone on the machine, one after another; then its valid scores: the
last validation's nll and greedy BLEU (300 sentences, from RUN/metrics.jsonl) and sacreBLEU of beam 5 (length
penalty 1.0) over the whole valid split, from the raw text. test2016 is never read. Results accumulate in
benchmarks/results/ablations.{json,md} (one entry per variant and seed; a re-run replaces its entry), with the CPU
named.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TFCLI = str(Path(sys.executable).with_name("tfcli"))

VARIANTS = {
    "baseline": [],
    "muon": ["train.optimizer=muon"],
    "rms_norm": ["model.rms_norm=true"],
    "swiglu": ["model.activation=swiglu"],
    "relu2": ["model.activation=relu2"],
    "qk_norm": ["model.qk_norm=true"],
    "zero_init_residual": ["model.zero_init_residual=true"],
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prep")
    p.add_argument("--variants", default="baseline,muon")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", default=str(ROOT / "runs" / "ablations"))
    p.add_argument("--config", default="recipes/multi30k-cpu.yaml")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--pair", default="de-en")
    p.add_argument("--out", default=str(RESULTS / "ablations"))
    args = p.parse_args()
    src, tgt = args.pair.split("-")
    valid = Path(args.data) / "multi30k"
    out = Path(args.out)
    entries = json.loads(out.with_suffix(".json").read_text())["entries"] if out.with_suffix(".json").exists() else []
    for name in args.variants.split(","):
        run = Path(args.runs) / f"{args.pair}-{name}-seed{args.seed}"
        sets = [a for s in VARIANTS[name] for a in ("--set", s)]
        cmd = [TFCLI, "train", args.prep, "-o", str(run), "--config", args.config, "--seed", str(args.seed), *sets]
        start = time.time()
        load = [round(x, 2) for x in os.getloadavg()]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.time() - start
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        last = [r for r in rows if r["split"] == "valid"][-1]
        beam = subprocess.run(
            [TFCLI, "eval", "--model", str(run), "--translate", str(valid / f"valid.{src}"), "-r",
             str(valid / f"valid.{tgt}"), "--beam-size", "5", "--len-penalty", "1.0", "--metrics", "bleu",
             "--score-only"], check=True, capture_output=True, text=True).stdout.strip()
        entry = {"variant": name, "seed": args.seed, "pair": args.pair, "set": VARIANTS[name], "steps": last["step"],
                 "valid_nll": last["nll"], "valid_greedy_bleu_300": last["bleu"], "valid_beam5_sacrebleu": float(beam),
                 "train_wall_s": round(wall, 1), "cpu": cpu_name(), "load_average_at_start": load,
                 "date": time.strftime("%Y-%m-%d %H:%M"), "command": shlex.join(cmd)}
        entries = [e for e in entries if (e["variant"], e["seed"], e["pair"]) != (name, args.seed, args.pair)]
        entries.append(entry)
        print(f"{name} seed {args.seed}: valid nll {last['nll']:.3f}, beam-5 sacreBLEU {float(beam):.2f}, "
              f"{last['step']} steps", flush=True)
        write(out, entries, args)


def write(out: Path, entries: list, args) -> None:
    base = {(e["pair"], e["seed"]): e for e in entries if e["variant"] == "baseline"}
    md = [
        "# Ablations: each option alone against the `cpu` recipe (Multi30k, valid only)", "",
        f"Each row: `tfcli train` with `{args.config}` (its wall-clock budget) plus the option, alone on the machine; "
        "valid nll and greedy BLEU (300 sentences) of the last validation, and sacreBLEU of beam 5 (length penalty "
        "1.0) on the whole valid split. Written by `benchmarks/ablations.py`; test2016 is never read.", "",
        "| pair | variant | seed | steps | valid nll | greedy BLEU (300) | beam-5 sacreBLEU | vs baseline | CPU | date |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for e in sorted(entries, key=lambda e: (e["pair"], e["variant"] != "baseline", e["variant"], e["seed"])):
        b = base.get((e["pair"], e["seed"]))
        delta = f"{e['valid_beam5_sacrebleu'] - b['valid_beam5_sacrebleu']:+.2f}" if b and b is not e else ""
        md.append(f"| {e['pair']} | {e['variant']} | {e['seed']} | {e['steps']} | {e['valid_nll']:.3f} | "
                  f"{e['valid_greedy_bleu_300']:.2f} | {e['valid_beam5_sacrebleu']:.2f} | {delta} | {e['cpu']}, 2 "
                  f"cores | {e['date']} |")
    md += ["", "Commands: " + "; ".join(f"`{e['command']}`" for e in entries), ""]
    write_results(str(out), {"entries": entries}, "\n".join(md))


if __name__ == "__main__":
    main()
