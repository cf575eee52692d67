"""Translation speed on a GPU: tfcli and Hugging Face `generate`, side by side in one run on one trained checkpoint.

    python3 benchmarks/gpu_translate_speed.py CKPT [--data DIR] [--split train] [--sentences 20000]
                                              [--batch-sizes 64 256] [--dtype bf16] [--repeats 1]
    python3 benchmarks/gpu_translate_speed.py CKPT --device cpu --dtype fp32 --split test2016 --sentences 40
                                              --batch-sizes 8 --out X
                                                   a check that the script runs (not a measurement)

The first --sentences source lines of a Multi30k split (--src/--tgt, default de -> en; by default 20,000 of train's
29,000, since test2016's 1,000 are four batches at batch 256: a start-up figure, not a throughput) through
  tfcli  the Python API (`tfcli.load(CKPT, device, dtype).translate`): what `tfcli translate --device cuda --dtype
         bf16` runs, tokenising, batching by length and detokenising included;
  tfcli, eager steps  the same, with the decoder's step run op by op (no CUDA graph, a batch that shrinks as
         sentences finish) and the search reading the device every step: what decoded before the CUDA-graph step,
         to show what it gains (`StepModel.static = False`, `check_every=1`);
  HF     the checkpoint exported by `tfcli export --to hf` (tfcli.interop), loaded by transformers in the same dtype
         (its weights cast, HF's usual way), `generate` on the same sources pre-tokenised by the checkpoint's
         tokenizer and sorted by length (its tokenising and detokenising are not timed: in HF's favour).
The same search for both: beam 5 and greedy, no length normalisation (alpha 0: both rank by summed log-probability,
which only falls as a hypothesis grows, so both find the same best one; tfcli lets a sentence go as soon as no live
beam can beat its best finished hypothesis, HF once it has `beam` finished ones), stop at </s>, at most --max-len
new tokens. Batches of each --batch-sizes sentences. One untimed pass first over every twentieth-odd line (1,000
lines of all lengths: CUDA context, kernels, allocator, graphs), then the best of --repeats, CUDA synchronised.
Target tokens/s counts the tokens each system generated (its output re-encoded by the target tokenizer, plus </s>);
BLEU (sacreBLEU, the default signature, against the split's references: on train, lines the model was trained
on) shows that both translate, not how well. Results: benchmarks/results/gpu_translate_speed.{json,md}, with the
GPU named, and gpu_translate_speed_profile.txt: torch.profiler's op tables of one more tfcli pass (beam, the
largest batch).
"""

from __future__ import annotations

import argparse
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from common import SHARED_DATA, cpu_name, portable, write_results

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
THROUGHPUT_MIN = 20000  # sentences a figure needs to be a throughput, not a start-up figure


def synced(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn, inputs, warm_inputs, repeats: int, device: torch.device):
    """fn(warm_inputs) once untimed, then the best of `repeats` timed fn(inputs) calls; returns (seconds, the last
    output)."""
    fn(warm_inputs)
    times = []
    for _ in range(repeats):
        synced(device)
        t0 = time.perf_counter()
        out = fn(inputs)
        synced(device)
        times.append(time.perf_counter() - t0)
    return min(times), out


def hf_translate(model, ids: list[list[int]], beam: int, batch_size: int, max_len: int, device) -> list[list[int]]:
    """transformers' generate over `ids` (each ending in </s>), sorted by length, `batch_size` at a time; the output
    ids of each, in the input order, cut at </s>."""
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[list[int]] = [[] for _ in ids]
    with torch.inference_mode():
        for j in range(0, len(order), batch_size):
            rows = [ids[i] for i in order[j : j + batch_size]]
            width = max(map(len, rows))
            src = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
            gen = model.generate(input_ids=src, attention_mask=(src != pad).long(), num_beams=beam, do_sample=False,
                                 max_new_tokens=max_len, length_penalty=0.0, early_stopping=True)
            for i, row in zip(order[j : j + batch_size], gen.tolist()):
                toks = row[1:]  # after the decoder start token
                out[i] = toks[: toks.index(eos)] if eos in toks else [t for t in toks if t != pad]
    return out


def profile_pass(run, device: torch.device, out: Path) -> Path:
    """One untimed pass under torch.profiler; its op tables (host time, device time) beside the results."""
    from tfcli.train import new_profiler, op_table

    cuda = device.type == "cuda"
    with new_profiler(cuda) as prof:
        run()
        if cuda:
            torch.cuda.synchronize(device)
    ops = prof.key_averages()
    tables = [op_table(ops, "self_cpu_time_total")] + ([op_table(ops, "self_cuda_time_total")] if cuda else [])
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}_profile.txt"
    path.write_text(portable("\n\n".join(tables)) + "\n", encoding="utf-8")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint")
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--src", default="de")
    p.add_argument("--tgt", default="en")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--max-len", type=int, default=100, help="new tokens per sentence, at most")
    p.add_argument("--split", default="train", help="the Multi30k split translated (train, valid, test2016)")
    p.add_argument("--sentences", type=int, default=THROUGHPUT_MIN,
                   help=f"its first N lines (0: all; under {THROUGHPUT_MIN:,}: a check)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=str(RESULTS / "gpu_translate_speed"))
    args = p.parse_args()
    import sacrebleu
    from transformers import AutoModelForSeq2SeqLM

    import tfcli
    from tfcli import checkpoint, checkpoint_meta
    from tfcli.data import decode_batch, encode_batch, source_ids
    from tfcli.errors import TfcliError
    from tfcli.interop import export

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_translate_speed: no CUDA device; --device cpu --dtype fp32 --split test2016 --sentences 40 "
                 "checks that it runs")
    ckpt = checkpoint_meta.resolve(args.checkpoint)
    meta = checkpoint_meta.read_meta(ckpt)
    hf_dir = Path(tempfile.mkdtemp()) / "hf"
    try:  # before anything is loaded: the comparison needs a model a transformers class can hold
        export(ckpt, "hf", hf_dir)
    except TfcliError as e:
        sys.exit(f"gpu_translate_speed: {ckpt} cannot be compared with Hugging Face: {e}")
    src_tok, tgt_tok = checkpoint.tokenizer(meta, "src"), checkpoint.tokenizer(meta, "tgt")
    data = Path(args.data) / "multi30k"
    lines = (data / f"{args.split}.{args.src}").read_text(encoding="utf-8").splitlines()
    refs = (data / f"{args.split}.{args.tgt}").read_text(encoding="utf-8").splitlines()
    if args.sentences:
        lines, refs = lines[: args.sentences], refs[: args.sentences]
    warm_lines = lines[:: max(1, len(lines) // 1000)]  # the untimed pass: lines of every length

    translator = tfcli.load(str(ckpt), device=args.device, dtype=args.dtype)
    eager = tfcli.load(str(ckpt), device=args.device, dtype=args.dtype)
    eager.loaded.steps.static = False
    hf = AutoModelForSeq2SeqLM.from_pretrained(hf_dir, dtype=DTYPES[args.dtype]).to(device).eval()
    shutil.rmtree(hf_dir.parent)
    src_ids = [source_ids(ids) for ids in encode_batch(src_tok, lines)]
    warm_ids = [source_ids(ids) for ids in encode_batch(src_tok, warm_lines)]

    def tokens(hyps: list[str]) -> int:  # what a system generated, </s> included
        return sum(len(ids) + 1 for ids in encode_batch(tgt_tok, hyps))

    runs = []
    for beam in (args.beam, 1):
        for bs in args.batch_sizes:
            opts = dict(beam_size=beam, batch_size=bs, max_tokens=10**9, len_penalty=0.0, max_len_a=0.0,
                        max_len_b=args.max_len)
            t_tfcli, hyps_tfcli = best_time(lambda x: translator.translate(x, **opts), lines, warm_lines,
                                            args.repeats, device)
            t_eager, hyps_eager = best_time(lambda x: eager.translate(x, **opts, check_every=1), lines, warm_lines,
                                            args.repeats, device)
            t_hf, ids_hf = best_time(lambda x: hf_translate(hf, x, beam, bs, args.max_len, device), src_ids,
                                     warm_ids, args.repeats, device)
            hyps_hf = decode_batch(tgt_tok, ids_hf)
            row = {"beam": beam, "batch_size": bs}
            for name, t, hyps in (("tfcli", t_tfcli, hyps_tfcli), ("tfcli_eager", t_eager, hyps_eager),
                                  ("hf", t_hf, hyps_hf)):
                row[name] = {"seconds": t, "sentences_per_s": len(lines) / t, "tgt_tokens_per_s": tokens(hyps) / t,
                             "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score}
            row["same_output"] = sum(a == b for a, b in zip(hyps_tfcli, hyps_hf)) / len(lines)
            row["tfcli_over_hf"] = row["tfcli"]["sentences_per_s"] / row["hf"]["sentences_per_s"]
            row["tfcli_over_eager"] = row["tfcli"]["sentences_per_s"] / row["tfcli_eager"]["sentences_per_s"]
            row["same_as_eager"] = sum(a == b for a, b in zip(hyps_tfcli, hyps_eager)) / len(lines)
            print(f"beam {beam}, batch {bs}: tfcli {row['tfcli']['sentences_per_s']:.0f} sent/s, "
                  f"HF {row['hf']['sentences_per_s']:.0f} sent/s ({row['tfcli_over_hf']:.2f}x)", file=sys.stderr)
            runs.append(row)

    profile = profile_pass(lambda: translator.translate(lines, beam_size=args.beam, batch_size=max(args.batch_sizes),
                                                        max_tokens=10**9, len_penalty=0.0, max_len_a=0.0,
                                                        max_len_b=args.max_len), device, Path(args.out))

    import transformers

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    res = {
        "device": gpu or f"CPU ({cpu_name()})", "dtype": args.dtype, "checkpoint": str(ckpt),
        "split": args.split, "sentences": len(lines), "pair": f"{args.src}-{args.tgt}",
        "max_new_tokens": args.max_len,
        "repeats": args.repeats, "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs,
        "check_only": len(lines) < THROUGHPUT_MIN or device.type != "cuda", "profile": profile.name,
    }
    md = [
        f"# Translation speed on {res['device']}: tfcli and Hugging Face generate", "",
        *([f"**A check that the script runs (a CPU, or under {THROUGHPUT_MIN:,} sentences), not a measurement.**", ""]
          if res["check_only"] else []),
        f"Multi30k {args.split} {res['pair']}, the first {len(lines)} sentences; {args.dtype}; alpha 0, at most "
        f"{args.max_len} new tokens; best of {args.repeats} after an untimed pass over {len(warm_lines)} of them; "
        f"torch {res['torch']}, transformers {res['transformers']}; {res['date']}. Checkpoint `{ckpt}`. Written by "
        "`benchmarks/gpu_translate_speed.py` "
        "(its docstring says what each system's time includes).", "",
        "| search | batch | tfcli sent/s | HF sent/s | tfcli / HF | tfcli tgt tok/s | HF tgt tok/s | BLEU tfcli | "
        "BLEU HF | same output | tfcli eager steps sent/s | tfcli / eager steps | same as eager steps |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {'greedy' if r['beam'] == 1 else 'beam %d' % r['beam']} | {r['batch_size']} | "
          f"{r['tfcli']['sentences_per_s']:.0f} | {r['hf']['sentences_per_s']:.0f} | **{r['tfcli_over_hf']:.2f}x** | "
          f"{r['tfcli']['tgt_tokens_per_s']:,.0f} | {r['hf']['tgt_tokens_per_s']:,.0f} | {r['tfcli']['bleu']:.2f} | "
          f"{r['hf']['bleu']:.2f} | {100 * r['same_output']:.0f}% | {r['tfcli_eager']['sentences_per_s']:.0f} | "
          f"{r['tfcli_over_eager']:.2f}x | {100 * r['same_as_eager']:.0f}% |" for r in runs], "",
        f"One more tfcli pass (beam {args.beam}, batch {max(args.batch_sizes)}) ran under torch.profiler: "
        f"`{profile.name}` (the ops by host time, then by device time; the host's waits for the device are the "
        "`cudaStreamSynchronize` / `cudaMemcpyAsync` rows).", "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
