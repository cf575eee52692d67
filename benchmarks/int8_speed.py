"""int8 on the CPU: `tfcli translate --dtype int8` beside float32, and beside CTranslate2 int8 on the same weights.

    .venv/bin/python benchmarks/int8_speed.py CKPT [--threads N] [--batch 64] [--repeats 3] [--data ../shared/data]

The 1,000 German sentences of Multi30k test2016 through four systems, each in a process of its own
(benchmarks/common.py: Isolated), beam 5 at batch 64, length penalty 0 and at most MAX_LEN output tokens in all
(as benchmarks/export_check.py does, so that CTranslate2 decodes the same search): tfcli float32, tfcli int8, and
the checkpoint exported by `tfcli export --to ctranslate2` with and without `--quantization int8`. BLEU is
sacreBLEU on the references; sentences/s the best of --repeats, the systems interleaved. Then each system
translates the same sentences at batch 7: how many of its translations differ from those at --batch (int8 inputs
are quantised with one scale per call, so a sentence's int8 translation can depend on the rest of its batch).
Results: benchmarks/results/int8_speed.{json,md}, with the CPU named.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from common import CT2System, Isolated, TfcliSystem, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = ("tfcli fp32", "tfcli int8", "CT2 fp32", "CT2 int8")
OTHER_BATCH = 7  # a second batch size, to count the translations that change with it


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    p.add_argument("--out", default=str(RESULTS / "int8_speed"))
    args = p.parse_args()
    import sacrebleu

    from tfcli import checkpoint
    from tfcli.interop.export import export

    data = Path(args.data) / "multi30k"
    lines = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    refs = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/int8_speed.py", *sys.argv[1:]]),
           "cpu": cpu_name(), "threads": args.threads, "batch": args.batch, "beam": 5, "repeats": args.repeats,
           "checkpoint": str(checkpoint.resolve(args.checkpoint)), "sentences": len(lines),
           "date": time.strftime("%Y-%m-%d %H:%M"), "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        export(args.checkpoint, "ctranslate2", Path(tmp) / "fp32")
        export(args.checkpoint, "ctranslate2", Path(tmp) / "int8", quantization="int8")
        t = args.threads
        systems = {
            "tfcli fp32": Isolated("tfcli fp32", TfcliSystem, args.checkpoint, t, "fp32", threads=t),
            "tfcli int8": Isolated("tfcli int8", TfcliSystem, args.checkpoint, t, "int8", threads=t),
            "CT2 fp32": Isolated("CT2 fp32", CT2System, str(Path(tmp) / "fp32"), t, threads=t),
            "CT2 int8": Isolated("CT2 int8", CT2System, str(Path(tmp) / "int8"), t, threads=t),
        }
        try:
            times = {name: [] for name in SYSTEMS}
            bleu = {}
            outputs = {}
            for r in range(args.repeats):
                for name in SYSTEMS:
                    seconds, outputs[name] = systems[name].run(lines, 5, args.batch)
                    times[name].append(seconds)
                    bleu[name] = sacrebleu.corpus_bleu(outputs[name], [refs]).score
            # the same sentences in other company: how many translations change with the batch size
            changed = {name: sum(a != b for a, b in zip(outputs[name], systems[name].run(lines, 5, OTHER_BATCH)[1]))
                       for name in SYSTEMS}
        finally:
            for system in systems.values():
                system.close()
    speed = {name: len(lines) / min(ts) for name, ts in times.items()}
    res.update(bleu=bleu, sent_per_s=speed, load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    res[f"changed_at_batch_{OTHER_BATCH}"] = changed
    res["ratios"] = {
        "tfcli int8 / tfcli fp32": speed["tfcli int8"] / speed["tfcli fp32"],
        "tfcli int8 / CT2 int8": speed["tfcli int8"] / speed["CT2 int8"],
        "CT2 int8 / CT2 fp32": speed["CT2 int8"] / speed["CT2 fp32"],
    }
    md = [
        "# int8 on the CPU: tfcli and CTranslate2, Multi30k test2016 de->en", "",
        f"CPU: {res['cpu']}, {args.threads} threads; {len(lines)} sentences, beam 5, batch {args.batch}, length "
        f"penalty 0; best of {args.repeats}; {res['date']}. Checkpoint `{res['checkpoint']}`. Written by "
        "`benchmarks/int8_speed.py`.", "",
        f"| system | sacreBLEU | sentences/s | translations that differ at batch {OTHER_BATCH} |",
        "| --- | ---: | ---: | ---: |",
        *[f"| {name} | {bleu[name]:.2f} | {speed[name]:.1f} | {changed[name]} of {len(lines)} |" for name in SYSTEMS],
        "",
        *[f"- {k}: {v:.2f}x" for k, v in res["ratios"].items()],
        f"- BLEU, tfcli int8 - fp32: {bleu['tfcli int8'] - bleu['tfcli fp32']:+.2f}", "",
        "Targets (issue 18): " + "; ".join(
            f"{what} {'met' if ok else 'NOT met'}" for what, ok in (
                ("int8 >= 1.5x tfcli fp32", res["ratios"]["tfcli int8 / tfcli fp32"] >= 1.5),
                ("int8 >= 0.8x CT2 int8", res["ratios"]["tfcli int8 / CT2 int8"] >= 0.8),
                ("BLEU within 0.5 of fp32", abs(bleu["tfcli int8"] - bleu["tfcli fp32"]) <= 0.5),
            )
        ) + ".", "",
        f"Command: `{res['command']}`.", "",
        f"Load average at start {res['load_average_at_start']}, at end {res['load_average_at_end']}.", "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
