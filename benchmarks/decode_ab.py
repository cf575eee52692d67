"""Every decoding mode of the public API against the same modes at an earlier commit: the outputs byte for byte,
and the time of each, in alternating processes (CPU).

    .venv/bin/python benchmarks/decode_ab.py --before COMMIT -t RUN_A [-t RUN_B] [--lm LM_RUN] [--src FILE]
        [--lines 200] [--rounds 3] [--threads 2] [--out OUT]

COMMIT's `tfcli/` is read from git into a temporary folder; each round runs one process of each version (before,
now, alternating which goes first), each loading the checkpoints through `tfcli.load` and decoding the first
--lines lines of --src (default: data/numbers/test.en) at batch sizes 1, 7 and 64: beam 5 (n-best 3 with scores),
greedy, keyed sampling, target prefixes, phrases to avoid (beam, greedy, sampling) and to hold (beam), int8, the
ensemble of every -t checkpoint, and with --lm, sampled (top-p, top-k) and greedy continuations of prompts (the first
words of the same lines). The outputs of the two versions must be identical (the run fails naming the first case
that differs); reported: the best time of each case, before and now.
Results: OUT.json and OUT.md, with the CPU named (by default in the temporary folder: a before/after comparison
belongs in the commit message, not in benchmarks/results).
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

ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 7, 64)


def cases(args) -> list[tuple[str, str, str, dict]]:
    """(name, model, method, options) for every case: model is 'a' (the first -t), 'ens' (all of them) or 'lm'."""
    out = []
    for b in BATCHES:
        out += [
            (f"beam5 nbest3 b{b}", "a", "translate_nbest", dict(n=3, beam_size=5, scores=True, batch_size=b)),
            (f"greedy b{b}", "a", "translate", dict(beam_size=1, batch_size=b)),
            (f"sampling b{b}", "a", "translate", dict(sampling=True, topk=10, seed=3, batch_size=b)),  # (old name)
            (f"prefix beam5 b{b}", "a", "translate", dict(beam_size=5, batch_size=b, prefixes=True)),
            (f"prefix greedy b{b}", "a", "translate", dict(beam_size=1, batch_size=b, prefixes=True)),
            (f"avoid beam5 b{b}", "a", "translate", dict(beam_size=5, batch_size=b, avoid=True)),
            (f"avoid greedy b{b}", "a", "translate", dict(beam_size=1, batch_size=b, avoid=True)),
            (f"avoid sampling b{b}", "a", "translate", dict(sampling=True, topk=10, seed=3, batch_size=b, avoid=True)),
            (f"constraints beam5 b{b}", "a", "translate", dict(beam_size=5, batch_size=b, constraints=True)),
            (f"int8 beam5 b{b}", "int8", "translate", dict(beam_size=5, batch_size=b)),
            (f"int8 greedy b{b}", "int8", "translate", dict(beam_size=1, batch_size=b)),
        ]
        if len(args.translation) > 1:
            out += [(f"ensemble beam5 b{b}", "ens", "translate", dict(beam_size=5, batch_size=b)),
                    (f"ensemble greedy b{b}", "ens", "translate", dict(beam_size=1, batch_size=b))]
        if args.lm:
            out += [(f"lm sample b{b}", "lm", "generate", dict(max_new_tokens=24, seed=5, top_p=0.9, batch_size=b)),
                    (f"lm top-k b{b}", "lm", "generate", dict(max_new_tokens=24, seed=7, top_k=40, batch_size=b)),
                    (f"lm greedy b{b}", "lm", "generate", dict(max_new_tokens=24, greedy=True, batch_size=b)),
                    (f"lm repetition stop b{b}", "lm", "generate",
                     dict(max_new_tokens=24, seed=2, repetition_penalty=1.3, stop=["."], batch_size=b))]
    return out


def child(args) -> None:
    """Run every case with the tfcli found first on sys.path; print {case: [seconds, outputs]} as JSON."""
    import torch

    import tfcli

    torch.set_num_threads(args.threads)
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()[: args.lines]
    prefixes = [" ".join(line.split()[:1]) if i % 3 == 0 else "" for i, line in enumerate(lines)]
    prompts = [" ".join(line.split()[: 1 + i % 3]) for i, line in enumerate(lines)]
    models = {"a": tfcli.load(args.translation[0]), "int8": tfcli.load(args.translation[0], dtype="int8")}
    if len(args.translation) > 1:
        models["ens"] = tfcli.load(args.translation)
    if args.lm:
        models["lm"] = tfcli.load(args.lm)
    # phrases from the model's own greedy outputs (the same in both versions): to avoid, a word of the line's own
    # output (every third line); to hold, a word of the next line's (every fourth line)
    greedy = [t.split() for t in models["a"].translate(lines, beam_size=1)]
    avoid = [[g[len(g) // 2]] if g and i % 3 == 1 else [] for i, g in enumerate(greedy)]
    nxt = greedy[1:] + greedy[:1]
    constraints = [[n[-1]] if n and i % 4 == 2 else [] for i, n in enumerate(nxt)]
    result = {}
    for name, model, method, options in cases(args):
        options = dict(options)
        if options.pop("prefixes", False):
            options["prefixes"] = prefixes
        if options.pop("avoid", False):
            options["avoid"] = avoid
        if options.pop("constraints", False):
            options["constraints"] = constraints
        texts = prompts if method == "generate" else lines
        start = time.perf_counter()
        out = getattr(models[model], method)(texts, **options)
        seconds = time.perf_counter() - start
        if method == "translate_nbest":
            out = [[(h.text, h.score, h.token_scores) for h in hyps] for hyps in out]
        result[name] = [seconds, out]
    json.dump(result, sys.stdout)


def run(version: str, tree: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    argv = [sys.executable, __file__, "--child", "--src", args.src, "--lines", str(args.lines),
            "--threads", str(args.threads)] + [a for t in args.translation for a in ("-t", t)]
    if args.lm:
        argv += ["--lm", args.lm]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(f"{version} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", help="the commit to compare with")
    p.add_argument("-t", "--translation", action="append", required=True, help="a translation run or checkpoint")
    p.add_argument("--lm", help="a language-model run or checkpoint")
    p.add_argument("--src", default=str(ROOT / "data" / "numbers" / "test.en"))
    p.add_argument("--lines", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "decode_ab"),
                   help="OUT.json and OUT.md (a comparison: for the commit message, not benchmarks/results)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.translation = [str(Path(t).resolve()) for t in args.translation]
    args.lm = str(Path(args.lm).resolve()) if args.lm else None
    args.src = str(Path(args.src).resolve())
    if args.child:
        return child(args)
    if not args.before:
        p.error("--before COMMIT is needed")
    sys.path.insert(0, str(ROOT))
    from common import cpu_name, write_results

    commit = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    before_tree = Path(tempfile.mkdtemp(prefix="tfcli-before-"))
    archive = subprocess.run(["git", "archive", commit, "tfcli"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before_tree)], input=archive, check=True)
    trees = {"before": before_tree, "now": ROOT}
    best: dict[str, dict[str, float]] = {"before": {}, "now": {}}
    outputs: dict[str, dict] = {}
    for r in range(args.rounds):
        for version in (("before", "now") if r % 2 == 0 else ("now", "before")):
            got = run(version, trees[version], args)
            for name, (seconds, out) in got.items():
                best[version][name] = min(seconds, best[version].get(name, float("inf")))
                outputs.setdefault(version, {})[name] = out
        for name in outputs["now"]:
            if outputs["now"][name] != outputs["before"][name]:
                raise SystemExit(f"outputs differ: {name}")
        print(f"round {r + 1}: outputs identical in {len(outputs['now'])} cases", file=sys.stderr)
    names = list(best["now"])
    total = {v: sum(best[v].values()) for v in best}
    rows = [f"| {n} | {best['before'][n]:.3f} | {best['now'][n]:.3f} | {best['before'][n] / best['now'][n]:.2f}x |"
            for n in names]
    cpu = cpu_name()
    md = "\n".join([
        f"# Decoding now against {commit}: identical outputs, time ({cpu}, {args.threads} threads)", "",
        f"`benchmarks/decode_ab.py --before {commit}`: {len(names)} cases, {args.lines} lines each, best of "
        f"{args.rounds} alternating processes. Outputs: byte for byte the same in every case.", "",
        "| case | before s | now s | speed now/before |", "| --- | ---: | ---: | ---: |", *rows,
        f"| all | {total['before']:.2f} | {total['now']:.2f} | {total['before'] / total['now']:.3f}x |", ""])
    write_results(args.out, {"cpu": cpu, "before": commit, "threads": args.threads, "lines": args.lines,
                             "rounds": args.rounds, "identical": True, "seconds": best}, md)


if __name__ == "__main__":
    main()
