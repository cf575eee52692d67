"""Language-model sampling speed, side by side in one run: tfcli vs Hugging Face `generate` vs CTranslate2, on the CPU.

    .venv/bin/python benchmarks/lm_generate_speed.py [--threads N] [--vocab V] [--batch-sizes 1,8,32] [--quick]

A randomly initialised tfcli decoder-only LM shaped like a preset (default `baby-gpt`: 6 layers, d_model 384,
6 heads, FFN 1536, learned positions up to 256, pre-norm, exact-erf GELU, output tied to the token embedding, no
embedding scaling; vocabulary --vocab) is exported with `tfcli export` (tfcli/interop) to a
`transformers.GPT2LMHeadModel` and a CTranslate2 float32 model, as a user's export is. The exports are checked:
max |logit difference| against tfcli, HF and CT2 both, must stay below 1e-3 (recorded).

All three continue the same prompts (--prompt-len tokens, starting with </s> as `tfcli generate` prompts do, equal
lengths so there is no padding) for a FORCED number of new tokens N (--new-tokens), so they do the same work:
</s> (the end token) is banned for all three (tfcli: `ignore_eos`; HF: min_new_tokens = max_new_tokens = N; CT2:
min_length = max_length = N), and <pad> and <s>, which tfcli's sampler never picks, are suppressed in HF and CT2 too
(HF suppress_tokens, CT2 suppress_sequences), so greedy decoding can agree token for token. tfcli runs through its
Python API (`tfcli.load(...).generate`, the prompts as words of the word-level vocabulary) in a process tuned as
`tfcli generate` tunes its own (tfcli.runtime), on the CPU in fp32; HF runs its default
path (`generate`, its default attention implementation and cache); CT2 a `Generator` with the prompt forwarded at
once (include_prompt_in_result=False). Greedy and top-k sampling (--top-k, temperature 1) at each of --batch-sizes;
every measurement generates for the same --prompts rows (in batches of that size).

Each system runs in a process of its own, one at a time (in a shared process, CTranslate2's OpenMP runtime slows
torch 2-3x: benchmarks/common.py, Isolated). Reported: new tokens per second = rows x N / wall time of the generation
call (all of a measurement's batches in turn, in one call; prompt processing included in the time, prompt tokens not
counted), best of --repeats with the systems interleaved (the machine may be shared); the ratios tfcli/HF and
tfcli/CT2; for greedy, the share of rows whose N tokens are identical to tfcli's. Peak memory: each system alone in
a fresh subprocess that loads the model and generates one batch (the largest batch size, greedy): ru_maxrss at the
end minus ru_maxrss right after its imports.
Results: benchmarks/results/lm_generate_speed.{json,md}; --quick (a tiny model, a few rows, one repeat) is a check
that everything runs and writes to a temporary directory unless --out is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import Isolated, cpu_name, export_peers, write_results
from tfcli.model import build_model, count_parameters, preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
SUPPRESSED = [PAD_ID, BOS_ID]  # tfcli's sampler never picks these (tfcli/generate/sampling.py)
START_ID = EOS_ID  # what precedes every prompt in `tfcli generate`


# --- the same function -----------------------------------------------------------------------------------------


def check_same_function(model, gpt2, ct2_generator, n=4, length=20) -> dict:
    """Max |logit difference| of the HF and CT2 copies against tfcli on random sequences (raises if >= 1e-3)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(len(SPECIAL_TOKENS), model.cfg.tgt_vocab_size, (n, length), generator=g)
    ids[:, 0] = START_ID
    with torch.inference_mode():
        ours = model(ids)
        hf = gpt2(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    ct2 = torch.from_numpy(np.asarray(ct2_generator.forward_batch(ids.tolist())))
    diff = {"hf": float((ours - hf).abs().max()), "ct2": float((ours - ct2).abs().max())}
    for name, d in diff.items():
        assert d < 1e-3, f"the {name} copy differs from the tfcli model (max logit difference {d})"
    return diff


# --- the three generators --------------------------------------------------------------------------------------
# run(batches, n, top_k, seed) -> list of new-id lists, the batches' rows in order; each batch a (B, P) int64 tensor
# of prompts, generated in turn, batch i with seed + i; top_k 0 means greedy. All batches of a measurement go in one
# call, timed in the system's process as one (as translate_speed gives each system its batches), so that the pause
# before a call (Isolated) comes once per measurement, not before each batch.


class Runner:
    def run(self, batches, n, top_k, seed):
        return [row for i, b in enumerate(batches) for row in self.run_batch(b, n, top_k, seed + i)]


class TfcliRunner(Runner):
    """`tfcli generate` through the Python API, in a process tuned as the command tunes its own (tfcli.runtime):
    the prompts' ids after </s> as words of the checkpoint's word-level vocabulary (common.export_peers), which the
    API starts with </s> itself; </s> banned (ignore_eos), so each row gets exactly N tokens."""

    name = "tfcli"

    def __init__(self, ckpt: str, vocab: list[str]):
        import tfcli
        from tfcli.runtime import tune_process

        tune_process("cpu")
        self.generator = tfcli.load(ckpt, device="cpu")
        self.vocab, self.index = vocab, {t: i for i, t in enumerate(vocab)}

    def run_batch(self, prompts, n, top_k, seed):
        texts = [" ".join(self.vocab[t] for t in row[1:]) for row in prompts.tolist()]
        search = dict(top_k=top_k) if top_k else dict(greedy=True)
        out = self.generator.generate(texts, max_new_tokens=n, ignore_eos=True, seed=seed, batch_size=len(texts),
                                      **search)
        return [[self.index[t] for t in text.split()] for text in out]


class HFRunner(Runner):
    name = "hf"

    def __init__(self, gpt2):
        self.gpt2 = gpt2

    def run_batch(self, prompts, n, top_k, seed):
        sample = dict(do_sample=True, top_k=top_k, top_p=1.0, temperature=1.0) if top_k else dict(do_sample=False)
        torch.manual_seed(seed)
        with torch.inference_mode():
            out = self.gpt2.generate(
                input_ids=prompts, attention_mask=torch.ones_like(prompts), min_new_tokens=n, max_new_tokens=n,
                suppress_tokens=SUPPRESSED, pad_token_id=PAD_ID, eos_token_id=EOS_ID, **sample,
            )
        return out[:, prompts.size(1):].tolist()


class CT2Runner(Runner):
    name = "ct2"

    def __init__(self, path, vocab, threads):
        import ctranslate2

        self.ct2 = ctranslate2
        self.generator = ctranslate2.Generator(str(path), device="cpu", compute_type="float32",
                                               intra_threads=threads, inter_threads=1)
        self.vocab = vocab

    def run_batch(self, prompts, n, top_k, seed):
        self.ct2.set_random_seed(seed)
        res = self.generator.generate_batch(
            [[self.vocab[t] for t in row] for row in prompts.tolist()], max_length=n, min_length=n,
            include_prompt_in_result=False, sampling_topk=top_k or 1, sampling_temperature=1.0,
            suppress_sequences=[[self.vocab[t]] for t in SUPPRESSED],
        )
        return [r.sequences_ids[0] for r in res]


def compare(runners, prompts, bs, n, top_k, repeats, seed) -> dict:
    """Best-of-`repeats` new tokens/s per runner over all rows of `prompts` in batches of `bs`, interleaved; output
    lengths, and for greedy the share of rows identical to tfcli's."""
    batches = prompts.split(bs)
    rows = prompts.size(0)
    for r in runners:  # warm-up: first calls allocate, pick kernels, fill caches
        r.run(batches[:1], min(n, 4), top_k, seed)
    times = {r.name: [] for r in runners}
    outputs = {}
    for _ in range(repeats):
        for r in runners:
            seconds, outputs[r.name] = r.run(batches, n, top_k, seed)  # every batch in turn, in one call
            times[r.name].append(seconds)
    res = {"rows": rows, "batch_size": bs, "new_tokens_per_row": n, "decoding": f"top-k {top_k}" if top_k else "greedy"}
    for r in runners:
        lengths = sorted({len(o) for o in outputs[r.name]})
        assert lengths == [n], f"{r.name}: generated {lengths} tokens per row, not the forced {n}"
        res[r.name] = {"new_tok_per_s": rows * n / min(times[r.name]), "best_s": min(times[r.name]),
                       "median_s": float(np.median(times[r.name])), "times_s": times[r.name]}
    for r in runners[1:]:
        if not top_k:  # samples from different random generators are not comparable
            same = sum(a == b for a, b in zip(outputs["tfcli"], outputs[r.name])) / rows
            res[r.name]["same_output_as_tfcli"] = same
        res[f"tfcli_over_{r.name}"] = res["tfcli"]["new_tok_per_s"] / res[r.name]["new_tok_per_s"]
    return res


# --- peak memory, each system alone in a subprocess ------------------------------------------------------------


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def make_runner(system: str, directory: str, threads: int):
    """One system's runner from the files saved in `directory` (probe.json, the tfcli checkpoint, the HF and CT2
    copies): the timing processes and the memory probe build it alike."""
    d = Path(directory)
    meta = json.loads((d / "probe.json").read_text())
    if system == "tfcli":
        return TfcliRunner(str(d / "ckpt"), meta["vocab"])
    if system == "hf":
        from transformers import GPT2LMHeadModel

        return HFRunner(GPT2LMHeadModel.from_pretrained(d / "hf").eval())
    return CT2Runner(d / "ct2", meta["vocab"], threads)


def probe(args) -> None:
    """Subprocess body (--probe SYSTEM): import, load the model saved in --probe-dir, generate one greedy batch;
    print peak-RSS figures as one JSON line."""
    torch.set_num_threads(args.threads)
    d = Path(args.probe_dir)
    if args.probe == "tfcli":
        from tfcli import load  # noqa: F401  (the API and torch)
    elif args.probe == "hf":
        from transformers import GPT2LMHeadModel
    else:
        import ctranslate2  # noqa: F401
    after_imports = maxrss_mib()
    runner = make_runner(args.probe, str(d), args.threads)
    meta = json.loads((d / "probe.json").read_text())
    prompts = make_prompts(meta["batch_size"], meta["prompt_len"], len(meta["vocab"]), seed=1)
    out = runner.run([prompts], meta["new_tokens"], 0, 0)
    assert all(len(o) == meta["new_tokens"] for o in out)
    peak = maxrss_mib()
    print(json.dumps({"after_imports_mib": after_imports, "peak_mib": peak, "delta_mib": peak - after_imports,
                      "vm_hwm_mib": _vm_hwm_mib()}))


def _vm_hwm_mib() -> float | None:
    """The kernel's own per-process peak RSS (VmHWM), a cross-check of ru_maxrss; None off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure_memory(args, directory: Path, vocab: list[str]) -> dict:
    bs = max(args.batch_sizes)
    meta = {"vocab": vocab, "batch_size": bs,
            "prompt_len": args.prompt_len, "new_tokens": args.new_tokens}
    (directory / "probe.json").write_text(json.dumps(meta))
    out = {"batch_size": bs, "decoding": "greedy", "new_tokens_per_row": args.new_tokens}
    for system in ("tfcli", "hf", "ct2"):
        print(f"memory: {system} alone in a subprocess ...", file=sys.stderr, flush=True)
        cmd = [sys.executable, __file__, "--probe", system, "--probe-dir", str(directory), "--threads",
               str(args.threads)]
        # Linux carries ru_maxrss over execve, so a child started straight from this (large) process would report at
        # least our own peak; a small shell that forks the probe (rather than exec-ing it) starts it from zero.
        r = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *cmd], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(f"memory probe for {system} failed:\n{r.stderr[-3000:]}")
        out[system] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


# --- the run ---------------------------------------------------------------------------------------------------


def make_prompts(rows, length, vocab_size, seed) -> torch.Tensor:
    """`rows` prompts of `length` ids: </s> (what precedes every text, as in `tfcli generate`), then random ids."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(len(SPECIAL_TOKENS), vocab_size, (rows, length), generator=g)
    prompts[:, 0] = START_ID
    return prompts


def benchmark(args, tmp: Path) -> dict:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    torch.manual_seed(0)
    overrides = dict(tgt_vocab_size=args.vocab, dropout=0.0)
    model = build_model(preset(args.preset, **overrides)).eval()
    cfg = model.cfg
    if args.prompt_len + args.new_tokens > cfg.max_len:
        sys.exit(f"--prompt-len + --new-tokens must fit the model's max_len ({cfg.max_len})")
    vocab = SPECIAL_TOKENS + [f"w{i}" for i in range(len(SPECIAL_TOKENS), args.vocab)]
    hf_dir, ct2_dir = export_peers(model, vocab, tmp)
    from transformers import AutoModelForCausalLM

    gpt2 = AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    diff = check_same_function(model, gpt2, CT2Runner(ct2_dir, vocab, args.threads).generator)
    memory = measure_memory(args, tmp, vocab)  # also saves what make_runner reads
    # each system in a process of its own, one at a time (benchmarks/common.py, Isolated, says why)
    runners = [Isolated(s, make_runner, s, str(tmp), args.threads, threads=args.threads)
               for s in ("tfcli", "hf", "ct2")]
    prompts = make_prompts(args.prompts, args.prompt_len, args.vocab, seed=0)
    out = {
        "model": f"random {args.preset}-shaped decoder-only LM: {cfg.n_decoder_layers} layers, d_model {cfg.d_model}, "
                 f"{cfg.n_head} heads, FFN {cfg.d_ff}, max_len {cfg.max_len}, vocab {args.vocab}",
        "preset": args.preset, "vocab": args.vocab, "parameters": count_parameters(model),
        "hf_attn_implementation": gpt2.config._attn_implementation,
        "max_logit_difference_vs_tfcli": diff, "rows": args.prompts, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, "top_k": args.top_k, "runs": [], "memory": memory,
    }
    for bs in args.batch_sizes:
        run = {"batch_size": bs}
        for key, top_k in (("greedy", 0), ("sample", args.top_k)):
            print(f"batch size {bs}, {key} ...", file=sys.stderr, flush=True)
            run[key] = compare(runners, prompts, bs, args.new_tokens, top_k, args.repeats, args.seed)
        out["runs"].append(run)
    for r in runners:
        r.close()
    return out


def markdown(res: dict) -> str:
    b = res["bench"]
    lines = ["# Language-model generation speed (CPU, float32)", "", f"Command: `{res['command']}`", "",
             f"Machine: {res['nproc']} CPUs ({res['cpu']}), Python {res['python']}, torch {res['torch']}, "
             f"transformers {res['transformers']}, ctranslate2 {res['ctranslate2']}, threads {res['threads']}. "
             f"Measured {res['date']}.", "",
             "## Same weights in tfcli, HF GPT2LMHeadModel and CTranslate2 Generator, forced output length", "",
             f"{b['model']} ({b['parameters'] / 1e6:.2f}M parameters); {b['rows']} prompts of {b['prompt_len']} "
             f"tokens, each continued by exactly {b['new_tokens']} new tokens (</s> banned for all three). "
             f"tok/s = generated tokens (rows x {b['new_tokens']}, prompt tokens not counted) / wall time, prompt "
             f"processing included; best of {res['repeats']} interleaved runs, each a system's batches one after "
             f"another in one call. HF attention: "
             f"`{b['hf_attn_implementation']}`.", "",
             "| batch size | decoding | tfcli tok/s | HF generate tok/s | CT2 tok/s | tfcli / HF | tfcli / CT2 | "
             "same output as tfcli (HF, CT2) |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for run in b["runs"]:
        for key in ("greedy", "sample"):
            r = run[key]
            same = (f"{r['hf']['same_output_as_tfcli']:.0%}, {r['ct2']['same_output_as_tfcli']:.0%}"
                    if "same_output_as_tfcli" in r["hf"] else "n/a (sampling)")
            lines.append(
                f"| {run['batch_size']} | {r['decoding']} | {r['tfcli']['new_tok_per_s']:.1f} | "
                f"{r['hf']['new_tok_per_s']:.1f} | {r['ct2']['new_tok_per_s']:.1f} | {r['tfcli_over_hf']:.2f}x | "
                f"{r['tfcli_over_ct2']:.2f}x | {same} |"
            )
    m = b["memory"]
    lines += ["", f"### Peak memory: each system alone in a subprocess, loading the model and generating one greedy "
              f"batch of {m['batch_size']} x {m['new_tokens_per_row']} tokens", "",
              "| system | peak RSS after imports | peak RSS at the end | model + generation (difference) |",
              "| --- | ---: | ---: | ---: |"]
    for system, name in (("tfcli", "tfcli"), ("hf", "HF"), ("ct2", "CT2")):
        s = m[system]
        lines.append(f"| {name} | {s['after_imports_mib']:.0f} MiB | {s['peak_mib']:.0f} MiB | "
                     f"{s['delta_mib']:.0f} MiB |")
    d = b["max_logit_difference_vs_tfcli"]
    load = f"at start {res['load_average_at_start']}, at end {res['load_average_at_end']}"
    lines += ["", f"Max logit difference vs tfcli: HF {d['hf']:.1e}, CT2 {d['ct2']:.1e}. "
              f"Load average (1, 5, 15 min) {load}: the machine may have been shared.",
              "Written by `benchmarks/lm_generate_speed.py`."]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--preset", default="baby-gpt", help="a decoder-only preset for the shapes")
    p.add_argument("--vocab", type=int, default=8000, help="vocabulary size (e.g. 69: 65 characters + 4 specials)")
    p.add_argument("--batch-sizes", default="1,8,32", help="comma-separated batch sizes (rows) to compare at")
    p.add_argument("--prompts", type=int, default=32, help="rows generated per measurement, in batches")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt length in tokens (</s> included)")
    p.add_argument("--new-tokens", type=int, default=64, help="forced number of new tokens per row")
    p.add_argument("--top-k", type=int, default=40, help="top-k for the sampling runs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a tiny check run (lm-toy shapes, a few rows, one repeat)")
    p.add_argument("--out", default=None, help="results path without suffix (default: benchmarks/results/"
                   "lm_generate_speed; with --quick a temporary directory)")
    p.add_argument("--probe", choices=("tfcli", "hf", "ct2"), help=argparse.SUPPRESS)  # memory subprocess
    p.add_argument("--probe-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.probe:
        return probe(args)
    if args.quick:
        args.preset, args.vocab, args.batch_sizes, args.prompts = "lm-toy", 500, "1,4", 4
        args.prompt_len, args.new_tokens, args.repeats = 8, 8, 1
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.out is None:
        quick_dir = Path(tempfile.gettempdir()) / "tfcli-bench-quick"
        args.out = str((quick_dir if args.quick else RESULTS) / "lm_generate_speed")

    import ctranslate2
    import transformers

    torch.set_num_threads(args.threads)
    res = {
        "command": shlex.join([".venv/bin/python", "benchmarks/lm_generate_speed.py", *sys.argv[1:]]),
        "nproc": os.cpu_count(), "cpu": cpu_name(), "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "ctranslate2": ctranslate2.__version__, "threads": args.threads,
        "date": time.strftime("%Y-%m-%d %H:%M"), "repeats": args.repeats, "quick": args.quick,
        "load_average_at_start": os.getloadavg(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        res["bench"] = benchmark(args, Path(tmp))
    res["load_average_at_end"] = os.getloadavg()
    write_results(args.out, res, markdown(res))
    print(f"written: {args.out}.json, {args.out}.md", file=sys.stderr)



if __name__ == "__main__":
    main()
