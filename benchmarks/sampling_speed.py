"""Sampling (back-translation) against beam search on the same model: `translate --sampling` beside beam 5 and greedy.

    .venv/bin/python benchmarks/sampling_speed.py --checkpoint CKPT [--data ../shared/data] [--repeats 3]

Multi30k test2016's 1,000 German sentences through the Python API (`tfcli.load(CKPT).translate`, the decoder that
`tfcli translate` runs, in a process tuned as the command tunes its own), at batch 64: beam 5 (alpha 0.6), greedy,
and sampling with top-k 10 (temperature 1, seed 1). Best of --repeats, the three interleaved. CTranslate2 reports
its sampling at 1.9x its beam search; the ratio here is the comparable figure. Results:
benchmarks/results/sampling_speed.{json,md}, with the CPU named.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from common import cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

MODES = {
    "beam 5": dict(beam_size=5, len_penalty=0.6),
    "greedy": dict(beam_size=1),
    "sampling, top-k 10": dict(sampling=True, top_k=10, temperature=1.0, seed=1),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "sampling_speed"))
    args = p.parse_args()

    import tfcli
    from tfcli.runtime import tune_process

    src = Path(args.data) / "multi30k" / "test2016.de"
    if not src.exists():
        raise SystemExit(f"{src}: not found; pass --data")
    texts = src.read_text(encoding="utf-8").splitlines()
    tune_process("cpu", args.threads)  # threads and the allocator, as `tfcli translate` sets them
    translator = tfcli.load(args.checkpoint, device="cpu")
    seconds = {mode: [] for mode in MODES}
    outputs = {}
    for r in range(args.repeats):
        print(f"round {r + 1}/{args.repeats} ...", file=sys.stderr)
        for mode, options in MODES.items():
            start = time.perf_counter()
            outputs[mode] = translator.translate(texts, batch_size=args.batch_size, **options)
            seconds[mode].append(time.perf_counter() - start)
    best = {mode: min(v) for mode, v in seconds.items()}
    rate = {mode: len(texts) / s for mode, s in best.items()}
    words = {mode: sum(len(t.split()) for t in out) for mode, out in outputs.items()}
    result = {
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "torch": torch.__version__},
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["benchmarks/sampling_speed.py", *sys.argv[1:]]),
        "sentences": len(texts), "batch_size": args.batch_size, "modes": MODES, "seconds": seconds,
        "sentences_per_s": rate, "output_words": words,
        "sampling_over_beam5": rate["sampling, top-k 10"] / rate["beam 5"],
    }
    rows = "".join(f"| {mode} | {best[mode]:.2f} | {rate[mode]:.1f} | {words[mode]:,} | {rate[mode] / rate['beam 5']:.2f}x |\n"
                   for mode in MODES)
    md = (
        "# Sampling against beam search (CPU, float32)\n\n"
        f"Command: `.venv/bin/python {result['command']}`\n\n"
        f"Machine: {os.cpu_count()} CPUs ({cpu_name()}), torch {torch.__version__}, threads {args.threads}. "
        f"Measured {result['measured']}.\n\n"
        f"Multi30k test2016, {len(texts)} German sentences to English through `tfcli.load(...).translate`, batch "
        f"{args.batch_size}, best of {args.repeats} interleaved rounds.\n\n"
        "| decoding | seconds | sent/s | output words | sent/s against beam 5 |\n| --- | ---: | ---: | ---: | ---: |\n"
        + rows + "\nWritten by `benchmarks/sampling_speed.py`.\n"
    )
    write_results(args.out, result, md)


if __name__ == "__main__":
    main()
