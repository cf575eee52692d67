"""`tfcli prepare` at WMT scale: peak memory and throughput against corpus size.

The corpora are synthetic, so nothing is downloaded: Multi30k's training pairs (../shared/data/multi30k), copied as
often as needed, each copy with the words of every sentence shuffled by a seeded generator. The lines are new (so
`--dedupe` would keep them), while their vocabulary, sentence lengths and bytes per pair stay Multi30k's.
Each size is prepared by `tfcli prepare` in a process of its own (joint BPE 32k, the defaults otherwise); its peak
RSS comes from wait4() for that process alone.

    python benchmarks/prepare_scale.py       # 0.5M, 1M and 4M pairs, 125 MB and 1 GB of text: about 20 minutes
    python benchmarks/prepare_scale.py --sizes 100000 --mono-mb 10 --out /tmp/x   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from common import cpu_name, run_tfcli_measured, write_results

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def synthetic_corpus(n: int, workdir: Path) -> tuple[Path, Path]:
    """N pairs built from Multi30k's train split (see the module docstring); reused when already built."""
    src, tgt = workdir / f"pairs-{n}.de", workdir / f"pairs-{n}.en"
    if src.exists() and tgt.exists():
        return src, tgt
    de = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines()
    en = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines()
    rng = random.Random(0)
    workdir.mkdir(parents=True, exist_ok=True)
    with open(f"{src}.tmp", "w", encoding="utf-8") as fs, open(f"{tgt}.tmp", "w", encoding="utf-8") as ft:
        for i in range(n):
            j = i % len(de)
            a, b = de[j].split(), en[j].split()
            if i >= len(de):  # the first copy is Multi30k itself
                rng.shuffle(a)
                rng.shuffle(b)
            fs.write(" ".join(a) + "\n")
            ft.write(" ".join(b) + "\n")
    os.replace(f"{src}.tmp", src)
    os.replace(f"{tgt}.tmp", tgt)
    return src, tgt


def mono_corpus(mb: int, workdir: Path) -> Path:
    """About `mb` MB of monolingual text: the English sides of the synthetic pairs (line mode, as a language-model
    corpus is prepared)."""
    path = workdir / f"mono-{mb}mb.txt"
    if path.exists():
        return path
    _, en = synthetic_corpus(30_000, workdir)  # Multi30k itself, words in order
    lines = en.read_text(encoding="utf-8").splitlines()
    rng = random.Random(1)
    size, target = 0, mb * 1_000_000
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        while size < target:
            words = rng.choice(lines).split()
            rng.shuffle(words)
            line = " ".join(words) + "\n"
            f.write(line)
            size += len(line.encode("utf-8"))
    os.replace(f"{path}.tmp", path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[500_000, 1_000_000, 4_000_000])
    ap.add_argument("--mono-mb", type=int, nargs="*", default=[125, 1000], help="monolingual corpora, MB of text")
    ap.add_argument("--vocab-size", type=int, default=32000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/tfcli-prepare-scale"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "prepare_scale"))
    args = ap.parse_args()
    if not (MULTI30K / "train.de").exists():
        raise SystemExit(f"{MULTI30K}: Multi30k is needed to build the synthetic corpora")

    rows = []
    for n in args.sizes:
        src, tgt = synthetic_corpus(n, args.workdir)
        out = args.workdir / f"prepared-{n}"
        seconds, rss = run_tfcli_measured("prepare", ["--src", str(src), "--tgt", str(tgt), "-o", str(out),
                                                      "--force", "--vocab-size", str(args.vocab_size)])
        meta = json.loads((out / "meta.json").read_text())
        mb = (src.stat().st_size + tgt.stat().st_size) / 1e6
        rows.append({"pairs": n, "text_mb": round(mb, 1), "seconds": round(seconds, 1),
                     "pairs_per_s": round(n / seconds), "peak_rss_mb": round(rss / 2**20),
                     "kept": meta["cleaning"]["train"]["kept"]})
        print(rows[-1], flush=True)

    mono = []
    for mb in args.mono_mb:
        text = mono_corpus(mb, args.workdir)
        out = args.workdir / f"prepared-mono-{mb}"
        seconds, rss = run_tfcli_measured("prepare", ["--train", str(text), "-o", str(out), "--force",
                                                      "--valid-ratio", "0.001", "--vocab-size", str(args.vocab_size)])
        meta = json.loads((out / "meta.json").read_text())
        n = meta["cleaning"]["train"]["input"] + meta["cleaning"]["valid"]["input"]
        mono.append({"text_mb": round(text.stat().st_size / 1e6), "lines": n, "seconds": round(seconds, 1),
                     "lines_per_s": round(n / seconds), "peak_rss_mb": round(rss / 2**20)})
        print(mono[-1], flush=True)

    first, last = rows[0], rows[-1]
    result = {
        "benchmark": "prepare_scale", "machine": f"{os.cpu_count()}-core CPU ({cpu_name()})",
        "date": time.strftime("%Y-%m-%d %H:%M"), "vocab_size": args.vocab_size,
        "load_average": [round(x, 2) for x in os.getloadavg()], "rows": rows,
        "rss_ratio_largest_to_smallest": round(last["peak_rss_mb"] / first["peak_rss_mb"], 2), "mono": mono,
    }
    lines = [
        "# `tfcli prepare` at scale", "",
        f"Synthetic corpora from Multi30k (words shuffled per copy), joint BPE {args.vocab_size // 1000}k, one "
        f"process per size. {result['machine']}, {result['date']}.", "",
        "| pairs | text | time | pairs/s | peak RSS |", "| ---: | ---: | ---: | ---: | ---: |",
        *[f"| {r['pairs']:,} | {r['text_mb']} MB | {r['seconds']} s | {r['pairs_per_s']:,} | {r['peak_rss_mb']} MB |"
          for r in rows],
        "", f"Peak RSS, largest over smallest corpus: {result['rss_ratio_largest_to_smallest']}x.", "",
    ]
    if mono:
        lines += [
            "Monolingual text (a language-model corpus: the English sides, words shuffled; line mode, "
            "--valid-ratio 0.001, BPE of the same size):", "",
            "| text | lines | time | lines/s | peak RSS |", "| ---: | ---: | ---: | ---: | ---: |",
            *[f"| {r['text_mb']} MB | {r['lines']:,} | {r['seconds']} s | {r['lines_per_s']:,} | {r['peak_rss_mb']} MB |"
              for r in mono], "",
        ]
    write_results(args.out, result, "\n".join(lines))


if __name__ == "__main__":
    main()
