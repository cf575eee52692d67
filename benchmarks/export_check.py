"""Trained Multi30k models through `tfcli export` and `tfcli import`: the same outputs, and int8 beside float32.

    .venv/bin/python benchmarks/export_check.py CKPT [CKPT ...] [--threads N] [--data ../shared/data]

For each checkpoint (trained de->en models: the recipes give pre-norm ones; a post-norm one comes from
`--set model.norm=post`), on the 1,000 German sentences of test2016:
  - CTranslate2, float32: `tfcli export --to ctranslate2`; the share of sentences whose 1-best is the same as
    `tfcli translate`'s, with beam 5 and greedy (alpha 0 in both: they define the length penalty differently, and
    both rank by summed log-probability without it; at most MAX_LEN output tokens in both, since CTranslate2 has
    one length limit per batch where tfcli has one per sentence (1.2 x source + 10 by default));
  - transformers: `tfcli export --to hf`; the largest |logit| difference from tfcli over the test sentences,
    teacher-forced with tfcli's greedy translations, in batches of 50;
  - import(export): `tfcli import` of that directory gives back every weight bit for bit;
  - int8: `--dtype int8`: BLEU (sacreBLEU, beam 5, alpha 0) beside float32's, and sentences/s of tfcli
    float32, CTranslate2 float32 and CTranslate2 int8, beam 5 at batch 64, each system in a process of its own
    (benchmarks/common.py: Isolated), best of --repeats, the systems interleaved.
Results: benchmarks/results/export_check.{json,md}, with the CPU named.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import SHARED_DATA, CT2System, Isolated, TfcliSystem, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"


def same(a: list[str], b: list[str]) -> float:
    return sum(x == y for x, y in zip(a, b)) / len(a)


def hf_logit_difference(ckpt: str, hf_dir: Path, lines: list[str], hyps: list[str]) -> float:
    from transformers import AutoModelForSeq2SeqLM

    from tfcli import checkpoint
    from tfcli.data import pad, source_ids
    from tfcli.data import encode_batch
    from tfcli.specials import BOS_ID, EOS_ID, PAD_ID

    model, meta = checkpoint.load(ckpt)
    hf = AutoModelForSeq2SeqLM.from_pretrained(hf_dir).eval()
    src_ids = encode_batch(checkpoint.tokenizer(meta, "src"), lines)
    tgt_ids = encode_batch(checkpoint.tokenizer(meta, "tgt"), hyps)
    worst = 0.0
    with torch.inference_mode():
        for i in range(0, len(lines), 50):
            src = pad([source_ids(s) for s in src_ids[i : i + 50]])
            tgt = pad([[BOS_ID] + t + [EOS_ID] for t in tgt_ids[i : i + 50]])
            ours = model(src, tgt)
            theirs = hf(input_ids=src, attention_mask=(src != PAD_ID).long(), decoder_input_ids=tgt).logits
            real = (tgt != PAD_ID)[..., None]  # positions past a target's end are padding in both
            worst = max(worst, float(((ours - theirs).abs() * real).max()))
    return worst


def import_is_exact(ckpt: str, hf_dir: Path, tmp: Path) -> bool:
    from tfcli import checkpoint
    from tfcli.interop import import_model

    import_model(hf_dir, tmp / "imported")
    a, _ = checkpoint.load(ckpt)
    b, _ = checkpoint.load(tmp / "imported")
    sa, sb = a.state_dict(), b.state_dict()
    return a.cfg == b.cfg and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def check(ckpt: str, args, tmp: Path) -> dict:
    import sacrebleu

    from tfcli import checkpoint_meta
    from tfcli.interop import export

    data = Path(args.data) / "multi30k"
    lines = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    refs = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    cfg = checkpoint_meta.model_config(checkpoint_meta.read_meta(ckpt))
    out = {"checkpoint": str(checkpoint_meta.resolve(ckpt)), "norm": cfg.norm, "sentences": len(lines)}
    dirs = {"fp32": tmp / "ct2", "int8": tmp / "ct2-int8", "hf": tmp / "hf"}
    t = time.perf_counter()
    export(ckpt, "ctranslate2", dirs["fp32"])
    out["export_ctranslate2_s"] = time.perf_counter() - t
    export(ckpt, "ctranslate2", dirs["int8"], quantization="int8")
    export(ckpt, "hf", dirs["hf"])
    systems = {"tfcli": Isolated("tfcli", TfcliSystem, ckpt, args.threads, threads=args.threads),
               "ct2": Isolated("ct2", CT2System, str(dirs["fp32"]), args.threads, threads=args.threads),
               "ct2-int8": Isolated("ct2-int8", CT2System, str(dirs["int8"]), args.threads, threads=args.threads)}
    try:
        outputs = {}
        for beam in (5, 1):
            for name in ("tfcli", "ct2"):
                outputs[(name, beam)] = systems[name].run(lines, beam, args.batch)[1]
            out[f"ct2_same_1best_beam{beam}"] = same(outputs[("tfcli", beam)], outputs[("ct2", beam)])
        outputs[("ct2-int8", 5)] = systems["ct2-int8"].run(lines, 5, args.batch)[1]
        out["bleu_beam5_alpha0"] = {name: sacrebleu.corpus_bleu(outputs[(name, 5)], [refs]).score
                                   for name in ("tfcli", "ct2", "ct2-int8")}
        times = {name: [] for name in systems}
        for _ in range(args.repeats):
            for name, system in systems.items():
                times[name].append(system.run(lines, 5, args.batch)[0])
        out["sent_per_s_beam5"] = {name: len(lines) / min(ts) for name, ts in times.items()}
        out["int8_over_fp32_ct2"] = out["sent_per_s_beam5"]["ct2-int8"] / out["sent_per_s_beam5"]["ct2"]
    finally:
        for system in systems.values():
            system.close()
    out["hf_max_logit_difference"] = hf_logit_difference(ckpt, dirs["hf"], lines, outputs[("tfcli", 1)])
    out["import_of_hf_export_is_exact"] = import_is_exact(ckpt, dirs["hf"], tmp)
    return out


def markdown(res: dict) -> str:
    lines = ["# Export check: trained Multi30k de->en models through `tfcli export` / `tfcli import`", "",
             f"CPU: {res['cpu']}, {res['threads']} threads; test2016 ({res['checkpoints'][0]['sentences']} sentences); "
             f"batch {res['batch']}. "
             "Written by `benchmarks/export_check.py` (its docstring says how each figure is taken).", "",
             "| checkpoint | norm | same 1-best as tfcli, CT2 fp32 (beam 5 / greedy) | HF max logit diff | "
             "import(export) exact | BLEU tfcli / CT2 fp32 / CT2 int8 (beam 5, alpha 0) | sent/s tfcli / CT2 fp32 / "
             "CT2 int8 (beam 5) | int8 / fp32 (CT2) |",
             "| --- | --- | ---: | ---: | --- | --- | --- | ---: |"]
    for r in res["checkpoints"]:
        b, s = r["bleu_beam5_alpha0"], r["sent_per_s_beam5"]
        lines.append(
            f"| `{r['checkpoint']}` | {r['norm']} | {100 * r['ct2_same_1best_beam5']:.1f}% / "
            f"{100 * r['ct2_same_1best_beam1']:.1f}% | {r['hf_max_logit_difference']:.1e} | "
            f"{'yes' if r['import_of_hf_export_is_exact'] else 'NO'} | {b['tfcli']:.2f} / {b['ct2']:.2f} / "
            f"{b['ct2-int8']:.2f} | {s['tfcli']:.1f} / {s['ct2']:.1f} / {s['ct2-int8']:.1f} | "
            f"{r['int8_over_fp32_ct2']:.2f}x |")
    lines += ["", "Targets (issue 17): the same 1-best on at least 99.5% with beam 5 and the same greedy output; HF "
              "logits within 1e-4; import(export) exact; int8 BLEU within 0.5 of float32."]
    for r in res["checkpoints"]:
        b = r["bleu_beam5_alpha0"]
        met = (r["ct2_same_1best_beam5"] >= 0.995, r["hf_max_logit_difference"] < 1e-4,
               r["import_of_hf_export_is_exact"], abs(b["ct2-int8"] - b["ct2"]) <= 0.5)
        lines.append(f"- {r['norm']}-norm: " + ", ".join(
            f"{name} {'met' if ok else 'NOT met'}" for name, ok in zip(("beam 5 agreement", "HF logits", "import",
                                                                        "int8 BLEU"), met))
            + f"; greedy agreement {100 * r['ct2_same_1best_beam1']:.1f}%")
    load = res["load_average"]
    lines += ["", f"Load average at start {load['start']}, at end {load['end']} (the machine may have been shared).", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--out", default=str(RESULTS / "export_check"))
    args = p.parse_args()
    import transformers

    transformers.logging.set_verbosity_error()
    res = {"cpu": cpu_name(), "threads": args.threads, "batch": args.batch, "repeats": args.repeats,
           "load_average": {"start": [round(x, 2) for x in os.getloadavg()]}, "checkpoints": []}
    for ckpt in args.checkpoints:
        print(f"{ckpt} ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            res["checkpoints"].append(check(ckpt, args, Path(tmp)))
    res["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    write_results(args.out, res, markdown(res))


if __name__ == "__main__":
    main()
