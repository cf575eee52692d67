"""What the benchmark scripts share: the machine's description, writing results as JSON + Markdown, running each
system in a process of its own, and the systems that several scripts compare.

The scripts run as `.venv/bin/python benchmarks/NAME.py` with tfcli installed (`make install`); this module is found
beside them, as Python puts a script's directory first on its path."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import time
from pathlib import Path

# The corpora (../shared/data beside the repository, see its README), or $TFCLI_SHARED_DATA, as the tests read them:
# set it when running a script from a copy of the repository elsewhere (a git worktree).
SHARED_DATA = os.environ.get("TFCLI_SHARED_DATA", str(Path(__file__).resolve().parents[2] / "shared" / "data"))


def cpu_name() -> str:
    """The CPU model and its widest matrix instructions (AMX, AVX-512 BF16, AVX-512 or AVX2), e.g. "AMD EPYC (AVX2)":
    a virtual machine's model name ("AMD EPYC") can stand for generations 2x apart, and bf16 training is native
    only on the first two. Settings that hold torch, oneDNN or CTranslate2 below the CPU's instructions (to measure
    as an older CPU runs) are named after it."""
    model, flags, family = "", set(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            elif line.startswith("cpu family") and not family:
                family = line.split(":", 1)[1].strip()
    except OSError:
        pass
    model = model or platform.processor() or platform.machine()
    zen = {"25": "Zen 4" if "avx512f" in flags else "Zen 3", "26": "Zen 5"}.get(family)  # (AMD's family numbers)
    if model.startswith("AMD") and zen and "Zen" not in model:
        model = f"{model} {zen}"  # Zen 5's FMA peak is twice Zen 4's: the same "AMD EPYC" in a virtual machine
    isa = next((name for name, flag in (("AMX", "amx_bf16"), ("AVX-512 BF16", "avx512_bf16"),
                                        ("AVX-512", "avx512f"), ("AVX2", "avx2")) if flag in flags), None)
    caps = [f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "CT2_FORCE_CPU_ISA")
            if os.environ.get(k)]
    isa = "; ".join(filter(None, [isa, f"held to {', '.join(caps)}" if caps else None]))
    return f"{model} ({isa})" if isa else model


_FMA_LOOP = r"""
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#ifdef __AVX512F__
typedef __m512 vec;
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define LANES 16
#else
typedef __m256 vec;
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define LANES 8
#endif
int main(void) {
    vec a[12], b = SET1(0.999999f), c = SET1(1e-7f);
    for (int i = 0; i < 12; i++) a[i] = SET1((float)i);
    const long n = 200000000;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; k < n; k++) {
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) a[i] = FMA(a[i], b, c); /* twelve independent chains in registers */
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    float sink = 0;
    for (int i = 0; i < 12; i++) sink += ((float *)&a[i])[0];
    printf("%f %f\n", n * 12.0 * LANES * 2 / ((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec)) / 1e9, sink);
    return 0;
}
"""


def fma_peak_gflops(threads: int) -> float | None:
    """This CPU's fp32 multiply-add peak in GFLOP/s over `threads` cores, measured: a loop of independent FMAs of its
    widest vectors (AVX-512, else AVX2), compiled here with the system's C compiler and run in `threads` processes
    at once (their rates summed). No fp32 program multiplies faster on this machine. None without a compiler."""
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "fma.c", Path(tmp) / "fma"
        src.write_text(_FMA_LOOP)
        if subprocess.run([cc, "-O2", "-march=native", "-o", str(exe), str(src)], capture_output=True).returncode:
            return None
        runs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True) for _ in range(threads)]
        return sum(float(r.communicate()[0].split()[0]) for r in runs)


def trained_precision(run: Path) -> str | None:
    """fp32, bf16 or fp16: what a `tfcli train` run trained in, from its log's first lines (the config's `auto` or
    `native-bf16` resolves by the machine)."""
    log = Path(run) / "train.log"
    m = re.search(r"device \S+, (fp32|bf16|fp16), ", log.read_text()) if log.exists() else None
    return m.group(1) if m else None


def fell_back_to_fp32(run: Path) -> bool:
    """Whether a run's config asked for `native-bf16` and the CPU, lacking it, trained in fp32: about half the steps
    in a time budget, so its results are entries of their own."""
    import yaml

    config = Path(run) / "config.yaml"
    train = (yaml.safe_load(config.read_text()) or {}).get("train", {}) if config.exists() else {}
    asked = train.get("dtype", train.get("precision"))  # (precision: dtype's earlier name, in older runs)
    return asked == "native-bf16" and trained_precision(run) == "fp32"


def gpu_name() -> str | None:
    """The first CUDA GPU's name, None without one."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


ROOT = Path(__file__).resolve().parents[1]
# an absolute path of one machine (a POSIX path under a top-level folder, or a Windows drive's)
_MACHINE_PATH = re.compile(r"(?<![\w.~-])(?:/(?:work|tmp|home|root|mnt|data|opt|srv|scratch|Users|private|var)"
                           r"|[A-Za-z]:\\)[^\s\"'`|),;\]]*")


def portable(text: str, root: Path | str = ROOT) -> str:
    """`text` without the absolute paths of the machine that wrote it: the repository's own paths relative to it,
    the corpora's as `../shared/...`, anything else (a run or checkpoint directory) by its last three names."""
    shared = str(Path(SHARED_DATA).parent)

    def short(m: re.Match) -> str:
        path = m.group(0)
        for prefix, to in ((str(root) + "/", ""), (shared + "/", "../shared/"), (shared, "../shared")):
            if path.startswith(prefix):
                return to + path[len(prefix):]
        if "/shared/" in path:
            return "../shared/" + path.split("/shared/", 1)[1]
        parts = [p for p in re.split(r"[/\\]", path) if p][1:]  # (without the top folder, a drive, a user's)
        if path[1:].startswith(("home/", "Users/")) or path[1:3] == ":\\" and parts[:1] == ["Users"]:
            parts = parts[1:]
        return "/".join(parts[-3:])

    return _MACHINE_PATH.sub(short, text)


def best_of(ways: dict, repeats: int) -> tuple[dict, dict]:
    """Each way (name -> a function of no arguments) run `repeats` times, the ways in turn, side by side: (the last
    output of each, its times in seconds)."""
    import time

    outputs, times = {}, {name: [] for name in ways}
    for _ in range(repeats):
        for name, f in ways.items():
            start = time.perf_counter()
            outputs[name] = f()
            times[name].append(time.perf_counter() - start)
    return outputs, times


def write_results(out: str | Path, result: dict, markdown: str, quiet: bool = False) -> None:
    """OUT.json and OUT.md (OUT is a path without suffix), each written whole (temp + rename: a run killed at a time
    limit leaves the last complete version), without this machine's paths (`portable`), and the Markdown on stdout
    unless `quiet`."""
    from tfcli.io import atomic_write_text

    out = Path(out)
    atomic_write_text(out.with_suffix(".json"), portable(json.dumps(result, indent=2)) + "\n")
    atomic_write_text(out.with_suffix(".md"), portable(markdown))
    if not quiet:
        print(markdown)


def run_measured(argv: list[str]):
    """(seconds, resource usage from wait4() for that process alone) of one command run from the repository root;
    exits naming the command and its stderr if it fails."""
    import subprocess
    import time

    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    err = proc.stderr.read().decode()  # before waiting: a full pipe would block the child
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{err}")
    return seconds, usage


def run_tfcli_measured(command: str, args: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of one `python -m tfcli COMMAND ARGS` process (run_measured)."""
    import sys

    seconds, usage = run_measured([sys.executable, "-m", "tfcli", command, *args])
    return seconds, usage.ru_maxrss * 1024  # Linux reports KiB


def train_ab_setup(doc: str, steps: int, out: str) -> tuple[argparse.Namespace, dict]:
    """The arguments and the results header of a side-by-side CPU training benchmark (cpu_precision.py,
    train_cpu_step.py): a prepared directory, a recipe's config, steps, warmup steps left out of the rate, rounds."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("prep", help="a prepared directory (tfcli prepare)")
    p.add_argument("--config", default="recipes/multi30k-cpu-long.yaml")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--warmup", type=int, default=50, help="steps left out of the rate (and the lr warmup)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=out)
    args = p.parse_args()
    res = {"cpu": cpu_name(), "threads": os.cpu_count(), "prep": args.prep, "config": args.config,
           "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d %H:%M"),
           "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    return args, res


def train_steps(prep: str, config: str, steps: int, warmup: int, out: Path, extra: list[str] = (),
                launcher: list[str] | None = None) -> tuple[list[dict], dict]:
    """A short `tfcli train` run with a recipe's config: `steps` steps (`warmup` of them warming up), logged every 25,
    one validation at the end (loss only). Returns the train rows of its metrics.jsonl and its process's resource
    use (seconds, minor page faults, peak RSS). `launcher`: the Python command that runs the CLI with arguments after
    it (default: `python -m tfcli`)."""
    import sys

    args = [*(launcher or [sys.executable, "-m", "tfcli"]), "train", prep, "-o", str(out), "--config", config,
            "--set", "train.max_minutes=0", "--set", f"train.max_steps={steps}", "--set", f"train.warmup={warmup}",
            "--set", f"train.valid_every={steps}", "--set", "train.log_every=25", "--set", "train.valid_bleu=false",
            "--set", "train.early_stop_metric=loss", "--set", "train.average_last=0", "--seed", "1", *extra]
    seconds, usage = run_measured(args)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    use = {"seconds": seconds, "minor_faults": usage.ru_minflt, "peak_rss": usage.ru_maxrss * 1024}
    return [r for r in rows if r["split"] == "train"], use


class Isolated:
    """A benchmark runner in a process of its own: `run(*args)` returns (seconds, output), timed in that process.

    Each system runs alone in its process, as users run them. Sharing one process is not neutral: CTranslate2
    ships its own OpenMP runtime, and once it has run in a process, torch's two threads there contend for one core
    (measured on this project's 2-core machine: tfcli and HF generate 2-3x slower after a single CT2 call, for as
    long as the process lives). Nor is starting at once after another system: CTranslate2's threads spin on for
    200 ms after its work (Intel OpenMP's KMP_BLOCKTIME), so each run waits `pause_s` first, untimed.
    `factory(*args)` builds the runner (an object with `.run`) in the child; it and its arguments must be picklable
    (a module-level function, paths, plain data).
    """

    def __init__(self, name: str, factory, *args, threads: int):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing inherited from this process
        self.name = name
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child, factory, args, threads), daemon=True)
        self._proc.start()
        child.close()
        self._reply()  # the runner is built (or the error that stopped it)

    pause_s = 0.3  # idle seconds before each run (the class docstring says why)

    def run(self, *args):
        time.sleep(self.pause_s)
        self._conn.send(("run", *args))
        return self._reply()

    def _reply(self):
        ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(f"{self.name} (in its own process) failed:\n{value}")
        return value

    def peak_rss(self) -> int:
        """The process's peak resident memory so far, in bytes (its model, its work, and the libraries it loaded)."""
        self._conn.send(("rss",))
        return self._reply()

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send(("stop",))
            self._proc.join(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _serve(conn, factory, args, threads: int) -> None:
    import time
    import traceback

    import torch

    torch.set_num_threads(threads)
    try:
        runner = factory(*args)
        conn.send((True, None))
    except Exception:
        conn.send((False, traceback.format_exc()))
        return
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        if message[0] == "rss":  # (VmHWM, not getrusage's ru_maxrss, which keeps the forking parent's peak)
            status = Path("/proc/self/status").read_text()
            conn.send((True, int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024))
            continue
        try:
            start = time.perf_counter()
            out = runner.run(*message[1:])
            conn.send((True, (time.perf_counter() - start, out)))
        except Exception:
            conn.send((False, traceback.format_exc()))


def save_word_level(model, vocab: list[str], directory: Path) -> Path:
    """The tfcli `model` saved as a checkpoint, directory/ckpt, with a word-level tokenizer over `vocab` (ids in
    order)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tfcli import checkpoint

    directory = Path(directory)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(vocab[:4])
    tok.save(str(directory / "words.json"))
    sides = ("src", "tgt") if model.cfg.kind == "seq2seq" else ("tgt",)
    return checkpoint.save(directory / "ckpt", model, {"model": dataclasses.asdict(model.cfg)},
                           {side: directory / "words.json" for side in sides})


def export_peers(model, vocab: list[str], directory: Path, ct2: bool = True) -> tuple[Path, Path | None]:
    """`save_word_level`'s checkpoint (directory/ckpt) exported with `tfcli export` (tfcli.interop) to a
    transformers model (directory/hf) and, with `ct2`, a CTranslate2 float32 model (directory/ct2): the peers run
    exactly what a user's export gives them."""
    from tfcli.interop import export

    directory = Path(directory)
    ckpt = save_word_level(model, vocab, directory)
    export(ckpt, "hf", directory / "hf")
    if not ct2:
        return directory / "hf", None
    export(ckpt, "ctranslate2", directory / "ct2")
    return directory / "hf", directory / "ct2"


MAX_LEN = 100  # output tokens at most, in every system (CTranslate2 has one limit per batch, not per sentence)


class TfcliSystem:
    """`tfcli translate` through the Python API (the same decoder) in a process tuned as the command tunes its own,
    on pre-split batches of lines."""

    def __init__(self, ckpt: str, threads: int, dtype: str = "fp32"):
        from tfcli import load
        from tfcli.runtime import tune_process

        tune_process("cpu", threads)  # threads and the allocator, as `tfcli translate` sets them
        self.translator = load(ckpt, device="cpu", dtype=dtype)

    def run(self, lines: list[str], beam: int, batch: int) -> list[str]:
        return self.translator.translate(lines, beam_size=beam, len_penalty=0.0, batch_size=batch, max_len_a=0.0,
                                         max_len_b=MAX_LEN)


class CT2System:
    """A CTranslate2 export: tokenised with the copied tfcli tokenizer, detokenised with it."""

    def __init__(self, directory: str, threads: int):
        import ctranslate2

        from tfcli.data import load_tokenizer

        self.translator = ctranslate2.Translator(directory, device="cpu", intra_threads=threads, inter_threads=1)
        self.src = load_tokenizer(Path(directory) / "tokenizer.src.json")
        self.tgt = load_tokenizer(Path(directory) / "tokenizer.tgt.json")

    def run(self, lines: list[str], beam: int, batch: int) -> list[str]:
        from tfcli.data import decode_batch

        encodings = self.src.encode_batch(lines, add_special_tokens=False)
        out = []
        for i in range(0, len(lines), batch):
            part = [e.tokens for e in encodings[i : i + batch]]
            res = self.translator.translate_batch(
                part, beam_size=beam, length_penalty=0.0, max_batch_size=batch, max_decoding_length=MAX_LEN,
                suppress_sequences=[["<pad>"], ["<s>"]],
            )
            out += decode_batch(self.tgt, [[self.tgt.token_to_id(t) for t in r.hypotheses[0]] for r in res])
        return out
