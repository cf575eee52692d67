"""Collect what the recipes measured into benchmarks/results/recipes.{json,md}.

    python3 benchmarks/recipe_results.py record multi30k OUT --pair de-en --size cpu --checkpoint CKPT
    python3 benchmarks/recipe_results.py record lm OUT --name shakespeare-char --size cpu [--ppl OUT/ppl.json]
    python3 benchmarks/recipe_results.py record demo OUT --size cpu --wall-s SECONDS
    python3 benchmarks/recipe_results.py table          # rewrite recipes.md (and the blocks in README.md and docs/recipes.md) from recipes.json

The recipes (recipes/*.sh) call `record` as their last step. It reads the run directory (OUT/run: metrics.jsonl,
config.yaml) and the score files the recipe wrote, adds the hardware, writes OUT/result.json, and merges that entry
into benchmarks/results/recipes.json under "NAME/SIZE" (an entry is replaced only by a new run of the same recipe).
Every figure comes from those files; nothing is typed in by hand. The recipe table (docs/recipes.md) and the README's
demo sentence and table of the recipes as they ship are rewritten from recipes.json at the same time (between their
<!-- recipes:... -->, <!-- demo:... --> and <!-- current:... --> markers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import yaml

from common import cpu_name, fell_back_to_fp32, portable, trained_precision
from tfcli.io import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
# TFCLI_RECIPE_RESULTS=DIR: record into DIR/recipes.{json,md} and leave the README alone (benchmarks/gpu_all.sh's
# toy-size check on the CPU, whose runs must not enter the committed results)
RESULTS_DIR = os.environ.get("TFCLI_RECIPE_RESULTS")
RESULTS = (Path(RESULTS_DIR) if RESULTS_DIR else ROOT / "benchmarks" / "results") / "recipes"
README = ROOT / "README.md"
# Published figures the recipes are compared with, in the metric the recipe records beside its own.
ANCHORS = {
    "multi30k-de-en": ("36.52 lowercased tokenised BLEU: bentrevett/pytorch-seq2seq's Transformer tutorial (3+3 x 256, "
                       "10 epochs, greedy; spaCy tokens, where ours are Moses tokens)", "tokenised_bleu_lowercased"),
    # its data (LividWo/Revisit-MMT's data/multi30k-en-de) is lowercased and Moses-tokenised before BPE, and its BLEU
    # is over that text: its test2016 reference (12,103 tokens) is ours lowercased, 999 of the 1,000 lines identical
    "multi30k-en-de": ("41.02 lowercased tokenised BLEU: fairseq `transformer_tiny` (Wu et al. 2021 baseline, "
                       "trained and scored on lowercased text; last 10 checkpoints averaged, beam 5)",
                       "tokenised_bleu_lowercased"),
    "shakespeare-char": ("1.88 valid loss: nanoGPT, the same shapes, 2000 iterations (an estimate from 20 batches; "
                         "ours is over the whole split)", None),
    # NAME/SIZE: where a size has its own anchor
    "shakespeare-char/full": ("1.4697 valid loss: nanoGPT's baby GPT, the same shapes, 5000 iterations, about 3 "
                              "minutes on an A100", None),
}


def anchor(e: dict) -> tuple[str, str | None]:
    return ANCHORS.get(f"{e['name']}/{e['size'].split()[0]}") or ANCHORS.get(e["name"], ("", None))


def hardware() -> dict:
    import torch

    hw = {"cpu": cpu_name(), "cpus": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}
    if torch.cuda.is_available():
        hw["gpu"] = torch.cuda.get_device_name(0)
    hw["load_average"] = [round(x, 2) for x in os.getloadavg()]
    return hw



def training(run: Path) -> dict:
    """Steps, wall time (seconds from start to the last log or validation line) and the validations of a run."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [x for x in lines if x["split"] == "train"]
    valid = [x for x in lines if x["split"] == "valid"]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    out = {
        "steps": max(x["step"] for x in lines),
        "epochs": max(x["epoch"] for x in lines if "epoch" in x),
        "wall_s": max(x["time"] for x in lines),
        "median_tgt_tokens_per_s": sorted(x["tgt_tokens_per_s"] for x in train)[len(train) // 2] if train else None,
        "valid": [{k: x[k] for k in ("step", "loss", "ppl", "bleu") if k in x} for x in valid],
        "config": cfg,
    }
    if valid:
        out["best_valid_loss"] = min(x["loss"] for x in valid)
    return out


def _bleu(path: Path) -> dict:
    d = json.loads(path.read_text())
    scores = d["systems"][0]["scores"]
    return {name: {"score": s["score"], "signature": d["signatures"][name]} for name, s in scores.items()}


def record(args) -> dict:
    out = Path(args.out)
    # a variant of the recipe: another vocabulary, BPE size or seed than its own, extra training arguments
    variant = " ".join(filter(None, [f"VOCAB={args.vocab}" if args.vocab else "", f"BPE={args.bpe}" if args.bpe else "",
                                     f"SEED={args.seed}" if args.seed else "", "LOWERCASE=1" if args.lowercase else "",
                                     args.train_args.strip()]))
    size = args.size
    precision = trained_precision(out / "run")
    if fell_back_to_fp32(out / "run"):
        size += " (fp32)"  # a CPU without native bf16: its own entry, beside the bf16 one
    entry = {
        "recipe": args.recipe, "name": args.name or f"{args.recipe}-{args.pair}",
        "size": f"{size} ({variant})" if variant else size,
        "precision": precision,
        "date": time.strftime("%Y-%m-%d %H:%M"), "out": str(out), "hardware": hardware(),
    }
    if (out / "run" / "metrics.jsonl").exists():
        entry["training"] = training(out / "run")
    if args.checkpoint:
        entry["checkpoint"] = args.checkpoint
    if getattr(args, "busy_cores", None) is not None:
        entry["busy_cores_before"] = args.busy_cores  # other work's cores when the recipe started
    if args.resumed:
        entry["resumed"] = True  # the script's clock saw only the last part; training time comes from the run
    elif args.wall_s is not None:
        entry["recipe_wall_s"] = args.wall_s  # the whole recipe, as timed by its script
    if args.len_penalty is not None:
        entry["len_penalty"] = args.len_penalty  # chosen on the valid split
    if (out / "valid_len_penalty.tsv").exists():  # the valid scores it was chosen by: beam 5, sacreBLEU
        entry["valid_sacrebleu_by_len_penalty"] = {
            f"{float(alpha):g}": float(bleu) for alpha, bleu in (line.split("\t") for line in
                                                   (out / "valid_len_penalty.tsv").read_text().splitlines())}
    if args.recipe == "demo":
        entry["sacrebleu"] = _bleu(out / "sacrebleu.json")
    if args.recipe == "multi30k":
        entry["pair"] = args.pair
        entry["sacrebleu"] = _bleu(out / "sacrebleu.json")
        entry["tokenised_bleu"] = _bleu(out / "tokbleu.json")["BLEU"]
        if (out / "tokbleu-lc.json").exists():
            entry["tokenised_bleu_lowercased"] = _bleu(out / "tokbleu-lc.json")["BLEU"]
    if args.ppl:
        entry["perplexity"] = json.loads(Path(args.ppl).read_text())
    atomic_write_text(out / "result.json", json.dumps(entry, indent=2) + "\n")
    merge(entry)
    return entry


def record_distill(args) -> dict:
    """recipes/distill.sh's run as one entry: its teacher's and student's recorded runs (OUT/teacher,
    OUT/student*/result.json, which `record` wrote), the speed benchmark's figures, and the whole run's time."""
    out = Path(args.out)
    sides = {"teacher": out / "teacher", "student": out / f"student{args.tag}"}
    entry = {"recipe": "distill", "name": f"distill{args.tag}-{args.pair}", "size": args.size,
             "pair": args.pair, "date": time.strftime("%Y-%m-%d %H:%M"), "hardware": hardware()}
    for who, run in sides.items():
        e = json.loads((run / "result.json").read_text())
        model = e["training"]["config"]["model"]
        entry[who] = {
            "recipes_key": f"{e['name']}/{e['size']}", "steps": e["training"]["steps"],
            "layers": f"{model['n_encoder_layers']}+{model['n_decoder_layers']} x {model['d_model']}",
            "parameters": _parameters(model), "len_penalty": e.get("len_penalty"),
            "valid_sacrebleu": max((e.get("valid_sacrebleu_by_len_penalty") or {"": None}).values()),
            "test_sacrebleu": e["sacrebleu"]["BLEU"]["score"], "recipe_wall_s": e.get("recipe_wall_s"),
        }
    speed = json.loads(Path(args.speed).read_text())
    entry["speed"] = {k: speed[k] for k in ("sent_per_s", "bleu", "batch", "threads", "cpu", "date")}
    # teacher, translation of train, student and the speed benchmark; a teacher trained earlier adds its recipe's time
    entry["whole_wall_s"] = args.wall_s + (entry["teacher"]["recipe_wall_s"] if args.add_teacher_time else 0)
    merge(entry)
    return entry


def _parameters(model: dict) -> int:
    from tfcli.model import ModelConfig, build_model, count_parameters

    return count_parameters(build_model(ModelConfig(**model)))


def merge(entry: dict) -> None:
    path = RESULTS.with_suffix(".json")
    all_ = json.loads(path.read_text()) if path.exists() else {}
    all_[f"{entry['name']}/{entry['size']}"] = entry
    atomic_write_text(path, portable(json.dumps(dict(sorted(all_.items())), indent=2)) + "\n")
    atomic_write_text(RESULTS.with_suffix(".md"), portable(table(all_)))
    if not RESULTS_DIR:
        update_readme(all_)


def _minutes(s: float) -> str:
    return f"{s / 60:.1f} min"


def _score(s: dict | None) -> str:
    return f"{s['score']:.2f}" if s else "–"


def _valid(e: dict) -> str:
    """The valid sacreBLEU at the chosen length penalty, where the run recorded its choice."""
    scores = e.get("valid_sacrebleu_by_len_penalty")
    chosen = f"{e['len_penalty']:g}" if "len_penalty" in e else None
    return f"{scores[chosen]:.2f}" if scores and chosen in scores else "–"


def _wall(e: dict) -> str:
    if e.get("resumed"):
        return "(resumed)"
    return _minutes(e["recipe_wall_s"]) if e.get("recipe_wall_s") is not None else "(not timed)"


def _machine(hw: dict) -> str:
    return hw.get("gpu") or f"{hw['cpus']}-core {hw['cpu']}"


def table(all_: dict) -> str:
    lines = ["# Recipe results", "",
             "Written by `benchmarks/recipe_results.py` from the runs of `recipes/*.sh`; every figure is read from the "
             "run's own files (metrics.jsonl, the `tfcli eval --json` outputs). \"training\" is the training run "
             "alone (validations included); \"whole recipe\" is the script from start to end (prepare, train, "
             "translate, score), as it timed itself.", ""]
    demo = [e for e in all_.values() if e["recipe"] == "demo"]
    if demo:
        lines += ["## Demo (`make demo`: data/numbers, English -> French number words, 500 test sentences, beam 5)", "",
                  "| sacreBLEU | chrF2 | steps | training | whole recipe | machine | date |",
                  "| ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for e in demo:
            t = e.get("training", {})
            lines.append(
                f"| {e['sacrebleu']['BLEU']['score']:.2f} | {e['sacrebleu']['chrF2']['score']:.2f} | "
                f"{t.get('steps', '')} | {_minutes(t['wall_s']) if t else ''} | {_wall(e)} | "
                f"{_machine(e['hardware'])} | {e['date']} |"
            )
        lines.append("")
    mt = [e for e in all_.values() if e["recipe"] == "multi30k"]
    if mt:
        lines += ["## Multi30k test2016, beam 5", "",
                  "cpu: the checkpoint with the best validation BLEU; cpu-long: the average of the last 3; full: "
                  "the average of the last 5 (as each row's checkpoint in recipes.json says). "
                  "Length penalty (alpha): chosen on the valid split by the recipe (valid: its sacreBLEU there, "
                  "beam 5, where the run recorded it). lc tok. BLEU: tokenised BLEU, lowercased (the metric of "
                  "both Multi30k anchors: the small-Transformer tutorial's de->en and fairseq transformer_tiny's "
                  "en->de, whose text was lowercased before training). Rows named LOWERCASE=1 were trained on "
                  "lowercased text (`tfcli prepare --lowercase`): every score of theirs is lowercased, sacreBLEU "
                  "and chrF2 included (their signatures say case:lc).", "",
                  "| pair | size | sacreBLEU | chrF2 | tokenised BLEU | lc tok. BLEU | alpha | valid | steps | "
                  "training | whole recipe | machine | date |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for e in mt:
            t = e.get("training", {})
            lines.append(
                f"| {e['pair']}{_student(e)} | {e['size']} | {e['sacrebleu']['BLEU']['score']:.2f} | "
                f"{e['sacrebleu'].get('chrF2', {}).get('score', float('nan')):.2f} | {e['tokenised_bleu']['score']:.2f} | "
                f"{_score(e.get('tokenised_bleu_lowercased'))} | {e.get('len_penalty', 0.6):g} | {_valid(e)} | "
                f"{t.get('steps', '')} | "
                f"{_minutes(t['wall_s']) if t else ''} | {_wall(e)} | {_machine(e['hardware'])} | {e['date']} |"
            )
        sigs = sorted({s["signature"] for e in mt for s in e["sacrebleu"].values()})
        lines += ["", "Signatures: " + "; ".join(f"`{s}`" for s in sigs),
                  "Tokenised BLEU: hypotheses and references Moses-tokenised (sacremoses), then BLEU with "
                  f"`{mt[0]['tokenised_bleu']['signature']}`.", ""]
    distilled = [e for e in all_.values() if e["recipe"] == "distill"]
    if distilled:
        lines += ["## Distillation (recipes/distill.sh)", "", *distill_table(distilled), ""]
    if multilingual_table(all_):
        lines += ["## One model for several directions (recipes/multi30k-multi.sh)", "", *multilingual_table(all_), ""]
    if decoder_table(all_):
        lines += ["## Decoder-only translators (MODEL=decoder recipes/multi30k.sh)", "", *decoder_table(all_), ""]
    lm = [e for e in all_.values() if e["recipe"] == "lm"]
    if lm:
        lines += ["## Language models", "",
                  "| recipe | size | best valid loss | held-out perplexity | steps | training | machine | date |",
                  "| --- | --- | ---: | --- | ---: | ---: | --- | --- |"]
        for e in lm:
            t, p = e.get("training", {}), e.get("perplexity")
            ppl = ""
            if p:
                ppl = f"{p['ppl']:.2f} per token" + (f", {p['word_ppl']:.2f} per word" if p.get("word_ppl") else "")
                ppl += f" ({p['split']}, {p['tokens']:,} tokens)"
            loss = f"{t['best_valid_loss']:.4f}" if t.get("best_valid_loss") is not None else ""
            lines.append(
                f"| {e['name']} | {e['size']} | {loss} | {ppl} | {t.get('steps', '')} | "
                f"{_minutes(t['wall_s']) if t else ''} | {_machine(e['hardware'])} | {e['date']} |"
            )
        lines.append("")
    lines += ["Load average when each entry was recorded (a shared machine runs slower): "
              + "; ".join(f"{k}: {e['hardware']['load_average']}" for k, e in all_.items()), ""]
    return "\n".join(lines)


def _lowercased(e: dict) -> bool:
    """A run scored lowercased throughout (`LOWERCASE=1`: its text was lowercased before training)."""
    return "case:lc" in e["sacrebleu"]["BLEU"]["signature"]


# the sizes the recipes ship with (an entry of one of these, or of it " (fp32)", is the recipe as it is today: the
# rows of an earlier config are renamed by their differences from the current one)
SHIPPED = re.compile(r"(cpu|cpu-long|full)( \(fp32\))?")


def _student(e: dict) -> str:
    """What sets a Multi30k run apart from the recipe's own: a distilled student (recipes/distill.sh names it), or
    one multilingual model's direction (recipes/multi30k-multi.sh; -zs: its zero-shot run), or a decoder-only
    translator (recipes/multi30k-decoder-cpu-long.yaml)."""
    if e["name"].startswith("multi30k-distill"):  # (multi30k-distill[-teacher-size][-orig]-SRC-TGT)
        variant = e["name"][len("multi30k-distill"):-len("-xx-yy")]
        return " distilled student" + {"": "", "-teacher-size": " of the teacher's size", "-orig": " (with the "
                                       "original pairs)", "-teacher-size-orig": " of the teacher's size (with the "
                                       "original pairs)"}.get(variant, f" ({variant.lstrip('-')})")
    if e["name"].startswith("multi30k-decoder"):  # (multi30k-decoder[-prefix]-SRC-TGT)
        return " decoder-only translator" + (" (prefix attention)" if "-prefix-" in e["name"] else " (causal)")
    if e["name"].startswith("multi30k-multi"):
        return " one multilingual model" + (" (zero-shot run)" if e["name"].startswith("multi30k-multi-zs") else "")
    return ""


def _row(e: dict) -> str:
    """One recipe table row: what ran, its test result, the anchor, the whole recipe's time, the machine."""
    t = e.get("training", {})
    if e["recipe"] == "multi30k":
        what = f"Multi30k {e['pair'].replace('-', '->')}{_student(e)}, `{e['size']}`, {t.get('steps', '?')} steps"
        bleu, tok = e["sacrebleu"]["BLEU"]["score"], e["tokenised_bleu"]["score"]
        if _lowercased(e):  # trained on lowercased text: every score is lowercased
            ours = f"lowercased: {bleu:.2f} sacreBLEU, {tok:.2f} tokenised BLEU"
        else:
            lc = e.get("tokenised_bleu_lowercased")
            ours = f"{bleu:.2f} sacreBLEU, {tok:.2f} tokenised BLEU"
            ours += f", {lc['score']:.2f} lowercased tokenised" if lc else ""
    else:
        p = e.get("perplexity") or {}
        ours = f"valid loss {t['best_valid_loss']:.3f}" if t.get("best_valid_loss") is not None else ""
        if p.get("word_ppl"):
            ours += f"; {p['split']} perplexity {p['word_ppl']:.0f} per word"
        what = f"{e['name']}, `{e['size']}`, {t.get('steps', '?')} steps"
    anchor_text = anchor(e)[0] or "–"
    time_ = _wall(e) if e.get("recipe_wall_s") is not None else f"(training {_minutes(t['wall_s'])})" if t else ""
    return f"| {what} | {ours} | {anchor_text} | {time_} | {_machine(e['hardware'])}, {e['date'][:10]} |"


def _line(e: dict) -> str:
    """One shipped recipe in a line: its test result, steps, the whole recipe's time, the machine."""
    t = e.get("training", {})
    if e["recipe"] == "multi30k":
        what = f"Multi30k {e['pair'].replace('-', '->')}{_student(e)} `{e['size']}`"
        lc = e.get("tokenised_bleu_lowercased")
        ours = f"{e['sacrebleu']['BLEU']['score']:.2f} sacreBLEU" + (
            f", {lc['score']:.2f} lowercased tokenised BLEU" if lc and not _lowercased(e) else "") + " on test2016"
    else:
        what = f"{e['name']} `{e['size']}`"
        p = e.get("perplexity") or {}
        ours = f"valid loss {t['best_valid_loss']:.3f}" if t.get("best_valid_loss") is not None else ""
        ours += f"; {p['split']} perplexity {p['word_ppl']:.0f} per word" if p.get("word_ppl") else ""
    time_ = _wall(e) if e.get("recipe_wall_s") is not None else f"training {_minutes(t['wall_s'])}" if t else ""
    return f"- {what}: {ours} ({t.get('steps', '?')} steps, {time_}; {_machine(e['hardware'])}, {e['date'][:10]})"


def distill_table(entries: list[dict]) -> list[str]:
    """Teacher against student: BLEU on valid (the length penalty each chose) and test2016 (sacreBLEU, beam 5), the
    speed of each at batch 64 in int8 (beam 5), the student's speed over the teacher's in CTranslate2 int8."""
    rows = ["| pair | budget | teacher | student | valid: teacher / student | test2016: teacher / student "
            "(student - teacher) | beam 5 int8 sent/s: teacher / student | student / teacher in CT2 int8 | "
            "whole run | machine |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | ---: | --- |"]
    for e in entries:
        t, st, sp = e["teacher"], e["student"], e["speed"]["sent_per_s"]
        fast = {who: sp[f"{who} int8 / beam 5"] for who in ("teacher", "student")}
        ct2 = sp.get("teacher CT2 int8 / beam 5")
        over_ct2 = f"{fast['student'] / ct2:.2f}x" if ct2 else "–"
        # the teacher's own variant where it is not the budget's recipe (a seed, R-Drop before it was the default)
        variant = t["recipes_key"].split("/", 1)[1].removeprefix(e["size"]).strip()
        rows.append(
            f"| {e['pair'].replace('-', '->')} | `{e['size']}` | {t['layers']}, {t['parameters'] / 1e6:.2f}M, "
            f"{t['steps']} steps{' ' + variant if variant else ''} | "
            f"{st['layers']}, {st['parameters'] / 1e6:.2f}M, {st['steps']} steps | "
            f"{t['valid_sacrebleu']:.2f} / {st['valid_sacrebleu']:.2f} | {t['test_sacrebleu']:.2f} / "
            f"{st['test_sacrebleu']:.2f} ({st['test_sacrebleu'] - t['test_sacrebleu']:+.2f}) | "
            f"{fast['teacher']:.0f} / {fast['student']:.0f} ({fast['student'] / fast['teacher']:.2f}x) | "
            f"{over_ct2} | {_minutes(e['whole_wall_s'])} | "
            f"{_machine(e['hardware'])}, {e['date'][:10]} |")
    return rows


def multilingual_table(all_: dict) -> list[str]:
    """Each direction of a multilingual run (recipes/multi30k-multi.sh) beside the bilingual recipe of its budget
    (its latest run of the same size, where there is one): test2016 sacreBLEU, beam 5."""
    multi = [e for e in all_.values() if e["recipe"] == "multi30k" and e["name"].startswith("multi30k-multi")]
    if not multi:
        return []
    rows = ["| direction | run | valid | test2016 | bilingual recipe, same budget | multilingual - bilingual | steps | "
            "whole run | machine |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for e in sorted(multi, key=lambda e: (e["name"].startswith("multi30k-multi-zs"), e["size"], e["pair"])):
        budget = e["size"].split(" ")[0]
        bilingual = [b for b in all_.values() if b["recipe"] == "multi30k" and b["name"] == f"multi30k-{e['pair']}"
                     and b["size"].removesuffix(" (fp32)") == budget]
        ours = e["sacrebleu"]["BLEU"]["score"]
        b = max(bilingual, key=lambda b: b["date"]) if bilingual else None
        theirs = f"{b['sacrebleu']['BLEU']['score']:.2f}" if b else "–"
        diff = f"{ours - b['sacrebleu']['BLEU']['score']:+.2f}" if b else "–"
        zs_run = e["name"].startswith("multi30k-multi-zs")  # (ZERO_SHOT: some directions not trained)
        zero = zs_run and not e.get("valid_sacrebleu_by_len_penalty")
        run = f"`{e['size']}`" + (", zero-shot" if zero else ", trained in the zero-shot run" if zs_run else "")
        rows.append(f"| {e['pair'].replace('-', '->')} | {run} | {_valid(e)} | {ours:.2f} | {theirs} | {diff} | "
                    f"{e.get('training', {}).get('steps', '')} | {_wall(e)} | {_machine(e['hardware'])}, "
                    f"{e['date'][:10]} |")
    return rows


def decoder_table(all_: dict) -> list[str]:
    """Each decoder-only translator's run (MODEL=decoder[-prefix] recipes/multi30k.sh) beside the encoder-decoder
    recipe of its pair and budget recorded on the same machine nearest in time (a shared machine's speed varies by
    the hour: the target tokens a second say what each run had): test2016, beam 5."""
    runs = [e for e in all_.values() if e["recipe"] == "multi30k" and e["name"].startswith("multi30k-decoder")]
    if not runs:
        return []
    rows = ["| direction | attention | test2016 sacreBLEU | lc tok. BLEU | steps | target tok/s | encoder-decoder "
            "(`cpu-long`, same machine) | its steps | its target tok/s | decoder-only - encoder-decoder | machine, "
            "date |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for e in sorted(runs, key=lambda e: (e["pair"], e["date"])):
        budget = e["size"].split(" ")[0]
        same = [b for b in all_.values() if b["recipe"] == "multi30k" and b["name"] == f"multi30k-{e['pair']}"
                and b["size"].removesuffix(" (fp32)") == budget and _machine(b["hardware"]) == _machine(e["hardware"])]
        b = min(same, key=lambda b: abs(_when(b) - _when(e))) if same else None
        t, ours = e.get("training", {}), e["sacrebleu"]["BLEU"]["score"]
        tb = b.get("training", {}) if b else {}
        rows.append(
            f"| {e['pair'].replace('-', '->')} | {'prefix' if '-prefix-' in e['name'] else 'causal'} | {ours:.2f} | "
            f"{_score(e.get('tokenised_bleu_lowercased'))} | {t.get('steps', '')} | "
            f"{t.get('median_tgt_tokens_per_s', 0):.0f} | "
            + (f"{b['sacrebleu']['BLEU']['score']:.2f} ({b['date']}) | {tb.get('steps', '')} | "
               f"{tb.get('median_tgt_tokens_per_s', 0):.0f} | {ours - b['sacrebleu']['BLEU']['score']:+.2f}" if b
               else "– | – | – | –")
            + f" | {_machine(e['hardware'])}, {e['date']} |")
    return rows


def _when(e: dict) -> float:
    return time.mktime(time.strptime(e["date"], "%Y-%m-%d %H:%M"))


def readme_blocks(all_: dict) -> dict[str, str]:
    """The blocks the documents hold, from recipes.json: `current` (README: each recipe as it ships, its latest
    run), `recipes` (docs/recipes.md: those and their one-option variants) and `demo` (README: the demo sentence)."""
    head = ["| recipe | result (test) | published anchor, same metric | whole recipe | machine |",
            "| --- | --- | --- | ---: | --- |"]
    rows = []
    for e in all_.values():
        # a variant of more than one option (another vocabulary, BPE size, seed, training argument) stays in recipes.md
        variant = re.search(r" \(((?:--|VOCAB=|BPE=|SEED=|LOWERCASE=).*)\)$", e["size"])
        # (the CPU recipes' earlier vocabulary, VOCAB=joint, counts as no option beside one other: their rows before)
        one = r"(VOCAB=joint )?(--set (model|train)\.\w+=[\w.]+|BPE=\d+|LOWERCASE=1)|VOCAB=\w+"
        if e["recipe"] in ("demo", "distill") or (variant and not re.fullmatch(one, variant.group(1))):
            continue
        rows.append(_row(e))
    # README: one line per shipped recipe, its latest run (in fp32 or in bf16, whichever CPU ran it last), Multi30k
    # in the directions README shows (the French ones are in docs/recipes.md); a distilled student's figures are
    # read beside its teacher's, in docs/recipes.md's distillation table
    latest: dict[tuple, dict] = {}
    for e in all_.values():
        student = e["name"].startswith("multi30k-distill")
        other_pair = e["recipe"] == "multi30k" and e["name"] not in ("multi30k-de-en", "multi30k-en-de")
        if e["recipe"] not in ("demo", "distill") and not student and not other_pair and SHIPPED.fullmatch(e["size"]):
            key = (e["recipe"] != "multi30k", e["name"], e["size"].removesuffix(" (fp32)"))
            if key not in latest or e["date"] > latest[key]["date"]:
                latest[key] = e
    blocks = {"recipes": "\n".join(head + rows), "current": "\n".join(_line(latest[k]) for k in sorted(latest)),
              "distill": "\n".join(distill_table([e for e in all_.values() if e["recipe"] == "distill"])),
              "multilingual": "\n".join(multilingual_table(all_)), "decoder": "\n".join(decoder_table(all_))}
    demo = all_.get("demo/cpu")
    if demo:
        busy = demo.get("busy_cores_before")
        state = "" if busy is None else (", idle" if busy < 0.25 else f", beside other work ({busy:.1f} cores busy)")
        blocks["demo"] = (f"Measured on {_machine(demo['hardware'])}{state}, {demo['date'][:10]}: "
                          f"{_minutes(demo['recipe_wall_s'])}, BLEU {demo['sacrebleu']['BLEU']['score']:.2f}, "
                          f"chrF2 {demo['sacrebleu']['chrF2']['score']:.2f}.")
    return blocks


def update_readme(all_: dict, path: Path | None = None) -> None:
    """Replace the text between <!-- NAME:begin --> and <!-- NAME:end --> by each block, in the README (the demo
    sentence, the shipped recipes' table) and in docs/recipes.md beside it (the recipe table with its variants): each
    document holds the markers of its blocks."""
    for doc in [path] if path else [README, README.parent / "docs" / "recipes.md"]:
        if not doc.exists():
            continue
        text = doc.read_text(encoding="utf-8")
        for name, block in readme_blocks(all_).items():
            begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
            if begin in text and end in text:
                head, rest = text.split(begin, 1)
                text = head + begin + "\n" + block + "\n" + end + rest.split(end, 1)[1]
        atomic_write_text(doc, text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("recipe", choices=["multi30k", "lm", "demo"])
    r.add_argument("out")
    r.add_argument("--name")
    r.add_argument("--pair")
    r.add_argument("--size", required=True)
    r.add_argument("--checkpoint")
    r.add_argument("--ppl", help="a `tfcli eval --model ... --json` output")
    r.add_argument("--wall-s", type=float, help="seconds the whole recipe took (its script times itself)")
    r.add_argument("--busy-cores", type=float, help="the cores other work kept busy as the recipe started (its "
                   "script measures them: tfcli.cli.process.busy_cores): whether the machine was idle")
    r.add_argument("--resumed", action="store_true", help="the recipe resumed a stopped run (--wall-s is then "
                   "only the last part, and is not recorded)")
    r.add_argument("--len-penalty", type=float, help="the length penalty used on test (chosen on valid)")
    r.add_argument("--vocab", choices=["joint", "separate"], help="the run's BPE vocabulary (one for both sides or "
                   "one a side), where it is not the recipe's own")
    r.add_argument("--bpe", type=int, help="the run's BPE size, where it is not the recipe's own")
    r.add_argument("--seed", type=int, help="the run's seed, where it is not the recipe's own")
    r.add_argument("--lowercase", action="store_true", help="the run was prepared with --lowercase (so scored)")
    r.add_argument("--train-args", default="", help="extra `tfcli train` arguments the run had (TRAIN_ARGS): such a "
                   "variant is recorded beside the recipe's own figures, not over them")
    d = sub.add_parser("distill", help="recipes/distill.sh's run (OUT) as one entry, after its parts are recorded")
    d.add_argument("out")
    d.add_argument("--pair", required=True)
    d.add_argument("--size", required=True, help="the budget (cpu, cpu-long, full) and its TRAIN_ARGS")
    d.add_argument("--add-teacher-time", action="store_true",
                   help="the teacher was trained before this run: add its recipe's time to the whole run's")
    d.add_argument("--tag", default="", help="the student's variant (-teacher-size, -orig), as distill.sh names it")
    d.add_argument("--speed", required=True, help="benchmarks/distill_speed.py's JSON for this run")
    d.add_argument("--wall-s", type=float, required=True, help="seconds the whole run took")
    sub.add_parser("table")
    args = p.parse_args()
    if args.cmd == "record":
        e = record(args)
        print(json.dumps({k: e[k] for k in ("name", "size")} | {"result": str(Path(args.out) / "result.json")}))
    elif args.cmd == "distill":
        e = record_distill(args)
        print(json.dumps({k: e[k] for k in ("name", "size")}))
    else:
        all_ = json.loads(RESULTS.with_suffix(".json").read_text())
        atomic_write_text(RESULTS.with_suffix(".md"), portable(table(all_)))
        update_readme(all_)
    sys.exit(0)


if __name__ == "__main__":
    main()
