"""Two Multi30k translators side by side in one run (CPU), speed and BLEU: a distilled student against its teacher
(recipes/distill.sh), or with --versus decoder-only, a decoder-only translator against the encoder-decoder
(recipes/multi30k-decoder-cpu-long.yaml against recipes/multi30k-cpu-long.yaml).

    .venv/bin/python benchmarks/distill_speed.py TEACHER STUDENT [--pair de-en] [--threads N] [--batch 64]
        [--repeats 3] [--data ../shared/data] [--out benchmarks/results/distill_speed-PAIR]
    .venv/bin/python benchmarks/distill_speed.py ENCODER_DECODER DECODER_ONLY --versus decoder-only [...]
        (--out default: benchmarks/results/decoder_speed-PAIR)

Multi30k test2016's 1,000 sentences through each system in a process of its own (benchmarks/common.py: Isolated):
the teacher and the student in fp32 and in int8 (`tfcli translate --dtype int8`), and the teacher exported to
CTranslate2 int8 where its model exports (a QK-norm model does not: the row says so). Beam 5 and greedy, batch 64,
length penalty 0 and at most MAX_LEN output tokens in all (the same search in every system); sentences/s the best of
--repeats, the systems interleaved; sacreBLEU on the references. The targets (issue 61): the student's int8 at least
2x the teacher's int8, within 0.5 BLEU of the teacher (beam 5, fp32); the decoder-only translator's (issue 107):
within 1.0 BLEU of the encoder-decoder at equal parameters and training time (beam 5, fp32), its speed beside it.
Results: OUT.json and OUT.md, the CPU named.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from common import SHARED_DATA, CT2System, Isolated, TfcliSystem, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]
SEARCHES = {"beam 5": 5, "greedy": 1}
# what each comparison calls its two checkpoints, its title and its results file's stem
VERSUS = {"distill": (("teacher", "student"), "A distilled student against its teacher", "distill_speed"),
          "decoder-only": (("encoder-decoder", "decoder-only"), "A decoder-only translator against the "
                           "encoder-decoder", "decoder_speed")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("teacher")
    p.add_argument("student")
    p.add_argument("--pair", default="de-en")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--versus", choices=list(VERSUS), default="distill")
    p.add_argument("--out")
    args = p.parse_args()
    import sacrebleu

    from tfcli.errors import TfcliError
    from tfcli.interop import export

    src, tgt = args.pair.split("-")
    data = Path(args.data) / "multi30k"
    lines = (data / f"test2016.{src}").read_text(encoding="utf-8").splitlines()
    refs = (data / f"test2016.{tgt}").read_text(encoding="utf-8").splitlines()
    t = args.threads
    (first, second), title, stem = VERSUS[args.versus]
    res = {"cpu": cpu_name(), "threads": t, "batch": args.batch, "repeats": args.repeats, "pair": args.pair,
           first: args.teacher, second: args.student, "sentences": len(lines),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    with tempfile.TemporaryDirectory() as tmp:
        systems = {f"{who} {dtype}": Isolated(f"{who} {dtype}", TfcliSystem, ckpt, t, dtype, threads=t)
                   for who, ckpt in ((first, args.teacher), (second, args.student))
                   for dtype in ("fp32", "int8")}
        try:
            export(args.teacher, "ctranslate2", Path(tmp) / "ct2", quantization="int8")
            systems[f"{first} CT2 int8"] = Isolated(f"{first} CT2 int8", CT2System, str(Path(tmp) / "ct2"), t,
                                                    threads=t)
        except TfcliError as e:
            res["ct2_skipped"] = str(e)
        try:
            seconds = {(name, s): [] for name in systems for s in SEARCHES}
            bleu = {}
            for _ in range(args.repeats):
                for name, system in systems.items():
                    for search, beam in SEARCHES.items():
                        took, out = system.run(lines, beam, args.batch)
                        seconds[name, search].append(took)
                        bleu[name, search] = sacrebleu.corpus_bleu(out, [refs]).score
        finally:
            for system in systems.values():
                system.close()
    speed = {k: len(lines) / min(v) for k, v in seconds.items()}
    res["sent_per_s"] = {f"{n} / {s}": v for (n, s), v in speed.items()}
    res["bleu"] = {f"{n} / {s}": v for (n, s), v in bleu.items()}
    ratio = speed[f"{second} int8", "beam 5"] / speed[f"{first} int8", "beam 5"]
    fp32 = speed[f"{second} fp32", "beam 5"] / speed[f"{first} fp32", "beam 5"]
    gap = bleu[f"{first} fp32", "beam 5"] - bleu[f"{second} fp32", "beam 5"]
    if args.versus == "distill":
        res["targets"] = {"student int8 / teacher int8 (beam 5) >= 2": ratio, "teacher - student BLEU <= 0.5": gap}
        targets = [f"- student int8 / teacher int8, beam 5: {ratio:.2f}x (target 2x: "
                   f"{'met' if ratio >= 2 else 'NOT met'})",
                   f"- teacher - student, beam 5, fp32: {gap:+.2f} BLEU (target at most 0.5: "
                   f"{'met' if gap <= 0.5 else 'NOT met'})"]
    else:
        res["targets"] = {"encoder-decoder - decoder-only BLEU <= 1.0": gap}
        res["decoder_over_encoder_decoder"] = {"fp32": fp32, "int8": ratio}
        targets = [f"- decoder-only / encoder-decoder, beam 5: {fp32:.2f}x in fp32, {ratio:.2f}x in int8",
                   f"- encoder-decoder - decoder-only, beam 5, fp32: {gap:+.2f} BLEU (target at most 1.0: "
                   f"{'met' if gap <= 1.0 else 'NOT met'})"]
    ct2 = (f"{first} CT2 int8", "beam 5") in speed
    if ct2:
        res[f"{second}_int8_over_{first}_ct2_int8"] = speed[f"{second} int8", "beam 5"] / speed[f"{first} CT2 int8",
                                                                                              "beam 5"]
        targets.append(f"- {second} int8 / the {first} in CTranslate2 int8, beam 5: "
                       f"{res[f'{second}_int8_over_{first}_ct2_int8']:.2f}x")
    rows = [f"| {n} | " + " | ".join(f"{speed[n, s]:.1f} | {bleu[n, s]:.2f}" for s in SEARCHES) + " |"
            for n in systems]
    md = "\n".join([
        f"# {title}, Multi30k test2016 {src}->{tgt} ({res['cpu']}, {t} threads)", "",
        f"`benchmarks/distill_speed.py`, {res['date']}: {len(lines)} sentences, batch {args.batch}, length penalty "
        f"0, best of {args.repeats}. {first.capitalize()} `{args.teacher}`, {second} `{args.student}`.", "",
        "| system | beam 5 sent/s | beam 5 BLEU | greedy sent/s | greedy BLEU |", "| --- | ---: | ---: | ---: | ---: |",
        *rows, "", *targets,
        *([f"- CTranslate2: not measured ({res['ct2_skipped']})"] if "ct2_skipped" in res else []), ""])
    write_results(args.out or ROOT / "benchmarks" / "results" / f"{stem}-{args.pair}", res, md)


if __name__ == "__main__":
    main()
