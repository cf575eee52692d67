"""Language-model generation speed on a GPU: tfcli and Hugging Face `generate`, side by side in one run.

    python3 benchmarks/gpu_lm_generate_speed.py [--presets baby-gpt gpt2-small] [--batch-sizes 1 32] [--dtype bf16]
    python3 benchmarks/gpu_lm_generate_speed.py --device cpu --dtype fp32 --quick     a check that it runs

For each preset, a randomly initialised tfcli decoder-only model of its shapes (vocabulary --vocab) is saved as a
checkpoint and exported with `tfcli export --to hf` (a GPT-2 model, as a user's export is). Both continue the same
prompts (--prompt-len tokens, the first </s> as `tfcli generate` starts them, equal lengths: no padding) for
exactly --new-tokens new tokens (</s> never chosen: tfcli `ignore_eos`, HF min_new_tokens = max_new_tokens; <pad>
and <s>, which tfcli never picks, suppressed in HF), greedy and top-k sampling (--top-k, temperature 1), --batches
batches at each batch size (so that batch 1 does not take 32 times batch 32's time), in --dtype (tfcli:
the Python API, `tfcli.load(CKPT, device, dtype).generate`, all prompts in one call of --batch-size rows at a time,
as `tfcli generate --dtype` runs; HF: its weights cast, batch by batch). New tokens/s: rows x N / time of the generation calls (prompts
included), the best of --repeats after an untimed pass, CUDA synchronised; for greedy, the share of rows identical
to tfcli's. tfcli also runs with eager steps (no CUDA graph: the loaded model's `steps.static =
False`), to show what the graph gains. Results: benchmarks/results/gpu_lm_generate_speed.{json,md}, rewritten after
each case, so a run stopped at a time limit keeps the cases it finished (the file says how many of how many).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import cpu_name, export_peers, write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def best_time(fn, repeats: int, device: torch.device):
    """fn() once untimed, then the best of `repeats` timed calls; returns (seconds, the last output)."""
    out = fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return min(times), out


def same(row: dict) -> str:
    return "" if row["same_output"] is None else f"{100 * row['same_output']:.0f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["baby-gpt", "gpt2-small"])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32])
    p.add_argument("--batches", type=int, default=8, help="batches generated per measurement")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a tiny model, few rows and tokens, one repeat: a check")
    p.add_argument("--out", default=str(RESULTS / "gpu_lm_generate_speed"))
    args = p.parse_args()
    from transformers import AutoModelForCausalLM

    import tfcli
    from tfcli.model import build_model, preset
    from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_lm_generate_speed: no CUDA device; --device cpu --dtype fp32 --quick checks that it runs")
    if args.quick:
        args.presets, args.vocab, args.batches, args.new_tokens, args.repeats = ["lm-toy"], 100, 2, 8, 1
        args.batch_sizes = [1, 4]
    vocab = SPECIAL_TOKENS + [f"w{i}" for i in range(args.vocab - len(SPECIAL_TOKENS))]
    index = {t: i for i, t in enumerate(vocab)}
    g = torch.Generator().manual_seed(0)
    all_prompts = torch.randint(len(SPECIAL_TOKENS), args.vocab, (args.batches * max(args.batch_sizes),
                                                                 args.prompt_len), generator=g)
    all_prompts[:, 0] = EOS_ID  # what `tfcli generate` starts every prompt with
    import transformers

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    res = {"device": gpu or f"CPU ({cpu_name()})", "dtype": args.dtype, "vocab": args.vocab,
           "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "batches": args.batches,
           "repeats": args.repeats, "torch": torch.__version__, "transformers": transformers.__version__,
           "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"), "runs": [],
           "cases": len(args.presets) * 2 * len(args.batch_sizes), "check_only": args.quick or device.type != "cuda"}
    out = Path(args.out) if not res["check_only"] or args.out != str(RESULTS / "gpu_lm_generate_speed") else (
        Path(tempfile.mkdtemp()) / "gpu_lm_generate_speed")
    for name in args.presets:
        torch.manual_seed(0)
        model = build_model(preset(name, tgt_vocab_size=args.vocab, dropout=0.0)).eval()
        if args.prompt_len + args.new_tokens > model.cfg.max_len:
            sys.exit(f"--prompt-len + --new-tokens must fit {name}'s max_len ({model.cfg.max_len})")
        with tempfile.TemporaryDirectory() as tmp:
            hf_dir, _ = export_peers(model, vocab, Path(tmp), ct2=False)
            generator = tfcli.load(str(Path(tmp) / "ckpt"), device=args.device, dtype=args.dtype)
            eager = tfcli.load(str(Path(tmp) / "ckpt"), device=args.device, dtype=args.dtype)
            eager.loaded.steps.static = False  # steps op by op, no CUDA graph: what the graph gains
            hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=DTYPES[args.dtype]).to(device).eval()
        for top_k in (0, args.top_k):
            for bs in args.batch_sizes:
                prompts = all_prompts[: args.batches * bs]

                texts = [" ".join(vocab[t] for t in row[1:]) for row in prompts.tolist()]  # the API adds </s>
                search = dict(top_k=top_k) if top_k else dict(greedy=True)

                def tfcli_run(who=generator):
                    out = who.generate(texts, max_new_tokens=args.new_tokens, ignore_eos=True, seed=1,
                                       batch_size=bs, **search)
                    return [[index[t] for t in text.split()] for text in out]

                def hf_run():
                    sample = dict(do_sample=True, top_k=top_k, top_p=1.0, temperature=1.0) if top_k else dict(
                        do_sample=False)
                    out = []
                    with torch.inference_mode():
                        for j in range(0, len(prompts), bs):
                            batch = prompts[j : j + bs].to(device)
                            ids = hf.generate(input_ids=batch, attention_mask=torch.ones_like(batch),
                                              min_new_tokens=args.new_tokens, max_new_tokens=args.new_tokens,
                                              suppress_tokens=[PAD_ID, BOS_ID], pad_token_id=PAD_ID,
                                              eos_token_id=EOS_ID, **sample)
                            out += ids[:, batch.size(1) :].tolist()
                    return out

                t_tfcli, out_tfcli = best_time(tfcli_run, args.repeats, device)
                t_eager, out_eager = best_time(lambda: tfcli_run(eager), args.repeats, device)
                t_hf, out_hf = best_time(hf_run, args.repeats, device)
                tokens = len(prompts) * args.new_tokens
                row = {"preset": name, "params": sum(p.numel() for p in model.parameters()), "batch_size": bs,
                       "search": "greedy" if top_k == 0 else f"top-k {top_k}",
                       "tfcli_tok_per_s": tokens / t_tfcli, "hf_tok_per_s": tokens / t_hf,
                       "tfcli_over_hf": t_hf / t_tfcli, "eager_tok_per_s": tokens / t_eager,
                       "tfcli_over_eager": t_eager / t_tfcli,
                       "same_as_eager": sum(a == b for a, b in zip(out_tfcli, out_eager)) / len(prompts),
                       "same_output": (sum(a == b for a, b in zip(out_tfcli, out_hf)) / len(prompts)
                                       if top_k == 0 else None)}
                print(f"{name}, {row['search']}, batch {bs}: tfcli {row['tfcli_tok_per_s']:,.0f} tok/s, HF "
                      f"{row['hf_tok_per_s']:,.0f} tok/s ({row['tfcli_over_hf']:.2f}x)", file=sys.stderr)
                res["runs"].append(row)
                write(out, res, args)


def write(out: Path, res: dict, args) -> None:
    runs, partial = res["runs"], len(res["runs"]) < res["cases"]
    md = [
        f"# Language-model generation on {res['device']}: tfcli and Hugging Face generate", "",
        *(["**A check that the script runs (a CPU or --quick), not a measurement.**", ""] if res["check_only"] else []),
        *([f"**{len(runs)} of the {res['cases']} cases: the run stopped (or is still running) before the rest.**", ""]
          if partial else []),
        f"Random models of each preset's shapes, vocabulary {args.vocab}, exported to GPT-2 by `tfcli export`; "
        f"{args.batches} batches of prompts of {args.prompt_len} tokens at each batch size, exactly "
        f"{args.new_tokens} new tokens each; {args.dtype}; "
        f"best of {args.repeats} after an untimed pass; torch {res['torch']}, transformers {res['transformers']}; "
        f"{res['date']}. Written by `benchmarks/gpu_lm_generate_speed.py` (its docstring says what is timed).", "",
        "| model | params | search | batch | tfcli tok/s | HF tok/s | tfcli / HF | same output (greedy) | "
        "tfcli eager steps tok/s | tfcli / eager steps | same as eager steps |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['search']} | {r['batch_size']} | "
          f"{r['tfcli_tok_per_s']:,.0f} | {r['hf_tok_per_s']:,.0f} | **{r['tfcli_over_hf']:.2f}x** | "
          f"{same(r)} | {r['eager_tok_per_s']:,.0f} | {r['tfcli_over_eager']:.2f}x | "
          f"{100 * r['same_as_eager']:.0f}% |" for r in runs], "",
    ]
    write_results(out, res, "\n".join(md), quiet=partial)


if __name__ == "__main__":
    main()
