"""One search against an earlier version of itself, in one process, on a trained checkpoint (CPU).

    .venv/bin/python benchmarks/search_ab.py CKPT --before COMMIT [--dtype fp32|int8] [--batch 64] [--rounds 6]
        [--threads 2] [--data ../shared/data] [--out DIR/NAME]

`tfcli/generate/search.py` as it was at COMMIT (read from git) and as it is now, each run over the same batches
of the 1,000 Multi30k test2016 German sentences (sorted by length, --batch at a time; natural lengths: alpha 0, at
most 80 tokens), greedy and beam 5, the two versions alternating for --rounds rounds. Both step through the same
decoder (today's `tfcli/generate/step.py`, packed fp32 weights as `tfcli translate` runs on the CPU, or --dtype
int8), so only the search differs, and the machine's drift touches both alike: a finer comparison than two runs of
translate_speed.py. The outputs must be identical (checked). Reported: the best and the median time of each, and
now/before speed ratios. Results: OUT.json and OUT.md, with the CPU named.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]


def old_search(commit: str):
    """search.py at `commit`, imported as a module of its own (it imports today's step.py and the rest)."""
    text = subprocess.run(["git", "show", f"{commit}:tfcli/generate/search.py"], cwd=ROOT, check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "search_before.py"
    path.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("search_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["search_before"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--before", required=True, help="the commit whose search.py to compare with")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "int8"], help="the decoder's weights (as translate)")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_ab"))
    args = p.parse_args()
    from tfcli.data.batching import pad, source_ids
    from tfcli.data.tokenizer import encode_batch
    from tfcli.generate import search as now
    from tfcli.generate.loader import load

    torch.set_num_threads(args.threads)
    before = old_search(args.before)
    loaded = load(args.checkpoint, torch.device("cpu"), "seq2seq", args.dtype)
    lines = (Path(args.data) / "multi30k" / "test2016.de").read_text(encoding="utf-8").splitlines()
    ids = [source_ids(x) for x in encode_batch(loaded.src_tok, lines)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [pad([ids[i] for i in order[j : j + args.batch]]) for j in range(0, len(order), args.batch)]

    def run(module, beam: int):
        t0 = time.perf_counter()
        if beam == 1:
            out = [h.tokens for b in batches for h in module.greedy_decode(loaded.steps, b, 0.0, 80)]
        else:
            out = [h[0].tokens for b in batches for h in module.beam_search(loaded.steps, b, beam, 0.0, 0.0, 80)]
        return time.perf_counter() - t0, out

    rows = []
    for beam in (5, 1):
        times = {"before": [], "now": []}
        for _ in range(args.rounds):
            t, ref = run(before, beam)
            times["before"].append(t)
            t, out = run(now, beam)
            times["now"].append(t)
            if out != ref:
                sys.exit(f"search_ab: beam {beam}: the outputs differ from {args.before}'s")
        med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
        rows.append({"beam": beam, "seconds": times, "best_ratio": min(times["before"]) / min(times["now"]),
                     "median_ratio": med["before"] / med["now"],
                     "sent_per_s_now": len(lines) / min(times["now"]),
                     "sent_per_s_before": len(lines) / min(times["before"])})
        print(f"beam {beam}: now/before speed {rows[-1]['best_ratio']:.3f} (best), {rows[-1]['median_ratio']:.3f} "
              "(median)", file=sys.stderr)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    res = {"cpu": cpu_name(), "threads": args.threads, "dtype": args.dtype, "torch": torch.__version__,
           "before": args.before,
           "now": head.strip(), "checkpoint": args.checkpoint, "batch": args.batch, "rounds": args.rounds,
           "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}
    md = [
        f"# search.py now ({res['now']}) against {args.before}, one process", "",
        f"{res['cpu']}, {args.threads} threads, {args.dtype}, torch {res['torch']}, {res['date']}. Checkpoint "
        f"`{args.checkpoint}`; "
        f"Multi30k test2016 de, 1,000 sentences in batches of {args.batch}, alpha 0, at most 80 tokens; "
        f"{args.rounds} rounds alternating; identical outputs. Written by `benchmarks/search_ab.py`.", "",
        "| search | before sent/s (best) | now sent/s (best) | now/before, best | now/before, median |",
        "| --- | ---: | ---: | ---: | ---: |",
        *[f"| {'greedy' if r['beam'] == 1 else 'beam %d' % r['beam']} | {r['sent_per_s_before']:.1f} | "
          f"{r['sent_per_s_now']:.1f} | {r['best_ratio']:.3f} | {r['median_ratio']:.3f} |" for r in rows], "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
