"""Where a small-batch decoding step spends its time on the CPU (issue: decoding as fast as CTranslate2 on every CPU).

    .venv/bin/python benchmarks/step_profile.py [--threads 2] [--out benchmarks/results/step_profile]

The synthetic model of benchmarks/translate_speed.py (6+6 x 256, FFN 1024, 4 heads, vocabulary 8000, post-norm, fp32),
loaded through the public API (`tfcli.load(...).translate`) and decoding forced-length outputs (20 tokens) at each
(batch, beam) case, twice: on the CPU as it is, and capped at AVX2 (ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2), each in a process of its own, and each again without tfcli's C kernels (the switch
`tfcli.generate.native.fp32_kernel`: the decoder's layers on oneDNN, the attention in torch operators), to measure
what the kernels buy. Per case: milliseconds a step (best of 5 runs, the encoder
included), the operators a step runs (all of them, and those called from Python), and the share of the profiled
time in the linear layers. Then the linear layers alone: each of the decoder's weight shapes at 1, 4, 20 and 320
rows, the microseconds a call through oneDNN's pre-packed weights (the encoder's and the output layer's, and the
decoder's where tfcli's own C kernel does not run) and through F.linear (MKL), and whether a row's result is the
same at every row count (what lets a sentence's output not depend on its batch).
Results: OUT.json and OUT.md, with the CPU named.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = ((1, 1), (1, 5), (4, 1), (4, 5), (64, 1), (64, 5))
OUT_LEN = 20
SHAPES = ((768, 256), (256, 256), (1024, 256), (256, 1024), (8000, 256))  # (out, in): qkv, d x d, w1, w2, output
ROWS = (1, 4, 20, 320)
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# the same child without tfcli's C kernels (the decoder's layers on oneDNN, the attention in torch operators)
NO_KERNEL = ("import tfcli.generate.native as m; m.fp32_kernel = lambda: None; import runpy, sys; "
             "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
RUNS = {"native": ({}, []), "native, without tfcli's C kernels": ({}, ["-c", NO_KERNEL]), "avx2": (AVX2, []),
        "avx2, without tfcli's C kernels": (AVX2, ["-c", NO_KERNEL])}


def _translator(tmp: Path):
    import dataclasses

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers

    import tfcli
    from tfcli import checkpoint
    from tfcli.model import build_model, preset
    from tfcli.specials import SPECIAL_TOKENS

    torch.manual_seed(0)
    cfg = preset("small", src_vocab_size=8000, tgt_vocab_size=8000, norm="post", dropout=0.0, share_embeddings=True,
                 tie_output=True, max_len=512)
    model = build_model(cfg).eval()
    vocab = SPECIAL_TOKENS + [f"w{i}" for i in range(len(SPECIAL_TOKENS), 8000)]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp / "words.json"))
    ckpt = checkpoint.save(tmp / "ckpt", model, {"model": dataclasses.asdict(cfg)},
                           {"src": tmp / "words.json", "tgt": tmp / "words.json"})
    return tfcli.load(ckpt, device="cpu"), vocab


def _steps(translator, vocab, batch: int, beam: int) -> dict:
    import numpy as np
    import torch

    rng = np.random.default_rng(batch)
    texts = [" ".join(vocab[t] for t in rng.integers(4, 8000, size=20)) for _ in range(batch)]

    def run():
        translator.translate(texts, beam_size=beam, min_len=OUT_LEN, max_len_a=0.0, max_len_b=OUT_LEN,
                             batch_size=batch, raw=True)

    for _ in range(2):
        run()
    best = min(_timed(run) for _ in range(5))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    events = prof.events()
    top = [e for e in events if e.cpu_parent is None]
    self_us = sum(e.self_cpu_time_total for e in events)
    linear_us = sum(e.self_cpu_time_total for e in events if "linear" in e.name or e.name in ("aten::addmm", "aten::mm"))
    common = collections.Counter(e.name for e in top).most_common(8)
    return {"batch": batch, "beam": beam, "ms_per_step": 1000 * best / OUT_LEN, "sentences_per_s": batch / best,
            "ops_per_step": len(events) / OUT_LEN, "python_ops_per_step": len(top) / OUT_LEN,
            "linear_share": linear_us / self_us,
            "most_called_from_python": [[name, count / OUT_LEN] for name, count in common]}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _linears() -> list[dict]:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    x_all = torch.randn(max(ROWS), 1024)
    out = []
    for n_out, n_in in SHAPES:
        w, b = torch.randn(n_out, n_in) * n_in**-0.5, torch.randn(n_out)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 64)
        kernels = {"onednn_packed": lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""),
                   "mkl": lambda x: F.linear(x, w, b)}

        for name, f in kernels.items():
            full = f(x_all[:, :n_in].contiguous())
            same = all(torch.equal(f(x_all[:m, :n_in].contiguous()), full[:m]) for m in (1, 2, 3, 4, 5, 7, 20, 33))
            us = {}
            for m in ROWS:
                x = x_all[:m, :n_in].contiguous()
                for _ in range(20):
                    f(x)
                reps = max(20, 20000 // m)
                t = time.perf_counter()
                for _ in range(reps):
                    f(x)
                us[m] = 1e6 * (time.perf_counter() - t) / reps
            out.append({"shape": [n_out, n_in], "kernel": name, "row_invariant": same, "us_per_call": us})
    return out


def child(args) -> None:
    import torch

    from common import cpu_name
    from tfcli.runtime import tune_process

    tune_process("cpu", args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        translator, vocab = _translator(Path(tmp))
        steps = [_steps(translator, vocab, b, k) for b, k in CASES]
    print(json.dumps({"cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "isa": torch.backends.cpu.get_cpu_capability(), "steps": steps, "linears": _linears()}))


def markdown(res: dict) -> str:
    lines = ["# Where a decoding step's time goes (CPU)", "",
             f"Command: `.venv/bin/python benchmarks/step_profile.py --threads {res['threads']}`", "",
             f"Machine: {res['cpu']}, torch {res['torch']}, {res['threads']} threads. Measured {res['date']}. "
             f"Model: the synthetic 6+6 x 256 of translate_speed.py (vocabulary 8000, fp32), forced {OUT_LEN}-token "
             "outputs, through `tfcli.load(...).translate`. Each section is a process of its own, minutes from the "
             "others on a shared machine: its milliseconds a step are for reading where the time goes, not for "
             "comparing sections (an A/B belongs in interleaved runs); the operator counts do not move. The time in "
             "linear layers counts torch's operators only: tfcli's C kernel, called through ctypes, is not one.", ""]
    for cap, r in res["runs"].items():
        lines += [f"## {cap} (ATen kernels: {r['isa']}{', oneDNN held to AVX2' if cap.startswith('avx2') else ''})", "",
                  "| batch | beam | ms / step | sent/s | ops / step | from Python | time in linear layers | "
                  "most called from Python (a step) |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for s in r["steps"]:
            most = ", ".join(f"{n.split('::')[-1]} {c:.0f}" for n, c in s["most_called_from_python"][:5])
            lines.append(f"| {s['batch']} | {s['beam']} | {s['ms_per_step']:.2f} | {s['sentences_per_s']:.1f} | "
                         f"{s['ops_per_step']:.0f} | {s['python_ops_per_step']:.0f} | {100 * s['linear_share']:.0f}% | "
                         f"{most} |")
        lines += ["", "Linear layers alone, microseconds a call (rows x in -> out); row-invariant: a row's result is "
                  "the same at every row count (1 to 33 rows checked).", "",
                  "| out x in | kernel | row-invariant | " + " | ".join(f"{m} rows" for m in ROWS) + " |",
                  "| --- | --- | --- | " + " | ".join("---:" for _ in ROWS) + " |"]
        for li in r["linears"]:
            us = " | ".join(f"{li['us_per_call'][str(m)]:.1f}" for m in ROWS)
            lines.append(f"| {li['shape'][0]} x {li['shape'][1]} | {li['kernel']} | "
                         f"{'yes' if li['row_invariant'] else 'no'} | {us} |")
        lines.append("")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "step_profile"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    from common import write_results

    runs = {}
    for name, (env, switch) in RUNS.items():
        print(f"step_profile: {name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, *switch, __file__, "--child", "--threads", str(args.threads)],
                              env={**os.environ, **env}, capture_output=True, text=True, cwd=Path(__file__).parent)
        if proc.returncode:
            sys.exit(f"step_profile: the {name} run failed: {proc.stderr.strip().splitlines()[-1:]}")
        runs[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        if switch and runs[name]["isa"] not in ("AVX512", "AVX2"):
            del runs[name]  # (the kernels need AVX2: without them this is the run before again)
    first = next(iter(runs.values()))
    res = {"cpu": first["cpu"], "torch": first["torch"], "threads": first["threads"],
           "date": time.strftime("%Y-%m-%d %H:%M"), "runs": runs}
    write_results(args.out, res, markdown(res))


if __name__ == "__main__":
    main()
