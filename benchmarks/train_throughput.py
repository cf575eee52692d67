"""Training throughput on the CPU, side by side in one run: tfcli's `small` preset vs an equivalent Hugging Face
`transformers.MarianMTModel`.

    .venv/bin/python benchmarks/train_throughput.py [--threads N] [--rounds R] [--steps K] [--data PREP]

Both models: d_model 256, 6 + 6 layers, 4 heads, FFN 1024 (ReLU), vocabulary 8000 with one embedding table shared by
encoder, decoder and output projection, sqrt(d_model)-scaled embeddings, sinusoidal positions, dropout 0.1 on
embeddings, sublayer outputs and inside the FFN, no attention dropout, float32. (tfcli's `small` is pre-norm, Marian
post-norm: the same operations, tfcli adds one final LayerNorm per stack.) Both train on the same synthetic batches
(length-bucketed by tfcli's token batcher, about --max-tokens padded target tokens each, sentence lengths 15-35),
or, with --data, on the first batches of a real prepared corpus (e.g. Multi30k, as `tfcli train` batches it),
with the same step: forward, label-smoothed (0.1) cross-entropy summed over the real target tokens and divided by
their count, backward, gradient clipping at norm 1, AdamW (betas 0.9/0.98). tfcli's forward and loss are the
trainer's own (`tfcli.train.loss.Objective`, which on the CPU skips the output projection at padding positions,
and the model's CPU dropout, which draws its masks more cheaply: see tfcli/model/dropout.py); Marian's loss is
`F.cross_entropy(..., label_smoothing=0.1, ignore_index=pad)` on its logits, as a Hugging Face training loop does.

After warmup steps, R rounds each time K steps of one system then K of the other (the order alternating by round),
so that a shared machine's load hits both alike. Reported: target tokens per second (non-padding target tokens;
source tokens are about as many), the median over rounds, and the ratio tfcli / HF per round and of the medians.
Results: benchmarks/results/train_throughput.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from common import cpu_name, write_results
from tfcli.data import collate_seq2seq, token_batches
from tfcli.model import preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID
from tfcli.model import build_model, count_parameters
from tfcli.train import Batch
from tfcli.train import Objective

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"


def synthetic_batches(n: int, vocab: int, max_tokens: int, seed: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    pairs = n * max_tokens // 25
    src = [rng.integers(4, vocab, rng.integers(15, 36)).tolist() for _ in range(pairs)]
    # target lengths follow the source's, as in real translation data
    tgt = [rng.integers(4, vocab, max(1, len(s) + int(rng.integers(-3, 4)))).tolist() for s in src]
    lengths = np.array([max(len(s), len(t)) + 1 for s, t in zip(src, tgt)])
    out = []
    for idx in token_batches(lengths, max_tokens, shuffle=True, seed=seed)[:n]:
        s, t_in, t_out = collate_seq2seq([src[i] for i in idx], [tgt[i] for i in idx])
        n_src, n_tgt = int((s != PAD_ID).sum()), int((t_out != PAD_ID).sum())
        out.append(Batch(s, t_in, t_out, n_src, n_tgt, s.numel() + t_out.numel()))
    return out


def real_batches(prep: str, n: int, max_tokens: int, seed: int, skip: int = 0) -> tuple[list[Batch], int]:
    """n batches of a prepared parallel directory (e.g. Multi30k with a joint vocabulary), exactly as `tfcli train`
    batches its first epoch (after `skip` batches); returns them and the vocabulary size."""
    from tfcli.data import PreparedData
    from tfcli.train import ParallelData

    prepared = PreparedData(prep)
    if prepared.kind != "parallel" or prepared.vocab_size("src") != prepared.vocab_size("tgt"):
        sys.exit(f"{prep}: needs a parallel prepared directory with a joint vocabulary (prepare --joint-vocab)")
    data = ParallelData(prepared, "train", 256, max_tokens, 0, seed)
    return [data.collate(idx) for idx in data.batches(0)[skip : skip + n]], prepared.vocab_size("tgt")


def tfcli_model(vocab: int):
    cfg = preset("small", src_vocab_size=vocab, tgt_vocab_size=vocab, share_embeddings=True, tie_output=True)
    return build_model(cfg).train()


def marian_model(vocab: int):
    from transformers import MarianConfig, MarianMTModel

    cfg = MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=256, encoder_layers=6, decoder_layers=6,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
        activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.1,
        max_position_embeddings=512, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
    )
    return MarianMTModel(cfg).train()


def tfcli_loss(objective: Objective, b: Batch) -> torch.Tensor:
    loss, _ = objective(b.src, b.inputs, b.targets)
    return loss


def marian_loss(model, b: Batch) -> torch.Tensor:
    logits = model(input_ids=b.src, attention_mask=b.src != PAD_ID, decoder_input_ids=b.inputs).logits
    return F.cross_entropy(logits.flatten(0, 1), b.targets.flatten(), ignore_index=PAD_ID, label_smoothing=0.1,
                           reduction="sum")


class System:
    def __init__(self, name: str, model, loss_fn):
        self.name, self.model, self.loss_fn = name, model, loss_fn
        self.opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        self.rates: list[float] = []

    def step(self, b: Batch) -> float:
        loss = self.loss_fn(self.model, b) / b.tgt_tokens
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def run(self, batches: list[Batch]) -> None:
        t0 = time.perf_counter()
        for b in batches:
            self.step(b)
        self.rates.append(sum(b.tgt_tokens for b in batches) / (time.perf_counter() - t0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6, help="steps per system per round")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None,
                    help="a prepared parallel directory (joint vocabulary): real batches instead of synthetic ones")
    ap.add_argument("--out", default=str(RESULTS / "train_throughput"), help="results path without suffix")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import transformers

    torch.manual_seed(args.seed)
    if args.data:
        warm, args.vocab = real_batches(args.data, args.warmup, args.max_tokens, args.seed)
        batches, _ = real_batches(args.data, args.steps, args.max_tokens, args.seed, skip=args.warmup)
    else:
        batches = synthetic_batches(args.steps, args.vocab, args.max_tokens, args.seed)
        warm = synthetic_batches(args.warmup, args.vocab, args.max_tokens, args.seed + 1)
    systems = [System("tfcli", Objective(tfcli_model(args.vocab), 0.1), tfcli_loss),
               System("hf-marian", marian_model(args.vocab), marian_loss)]
    params = {s.name: count_parameters(s.model) for s in systems}
    load_before = os.getloadavg()
    for s in systems:
        for b in warm:
            s.step(b)
    for r in range(args.rounds):
        for s in systems if r % 2 == 0 else systems[::-1]:
            s.run(batches)
        print(f"round {r + 1}: " + ", ".join(f"{s.name} {s.rates[-1]:.0f} tgt tok/s" for s in systems), file=sys.stderr)
    load_after = os.getloadavg()

    ours, hf = systems
    med = {s.name: statistics.median(s.rates) for s in systems}
    ratio = med["tfcli"] / med["hf-marian"]
    per_round = [a / b for a, b in zip(ours.rates, hf.rates)]
    tok = sum(b.tgt_tokens for b in batches) / len(batches)
    src_tok = sum(b.src_tokens for b in batches) / len(batches)
    pad = 1 - sum(b.src_tokens + b.tgt_tokens for b in batches) / sum(b.slots for b in batches)
    command = "python benchmarks/train_throughput.py " + shlex.join(sys.argv[1:])
    result = {
        "command": command.strip(),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "load_avg_before": [round(x, 2) for x in load_before],
                    "load_avg_after": [round(x, 2) for x in load_after]},
        "setup": {"batches": f"real: the first training batches of {args.data}" if args.data else "synthetic",
                  "vocab": args.vocab, "max_tokens": args.max_tokens, "steps_per_round": args.steps,
                  "rounds": args.rounds, "warmup_steps": args.warmup, "mean_tgt_tokens_per_batch": tok,
                  "mean_src_tokens_per_batch": src_tok, "padding_fraction": pad, "parameters": params},
        "tgt_tokens_per_s": {s.name: s.rates for s in systems},
        "median_tgt_tokens_per_s": med,
        "ratio_per_round": per_round,
        "ratio_of_medians": ratio,
        "target_ratio": 1.2,
    }
    write_results(args.out, result, _markdown(result))



def _markdown(r: dict) -> str:
    m, s = r["machine"], r["setup"]
    rows = "\n".join(
        f"| {name} | {s['parameters'][name] / 1e6:.2f}M | {r['median_tgt_tokens_per_s'][name]:,.0f} | "
        + ", ".join(f"{x:,.0f}" for x in r["tgt_tokens_per_s"][name]) + " |"
        for name in r["median_tgt_tokens_per_s"]
    )
    verdict = "reached" if r["ratio_of_medians"] >= r["target_ratio"] else "NOT reached"
    return f"""# Training throughput: tfcli `small` vs Hugging Face MarianMTModel (CPU, fp32)

Command: `{r['command']}`

Machine: {m['cpu']}, {m['cores']} cores, torch threads {m['torch_threads']}; Python {m['python']}, torch {m['torch']},
transformers {m['transformers']}. Load average before/after: {m['load_avg_before']} / {m['load_avg_after']}
(a shared machine: other jobs may have run alongside; the systems alternate, so both see the same load).

Same batches for both ({s.get('batches', 'synthetic')}; {s['rounds']} rounds x {s['steps_per_round']} steps after {s['warmup_steps']} warmup
steps): vocabulary {s['vocab']}, about {s['mean_tgt_tokens_per_batch']:.0f} target and {s['mean_src_tokens_per_batch']:.0f}
source tokens per batch (--max-tokens {s['max_tokens']}), {100 * s['padding_fraction']:.1f}% padding. A step is
forward + label-smoothed cross-entropy + backward + clipping + AdamW. "tok/s" = non-padding target tokens per second.

| system | parameters | median tgt tok/s | per round |
| --- | ---: | ---: | --- |
{rows}

tfcli / HF: **{r['ratio_of_medians']:.2f}x** (per round: {', '.join(f'{x:.2f}' for x in r['ratio_per_round'])});
target 1.2x: {verdict}.
Written by `benchmarks/train_throughput.py`.
"""


if __name__ == "__main__":
    main()
