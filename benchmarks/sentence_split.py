"""Sentence splitters for `tfcli translate --split-sentences`: which one finds the sentences of a paragraph best in
German, English and French, and what it costs to start and to run.

    .venv/bin/pip install pysbd sentence-splitter   # the other candidates (sentencex comes with tfcli)
    .venv/bin/python benchmarks/sentence_split.py [--data ../shared/data] [--size 5] [--out OUT]

Each candidate from the package index (sentencex, pysbd, sentence-splitter; each skipped, saying so, where it is
not installed) splits the Multi30k test2016 sentences joined into paragraphs of --size (200 a language, each
sentence once, joined by a space). A boundary is the character offset where one sentence ends and the next
begins; reported: precision and recall of the boundaries found, the share of paragraphs split exactly into their
sentences, the seconds to import the package and split the first paragraph (a process of its own, as `tfcli
translate` would pay once), and the paragraphs split a second after that. Results:
benchmarks/results/sentence_split.{json,md}, with the CPU named.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from common import SHARED_DATA, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LANGS = ("de", "en", "fr")

# name -> (module to import, code that makes `split(text, lang) -> list[str]`)
CANDIDATES = {
    "sentencex": ("sentencex", "from sentencex import segment\n"
                               "def split(text, lang): return [s.strip() for s in segment(lang, text) if s.strip()]"),
    "pysbd": ("pysbd", "import pysbd\n_seg = {}\n"
                       "def split(text, lang):\n"
                       "    s = _seg.get(lang) or _seg.setdefault(lang, pysbd.Segmenter(language=lang, clean=False))\n"
                       "    return [x.strip() for x in s.segment(text) if x.strip()]"),
    "sentence-splitter": ("sentence_splitter", "from sentence_splitter import SentenceSplitter\n_seg = {}\n"
                                               "def split(text, lang):\n"
                                               "    s = _seg.get(lang) or _seg.setdefault(lang, SentenceSplitter(language=lang))\n"
                                               "    return [x.strip() for x in s.split(text) if x.strip()]"),
}

CHILD = """
import json, sys, time
start = time.perf_counter()
{code}
paragraphs = json.load(open(sys.argv[1], encoding="utf-8"))
first = split(paragraphs[0][1], paragraphs[0][0])
startup = time.perf_counter() - start
start = time.perf_counter()
out = [split(text, lang) for lang, text in paragraphs]
print(json.dumps({{"startup_s": startup, "split_s": time.perf_counter() - start, "out": out}}))
"""


def paragraphs(data: Path, size: int) -> list[tuple[str, str, list[str]]]:
    """(language, paragraph, its sentences) for each language's test2016 sentences in groups of `size`."""
    out = []
    for lang in LANGS:
        lines = (data / "multi30k" / f"test2016.{lang}").read_text(encoding="utf-8").splitlines()
        for i in range(0, len(lines) - size + 1, size):
            sentences = [s.strip() for s in lines[i : i + size]]
            out.append((lang, " ".join(sentences), sentences))
    return out


def starts(pieces: list[str], paragraph: str) -> set[int]:
    """Where each piece but the first begins in `paragraph` (found in order, each after the one before)."""
    out, at = set(), 0
    for i, piece in enumerate(pieces):
        found = paragraph.find(piece, at)
        if found < 0:  # (a splitter that rewrote the text: its boundary is not counted as found)
            continue
        if i:
            out.add(found)
        at = found + len(piece)
    return out


def score(gold: list[list[str]], found: list[list[str]], text: list[str]) -> dict:
    tp = fp = fn = exact = 0
    for sentences, pieces, paragraph in zip(gold, found, text):
        want, got = starts(sentences, paragraph), starts(pieces, paragraph)
        tp, fp, fn = tp + len(want & got), fp + len(got - want), fn + len(want - got)
        exact += pieces == sentences
    return {"precision": tp / max(tp + fp, 1), "recall": tp / max(tp + fn, 1), "exact": exact / len(gold)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--size", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS / "sentence_split"))
    args = p.parse_args()
    paras = paragraphs(Path(args.data), args.size)
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/sentence_split.py", *sys.argv[1:]]),
           "cpu": cpu_name(), "paragraph_size": args.size, "paragraphs": len(paras),
           "date": time.strftime("%Y-%m-%d %H:%M"), "candidates": {}}
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sentence_split-{os.getpid()}.json"
    tmp.write_text(json.dumps([(lang, text) for lang, text, _ in paras]), encoding="utf-8")
    try:
        for name, (module, code) in CANDIDATES.items():
            proc = subprocess.run([sys.executable, "-c", CHILD.format(code=code), str(tmp)], capture_output=True,
                                  text=True)
            if proc.returncode:
                res["candidates"][name] = {"skipped": proc.stderr.strip().splitlines()[-1]}
                continue
            got = json.loads(proc.stdout)
            entry = {"startup_s": got["startup_s"], "paragraphs_per_s": len(paras) / got["split_s"]}
            for lang in LANGS:
                rows = [i for i, (lg, _, _) in enumerate(paras) if lg == lang]
                entry[lang] = score([paras[i][2] for i in rows], [got["out"][i] for i in rows],
                                    [paras[i][1] for i in rows])
            res["candidates"][name] = entry
    finally:
        tmp.unlink(missing_ok=True)
    md = ["# Sentence splitters on Multi30k test2016 paragraphs", "",
          f"CPU: {res['cpu']}. {len(paras)} paragraphs of {args.size} sentences ({len(paras) // len(LANGS)} a "
          f"language); {res['date']}. Written by `benchmarks/sentence_split.py`.", "",
          "| splitter | " + " | ".join(f"{lang} P / R / exact" for lang in LANGS)
          + " | start-up s | paragraphs/s |", "| --- |" + " ---: |" * (len(LANGS) + 2)]
    for name, e in res["candidates"].items():
        if "skipped" in e:
            md.append(f"| {name} | skipped: {e['skipped']} |" + " |" * (len(LANGS) + 1))
            continue
        cells = [f"{e[lang]['precision']:.3f} / {e[lang]['recall']:.3f} / {e[lang]['exact']:.1%}" for lang in LANGS]
        md.append(f"| {name} | " + " | ".join(cells) + f" | {e['startup_s']:.3f} | {e['paragraphs_per_s']:.0f} |")
    md += ["", "P: boundaries found that are real; R: real boundaries found; exact: paragraphs split into exactly "
           "their sentences. A sentence of Multi30k without a final stop (2% of German, 5% of English and French) "
           "cannot be found by any splitter.", "", f"Command: `{res['command']}`.", ""]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
