"""Compare two runs of translate_speed.py or lm_generate_speed.py (e.g. before and after a change to the decoder) on
one machine: tfcli's throughput in each, with Hugging Face's as the control for how fast the machine was.

    python benchmarks/compare.py BEFORE.json AFTER.json --label "before (abc123)" --label "after (def456)" --out OUT

writes OUT.md and OUT.json. A change is a regression where tfcli's after/before ratio falls clearly below HF's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import write_results


def rows(report: dict) -> dict[tuple, dict]:
    """{(batch size, decoding): {"tfcli": throughput, "hf": throughput, "unit": ...}} from either benchmark's JSON."""
    runs = report["synthetic"]["runs"] if "synthetic" in report else report["bench"]["runs"]
    out = {}
    for run in runs:
        for mode, m in run.items():
            if not isinstance(m, dict) or "tfcli" not in m:
                continue
            unit = "sent_per_s" if "sent_per_s" in m["tfcli"] else "new_tok_per_s"
            out[(run["batch_size"], mode)] = {"tfcli": m["tfcli"][unit], "hf": m["hf"][unit], "unit": unit}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("--label", action="append", default=[], help="names of the two runs (twice)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    labels = args.label if len(args.label) == 2 else ["before", "after"]
    reports = [json.loads(Path(f).read_text()) for f in (args.before, args.after)]
    a, b = (rows(r) for r in reports)
    table = []
    for key in a:
        if key in b:
            ra, rb = a[key], b[key]
            table.append({
                "batch_size": key[0], "decoding": key[1], "unit": ra["unit"],
                "tfcli_before": ra["tfcli"], "tfcli_after": rb["tfcli"], "tfcli_ratio": rb["tfcli"] / ra["tfcli"],
                "hf_before": ra["hf"], "hf_after": rb["hf"], "hf_ratio": rb["hf"] / ra["hf"],
            })
    machine = {k: reports[1].get(k) for k in ("cpu", "nproc", "torch", "threads")}
    dates = [r.get("date") for r in reports]
    result = {"before": {"label": labels[0], "file": args.before, "date": dates[0]},
              "after": {"label": labels[1], "file": args.after, "date": dates[1]}, "machine": machine, "rows": table}
    unit = table[0]["unit"].replace("_per_s", "/s").replace("_", " ") if table else ""
    lines = [
        f"# {labels[0]} vs {labels[1]}", "",
        f"Machine: {machine['nproc']} CPUs ({machine['cpu']}), torch {machine['torch']}, threads {machine['threads']}. "
        f"Runs: {dates[0]} ({args.before}) and {dates[1]} ({args.after}).", "",
        f"Throughput in {unit}, best of each run's repeats. HF's ratio is the control: it shows how much the "
        "machine's speed moved between the runs.", "",
        "| batch size | decoding | tfcli before | tfcli after | tfcli after/before | HF after/before |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in table:
        lines.append(f"| {r['batch_size']} | {r['decoding']} | {r['tfcli_before']:.1f} | {r['tfcli_after']:.1f} | "
                     f"{r['tfcli_ratio']:.3f} | {r['hf_ratio']:.3f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out, result, "\n".join(lines) + "\n", quiet=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
