"""Model-FLOPs utilisation (MFU) of `tfcli train` on a GPU, bf16 with --compile: a GPT-2-small-shaped LM and the
`base` encoder-decoder (issue 7's targets: 45% and 35% of the GPU's dense bf16 peak, 989 TFLOP/s on an H100 SXM).

    .venv/bin/python benchmarks/gpu_mfu.py [--case gpt2-small base] [--peak-flops FLOPS] [--work DIR]
    .venv/bin/python benchmarks/gpu_mfu.py --device cpu --quick      a check that the script runs (no MFU on a CPU)
    .venv/bin/python benchmarks/gpu_mfu.py --merge A.json B.json     cases measured in separate device calls

The figure is the one users see: each case runs the real CLI, `tfcli prepare` then `tfcli train`, as subprocesses,
and reads `mfu` and the token rates from the run's metrics.jsonl. The peak is the GPU's own, found from its name
(tfcli/train/flops.py: GPU_PEAKS), unless --peak-flops gives one. A case that fails is recorded with its log's
tail and the next one runs; the results are written after each case. The trainer's MFU counts model FLOPs only
(tfcli/train/flops.py: 6 FLOPs per weight per real token plus 12 * d_model per attention (query, key) pair and
layer; padding and recomputation do not count) over the time between log lines, checkpointing excluded.
The log lines of the first `skip` steps hold torch.compile's compilation and are left out; reported is the median
over the remaining lines.

The data is generated, so nothing is downloaded: random lowercase "words", drawn Zipf-like from a random lexicon.
  gpt2-small  one line per sentence (--mono-mode line), byte-level BPE with nanoGPT's 50304-token vocabulary, blocks
              of 1024 tokens, 16 blocks per micro-batch x 32 micro-batches = 524,288 tokens per step (GPT-2's
              batch), no label smoothing (as GPT-2/nanoGPT)
  base        sentence pairs, lengths about as WMT's (mean ~28 words), the target a word-by-word mapping of the
              source; a joint BPE vocabulary of 37000 (the 2017 paper's size), --max-tokens 32768 per side (the
              paper's ~25k source + 25k target tokens per step, on one GPU), label smoothing 0.1
  base-dynamic  `base` with --compile-shapes dynamic (graphs shared by the shape buckets); only when named by --case
Steps and batch sizes are in CASES below. The last steps of each case run under `tfcli train --profile`; the op
table goes beside the results (gpu_mfu_profile_CASE.txt), and the log lines of those steps are left out of the MFU.
Peak GPU memory is the trainer's `max_mem_gib` (torch's peak allocated memory on the device) at the last log line.
The scratch directory (data, runs with train.log) is kept and its path printed.
Results: benchmarks/results/gpu_mfu.{json,md}; a --quick run writes them into the scratch directory instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import cpu_name, write_results
from tfcli.train import gpu_peak_flops

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"

# kind lm: `words` words of text; kind seq2seq: `pairs` sentence pairs. `lexicon`: distinct words (per side), enough
# for the tokenizer to reach `vocab`. `skip`: leading steps whose log lines are left out (compilation).
CASES = {
    "gpt2-small": dict(kind="lm", arch="gpt2-small", target=0.45, words=3_000_000, lexicon=150_000, vocab=50304,
                       tokenizer="bytelevel", max_len=1024, max_tokens=16384, grad_accum=32, steps=50, log_every=5,
                       skip=10, profile=(50, 50), train_args=["--label-smoothing", "0"]),
    "base": dict(kind="seq2seq", arch="base", target=0.35, pairs=100_000, lexicon=75_000, vocab=37000,
                 tokenizer="bpe", max_len=256, max_tokens=32768, grad_accum=1, steps=400, log_every=20, skip=100,
                 profile=(396, 400), train_args=[]),
}
# `base` with dynamic-shape graphs shared by the shape buckets, in place of one static graph per bucket
CASES["base-dynamic"] = {**CASES["base"], "train_args": ["--compile-shapes", "dynamic"]}
# --quick: tiny presets and data, a few steps; only shows that every stage runs
QUICK = {
    "gpt2-small": dict(arch="lm-toy", words=20_000, lexicon=2000, vocab=300, max_len=64, max_tokens=256,
                       grad_accum=2, steps=6, log_every=2, skip=2, profile=(6, 6)),
    "base": dict(arch="toy", pairs=800, lexicon=2000, vocab=300, max_len=64, max_tokens=256, steps=6, log_every=2,
                 skip=2, profile=(6, 6)),
}
QUICK["base-dynamic"] = QUICK["base"]


# --- data ----------------------------------------------------------------------------------------------------------

def lexicon(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random lowercase words of 2-12 letters."""
    letters = rng.integers(ord("a"), ord("z") + 1, size=(n, 12), dtype=np.uint8)
    lengths = rng.integers(2, 13, n)
    return np.array([row[:k].tobytes().decode() for row, k in zip(letters, lengths)], dtype=object)


def zipf_ids(rng: np.random.Generator, n_types: int, size: int) -> np.ndarray:
    """Word ids with Zipf-Mandelbrot frequencies (p ~ 1 / (rank + 2.7)), as in natural text."""
    p = 1.0 / (np.arange(n_types) + 2.7)
    return rng.choice(n_types, size, p=p / p.sum())


def sentence_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    """Words per sentence: a gamma with mean ~28 and a long tail, 3 to 120 (about WMT's shape)."""
    return np.clip(rng.gamma(2.5, 10.0, n).astype(int) + 3, 3, 120)


def write_sentences(path: Path, words: np.ndarray, lengths: np.ndarray) -> None:
    ends = np.cumsum(lengths)
    path.write_text("".join(" ".join(words[e - k : e]) + "\n" for e, k in zip(ends, lengths)), encoding="utf-8")


def make_corpus(c: dict, work: Path, seed: int) -> list[str]:
    """Write the case's text into `work`; return the `tfcli prepare` arguments that read it."""
    rng = np.random.default_rng(seed)
    if c["kind"] == "lm":
        lengths = sentence_lengths(rng, c["words"] // 28)
        ids = zipf_ids(rng, c["lexicon"], int(lengths.sum()))
        write_sentences(work / "lm.txt", lexicon(rng, c["lexicon"])[ids], lengths)
        return ["--train", "lm.txt", "--mono-mode", "line"]
    lengths = sentence_lengths(rng, c["pairs"])
    ids = zipf_ids(rng, c["lexicon"], int(lengths.sum()))
    src_words, tgt_words = lexicon(rng, c["lexicon"]), lexicon(rng, c["lexicon"])
    write_sentences(work / "train.src", src_words[ids], lengths)
    write_sentences(work / "train.tgt", tgt_words[ids], lengths)
    return ["--src", "train.src", "--tgt", "train.tgt", "--joint-vocab"]


# --- running the CLI -----------------------------------------------------------------------------------------------

class CaseFailed(Exception):
    """A tfcli command of a case failed; the message holds its log's tail."""


def tfcli(args: list[str], work: Path, log: Path, threads: int) -> float:
    """Run `tfcli ARGS` in `work`, stdout and stderr into `log`; CaseFailed with the log's tail if it fails. Seconds
    taken."""
    # torch.compile's recompilations and their reasons go into the log (a slow first epoch: new shapes, or not?)
    env = {**os.environ, "TORCH_LOGS": os.environ.get("TORCH_LOGS", "recompiles")}
    if threads:  # the tokenizers' Rust thread pool too, not only torch
        env.update(RAYON_NUM_THREADS=str(threads), RAYON_RS_NUM_CPUS=str(threads))
    print(f"[{work}] tfcli {shlex.join(args)}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "tfcli", *args], cwd=work, stdout=f, stderr=subprocess.STDOUT,
                            env=env).returncode
    if rc:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise CaseFailed(f"{tail}\ntfcli {args[0]} failed (exit {rc}); full log: {log}")
    return time.perf_counter() - t0


def run_case(name: str, c: dict, args, work: Path, out: Path) -> dict:
    corpus = make_corpus(c, work, args.seed)
    prep, run_dir = f"prep-{name}", f"run-{name}"
    for d in (prep, run_dir):  # a reused --work directory: this case starts over
        shutil.rmtree(work / d, ignore_errors=True)
    prepare = ["prepare", *corpus, "--tokenizer", c["tokenizer"], "--vocab-size", str(c["vocab"]), "-o", prep]
    prepare_s = tfcli(prepare, work, work / f"prepare-{name}.log", args.threads)
    train = ["train", prep, "-o", run_dir, "--arch", c["arch"], "--device", args.device,
             "--dtype", "fp32" if args.quick else "bf16", "--no-compile" if args.quick else "--compile",
             "--max-steps", str(c["steps"]), "--max-epochs", "0", "--max-len", str(c["max_len"]),
             "--max-tokens", str(c["max_tokens"]), "--grad-accum", str(c["grad_accum"]),
             "--log-every", str(c["log_every"]), "--seed", str(args.seed), "--profile", "{}-{}".format(*c["profile"]),
             *c["train_args"]]
    if args.peak_flops:
        train += ["--set", f"train.peak_flops={args.peak_flops:g}"]
    if args.threads:
        train += ["--threads", str(args.threads)]
    (work / run_dir).mkdir()  # train.log lives in the run directory
    train_s = tfcli(train, work, work / run_dir / "train.log", args.threads)

    lines = [json.loads(ln) for ln in (work / run_dir / "metrics.jsonl").read_text().splitlines()]
    # a log line's interval is the log_every steps up to it; those holding profiled steps (slower) are left out
    first, last = c["profile"]
    kept = [r for r in lines if r["split"] == "train" and r["step"] > c["skip"]
            and not (r["step"] - c["log_every"] < last and r["step"] >= first)]
    if not kept:
        raise CaseFailed(f"{name}: no train log lines after step {c['skip']} in {work / run_dir / 'metrics.jsonl'}")
    mfu = [r["mfu"] for r in kept if "mfu" in r]  # the trainer logs MFU on a GPU only
    log_text = (work / run_dir / "train.log").read_text()
    params = re.search(r"([\d.]+)M parameters", log_text)
    vocab = json.loads((work / prep / "meta.json").read_text())["vocab"]
    ops = work / run_dir / "profile" / "ops.txt"
    profile = out.parent / f"{out.name}_profile_{name}.txt"  # the op table beside the results
    if ops.exists():
        shutil.copyfile(ops, profile)
    return {
        "profile": {"steps": list(c["profile"]), "ops": profile.name if ops.exists() else None},
        "recompiles": log_text.count("Recompiling function"),  # TORCH_LOGS=recompiles; reasons in train.log
        "kind": c["kind"], "arch": c["arch"],
        "parameters_M": float(params.group(1)) if params else None,
        "vocab": vocab, "tokenizer": c["tokenizer"],
        "max_len": c["max_len"], "max_tokens": c["max_tokens"], "grad_accum": c["grad_accum"],
        "padded_tokens_per_step": c["max_tokens"] * c["grad_accum"],
        "steps": c["steps"], "log_every": c["log_every"], "skipped_steps": c["skip"],
        "commands": {"prepare": "tfcli " + shlex.join(prepare), "train": "tfcli " + shlex.join(train)},
        "log_steps": [r["step"] for r in kept],
        "mfu": mfu,
        "median_mfu": statistics.median(mfu) if mfu else None,
        "target_mfu": None if args.quick else c["target"],
        "median_tgt_tokens_per_s": statistics.median(r["tgt_tokens_per_s"] for r in kept),
        "median_src_tokens_per_s": statistics.median(r["src_tokens_per_s"] for r in kept),
        "median_padding_fraction": statistics.median(r["padding_fraction"] for r in kept),
        "max_mem_gib": kept[-1].get("max_mem_gib"),  # the trainer logs it on a GPU only
        "prepare_s": round(prepare_s, 1), "train_wall_s": round(train_s, 1),
    }


# --- results -------------------------------------------------------------------------------------------------------

def machine(device: str) -> dict:
    """Asked after the runs: querying the GPU here earlier would hold a CUDA context beside the training process."""
    import torch

    git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = git("rev-parse", "--short", "HEAD") + ("+dirty" if git("status", "--porcelain") else "")
    return {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "cpu": cpu_name(), "tfcli_commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def _profile_line(r: dict) -> str:
    p = r.get("profile")
    if not p:
        return "not profiled"
    where = f"`{p['ops']}` (torch.profiler's op table)" if p["ops"] else "no table written"
    return f"steps {p['steps'][0]}-{p['steps'][1]} under `--profile` (left out of the MFU): {where}"


def verdict(r: dict) -> str:
    if r["median_mfu"] is None:
        return "n/a (no MFU: the trainer logs it on a GPU only)"
    if r["target_mfu"] is None:
        return "n/a (quick check, not a measurement)"
    return "met" if r["median_mfu"] >= r["target_mfu"] else "NOT met"


def markdown(res: dict) -> str:
    m = res["machine"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    tflops = lambda r: "n/a" if r["median_mfu"] is None or not res["peak_flops"] else f"{r['median_mfu'] * res['peak_flops'] / 1e12:.0f}"  # noqa: E731
    done = {name: r for name, r in res["cases"].items() if "error" not in r}
    rows = "\n".join(
        f"| {name} | {r['arch']} ({r['kind']}) | {r['parameters_M']}M | {r['padded_tokens_per_step']:,} | "
        f"**{pct(r['median_mfu'])}** | {pct(r['target_mfu'])} | {verdict(r)} | {tflops(r)} | "
        f"{r['median_tgt_tokens_per_s']:,.0f} | {r['median_src_tokens_per_s']:,.0f} | "
        f"{pct(r['median_padding_fraction'])} | "
        + ("n/a" if r["max_mem_gib"] is None else f"{r['max_mem_gib']:.1f} GiB") + " |"
        for name, r in done.items()
    )
    failed = "".join(f"\n### {name}: FAILED\n\n```\n{r['error']}\n```\n" for name, r in res["cases"].items()
                     if "error" in r)
    details = "\n".join(
        f"""
### {name}{f" (measured {r['date']})" if r.get('date') else ''}

- vocabulary: {', '.join(f'{side} {n}' for side, n in r['vocab'].items())} ({r['tokenizer']})
- {r['steps']} steps of --max-tokens {r['max_tokens']} x --grad-accum {r['grad_accum']}, --max-len {r['max_len']}
- MFU per log line, steps {r['log_steps'][0]}-{r['log_steps'][-1]} (every {r['log_every']}; the first \
{r['skipped_steps']} steps left out): {', '.join(pct(x) for x in r['mfu']) or 'n/a'}
- wall time: prepare {r['prepare_s']} s, training {r['train_wall_s']} s (compilation and the final checkpoint included)
- {_profile_line(r)}; torch.compile recompilations: {r.get('recompiles', 'not counted')}

```
{r['commands']['prepare']}
{r['commands']['train']}
```
"""
        for name, r in done.items()
    )
    peak = (f"{res['peak_flops'] / 1e12:.0f} TFLOP/s ({res['peak_source']})" if res["peak_flops"]
            else "the GPU (none here: no MFU)")
    quick = ("\n**A --quick run: tiny presets on the CPU, a check that the script works, not a measurement.**\n"
             if res["quick"] else "")
    return f"""# Model-FLOPs utilisation of `tfcli train` ({res['precision']}{', --compile' if res['compile'] else ''})
{quick}
Command: `{res['command']}`

Machine: {m['device']}; torch {m['torch']} (CUDA {m['cuda']}), Python {m['python']}, CPU {m['cpu']};
tfcli {m['tfcli_commit']}; {m['date']}.

MFU is the trainer's own figure (metrics.jsonl `mfu`): model FLOPs (tfcli/train/flops.py: 6 per weight and real
token, plus 12 x d_model per attention (query, key) pair and layer; no padding, no recomputation) per second, over
the dense peak of {peak}; the median over the log lines after the first steps
(compilation). tgt tok/s counts non-padding target tokens (for the LM: every token of its blocks),
src tok/s non-padding source tokens. The data is generated (random words; see the script's docstring).
Peak GPU memory: torch's peak allocated memory (metrics.jsonl `max_mem_gib`) at the last log line.

| case | model | params | padded tok/step (per side) | median MFU | target | met? | model TFLOP/s | tgt tok/s | src tok/s | pad | peak GPU memory |
| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |
{rows}
{details}{failed}
Written by `benchmarks/gpu_mfu.py`.
"""


def merge(files: list[Path], out: Path) -> None:
    runs = [json.loads(f.read_text()) for f in files]
    devices = {r["machine"]["device"] for r in runs} | {r["quick"] for r in runs}
    if len(devices) != 2:
        sys.exit(f"gpu_mfu --merge: the files were not all measured on one device, all --quick or none: {devices}")
    result = {**runs[-1], "cases": {}, "command": " and ".join(dict.fromkeys(r["command"] for r in runs))}
    for r in runs:
        for name, case in r["cases"].items():
            result["cases"][name] = {"date": r["machine"]["date"], **case}
    result["cases"] = {k: result["cases"][k] for k in CASES if k in result["cases"]}
    write_results(out, result, markdown(result))
    print(f"merged {len(files)} files into {out}.json/.md", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny presets and data, a few steps, no compile, fp32")
    ap.add_argument("--case", nargs="+", choices=list(CASES), default=["gpt2-small", "base"])
    ap.add_argument("--peak-flops", type=float, default=0.0,
                    help="the GPU's dense peak FLOP/s (default: from its name, tfcli/train/flops.py)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads for torch and the tokenizers (0: default)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default=None, help="scratch directory for data and runs (default: a new temp dir)")
    ap.add_argument("--out", default=None, help="results path without suffix (default: benchmarks/results/gpu_mfu; "
                    "with --quick: WORK/gpu_mfu)")
    ap.add_argument("--merge", nargs="+", metavar="JSON", default=None,
                    help="no runs: combine the cases of earlier results files (measured on the same GPU, each in "
                    "its own device call) into --out; a case in a later file replaces one in an earlier")
    args = ap.parse_args()
    if args.merge:
        merge([Path(f) for f in args.merge], Path(args.out or RESULTS / "gpu_mfu"))
        return
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_mfu: no CUDA device (torch.cuda.is_available() is False); this benchmark needs a GPU "
                 "(--device cpu --quick checks that the script runs)")
    if args.quick and args.out and Path(args.out).resolve().is_relative_to(RESULTS):
        sys.exit("gpu_mfu: a --quick run does not write into benchmarks/results/; give another --out")
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_mfu-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or (work / "gpu_mfu" if args.quick else RESULTS / "gpu_mfu"))

    result = {
        "command": ("python benchmarks/gpu_mfu.py " + shlex.join(sys.argv[1:])).strip(),
        "quick": args.quick, "precision": "fp32" if args.quick else "bf16", "compile": not args.quick,
        "work_dir": str(work), "cases": {},
    }
    # cases not run now are kept from the last results, where those were measured on the same device
    last = json.loads(out.with_suffix(".json").read_text()) if out.with_suffix(".json").exists() else {}
    kept = {k: v for k, v in last.get("cases", {}).items() if k not in args.case and last.get("quick") == args.quick}
    for name in args.case:
        c = {**CASES[name], **(QUICK[name] if args.quick else {})}
        try:
            result["cases"][name] = run_case(name, c, args, work, out)
            result["cases"][name]["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
            print(f"{name}: {verdict(result['cases'][name])}, median MFU {result['cases'][name]['median_mfu']}",
                  file=sys.stderr)
        except CaseFailed as e:
            result["cases"][name] = {"error": str(e)}
            print(f"{name}: FAILED\n{e}", file=sys.stderr)
        # written after each case, so that a later failure (or the device's time limit) loses nothing
        result["machine"] = machine(args.device)
        if kept and last.get("machine", {}).get("device") == result["machine"]["device"]:
            result["cases"] = {k: result["cases"].get(k) or kept[k] for k in CASES if k in result["cases"] or k in kept}
        found = gpu_peak_flops(result["machine"]["device"], result["precision"]) if args.device == "cuda" else None
        result["peak_flops"] = args.peak_flops or found
        result["peak_source"] = "--peak-flops" if args.peak_flops else "tfcli/train/flops.py, from the GPU's name"
        write_results(out, result, markdown(result))
    print(f"data and runs kept in {work}; results in {out}.json/.md", file=sys.stderr)
    if any("error" in r for r in result["cases"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
