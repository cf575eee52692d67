"""int8 on the CPU: `tfcli translate --dtype int8` beside float32, and beside CTranslate2 int8 on the same weights.

    .venv/bin/python benchmarks/int8_speed.py CKPT [--threads N] [--batch 64] [--repeats 3] [--data ../shared/data]

The 1,000 German sentences of Multi30k test2016 through five systems, each in a process of its own
(benchmarks/common.py: Isolated), beam 5 at batch 64, length penalty 0 and at most MAX_LEN output tokens in all
(as benchmarks/export_check.py does, so that CTranslate2 decodes the same search): tfcli float32, tfcli int8, tfcli
int8 as a CPU without AMX runs it (every product on fbgemm; oneDNN kept below AMX by ONEDNN_MAX_CPU_ISA), and
the checkpoint exported by `tfcli export --to ctranslate2` with and without `--dtype int8`. BLEU is
sacreBLEU on the references; sentences/s the best of --repeats, the systems interleaved. Then each system
translates the same sentences at batch 1 and 7, and in reverse order at --batch: how many of its translations
differ from those at --batch (none may: a sentence's translation must not depend on its batch or neighbours).
Results: benchmarks/results/int8_speed.{json,md}, with the CPU named.

    .venv/bin/python benchmarks/int8_speed.py --sizes [--threads N] [--sentences 256] [--repeats 3]

From which model size int8 pays: random-weight models of three shapes (the CPU recipe's 4+4 x 128 with QK-norm,
the `small` preset's 6+6 x 256, the `base` 6+6 x 512), pre-norm, ReLU, vocabulary 8,000, each as a checkpoint
through the Python API, tfcli fp32 against tfcli int8, beam 5 and greedy at batch 64, sources of Multi30k's
lengths (random words, 8 to 18 tokens) and a forced output of 14 tokens (the same work in both); each system in a
process of its own, best of --repeats, interleaved, once with the CPU's own kernels and once held to AVX2
(ATEN_CPU_CAPABILITY=avx2, which the C kernels follow). Results: benchmarks/results/int8_speed-sizes.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from common import SHARED_DATA, CT2System, Isolated, TfcliSystem, cpu_name, write_results

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
SYSTEMS = ("tfcli fp32", "tfcli int8", "tfcli int8, no AMX", "CT2 fp32", "CT2 int8")
# what a CPU without AMX runs (every int8 product on fbgemm), here by oneDNN's own switch, which tfcli follows
NO_AMX = {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}
OTHER_RUNS = ("batch 1", "batch 7", "reversed")  # other company for each sentence: count what changes


def with_env(env: dict, f, *args, **kwargs):
    """f(*args, **kwargs) with `env` set (a child process started in it keeps it), then the environment as it was."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return f(*args, **kwargs)
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


SHAPES = {  # name -> ModelConfig fields
    "recipe 4+4 x 128": dict(d_model=128, n_head=4, n_encoder_layers=4, n_decoder_layers=4, d_ff=256, qk_norm=True),
    "small 6+6 x 256": dict(d_model=256, n_head=4, n_encoder_layers=6, n_decoder_layers=6, d_ff=1024),
    "base 6+6 x 512": dict(d_model=512, n_head=8, n_encoder_layers=6, n_decoder_layers=6, d_ff=2048),
}
CAPABILITIES = ("native", "avx2")  # the CPU's own kernels, and held to AVX2
FORCED = 14  # output tokens in --sizes (Multi30k's mean reference length)


class ForcedSystem:
    """tfcli through the Python API, every output exactly `length` tokens (min_len = max_len)."""

    def __init__(self, ckpt: str, threads: int, dtype: str):
        from tfcli import load
        from tfcli.runtime import tune_process

        tune_process("cpu", threads)
        self.translator = load(ckpt, device="cpu", dtype=dtype)

    def run(self, lines: list[str], beam: int, batch: int, length: int) -> list[str]:
        return self.translator.translate(lines, beam_size=beam, len_penalty=0.0, batch_size=batch, min_len=length,
                                         max_len_a=0.0, max_len_b=length, raw=True)


def sizes(args) -> None:
    """int8 against fp32 by model size (the module docstring's second part)."""
    import random

    import torch

    from common import save_word_level
    from tfcli.model import ModelConfig, build_model
    from tfcli.specials import SPECIAL_TOKENS

    vocab = SPECIAL_TOKENS + [f"w{i}" for i in range(len(SPECIAL_TOKENS), 8000)]
    rng = random.Random(0)
    lines = [" ".join(rng.choice(vocab[4:]) for _ in range(rng.randint(8, 18))) for _ in range(args.sentences)]
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/int8_speed.py", *sys.argv[1:]]),
           "cpu": cpu_name(), "threads": args.threads, "batch": 64, "sentences": len(lines), "output_len": FORCED,
           "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()], "runs": []}
    t = args.threads
    with tempfile.TemporaryDirectory() as tmp:
        for name, fields in SHAPES.items():
            torch.manual_seed(0)
            cfg = ModelConfig(src_vocab_size=len(vocab), tgt_vocab_size=len(vocab), dropout=0.0, norm="pre",
                              share_embeddings=True, max_len=256, **fields)
            folder = Path(tmp) / name.split()[0]
            folder.mkdir()
            ckpt = str(save_word_level(build_model(cfg).eval(), vocab, folder))
            for capability in CAPABILITIES:
                env = {} if capability == "native" else {"ATEN_CPU_CAPABILITY": capability}
                systems = {dtype: with_env(env, Isolated, f"{name} {dtype}", ForcedSystem, ckpt, t, dtype, threads=t)
                           for dtype in ("fp32", "int8")}
                try:
                    for beam in (5, 1):
                        print(f"{name}, {capability}, beam {beam} ...", file=sys.stderr, flush=True)
                        for system in systems.values():  # warm-up
                            system.run(lines[:8], beam, 64, FORCED)
                        times = {dtype: [] for dtype in systems}
                        for _ in range(args.repeats):
                            for dtype, system in systems.items():
                                times[dtype].append(system.run(lines, beam, 64, FORCED)[0])
                        speed = {dtype: len(lines) / min(ts) for dtype, ts in times.items()}
                        res["runs"].append({"model": name, "capability": capability, "beam": beam,
                                            "sent_per_s": speed, "int8_over_fp32": speed["int8"] / speed["fp32"]})
                finally:
                    for system in systems.values():
                        system.close()
    res["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    md = ["# int8 against fp32 by model size (tfcli, CPU)", "",
          f"CPU: {res['cpu']}, {t} threads; {len(lines)} sentences of 8 to 18 random words, output forced to "
          f"{FORCED} tokens, batch 64; random weights, pre-norm, ReLU, vocabulary 8,000; best of {args.repeats}, "
          f"interleaved; {res['date']}. Written by `benchmarks/int8_speed.py --sizes`.", "",
          "| model | kernels | decoding | fp32 sent/s | int8 sent/s | int8 / fp32 |", "| --- | --- | --- | ---: | ---: | ---: |",
          *[f"| {r['model']} | {r['capability']} | {'greedy' if r['beam'] == 1 else 'beam 5'} | "
            f"{r['sent_per_s']['fp32']:.1f} | {r['sent_per_s']['int8']:.1f} | {r['int8_over_fp32']:.2f}x |"
            for r in res["runs"]], "",
          f"Command: `{res['command']}`.", "",
          f"Load average at start {res['load_average_at_start']}, at end {res['load_average_at_end']}.", ""]
    write_results(args.out, res, "\n".join(md))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", nargs="?")
    p.add_argument("--sizes", action="store_true", help="int8 against fp32 on random models of three sizes")
    p.add_argument("--sentences", type=int, default=256, help="--sizes: sentences a run")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.sizes:
        args.out = args.out or str(RESULTS / "int8_speed-sizes")
        return sizes(args)
    if not args.checkpoint:
        p.error("give a checkpoint, or --sizes")
    args.out = args.out or str(RESULTS / "int8_speed")
    import sacrebleu

    from tfcli import checkpoint_meta
    from tfcli.interop import export

    data = Path(args.data) / "multi30k"
    lines = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    refs = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    res = {"command": shlex.join([".venv/bin/python", "benchmarks/int8_speed.py", *sys.argv[1:]]),
           "cpu": cpu_name(), "threads": args.threads, "batch": args.batch, "beam": 5, "repeats": args.repeats,
           "checkpoint": str(checkpoint_meta.resolve(args.checkpoint)), "sentences": len(lines),
           "date": time.strftime("%Y-%m-%d %H:%M"), "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        export(args.checkpoint, "ctranslate2", Path(tmp) / "fp32")
        export(args.checkpoint, "ctranslate2", Path(tmp) / "int8", quantization="int8")
        t = args.threads
        systems = {
            "tfcli fp32": Isolated("tfcli fp32", TfcliSystem, args.checkpoint, t, "fp32", threads=t),
            "tfcli int8": Isolated("tfcli int8", TfcliSystem, args.checkpoint, t, "int8", threads=t),
            "tfcli int8, no AMX": with_env(NO_AMX, Isolated, "tfcli int8, no AMX", TfcliSystem, args.checkpoint, t,
                                           "int8", threads=t),
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
            # the same sentences in other company: how many translations change with it
            changed = {}
            for name in SYSTEMS:
                other = {"batch 1": systems[name].run(lines, 5, 1)[1], "batch 7": systems[name].run(lines, 5, 7)[1],
                         "reversed": systems[name].run(lines[::-1], 5, args.batch)[1][::-1]}
                changed[name] = {run: sum(a != b for a, b in zip(outputs[name], other[run])) for run in OTHER_RUNS}
        finally:
            for system in systems.values():
                system.close()
    speed = {name: len(lines) / min(ts) for name, ts in times.items()}
    res.update(bleu=bleu, sent_per_s=speed, load_average_at_end=[round(x, 2) for x in os.getloadavg()])
    res["changed"] = changed
    res["ratios"] = {
        "tfcli int8 / tfcli fp32": speed["tfcli int8"] / speed["tfcli fp32"],
        "tfcli int8 / CT2 int8": speed["tfcli int8"] / speed["CT2 int8"],
        "CT2 int8 / CT2 fp32": speed["CT2 int8"] / speed["CT2 fp32"],
        "tfcli int8, no AMX / tfcli fp32": speed["tfcli int8, no AMX"] / speed["tfcli fp32"],
    }
    md = [
        "# int8 on the CPU: tfcli and CTranslate2, Multi30k test2016 de->en", "",
        f"CPU: {res['cpu']}, {args.threads} threads; {len(lines)} sentences, beam 5, batch {args.batch}, length "
        f"penalty 0; best of {args.repeats}; {res['date']}. Checkpoint `{res['checkpoint']}`. Written by "
        "`benchmarks/int8_speed.py`.", "",
        f"| system | sacreBLEU | sentences/s | translations that differ from batch {args.batch}'s: "
        + ", ".join(OTHER_RUNS) + " |",
        "| --- | ---: | ---: | ---: |",
        *[f"| {name} | {bleu[name]:.2f} | {speed[name]:.1f} | "
          + ", ".join(str(changed[name][run]) for run in OTHER_RUNS) + f" of {len(lines)} |" for name in SYSTEMS],
        "",
        *[f"- {k}: {v:.2f}x" for k, v in res["ratios"].items()],
        f"- BLEU, tfcli int8 - fp32: {bleu['tfcli int8'] - bleu['tfcli fp32']:+.2f}", "",
        "Targets (issue 36): " + "; ".join(
            f"{what} {'met' if ok else 'NOT met'}" for what, ok in (
                ("int8 >= 1.5x tfcli fp32", res["ratios"]["tfcli int8 / tfcli fp32"] >= 1.5),
                ("int8 >= 2x CT2 int8", res["ratios"]["tfcli int8 / CT2 int8"] >= 2.0),
                ("BLEU within 0.3 of fp32", abs(bleu["tfcli int8"] - bleu["tfcli fp32"]) <= 0.3),
                ("tfcli int8 the same in every company", not any(changed["tfcli int8"].values())),
            )
        ) + ".", "",
        f"Command: `{res['command']}`.", "",
        f"Load average at start {res['load_average_at_start']}, at end {res['load_average_at_end']}.", "",
    ]
    write_results(args.out, res, "\n".join(md))


if __name__ == "__main__":
    main()
