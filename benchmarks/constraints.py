"""Terminology constraints on Multi30k test2016, by Post & Vilar's (2018) protocol.

    .venv/bin/python benchmarks/constraints.py CKPT [--src de] [--tgt en] [--beam 5] [--batch 64] [--repeats 3]
        [--seed 1] [--data ../shared/data] [--out OUT]

The 1,000 test sentences are translated without constraints (beam 5, batch 64, through the Python API); then each
sentence gets one or two phrases of one to three words drawn from its reference that its unconstrained
translation lacks (seeded; a sentence whose translation already holds its whole reference gets none), and is
translated again with them as `constraints=`. Reported: sacreBLEU of both against the references, the share of
the phrases found in the constrained output (the hit rate), and the best time of --repeats for each way (the
target: constrained at most 1.5x unconstrained). Results: benchmarks/results/constraints.{json,md}, the CPU named.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import string
import sys
import time
from pathlib import Path

from common import SHARED_DATA, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def holds(text: str, phrase: str) -> bool:
    """Whether `text`'s words, punctuation stripped from their ends ("kitchen." is "kitchen"), hold `phrase`."""
    return f" {phrase} " in f" {' '.join(w.strip(string.punctuation) for w in text.split())} "


def draw_phrases(rng: random.Random, ref: str, output: str, most: int = 2) -> list[str]:
    """Up to `most` phrases of 1-3 reference words (punctuation stripped from their ends), not overlapping, none
    of which `output` holds."""
    words = [w.strip(string.punctuation) for w in ref.split()]
    spans = [(i, n) for n in (1, 2, 3) for i in range(len(words) - n + 1)
             if all(words[i : i + n]) and not holds(output, " ".join(words[i : i + n]))]
    rng.shuffle(spans)
    want, chosen = rng.randint(1, most), []
    for i, n in spans:
        if len(chosen) == want:
            break
        if all(i + n <= j or j + m <= i for j, m in chosen):
            chosen.append((i, n))
    return [" ".join(words[i : i + n]) for i, n in sorted(chosen)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--out", default=str(RESULTS / "constraints"))
    args = p.parse_args()
    import sacrebleu

    import tfcli
    from tfcli.runtime import tune_process

    tune_process("cpu", args.threads)
    data = Path(args.data) / "multi30k"
    lines = (data / f"test2016.{args.src}").read_text(encoding="utf-8").splitlines()
    refs = (data / f"test2016.{args.tgt}").read_text(encoding="utf-8").splitlines()
    t = tfcli.load(args.checkpoint, device="cpu")
    opts = dict(beam_size=args.beam, batch_size=args.batch)
    free = t.translate(lines, **opts)
    rng = random.Random(args.seed)
    cons = [draw_phrases(rng, ref, out) for ref, out in zip(refs, free)]
    ways = {"unconstrained": lambda: t.translate(lines, **opts),
            "constrained": lambda: t.translate(lines, constraints=cons, **opts)}
    times = {name: [] for name in ways}
    outputs = {}
    for _ in range(args.repeats):
        for name, f in ways.items():
            start = time.perf_counter()
            outputs[name] = f()
            times[name].append(time.perf_counter() - start)
    assert outputs["unconstrained"] == free
    phrases = [(o, c) for o, cs in zip(outputs["constrained"], cons) for c in cs]
    hit = sum(holds(o, c) for o, c in phrases) / len(phrases)
    with_cons = [i for i, c in enumerate(cons) if c]
    metric = sacrebleu.BLEU()
    bleu = {name: metric.corpus_score(outputs[name], [refs]) for name in ways}
    sub = {name: sacrebleu.corpus_bleu([outputs[name][i] for i in with_cons], [[refs[i] for i in with_cons]]).score
           for name in ways}
    ratio = min(times["constrained"]) / min(times["unconstrained"])
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/constraints.py", *sys.argv[1:]]), "cpu": cpu_name(),
           "threads": args.threads, "checkpoint": args.checkpoint, "direction": f"{args.src}-{args.tgt}",
           "sentences": len(lines), "with_constraints": len(with_cons), "phrases": len(phrases),
           "phrase_words": sum(len(c.split()) for _, c in phrases) / len(phrases), "beam": args.beam,
           "batch": args.batch, "seed": args.seed, "date": time.strftime("%Y-%m-%d %H:%M"), "hit_rate": hit,
           "bleu": {name: b.score for name, b in bleu.items()},
           "bleu_signature": str(metric.get_signature()),
           "bleu_sentences_with_constraints": sub, "best_s": {name: min(v) for name, v in times.items()},
           "time_ratio": ratio, "target_time_ratio": 1.5}
    md = [f"# Terminology constraints: Multi30k test2016 {args.src}->{args.tgt}", "",
          f"CPU: {res['cpu']}, {args.threads} threads. Checkpoint `{args.checkpoint}`; beam {args.beam}, batch "
          f"{args.batch}; best of {args.repeats}; {res['date']}. Written by `benchmarks/constraints.py`. "
          f"Constraints by Post & Vilar's protocol: 1-2 reference phrases of 1-3 words a sentence that the "
          f"unconstrained output lacks (seed {args.seed}): {len(phrases)} phrases ({res['phrase_words']:.2f} words "
          f"each) on {len(with_cons)} of {len(lines)} sentences.", "",
          "| way | sacreBLEU | on the sentences with constraints | seconds |", "| --- | ---: | ---: | ---: |",
          *(f"| {name} | {bleu[name].score:.2f} | {sub[name]:.2f} | {min(times[name]):.2f} |" for name in ways), "",
          f"- hit rate (phrases found in the constrained output): {hit:.1%}",
          f"- time, constrained over unconstrained: {ratio:.2f}x (target: at most 1.5x)",
          f"- sacreBLEU signature: `{res['bleu_signature']}`", "", f"Command: `{res['command']}`.", ""]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
