"""A distilled student against its teacher (recipes/distill.sh): speed and BLEU side by side in one run (CPU).

    .venv/bin/python benchmarks/distill_speed.py TEACHER STUDENT [--pair de-en] [--threads N] [--batch 64]
        [--repeats 3] [--data ../shared/data] [--out benchmarks/results/distill_speed-PAIR]

Multi30k test2016's 1,000 sentences through each system in a process of its own (benchmarks/common.py: Isolated):
the teacher and the student in fp32 and in int8 (`tfcli translate --dtype int8`), and the teacher exported to
CTranslate2 int8 where its model exports (a QK-norm model does not: the row says so). Beam 5 and greedy, batch 64,
length penalty 0 and at most MAX_LEN output tokens in all (the same search in every system); sentences/s the best of
--repeats, the systems interleaved; sacreBLEU on the references. The targets (issue 61): the student's int8 at least
2x the teacher's int8, within 0.5 BLEU of the teacher (beam 5, fp32). Results: OUT.json and OUT.md, the CPU named.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("teacher")
    p.add_argument("student")
    p.add_argument("--pair", default="de-en")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=SHARED_DATA)
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
    res = {"cpu": cpu_name(), "threads": t, "batch": args.batch, "repeats": args.repeats, "pair": args.pair,
           "teacher": args.teacher, "student": args.student, "sentences": len(lines),
           "date": time.strftime("%Y-%m-%d %H:%M")}
    with tempfile.TemporaryDirectory() as tmp:
        systems = {f"{who} {dtype}": Isolated(f"{who} {dtype}", TfcliSystem, ckpt, t, dtype, threads=t)
                   for who, ckpt in (("teacher", args.teacher), ("student", args.student))
                   for dtype in ("fp32", "int8")}
        try:
            export(args.teacher, "ctranslate2", Path(tmp) / "ct2", quantization="int8")
            systems["teacher CT2 int8"] = Isolated("teacher CT2 int8", CT2System, str(Path(tmp) / "ct2"), t, threads=t)
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
    ratio = speed["student int8", "beam 5"] / speed["teacher int8", "beam 5"]
    gap = bleu["teacher fp32", "beam 5"] - bleu["student fp32", "beam 5"]
    res["targets"] = {"student int8 / teacher int8 (beam 5) >= 2": ratio, "teacher - student BLEU <= 0.5": gap}
    ct2 = ("teacher CT2 int8", "beam 5") in speed
    if ct2:
        res["student_int8_over_teacher_ct2_int8"] = speed["student int8", "beam 5"] / speed["teacher CT2 int8", "beam 5"]
    rows = [f"| {n} | " + " | ".join(f"{speed[n, s]:.1f} | {bleu[n, s]:.2f}" for s in SEARCHES) + " |"
            for n in systems]
    md = "\n".join([
        f"# A distilled student against its teacher, Multi30k test2016 {src}->{tgt} ({res['cpu']}, {t} threads)", "",
        f"`benchmarks/distill_speed.py`, {res['date']}: {len(lines)} sentences, batch {args.batch}, length penalty "
        f"0, best of {args.repeats}. Teacher `{args.teacher}`, student `{args.student}`.", "",
        "| system | beam 5 sent/s | beam 5 BLEU | greedy sent/s | greedy BLEU |", "| --- | ---: | ---: | ---: | ---: |",
        *rows, "",
        f"- student int8 / teacher int8, beam 5: {ratio:.2f}x (target 2x: {'met' if ratio >= 2 else 'NOT met'})",
        f"- teacher - student, beam 5, fp32: {gap:+.2f} BLEU (target at most 0.5: {'met' if gap <= 0.5 else 'NOT met'})",
        *([f"- student int8 / the teacher in CTranslate2 int8, beam 5: "
           f"{res['student_int8_over_teacher_ct2_int8']:.2f}x"] if ct2 else []),
        *([f"- CTranslate2: not measured ({res['ct2_skipped']})"] if "ct2_skipped" in res else []), ""])
    write_results(args.out or ROOT / "benchmarks" / "results" / f"distill_speed-{args.pair}", res, md)


if __name__ == "__main__":
    main()
