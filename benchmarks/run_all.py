"""Run every peer benchmark in turn, then summarise their JSON results in one table (`make bench`).

    .venv/bin/python benchmarks/run_all.py [--quick] [--threads N] [--only a,b] [--summary-only] [--results DIR]
                                           [--checkpoint MULTI30K_DE_EN_CHECKPOINT] [--peer-checkpoint POST_NORM_CKPT]

Each script runs as its own subprocess (a fresh interpreter each, so no benchmark's threads, caches or memory
affect the next), in this order: translate_speed (with --checkpoint / --peer-checkpoint, also its real Multi30k
parts), int8_speed (with --checkpoint and Multi30k: tfcli int8 beside its fp32 and CTranslate2 int8),
train_throughput on synthetic batches, train_throughput_multi30k (the same script on real Multi30k batches,
when ../shared/data has Multi30k), lm_generate_speed, prepare_multi30k. A failing script is reported and the others
still run; the exit status is 1 if any failed. Then benchmarks/results/peers.md gets one Markdown table built from
the results JSON files (throughput and ratios against Hugging Face and CTranslate2, and each file's key figures),
linking to the detailed .md files. Nothing in it is typed in by hand: a figure missing from the JSON files is shown
as missing.

--quick is a check that everything runs, not a measurement: scripts that have --quick get it; the others get small
settings of their own flags (QUICK_ARGS below); every result, peers.md included, goes to a temporary directory, so
the committed results are never overwritten by a quick run. A script that can be pointed nowhere else (no --out)
is skipped there, saying why. --summary-only rebuilds peers.md from the JSON files already in --results.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import portable

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"

SCRIPTS = ["translate_speed", "int8_speed", "train_throughput", "train_throughput_multi30k", "lm_generate_speed",
           "prepare_multi30k"]
# a job that runs another job's script with other data: name -> script
SCRIPT_OF = {"train_throughput_multi30k": "train_throughput"}
DATA = ROOT.parent / "shared" / "data"
# For --quick, scripts without a --quick flag of their own run with these (tiny, a check that they work).
QUICK_ARGS = {
    "translate_speed": ["--sentences", "8", "--src-len", "8", "--out-len", "4", "--batch-sizes", "4",
                        "--repeats", "1", "--vocab", "500"],
    "train_throughput": ["--rounds", "1", "--steps", "1", "--warmup", "1", "--max-tokens", "512", "--vocab", "500"],
}


def has_flag(script: Path, flag: str) -> bool:
    """Whether the script declares `flag` (read from its source: asking --help would import torch each time)."""
    return re.search(rf"""add_argument\(\s*["']{flag}["']""", script.read_text(encoding="utf-8")) is not None


def command(name: str, args, results: Path) -> tuple[list[str] | None, str]:
    """The command line for one benchmark, or None and the reason it is skipped."""
    base = SCRIPT_OF.get(name, name)
    script = BENCH / f"{base}.py"
    if not script.exists():
        return None, f"{script.relative_to(ROOT)} not found"
    cmd = [sys.executable, str(script)]
    if name == "train_throughput_multi30k":
        prep = multi30k_prepared()
        if prep is None:
            return None, f"needs Multi30k in {DATA / 'multi30k'}"
        cmd += ["--data", str(prep)]
    if name == "translate_speed" and args.checkpoint:
        cmd += ["--checkpoint", args.checkpoint]
    if name == "translate_speed" and args.peer_checkpoint:
        cmd += ["--peer-checkpoint", args.peer_checkpoint]
    if name == "int8_speed":
        if not args.checkpoint:
            return None, "needs --checkpoint (a trained Multi30k de-en model)"
        if not (DATA / "multi30k" / "test2016.de").exists():
            return None, f"needs Multi30k in {DATA / 'multi30k'}"
        cmd.append(args.checkpoint)
    if args.quick:
        if has_flag(script, "--quick"):
            cmd.append("--quick")
        elif base in QUICK_ARGS:
            cmd += QUICK_ARGS[base]
        else:
            return None, "has no --quick (nor small settings here) and a quick run is only a check"
    if args.threads and has_flag(script, "--threads"):
        cmd += ["--threads", str(args.threads)]
    if has_flag(script, "--out"):
        cmd += ["--out", str(results / name)]
    elif results.resolve() != RESULTS.resolve():
        return None, f"has no --out: it can only write to {RESULTS.relative_to(ROOT)}, not to {results}"
    return cmd, ""


def multi30k_prepared() -> Path | None:
    """Multi30k de-en prepared as the recipes do (joint BPE 8000), for real training batches; None without the data."""
    d = DATA / "multi30k"
    if not (d / "train.de").exists():
        return None
    out = Path(tempfile.gettempdir()) / "tfcli-bench-prep-multi30k-de-en"  # derived from the corpus: never in the repo
    cmd = [sys.executable, "-m", "tfcli", "prepare", "--src", str(d / "train.de"), "--tgt", str(d / "train.en"),
           "--tokenizer", "bpe", "--vocab-size", "8000", "--joint-vocab", "-o", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return out


def run_benchmarks(args, results: Path) -> dict[str, str]:
    """Run the selected scripts in turn; returns name -> "ok" / "failed (...)" / "skipped: ...". """
    status = {}
    for name in args.only:
        cmd, why = command(name, args, results)
        if cmd is None:
            print(f"== {name}: skipped: {why}", file=sys.stderr, flush=True)
            status[name] = f"skipped: {why}"
            continue
        shown = shlex.join([".venv/bin/python", *[str(Path(c).relative_to(ROOT)) if c.startswith(str(ROOT)) else c
                                                   for c in cmd[1:]]])
        print(f"== {name}: {shown}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        dt = time.perf_counter() - t
        status[name] = "ok" if rc == 0 else f"failed (exit status {rc})"
        print(f"== {name}: {status[name]} after {dt:.0f} s", file=sys.stderr, flush=True)
    return status


# --- the summary -----------------------------------------------------------------------------------------------


def _x(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "–"


def _n(v, unit="") -> str:
    if not isinstance(v, (int, float)):
        return "–"
    return (f"{v:,.0f}" if v >= 100 else f"{v:.1f}") + unit


def _side_by_side(what: str, batch_size: int, e: dict, lengths: str = "") -> list[str]:
    """One translate_speed comparison (tfcli, HF, CT2 on the same batches) as a summary row."""
    decoding = "greedy" if e["beam"] == 1 else f"beam {e['beam']}"
    return [what, f"batch {batch_size}, {decoding}{lengths}, sent/s",
            _n(e["tfcli"]["sent_per_s"]), _n(e["hf"]["sent_per_s"]), _n(e["ct2"]["sent_per_s"]),
            _x(e.get("tfcli_over_hf")), _x(e.get("tfcli_over_ct2"))]


def translate_rows(r: dict) -> list[list[str]]:
    keys = (f"beam{r['beam']}", "beam1")
    rows = [_side_by_side("translation (synthetic `small`, same weights)", run["batch_size"], run[key])
            for run in r["synthetic"]["runs"] for key in keys]
    peers = r.get("real_peers", {})
    rows += [_side_by_side("translation (Multi30k test2016, trained post-norm model, same weights)",
                           peers["batch_size"], peers[key], ", natural lengths") for key in keys if key in peers]
    real = r.get("real", {})
    for key, e in real.items():
        if key.startswith("tfcli_translate_beam"):
            bleu = f", BLEU {e['bleu']:.1f}" if "bleu" in e else ""
            measure = f"{key.removeprefix('tfcli_translate_')}, sent/s{bleu}"
            rows.append(["translation (Multi30k test2016, trained checkpoint)", measure, _n(e["sent_per_s"]),
                         "–", "–", "–", "–"])
    return rows


def int8_rows(r: dict) -> list[list[str]]:
    """int8_speed: tfcli int8 beside CTranslate2 int8 on the same weights, and beside tfcli fp32."""
    speed, bleu = r["sent_per_s"], r["bleu"]
    what = "int8 translation (Multi30k test2016, trained model, same weights)"
    return [
        [what, f"batch {r['batch']}, beam {r['beam']}, sent/s (BLEU {bleu['tfcli int8']:.1f} / "
               f"{bleu['CT2 int8']:.1f})", _n(speed["tfcli int8"]), "–", _n(speed["CT2 int8"]), "–",
         _x(r["ratios"]["tfcli int8 / CT2 int8"])],
        [what, "tfcli int8 / tfcli fp32 (CT2 int8 / CT2 fp32)", _x(r["ratios"]["tfcli int8 / tfcli fp32"]), "–",
         _x(r["ratios"]["CT2 int8 / CT2 fp32"]), "–", "–"],
    ]


def train_rows(r: dict) -> list[list[str]]:
    med = r["median_tgt_tokens_per_s"]
    hf = next((v for k, v in med.items() if k != "tfcli"), None)
    batches = "Multi30k batches" if r.get("setup", {}).get("batches", "synthetic") != "synthetic" else "synthetic batches"
    return [[f"training (`small` vs HF MarianMT, the same {batches})", "median target tok/s",
             _n(med.get("tfcli")), _n(hf), "–", _x(r.get("ratio_of_medians")), "–"]]


def lm_rows(r: dict) -> list[list[str]]:
    b = r["bench"]
    rows = []
    for run in b["runs"]:
        for key in ("greedy", "sample"):
            e = run[key]
            rows.append([
                f"LM generation (random `{b.get('preset', '?')}`, vocab {b.get('vocab', '?')}, same weights)",
                f"batch {run['batch_size']}, {e['decoding']}, new tok/s", _n(e["tfcli"]["new_tok_per_s"]),
                _n(e["hf"]["new_tok_per_s"]), _n(e["ct2"]["new_tok_per_s"]), _x(e.get("tfcli_over_hf")),
                _x(e.get("tfcli_over_ct2")),
            ])
    m = b.get("memory")
    if m:
        d = {s: m[s]["delta_mib"] for s in ("tfcli", "hf", "ct2")}
        rows.append(["LM generation, peak memory", f"model + one batch of {m['batch_size']}, MiB over imports",
                     _n(d["tfcli"]), _n(d["hf"]), _n(d["ct2"]), _x(d["tfcli"] / d["hf"] if d["hf"] else None),
                     _x(d["tfcli"] / d["ct2"] if d["ct2"] else None)])
    return rows


def prepare_rows(r: dict) -> list[list[str]]:
    return [
        ["`tfcli prepare` Multi30k (BPE 8000)", "full command, wall s (CPU s)",
         f"{r['prepare_s']['median']:.2f} ({r['prepare_cpu_s']['median']:.2f})", "–", "–", "–", "–"],
        ["`tfcli prepare` Multi30k, encoding", "encode_batch over a Python loop (speed-up)",
         _x(r.get("encode_speedup")), "–", "–", "–", "–"],
    ]


ROWS = {"translate_speed": translate_rows, "int8_speed": int8_rows, "train_throughput": train_rows, "train_throughput_multi30k": train_rows,
        "lm_generate_speed": lm_rows, "prepare_multi30k": prepare_rows}


def _when(r: dict) -> str:
    """Date, threads and load average, from whichever keys a results file has."""
    parts = []
    if "date" in r:
        parts.append(r["date"])
    m = r.get("machine", {})
    threads = r.get("threads", m.get("torch_threads"))
    if threads:
        parts.append(f"threads {threads}")
    load = r.get("load_average_at_start") or m.get("load_avg_before") or r.get("loadavg_before")
    if load:
        parts.append("load " + ", ".join(f"{x:.1f}" for x in load[:1]) + " at start")
    return "; ".join(parts)


def summary(results: Path, status: dict[str, str] | None = None, quick: bool = False) -> str:
    """peers.md: one table over all results JSON files in `results`, then where each came from."""
    head = ["benchmark", "measure", "tfcli", "Hugging Face", "CTranslate2", "tfcli / HF", "tfcli / CT2", "details"]
    lines = ["# Peer benchmarks: summary", "",
             "Built by `benchmarks/run_all.py` from the JSON results files in this directory; each row links to the "
             "detailed report (command, machine, load, method). Ratios above 1 mean tfcli is faster (for memory: "
             "uses more). `–`: not measured.", "",
             "| " + " | ".join(head) + " |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    notes = []
    for name in SCRIPTS:
        path = results / f"{name}.json"
        link = f"[{name}.md]({name}.md)" if (results / f"{name}.md").exists() else "–"
        state = (status or {}).get(name)
        if status is not None and state is None:
            state = "not run this time (--only)"
        if not path.exists():
            notes.append(f"- `{name}`: no results" + (f" ({state})" if state else "") + ".")
            continue
        try:
            r = json.loads(path.read_text())
            rows = ROWS[name](r)
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            notes.append(f"- `{name}`: {path.name} could not be read ({type(e).__name__}: {e}).")
            continue
        lines += ["| " + " | ".join(row + [link]) + " |" for row in rows]
        cmd = r.get("command", "?")
        notes.append(f"- `{name}`: `{cmd}`" + (f" ({_when(r)})" if _when(r) else "")
                     + (f"; this run: {state}" if state and state != "ok" else "") + ".")
    if quick:
        lines += ["", "**Quick run** (tiny settings, a check that the benchmarks work): not a measurement."]
    lines += ["", "Sources:", "", *notes, "", f"Summary written {time.strftime('%Y-%m-%d %H:%M')}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny runs, results to a temporary directory (a check)")
    ap.add_argument("--threads", type=int, default=0, help="passed to the scripts that take --threads")
    ap.add_argument("--only", default=",".join(SCRIPTS), help="comma-separated subset of: " + ", ".join(SCRIPTS))
    ap.add_argument("--summary-only", action="store_true", help="only rebuild peers.md from existing JSON files")
    ap.add_argument("--checkpoint", default=None, help="a trained Multi30k de-en checkpoint for translate_speed's "
                    "real-data part and int8_speed (e.g. the one recipes/multi30k.sh de en cpu-long writes)")
    ap.add_argument("--peer-checkpoint", default=None, help="a trained post-norm Multi30k de-en checkpoint for "
                    "translate_speed's side-by-side real-data part (the CPU recipe with --set model.norm=post)")
    ap.add_argument("--results", default=None, help="results directory (default benchmarks/results; with --quick "
                    "a temporary directory)")
    args = ap.parse_args()
    args.only = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in args.only if n not in SCRIPTS]
    if unknown:
        ap.error(f"--only: unknown {', '.join(unknown)}; choose from {', '.join(SCRIPTS)}")
    if args.results:
        results = Path(args.results)
    elif args.quick:
        results = Path(tempfile.mkdtemp(prefix="tfcli-bench-quick-"))
    else:
        results = RESULTS
    results.mkdir(parents=True, exist_ok=True)
    status = None if args.summary_only else run_benchmarks(args, results)
    peers = results / "peers.md"
    peers.write_text(portable(summary(results, status, args.quick)))
    print(peers.read_text())
    print(f"written: {peers}", file=sys.stderr)
    return 1 if status and any(s.startswith("failed") for s in status.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
