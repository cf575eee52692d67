"""A glossary on a real term-annotated test set: the WMT 2025 terminology shared task, track 1 (en-de, 500
sentences of software documentation, each with its "proper" and "random" term dictionaries).

    .venv/bin/python benchmarks/glossary_terms.py CKPT --data full_data.ende.jsonl [--mode proper] [--beam 5]
        [--batch 64] [--repeats 2] [--out OUT]

--data: ranking/references/track1/full_data.ende.jsonl of github.com/wmt-conference/wmt25-terminology (CC BY-NC
4.0: read from where it was fetched, never committed here). The union of the sentences' dictionaries of --mode is
one glossary (as a user keeps one; a source term given twice with different targets: the later one, counted); the
500 sentences are translated with and without it (`translate(..., glossary=)`, beam --beam, batch --batch), and each
with its own dictionary as its glossary (the task's setup).
Reported: the term success rate by the task's own rule (evaluate_track1.py: a sentence's term counts where its
source term is in the source, lowercased or lemmatised, and is met where its target term is in the output,
lowercased or lemmatised; simplemma's lemmas here in place of stanza's), with and without the glossary; BLEU and
chrF++ as the task computes them (sacrebleu, 13a, word order 2); the best time of --repeats of each; and how often
a term found more than once in a source appears as often in the output. Results: benchmarks/results/
glossary_terms.{json,md}, the CPU named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from common import best_of, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def lemma_string(text: str, lang: str) -> str:
    """`text`'s words lemmatised and lowercased, joined by "|||" (the task's form, with simplemma's lemmas)."""
    import simplemma

    return "|||".join(simplemma.lemmatize(w, lang=lang) for w in re.findall(r"\w+|[^\w\s]", text)).lower()


def success(rows: list[dict], mode: str, hyps: list[str]) -> tuple[float, int, int]:
    """(rate, met, total) by evaluate_track1.py's rule."""
    met = total = 0
    for row, hyp in zip(rows, hyps):
        src_l, hyp_l = lemma_string(row["en"], "en"), lemma_string(hyp, "de")
        for k, v in row[mode].items():
            if lemma_string(k, "en") in src_l or k.lower() in row["en"].lower():
                total += 1
                met += lemma_string(v, "de") in hyp_l or v.lower() in hyp.lower()
    return (met / total if total else float("nan")), met, total


def inside_words(rows: list[dict], mode: str, own: list) -> int:
    """The terms the task's rule counts as in their source that the glossary did not make a constraint of with the
    sentence's own dictionary (`own`: each sentence's Translation, whose `constraints` name them): their source
    terms stand only inside other words (`redeployment` for `deployment`, `MenuChange` for `Menu`)."""
    n = 0
    for row, t in zip(rows, own):
        made = {c for c, _ in (t.constraints or [])} if t is not None else set()
        src_l = lemma_string(row["en"], "en")
        n += sum(v not in made for k, v in row[mode].items()
                 if lemma_string(k, "en") in src_l or k.lower() in row["en"].lower())
    return n


def repeated(rows: list[dict], mode: str, hyps: list[str]) -> tuple[int, int]:
    """(terms found more than once in their source, of those the ones whose target appears as often in the
    output), counted on lowercased text."""
    found = as_often = 0
    for row, hyp in zip(rows, hyps):
        for k, v in row[mode].items():
            n = row["en"].lower().count(k.lower())
            if n > 1:
                found += 1
                as_often += hyp.lower().count(v.lower()) >= n
    return found, as_often


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", required=True, help="full_data.ende.jsonl of wmt-conference/wmt25-terminology")
    p.add_argument("--mode", default="proper", choices=("proper", "random"))
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--out", default=str(RESULTS / "glossary_terms"))
    args = p.parse_args()
    import sacrebleu

    import tfcli
    from tfcli.runtime import tune_process

    tune_process("cpu", args.threads)
    rows = [json.loads(line) for line in Path(args.data).read_text(encoding="utf-8").splitlines() if line.strip()]
    lines, refs = [r["en"] for r in rows], [r["de"] for r in rows]
    glossary, clashes = {}, 0
    for r in rows:
        for k, v in r[args.mode].items():
            clashes += k in glossary and glossary[k] != v
            glossary[k] = v
    t = tfcli.load(args.checkpoint, device="cpu")
    opts = dict(beam_size=args.beam, batch_size=args.batch, src_lang="en")
    ways = {"without glossary": lambda: t.translate(lines, **opts),
            "with glossary": lambda: t.translate(lines, glossary=glossary, **opts)}
    outputs, times = best_of(ways, args.repeats)
    # the task's own setup: each sentence with its own dictionary as its glossary (one call a sentence; a sentence
    # without terms is its translation without a glossary, which does not depend on its batch)
    start = time.perf_counter()
    own = [t.translate_nbest([r["en"]], n=1, glossary=r[args.mode], **opts)[0][0] if r[args.mode] else None
           for r in rows]
    outputs["each sentence's own dictionary"] = [o.text if o is not None else plain
                                                 for o, plain in zip(own, outputs["without glossary"])]
    own_s = time.perf_counter() - start
    names = [*ways, "each sentence's own dictionary"]
    rates = {name: success(rows, args.mode, outputs[name]) for name in names}
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF(word_order=2)
    scores = {name: {"bleu": bleu.corpus_score(outputs[name], [refs]).score,
                     "chrf++": chrf.corpus_score(outputs[name], [refs]).score} for name in names}
    twice = repeated(rows, args.mode, outputs["each sentence's own dictionary"])
    inside = inside_words(rows, args.mode, own)
    ratio = min(times["with glossary"]) / min(times["without glossary"])
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/glossary_terms.py", *sys.argv[1:]]),
           "cpu": cpu_name(), "threads": args.threads, "checkpoint": args.checkpoint, "mode": args.mode,
           "sentences": len(rows), "glossary_terms": len(glossary), "clashing_entries": clashes, "beam": args.beam,
           "batch": args.batch, "date": time.strftime("%Y-%m-%d %H:%M"),
           "term_success_rate": {name: r[0] for name, r in rates.items()},
           "terms_met": {name: r[1] for name, r in rates.items()}, "terms": rates["with glossary"][2],
           "scores": scores, "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
           "best_s": {name: min(v) for name, v in times.items()}, "time_ratio": ratio,
           "own_dictionaries_s": own_s, "terms_only_inside_other_words": inside,
           "repeated_terms": {"found": twice[0], "as_often_in_output": twice[1]},
           "target": {"term_success_rate": 0.99, "time_ratio": 1.5}}
    md = [f"# A glossary on WMT 2025 terminology track 1, en->de ({args.mode} terms)", "",
          f"CPU: {res['cpu']}, {args.threads} threads. Checkpoint `{args.checkpoint}`; beam {args.beam}, batch "
          f"{args.batch}; best of {args.repeats}; {res['date']}. Written by `benchmarks/glossary_terms.py`. The "
          f"{len(rows)} sentences' {args.mode} dictionaries as one glossary of {len(glossary)} terms ({clashes} "
          "source terms given twice with different targets: the later one kept). Term success rate by the task's "
          "rule (evaluate_track1.py), with simplemma's lemmas in place of stanza's.", "",
          "| way | term success rate | terms met | BLEU | chrF++ | seconds |", "| --- | ---: | ---: | ---: | ---: | ---: |",
          *(f"| {name} | {rates[name][0]:.3f} | {rates[name][1]} of {rates[name][2]} | {scores[name]['bleu']:.2f} | "
            f"{scores[name]['chrf++']:.2f} | {min(times[name]) if name in times else own_s:.2f} |" for name in names),
          "",
          "One glossary for the whole set misses the terms whose sentence's dictionary gives another target than the "
          "one kept, and those inside a longer term of another sentence's (the longest match wins); each sentence's "
          "own dictionary (the task's setup; one call a sentence, so its time is not comparable) has neither. Of "
          f"the terms the task's rule counts, {inside} stand in their source only inside another word (`redeployment` "
          "for `deployment`, `MenuChange` for `Menu`): the glossary matches whole words, so leaves them.",
          "",
          f"- time, with the glossary over without: {ratio:.2f}x (target: at most 1.5x)",
          f"- terms found more than once in a source: {twice[0]}; of those, as often in the output with their "
          f"sentence's own dictionary: {twice[1]} (each occurrence is a constraint of its own, the next waiting "
          "for the one before)",
          f"- BLEU signature: `{res['bleu_signature']}`; chrF++: `{res['chrf_signature']}`", "",
          f"Command: `{res['command']}`.", ""]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
