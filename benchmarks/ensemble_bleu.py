"""BLEU of an ensemble beside each of its models: `tfcli translate -m A -m B` against `-m A` and `-m B`.

    .venv/bin/python benchmarks/ensemble_bleu.py --checkpoint RUN_A --checkpoint RUN_B [--data ../shared/data]
        [--src de --tgt en] [--beam 5] [--alpha 0.6]

Multi30k test2016 translated through the Python API (`tfcli.load(path)` for each model, `tfcli.load([a, b])` for
the ensemble: the models' next-token probabilities averaged), beam 5, and scored with sacreBLEU (default
signature, printed) against the references. Results: benchmarks/results/ensemble_bleu.{json,md}, with the CPU
named and the speed of each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from common import SHARED_DATA, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", action="append", required=True, help="a model; give it twice or more")
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--out", default=str(RESULTS / "ensemble_bleu"))
    args = p.parse_args()
    if len(args.checkpoint) < 2:
        raise SystemExit("give --checkpoint at least twice")

    import tfcli

    d = Path(args.data) / "multi30k"
    src = (d / f"test2016.{args.src}").read_text(encoding="utf-8").splitlines()
    ref = (d / f"test2016.{args.tgt}").read_text(encoding="utf-8").splitlines()
    systems = {f"model {i + 1}": ckpt for i, ckpt in enumerate(args.checkpoint)}
    systems["ensemble"] = list(args.checkpoint)
    rows = {}
    for name, path in systems.items():
        print(f"{name} ...", file=sys.stderr)
        translator = tfcli.load(path, device="cpu")
        start = time.perf_counter()
        hyps = translator.translate(src, beam_size=args.beam, len_penalty=args.alpha)
        seconds = time.perf_counter() - start
        bleu = tfcli.score(hyps, ref, metrics=("bleu",))["BLEU"]
        rows[name] = {"checkpoint": path, "bleu": round(bleu.score, 2), "signature": bleu.signature,
                      "seconds": round(seconds, 2), "sentences_per_s": round(len(src) / seconds, 1)}
    result = {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__},
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["benchmarks/ensemble_bleu.py", *sys.argv[1:]]),
        "test": f"multi30k test2016 {args.src}-{args.tgt}", "sentences": len(src), "beam": args.beam,
        "alpha": args.alpha, "systems": rows,
    }
    table = "".join(f"| {name} | {r['bleu']:.2f} | {r['sentences_per_s']:.1f} | `{r['checkpoint']}` |\n"
                    for name, r in rows.items())
    md = (
        "# An ensemble beside its models (CPU)\n\n"
        f"Command: `.venv/bin/python {result['command']}`\n\n"
        f"Machine: {os.cpu_count()} CPUs ({cpu_name()}), torch {torch.__version__}. Measured {result['measured']}.\n\n"
        f"Multi30k test2016 {args.src}->{args.tgt}, {len(src)} sentences, beam {args.beam}, alpha {args.alpha}; "
        f"sacreBLEU `{rows['ensemble']['signature']}`.\n\n"
        "| system | BLEU | sent/s | checkpoint(s) |\n| --- | ---: | ---: | --- |\n" + table
        + "\nWritten by `benchmarks/ensemble_bleu.py`.\n"
    )
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
