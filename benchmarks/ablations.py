"""Ablations on valid only: each model/optimiser option alone against the `cpu` recipe's configuration.

    .venv/bin/python benchmarks/ablations.py PREP --variants baseline,muon [--seed 1] [--runs DIR]
        [--config recipes/multi30k-cpu.yaml] [--data ../shared/data] [--pair de-en] [--steps N]

PREP: a Multi30k prepared directory (the rows so far: a joint BPE of 8,000, as recipes/multi30k.sh made it before
its CPU sizes took one BPE of 5,000 a side, `VOCAB=joint` now); the data variants (`bpeN`, `sepN`) prepare their own
from the raw text (--data). Each variant trains with
`tfcli train PREP --config CONFIG --seed N --set ...` (the recipe's wall-clock budget, so a slower option trains
fewer steps: what a user of the recipe gets), alone on the machine, one after another; then its valid scores: the
last validation's nll and greedy BLEU (300 sentences, from RUN/metrics.jsonl) and sacreBLEU of beam 5 (length
penalty 1.0) over the whole valid split (from the average of the last checkpoints where the config makes one, else
the best), from the raw text. test2016 is never read. Results accumulate in
benchmarks/results/ablations.{json,md} (one entry per variant and seed; a re-run replaces its entry), with the CPU
named.

--set KEY=VALUE (repeatable) adds a setting to every variant; --jobs N trains N variants at once, for a GPU with room
for several (a config that stops at a step or epoch count, e.g. recipes/multi30k.yaml with --set train.device=cuda:
concurrency then changes the time, not the result). Every config is its own protocol, named by the config and a
hash of its text (a changed config starts a new protocol; the `cpu` recipe's runs before QK-norm entered it are
named `budget` or `N steps` alone; a budgeted run on a CPU without native bf16, where the config asks for it,
trains in fp32, about half the steps: its protocol says `(fp32)`).

--steps N: the budget off and N steps for every variant (the cosine schedule ends at step N), so that a row's quality
does not depend on the machine's speed that day (a wall-clock budget turns the machine's drift into a step count);
each option's cost per step is then its own measurement (train_wall_s / steps, alone on the machine). Rows compare
with the baseline of the same pair, seed and protocol (budget or N steps).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from common import SHARED_DATA, cpu_name, fell_back_to_fp32, gpu_name, trained_precision, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
TFCLI = [sys.executable, "-m", "tfcli"]
DEFAULT_CONFIG = "recipes/multi30k-cpu.yaml"

# variants of the prepared data: PREP made again from the raw train and valid text as recipes/multi30k.sh makes it,
# with this BPE size in place of its 8,000, joint or one vocabulary a side (valid nll then counts other tokens:
# compare their BLEU). On de-en, the target side of the joint 8,000 uses 4,245 of its tokens: one target vocabulary
# of 5,000 makes the output layer and the loss, the largest costs of the step at this model size, 5/8 of theirs
BPE_SIZE = {"bpe4000": 4000, "bpe2000": 2000, "sep5000": 5000}
SEPARATE = {"sep5000"}
# the "Transformer-Tiny" of Wu et al. 2021 (fairseq transformer_tiny)
TINY = ["model.d_model=128", "model.d_ff=256", "model.n_head=4", "model.n_encoder_layers=4", "model.n_decoder_layers=4"]
VARIANTS = {
    "baseline": [],
    "muon": ["train.optimizer=muon"],
    "rms_norm": ["model.rms_norm=true"],
    "swiglu": ["model.activation=swiglu"],
    "relu2": ["model.activation=relu2"],
    "qk_norm": ["model.qk_norm=true"],
    "no_qk_norm": ["model.qk_norm=false"],  # (QK-norm is in the cpu recipes since 2026-11-26)
    "zero_init_residual": ["model.zero_init_residual=true"],
    # R-Drop (issue 61): alpha 1 and 5 (the paper's IWSLT de-en value), and alpha 5 with the cpu-long recipe's
    # dropout raised, since R-Drop regularises through dropout's two masks; a step costs about two plain ones
    "rdrop1": ["train.rdrop=1"],
    "rdrop5": ["train.rdrop=5"],
    "rdrop5-dropout0.3": ["train.rdrop=5", "model.dropout=0.3"],
    # for the GPU-sized recipe (recipes/multi30k.yaml); the variants of its earlier version are in
    # results/gpu_ablations.json, each with its settings and command
    "layers4": ["model.n_encoder_layers=4", "model.n_decoder_layers=4"],
    "dropout0.4": ["model.dropout=0.4"],
    "attn_dropout0.1": ["model.attn_dropout=0.1"],
    "lr0.003": ["train.lr=0.003"],
    "lr0.001": ["train.lr=0.001"],
    "tokens1500": ["train.max_tokens=1500"],  # half the batch: twice the updates in the same tokens
    # Transformer-Tiny (its Multi30k en-de 41.02 is the en-de recipes' anchor): a third of the recipe's FLOPs a
    # token, so more epochs in the budget; alone, then at its authors' learning rate (fairseq: 0.005, inverse sqrt,
    # 2,000 warmup updates of 8,000; here the recipe's cosine, its warmup longer for the higher peak)
    "tiny": TINY,
    "tiny-lr0.005": [*TINY, "train.lr=0.005", "train.warmup=300"],
    "enc4dec2": ["model.n_encoder_layers=4", "model.n_decoder_layers=2"],  # depth moved to the encoder, same cost
    **{name: [] for name in BPE_SIZE if name not in SEPARATE},  # the data, not the config
    "sep5000": ["model.share_embeddings=false"],  # two vocabularies: two embedding tables
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("prep")
    p.add_argument("--variants", default="baseline,muon")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--runs", default=str(ROOT / "runs" / "ablations"))
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--pair", default="de-en")
    p.add_argument("--out", default=str(RESULTS / "ablations"))
    p.add_argument("--steps", type=int, default=0, help="train every variant this many steps, no time budget")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for every variant (e.g. train.device=cuda)")
    p.add_argument("--jobs", type=int, default=1,
                   help="variants trained at once (a GPU with room for several; only where the config stops at a "
                        "step or epoch count, not a wall-clock budget)")
    args = p.parse_args()
    out = Path(args.out)
    entries = json.loads(out.with_suffix(".json").read_text())["entries"] if out.with_suffix(".json").exists() else []
    lock = threading.Lock()

    def one(name: str) -> None:
        entry = run_variant(name, args)
        with lock:
            entries[:] = [e for e in entries if key(e) != key(entry)] + [entry]
            print(f"{name} seed {args.seed}: valid nll {entry['valid_nll']:.3f}, beam-5 sacreBLEU "
                  f"{entry['valid_beam5_sacrebleu']:.2f}, {entry['steps']} steps", flush=True)
            write(out, entries, args)

    with ThreadPoolExecutor(args.jobs) as pool:
        for f in [pool.submit(one, name) for name in args.variants.split(",")]:
            f.result()


def run_variant(name: str, args) -> dict:
    """Train one variant, then score on valid the checkpoint the recipe would translate with."""
    src, tgt = args.pair.split("-")
    valid = Path(args.data) / "multi30k"
    protocol = f"{args.steps} steps" if args.steps else ("budget" if args.config == DEFAULT_CONFIG
                                                          else config_protocol(args.config))
    if args.config == DEFAULT_CONFIG:  # the recipe's config changes as options enter it: its text names the protocol
        protocol += f", {config_protocol(args.config)}"
    run = Path(args.runs) / (f"{args.pair}-{name}-seed{args.seed}" + (f"-{args.steps}steps" if args.steps else ""))
    fixed = ["train.max_minutes=0", f"train.max_steps={args.steps}"] if args.steps else []
    sets = [a for s in VARIANTS[name] + fixed + args.sets for a in ("--set", s)]
    prep, prepare = prepared(name, args)
    cmd = [*TFCLI, "train", prep, "-o", str(run), "--config", args.config, "--seed", str(args.seed), *sets]
    start = time.time()
    load = [round(x, 2) for x in os.getloadavg()]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.time() - start
    precision = trained_precision(run)
    if fell_back_to_fp32(run) and not args.steps:
        protocol += " (fp32)"  # a CPU without native bf16 trains half the steps in the budget: a protocol of its own
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["split"] == "valid"][-1]
    # the checkpoint the recipe translates with: the average of the last ones where the config makes one, else BEST
    model = next(iter(sorted((run / "checkpoints").glob("avg-last*"))), run)
    beam = subprocess.run(
        [*TFCLI, "eval", "--model", str(model), "--translate", str(valid / f"valid.{src}"), "-r",
         str(valid / f"valid.{tgt}"), "--beam-size", "5", "--len-penalty", "1.0", "--metrics", "bleu",
         "--score-only"], check=True, capture_output=True, text=True).stdout.strip()
    return {"variant": name, "seed": args.seed, "pair": args.pair, "protocol": protocol, "set": VARIANTS[name],
            **({"bpe_size": BPE_SIZE[name], "prepare": prepare} if prepare else {}),
            "steps": last["step"], "valid_nll": last["nll"], "valid_greedy_bleu_300": last.get("bleu"),
            "valid_beam5_sacrebleu": float(beam), "train_wall_s": round(wall, 1), "precision": precision,
            "jobs": args.jobs,
            "cpu": cpu_name(), "gpu": gpu_name(), "load_average_at_start": load,
            "date": time.strftime("%Y-%m-%d %H:%M"), "command": shlex.join(cmd)}


def prepared(name: str, args) -> tuple[str, str | None]:
    """PREP, or for a data variant its own prepared directory beside the runs (made once, then reused) and the
    command that makes it."""
    if name not in BPE_SIZE:
        return args.prep, None
    src, tgt = args.pair.split("-")
    raw = Path(args.data) / "multi30k"
    prep = str(Path(args.runs) / f"prep-{args.pair}-{name}")
    cmd = [*TFCLI, "prepare", "--src", str(raw / f"train.{src}"), "--tgt", str(raw / f"train.{tgt}"),
           "--valid-src", str(raw / f"valid.{src}"), "--valid-tgt", str(raw / f"valid.{tgt}"), "--tokenizer", "bpe",
           "--vocab-size", str(BPE_SIZE[name]), "--separate-vocab" if name in SEPARATE else "--joint-vocab", "-o", prep]
    if not (Path(prep) / "meta.json").exists():
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return prep, shlex.join(cmd)


def config_protocol(config: str) -> str:
    """Another config's runs compare only with runs of the same settings: its name and a hash of its content (the
    parsed YAML, so that a comment changes nothing)."""
    content = json.dumps(yaml.safe_load(Path(config).read_text(encoding="utf-8")), sort_keys=True)
    return f"{Path(config).stem} ({hashlib.sha256(content.encode()).hexdigest()[:8]})"


def key(e: dict) -> tuple:
    return e["variant"], e["seed"], e["pair"], e.get("protocol", "budget")


def machine(e: dict) -> str:
    jobs = f", {e['jobs']} runs at once" if e.get("jobs", 1) > 1 else ""
    return (e["gpu"] if e.get("gpu") else f"{e['cpu']}, 2 cores") + jobs


def write(out: Path, entries: list, args) -> None:
    base = {key(e)[1:]: e for e in entries if e["variant"] == "baseline"}
    md = [
        f"# Ablations: each option alone against `{args.config}` (Multi30k, valid only)", "",
        f"Each row: `tfcli train` with `{args.config}` plus the option, alone on the machine unless the row says "
        "otherwise, either on the config's "
        "wall-clock budget (protocol `budget`: a slower option, or a slower day, trains fewer steps) or for a fixed "
        "number of steps (`--steps`: quality at equal steps; s/step is then the option's cost); valid nll and greedy "
        "BLEU of the last validation (300 sentences for the CPU recipes, all for `multi30k.yaml`), and sacreBLEU of beam 5 (length penalty 1.0) on the whole "
        "valid split; `vs baseline`: against the baseline of the same pair, seed and protocol (a config other than the "
        "`cpu` recipe's, and the `cpu` recipe's since QK-norm entered it, are named with the first 8 hex digits of "
        "the sha256 of its settings (the config text's before 2026-11-28): its version in git; `budget` and `N steps` alone: `recipes/multi30k-cpu.yaml` "
        "before QK-norm, git 02a265f). Written by `benchmarks/ablations.py`; test2016 is never read.", "",
        "| pair | protocol | variant | seed | steps | s/step | valid nll | greedy BLEU | beam-5 sacreBLEU | "
        "vs baseline | machine | date |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for e in sorted(entries, key=lambda e: (e["pair"], key(e)[3], e["variant"] != "baseline", e["variant"], e["seed"])):
        b = base.get(key(e)[1:])
        delta = f"{e['valid_beam5_sacrebleu'] - b['valid_beam5_sacrebleu']:+.2f}" if b and b is not e else ""
        md.append(f"| {e['pair']} | {key(e)[3]} | {e['variant']} | {e['seed']} | {e['steps']} | "
                  f"{e['train_wall_s'] / e['steps']:.3f} | {e['valid_nll']:.3f} | {e['valid_greedy_bleu_300']:.2f} | "
                  f"{e['valid_beam5_sacrebleu']:.2f} | {delta} | {machine(e)} | {e['date']} |")
    md += ["", "Commands: " + "; ".join((f"`{e['prepare']}` then " if e.get("prepare") else "") + f"`{e['command']}`"
                                         for e in entries), ""]
    write_results(str(out), {"entries": entries}, "\n".join(md))


if __name__ == "__main__":
    main()
