"""Peak memory and step time of adapting a large model on the CPU: `tfcli train --init-from CKPT` with LoRA
adapters (`--lora-rank 16`, every linear layer of the stack) beside full fine-tuning, at published shapes.

    .venv/bin/python benchmarks/adapt_memory.py [--shapes nllb-600m llama-3.2-1b] [--steps 4] [--max-tokens 256]

Each shape's model is built with random weights (fp32), saved as a checkpoint with a word-level tokenizer over its
vocabulary, and a small synthetic corpus prepared with `--tokenizer-from` it; then each way of training runs as
its own `tfcli train` process for `--steps` steps (one validation at the end, loss only), timed, its peak RSS from
wait4(). The target (issue 111): a LoRA run's peak at most the frozen weights' bytes plus 25%. Full fine-tuning
holds weights, gradients and AdamW's two moments (4x the weights) and is run only where it fits in memory
(`--full` names the shapes). Results: benchmarks/results/adapt_memory.{json,md} (--out: elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import cpu_name, run_measured, save_word_level, write_results
from tfcli.specials import SPECIAL_TOKENS

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SHAPES = {  # the published configs' values (random weights)
    "nllb-600m": ("seq2seq", dict(d_model=1024, n_head=16, n_encoder_layers=12, n_decoder_layers=12, d_ff=4096,
                                  norm="pre", positions="fairseq", share_embeddings=True, tie_output=True,
                                  scale_embedding=True, activation="relu", max_len=1024, vocab=256206)),
    "llama-3.2-1b": ("lm", dict(d_model=2048, n_head=32, n_kv_head=8, n_decoder_layers=16, d_ff=8192,
                                positions="rope", rope_theta=500000.0, rms_norm=True, activation="swiglu", bias=False,
                                tie_output=True, max_len=2048, vocab=128256)),
}
WAYS = {"LoRA rank 16": ["--lora-rank", "16"],
        "LoRA rank 16, activation checkpointing": ["--lora-rank", "16", "--activation-checkpointing"],
        "full fine-tuning": []}


def build(shape: str, directory: Path) -> tuple[Path, Path, int]:
    """(checkpoint, prepared directory, weight bytes) of `shape`."""
    from tfcli.model import build_model, preset

    kind, fields = SHAPES[shape]
    fields = dict(fields)
    V = fields.pop("vocab")
    sizes = dict(src_vocab_size=V, tgt_vocab_size=V) if kind == "seq2seq" else dict(tgt_vocab_size=V)
    torch.manual_seed(0)
    model = build_model(preset("base" if kind == "seq2seq" else "gpt2-small", **fields, **sizes, dropout=0.0))
    vocab = [*SPECIAL_TOKENS, *(f"w{i}" for i in range(V - 4))]
    ckpt = save_word_level(model, vocab, directory)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    rng = random.Random(0)
    lines = [" ".join(rng.choice(vocab[4:2000]) for _ in range(rng.randint(8, 24))) for _ in range(400)]
    text = directory / "text.txt"
    text.write_text("\n".join(lines) + "\n")
    prep = directory / "prep"
    sides = ["--src", str(text), "--tgt", str(text)] if kind == "seq2seq" else ["--train", str(text), "--format", "text"]
    run_measured([sys.executable, "-m", "tfcli", "prepare", *sides, "--valid-ratio", "0.05", "--tokenizer-from",
                  str(ckpt), "-o", str(prep), "-q"])
    return ckpt, prep, weight_bytes


def train(ckpt: Path, prep: Path, out: Path, way: list[str], steps: int, max_tokens: int) -> dict:
    seconds, usage = run_measured([
        sys.executable, "-m", "tfcli", "train", str(prep), "-o", str(out), "--init-from", str(ckpt), *way,
        "--max-steps", str(steps), "--max-epochs", "0", "--warmup", "1", "--valid-every", str(steps),
        "--no-valid-bleu", "--max-tokens", str(max_tokens), "--max-len", str(max_tokens), "--log-every", "1", "--lr", "1e-4", "--keep-last", "1",
        "--label-smoothing", "0", "-q"])
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["time"] for r in rows if r.get("split") == "train"]
    step_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None  # (the first step's setup left out)
    return {"seconds": round(seconds, 1), "step_s": round(step_s, 2) if step_s else None,
            "peak_rss": usage.ru_maxrss * 1024, "checkpoint_bytes": _bytes(out / "checkpoints")}


def _bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*.safetensors"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--full", nargs="*", default=["nllb-600m"], help="shapes to fine-tune fully too")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--out", default=str(RESULTS / "adapt_memory"))
    args = p.parse_args()
    res = {"cpu": cpu_name(), "threads": os.cpu_count(), "steps": args.steps, "max_tokens": args.max_tokens,
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M"), "shapes": {}}
    for shape in args.shapes:
        with tempfile.TemporaryDirectory() as tmp:
            ckpt, prep, weight_bytes = build(shape, Path(tmp))
            entry = res["shapes"][shape] = {"weight_bytes": weight_bytes, "ways": {}}
            for name, way in WAYS.items():
                if name != "full fine-tuning" or shape in args.full:
                    entry["ways"][name] = train(ckpt, prep, Path(tmp) / name.replace(" ", "-"), way, args.steps,
                                                args.max_tokens)
                    write_results(args.out, res, markdown(res), quiet=True)
    write_results(args.out, res, markdown(res))


def markdown(res: dict) -> str:
    gib = 2**30
    lines = [
        "# Adapting a large model on the CPU: peak memory and step time",
        "",
        f"`benchmarks/adapt_memory.py`, {res['cpu']}, {res['threads']} threads, torch {res['torch']}, "
        f"{res['date']}: `tfcli train --init-from` a random-weight fp32 model of each published shape, "
        f"{res['steps']} steps of at most {res['max_tokens']} tokens, one validation (loss). Target: a LoRA run's "
        "peak RSS at most the frozen weights plus 25%.",
        "",
        "| shape | weights | training | peak RSS | / weights | s per step | checkpoints on disk |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for shape, entry in res["shapes"].items():
        w = entry["weight_bytes"]
        for name, r in entry["ways"].items():
            lines.append(f"| {shape} | {w / gib:.2f} GiB | {name} | {r['peak_rss'] / gib:.2f} GiB | "
                         f"{r['peak_rss'] / w:.2f}x | {r['step_s'] if r['step_s'] is not None else '-'} | "
                         f"{r['checkpoint_bytes'] / 2**20:.1f} MiB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
