"""tfcli on a machine that is not idle: `tfcli train` and `tfcli translate` alone, beside one and beside two busy
single-threaded processes, and a two-stage `tfcli translate | tfcli translate` pipeline, each a whole process, for
this checkout and an earlier commit (the "before"), side by side in one run.

    .venv/bin/python benchmarks/busy_machine.py [--before COMMIT] [--steps 30] [--lines 1000] [--repeats 1]
        [--out benchmarks/results/busy_machine]

The data is the demo corpus (data/numbers, English -> French number words): prepared once, a checkpoint trained
once (the demo's model, --train-steps), then timed: training --steps steps of recipes/demo.yaml, and translating
--lines test sentences with beam 5. A busy process is `python -c "while True: pass"`, started before the command
and stopped after it. The pipeline's second stage translates the first's output with the same model (its time is
what a user of the pipeline waits). Reported: seconds, and each time over the same command's alone; the targets:
beside one busy thread at most 1.7x, beside two at most 2.3x, alone no slower than before beyond noise. Nothing is
set in the environment: each version chooses its threads as it does for users (OMP_NUM_THREADS unset).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ROOT / "data" / "numbers"
TARGETS = {"beside 1 busy": 1.7, "beside 2 busy": 2.3}


def tfcli(tree: Path, *args: str) -> list[str]:
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tree)!r}); from tfcli.cli import main; "
            "sys.argv[0] = 'tfcli'; main()", *args]


def env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS")}


def timed(argv: list[str] | str, busy: int, shell: bool = False) -> float:
    """Seconds of one command run beside `busy` spinning processes (started first, stopped after)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0)  # (the spinners running before the command starts)
        start = time.perf_counter()
        proc = subprocess.run(argv, shell=shell, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              cwd=ROOT, executable="/bin/bash" if shell else None)
        seconds = time.perf_counter() - start
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    if proc.returncode:
        raise SystemExit(f"{argv} failed:\n{proc.stderr.decode()[-2000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="HEAD", help="the commit to compare with (default: the last commit)")
    p.add_argument("--steps", type=int, default=30, help="training steps timed")
    p.add_argument("--train-steps", type=int, default=200, help="steps of the checkpoint that translates")
    p.add_argument("--lines", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=1, help="runs of each case (the best is kept)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "busy_machine"))
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tfcli-busy-"))
    commit = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    before = work / "before"
    before.mkdir()
    archive = subprocess.run(["git", "archive", commit, "tfcli"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
    trees = {"before": before, "now": ROOT}
    n = NUMBERS
    subprocess.run(tfcli(ROOT, "prepare", "-q", "--src", str(n / "train.en"), "--tgt", str(n / "train.fr"),
                         "--valid-src", str(n / "valid.en"), "--valid-tgt", str(n / "valid.fr"), "--tokenizer", "bpe",
                         "--vocab-size", "1000", "--joint-vocab", "-o", str(work / "prep")), check=True, env=env())
    subprocess.run(tfcli(ROOT, "train", str(work / "prep"), "-o", str(work / "model"), "--config", "recipes/demo.yaml",
                         "--max-steps", str(args.train_steps), "--valid-every", str(args.train_steps), "-q"),
                   check=True, env=env(), cwd=ROOT, stdout=subprocess.DEVNULL)
    src = work / "src.en"
    lines = (n / "test.en").read_text(encoding="utf-8").splitlines()
    src.write_text("\n".join((lines * (args.lines // len(lines) + 1))[: args.lines]) + "\n", encoding="utf-8")
    ckpt = str(work / "model")

    runs = itertools.count()

    def cases(tree: Path):
        def train():
            return tfcli(tree, "train", str(work / "prep"), "-o", str(work / f"train-{next(runs)}"), "--config",
                         "recipes/demo.yaml", "--max-steps", str(args.steps), "--valid-every", str(10 * args.steps),
                         "--keep-last", "1", "--no-valid-bleu", "--set", "train.early_stop_metric=loss",
                         "--set", "train.average_last=0", "-q")

        translate = tfcli(tree, "translate", "-m", ckpt, "--beam-size", "5", str(src), "-q")
        pipe = (" ".join(map(_quote, translate)) + " | "
                + " ".join(map(_quote, tfcli(tree, "translate", "-m", ckpt, "--beam-size", "5", "-q"))))
        for busy, label in ((0, "alone"), (1, "beside 1 busy"), (2, "beside 2 busy")):
            yield "train", label, lambda b=busy: timed(train(), b)
            yield "translate", label, lambda b=busy: timed(translate, b)
        yield "translate", "pipeline of 2", lambda: timed(pipe, 0, shell=True)

    seconds: dict[str, dict[str, float]] = {"before": {}, "now": {}}
    for r in range(args.repeats):
        for version in ("before", "now") if r % 2 == 0 else ("now", "before"):
            for command, label, run in cases(trees[version]):
                s = run()
                key = f"{command} / {label}"
                seconds[version][key] = min(s, seconds[version].get(key, float("inf")))
                print(f"{version:6s} {key:32s} {s:7.1f} s", file=sys.stderr, flush=True)
    rows, met = [], {}
    for key in seconds["now"]:
        command, label = key.split(" / ")
        ratio = {v: seconds[v][key] / seconds[v][f"{command} / alone"] for v in seconds}
        target = TARGETS.get(label)
        if target is not None:
            met[key] = ratio["now"] <= target
        rows.append(f"| {command} | {label} | {seconds['before'][key]:.1f} s ({ratio['before']:.2f}x) | "
                    f"{seconds['now'][key]:.1f} s ({ratio['now']:.2f}x) | "
                    + (f"<= {target}x: {'met' if met[key] else 'NOT met'}" if target else "") + " |")
    cpu = cpu_name()
    md = "\n".join([
        f"# tfcli on a busy machine ({cpu}, {os.cpu_count()} cores)", "",
        f"`benchmarks/busy_machine.py --steps {args.steps} --lines {args.lines} --repeats {args.repeats}`, "
        f"{time.strftime('%Y-%m-%d')}: before = {commit}, now = this checkout; each figure a whole process, "
        f"the best of {args.repeats}; in brackets, over the same command alone. Train: {args.steps} steps of "
        f"recipes/demo.yaml; translate: {args.lines} lines, beam 5. A busy process: one thread spinning.", "",
        "| command | case | before | now | target |", "| --- | --- | ---: | ---: | --- |", *rows, ""])
    write_results(args.out, {"cpu": cpu, "cores": os.cpu_count(), "before": commit, "steps": args.steps,
                             "lines": args.lines, "repeats": args.repeats, "seconds": seconds, "targets_met": met}, md)


def _quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


if __name__ == "__main__":
    main()
