"""Translation speed, side by side in one run: tfcli vs Hugging Face `generate` vs CTranslate2, on the CPU (or a GPU).

    .venv/bin/python benchmarks/translate_speed.py [--threads N] [--checkpoint CKPT] [--peer-checkpoint CKPT]

(1) Synthetic: a randomly initialised tfcli model shaped like the `small` preset (d_model 256, 6+6 layers, 4 heads,
    FFN 1024, vocabulary 8000; --arch base --vocab 58000: the OPUS-MT base shape, as CTranslate2's own benchmark;
    --int8 adds tfcli --dtype int8 and CTranslate2 int8), shared and tied embeddings, post-norm, ReLU, sinusoidal positions), exported with
    `tfcli export` (tfcli/interop) to a `transformers` MarianMTModel and a CTranslate2 float32 model, as a user's
    export is (checked: the same logits as tfcli, recorded). All three decode the same source batches with the same
    beam size, batch size and threads, and a FORCED output length (no </s> before L tokens, stop at L), so they do the same
    work: tfcli min_len = max_len = L, HF min_new_tokens = max_new_tokens = L, CT2 min/max_decoding_length = L.
    tfcli runs through its Python API (`tfcli.load(...).translate`, word-level text in, `raw` tokens out) in a
    process tuned as `tfcli translate` tunes its own (tfcli.runtime), on the CPU in fp32; HF runs its default eager
    path. Each system runs in a process of its own, one at a time (sharing a process with
    CTranslate2's OpenMP runtime slows torch 2-3x: benchmarks/common.py, Isolated). Compared at each of
    --batch-sizes, for beam search and greedy decoding.
(2) Real: the 1,000 Multi30k test2016 German sentences, translated by a trained checkpoint (--checkpoint) through the
    Python API (tokenise, batch, search, detokenise, as `tfcli translate`), greedy and beam, at the first --batch-sizes,
    with BLEU as a sanity check; skipped, saying why, when the data or the checkpoint is missing. tfcli only (the
    peers run in part (3)).
(3) Real, side by side: a trained checkpoint (--peer-checkpoint; one that `tfcli export --to hf` accepts: post-norm
    becomes MarianMT, pre-norm with shared embeddings Pegasus) exported to transformers and CTranslate2 as in (1);
    the same 1,000 sentences (pre-tokenised for the peers; tfcli, through its API, is given the text), natural
    output lengths, alpha 0, BLEU and agreement per system.

With --device cuda, (1) alone runs on the GPU with CTranslate2's GPU table's systems: tfcli bf16 (the main columns)
and fp16, HF fp16, CTranslate2 float16 and int8_float16 (its float model quantised at load); --hf-sentences N gives
HF every k-th batch, N sentences, where it would take too long for a device's time (benchmarks/gpu_all.sh: opus,
nllb).

With --int8, CTranslate2's int8 runs a model converted with `quantization="int8"` (what its documentation has int8
users do: a quarter of the bytes to read and hold), tfcli's the same fp32 checkpoint with `--dtype int8`. With
--shape, (1) also reports each system's time from a command's start to its first output line (load and one sentence
at the beam size; best of --first-line-repeats fresh processes) and that process's peak memory (GNU time's maximum
RSS): `tfcli translate` as a user runs it (stdin to stdout), CTranslate2 as a Python script that imports ctranslate2
alone (its users need no torch), and Python importing torch alone (no program on torch prints sooner); tfcli fp32
and int8 both making their layers at load and on the checkpoint after `tfcli quantize --dtype fp32` and `--dtype
int8` (the layers stored once in the layout decoding reads, as CTranslate2's model is converted once). (1) also
reports the fp32 arithmetic floor of each run: the linear layers' least multiply-adds at this CPU's FMA peak,
measured in the same run (common.fma_peak_gflops), against HF's and tfcli's times.

Each measurement is repeated (--repeats), systems interleaved, and the best time is kept (the machine may be
shared). Results: benchmarks/results/translate_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import SHARED_DATA, Isolated, cpu_name, export_peers, fma_peak_gflops, write_results
from tfcli.data import pad, source_ids
from tfcli.errors import TfcliError
from tfcli.model import build_model, preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
CT2_TARGET, HF_TARGET = 1.0, 2.5  # tfcli's speed over CTranslate2's (every case) and over HF generate's (beam search)
# the published families' shapes (--shape): their configs' values, random weights; exported to transformers as the
# family's own class (tc-big: MarianMT; M2M-100 and NLLB-200, fairseq positions: M2M100) and to CTranslate2
SHAPES = {
    "tc-big": dict(arch="big", vocab=54776, layers=6, norm="post", positions="sinusoidal"),
    "m2m100-418m": dict(arch="big", vocab=128112, layers=12, norm="pre", positions="fairseq"),
    "nllb-600m": dict(arch="big", vocab=256206, layers=12, norm="pre", positions="fairseq"),
}


# --- the same function -----------------------------------------------------------------------------------------


def check_same_function(model, marian, n=4, length=12) -> float:
    """Max |logit difference| between tfcli and its transformers export on a random batch (raises if they are not
    the same function)."""
    g = torch.Generator().manual_seed(0)
    V = model.cfg.tgt_vocab_size
    src = torch.randint(4, V, (n, length), generator=g)
    src[:, -1] = EOS_ID
    src[1, 7:] = PAD_ID
    tgt = torch.randint(4, V, (n, 9), generator=g)
    tgt[:, 0] = BOS_ID
    with torch.inference_mode():
        ours = model(src, tgt)
        # (M2M100's layout is fairseq's: <s> 0, <pad> 1, where tfcli has <pad> 0, <s> 1; every other id the same)
        swap = (lambda x: torch.where(x < 2, 1 - x, x)) if marian.config.pad_token_id == 1 else (lambda x: x)
        theirs = marian(input_ids=swap(src), attention_mask=(src != PAD_ID).long(), decoder_input_ids=swap(tgt)).logits
        if marian.config.pad_token_id == 1:
            theirs = theirs[..., swap(torch.arange(theirs.size(-1)))]
    diff = float((ours - theirs).abs().max())
    assert diff < 1e-3, f"the transformers export differs from the tfcli model (max logit difference {diff})"
    return diff


# --- the three decoders ----------------------------------------------------------------------------------------


class TfcliRunner:
    """`tfcli translate` through the Python API, in a process tuned as the command tunes its own (tfcli.runtime):
    token ids in and out as words of the checkpoint's word-level vocabulary (common.export_peers), `raw` output."""

    name = "tfcli"

    def __init__(self, ckpt: str, vocab: list[str], lines: dict | None = None, dtype: str = "fp32",
                 device: str = "cpu"):
        """`vocab`: the target tokens by id; `lines`: each source's text by its token ids (a tuple), for a subword
        model, whose tokens joined by spaces are not its input (without: the word-level synthetic model's words)."""
        import tfcli
        from tfcli.runtime import tune_process

        tune_process(device)
        self.translator = tfcli.load(ckpt, device=device, dtype=dtype)
        self.vocab, self.index, self.lines = vocab, {t: i for i, t in enumerate(vocab)}, lines

    def run(self, batches, beam, length, alpha, forced=True):
        """Forced: exactly `length` tokens each; else up to `length` tokens, stopping at </s>. A subword model's
        sources go in as text, tokenised in the timed call (as `tfcli translate` does). All batches in one call, at
        most the largest batch's sentences at a time, as CTranslate2 is given them (each forms its own batches by
        length)."""
        texts = [self.lines[tuple(s)] if self.lines else " ".join(self.vocab[t] for t in s) for b in batches for s in b]
        size = max(len(b) for b in batches)
        hyps = self.translator.translate(
            texts, beam_size=beam, len_penalty=alpha, min_len=length if forced else 0, max_len_a=0.0,
            max_len_b=length, batch_size=size, max_tokens=size * (max(len(s) for b in batches for s in b) + 1),
            raw=True)
        return [[self.index[t] for t in h.split()] for h in hyps]


class HFRunner:
    name = "hf"

    def __init__(self, marian):
        self.marian = marian

    def run(self, batches, beam, length, alpha, forced=True):
        V = self.marian.config.pad_token_id
        out = []
        with torch.inference_mode():
            for batch in batches:
                src = pad([source_ids(s) for s in batch], pad_id=V).to(self.marian.device)
                beam_args = dict(length_penalty=alpha, early_stopping=True) if beam > 1 else {}
                gen = self.marian.generate(
                    input_ids=src, attention_mask=(src != V).long(), num_beams=beam, do_sample=False,
                    min_new_tokens=length if forced else 0, max_new_tokens=length, num_return_sequences=1,
                    **beam_args,
                )
                out += [_until_eos([t for t in row[1:].tolist() if t != V]) for row in gen]
        return out


class CT2Runner:
    name = "ct2"

    def __init__(self, path, vocab, threads, compute_type="float32", device="cpu"):
        import ctranslate2

        self.translator = ctranslate2.Translator(str(path), device=device, compute_type=compute_type,
                                                 intra_threads=threads, inter_threads=1)
        self.vocab = vocab
        self.index = {t: i for i, t in enumerate(vocab)}

    def run(self, batches, beam, length, alpha, forced=True):
        sents = [[self.vocab[t] for t in s] for batch in batches for s in batch]  # the export appends </s>
        res = self.translator.translate_batch(
            sents, beam_size=beam, max_batch_size=max(len(b) for b in batches), batch_type="examples",
            min_decoding_length=length if forced else 0, max_decoding_length=length, length_penalty=alpha,
            suppress_sequences=[["<pad>"], ["<s>"]],  # never output by tfcli's decoders, nor by the HF export
        )
        return [[self.index[t] for t in r.hypotheses[0]] for r in res]


def hf_runner(directory: str, device: str = "cpu") -> HFRunner:
    """The transformers model, in fp32 on the CPU, in fp16 on a GPU (as CTranslate2's GPU table runs it)."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    return HFRunner(model if device == "cpu" else model.half().to(device))


def start_runners(ckpt: Path, hf_dir: Path, ct2_dir: Path, vocab: list[str], threads: int,
                  lines: dict | None = None, int8: Path | None = None, device: str = "cpu") -> list:
    """tfcli, HF and CT2 (with `int8`, the CTranslate2 int8 model's directory: tfcli --dtype int8 and CTranslate2
    int8 too), each in a process of its own (benchmarks/common.py: Isolated says why). On a GPU (`device` cuda),
    CTranslate2's GPU table's systems: tfcli bf16 and fp16, HF fp16, CTranslate2 float16 and int8_float16 (from its
    float model, quantised at load)."""
    if device != "cpu":
        return [Isolated("tfcli", TfcliRunner, str(ckpt), vocab, lines, "bf16", device, threads=threads),
                Isolated("hf", hf_runner, str(hf_dir), device, threads=threads),
                Isolated("ct2", CT2Runner, str(ct2_dir), vocab, threads, "float16", device, threads=threads),
                Isolated("tfcli_fp16", TfcliRunner, str(ckpt), vocab, lines, "fp16", device, threads=threads),
                Isolated("ct2_int8_float16", CT2Runner, str(ct2_dir), vocab, threads, "int8_float16", device,
                         threads=threads)]
    runners = [Isolated("tfcli", TfcliRunner, str(ckpt), vocab, lines, threads=threads),
               Isolated("hf", hf_runner, str(hf_dir), threads=threads),
               Isolated("ct2", CT2Runner, str(ct2_dir), vocab, threads, threads=threads)]
    if int8:
        runners += [Isolated("tfcli_int8", TfcliRunner, str(ckpt), vocab, lines, "int8", threads=threads),
                    Isolated("ct2_int8", CT2Runner, str(int8), vocab, threads, "int8", threads=threads)]
    return runners


_CT2_FIRST_LINE = """
import sys
import ctranslate2
path, compute_type, threads, beam, length, line = sys.argv[1:]
t = ctranslate2.Translator(path, device="cpu", compute_type=compute_type, intra_threads=int(threads), inter_threads=1)
r = t.translate_batch([line.split()], beam_size=int(beam), max_decoding_length=int(length),
                      min_decoding_length=int(length), length_penalty=0.0, suppress_sequences=[["<pad>"], ["<s>"]])
print(" ".join(r[0].hypotheses[0]), flush=True)
"""


def first_line(cmd: list[str], stdin: str) -> tuple[float, int, str]:
    """(seconds from the start of `cmd` to its first output line, its peak RSS in bytes, that line)."""
    with tempfile.NamedTemporaryFile() as rss:
        t = time.perf_counter()
        p = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        p.stdin.write(stdin)
        p.stdin.close()
        line = p.stdout.readline()
        dt = time.perf_counter() - t
        p.stdout.read()
        if p.wait():
            raise RuntimeError(f"{shlex.join(cmd)}: exit status {p.returncode}")
        return dt, int(Path(rss.name).read_text().split()[-1]) * 1024, line.strip()


def first_lines(ckpt: Path, ct2_dir: Path, int8_dir: Path | None, line: str, args) -> dict:
    """`first_line` of `tfcli translate` (fp32, and after `tfcli quantize --dtype fp32`; with `int8_dir`, --dtype int8
    too, at load and after `tfcli quantize`) and of CTranslate2's script
    on `ct2_dir` (float32) and `int8_dir` (int8), on one source line: best of args.first_line_repeats each,
    interleaved."""
    L, b, threads = str(args.out_len), str(args.beam), str(args.threads)

    def tfcli(path: Path) -> list[str]:
        return [sys.executable, "-m", "tfcli", "translate", "-m", str(path), "-b", b, "--len-penalty", "0",
                "--max-len-a", "0", "--max-len-b", L, "--min-len", L, "--raw", "--threads", threads, "-q"]

    ct2 = [sys.executable, "-c", _CT2_FIRST_LINE]
    cmds = {"tfcli": tfcli(ckpt), "ct2": ct2 + [str(ct2_dir), "float32", threads, b, L, line],
            "import_torch": [sys.executable, "-u", "-c", "import sys, torch; print(sys.stdin.readline().strip())"]}
    stored = ckpt.with_name(ckpt.name + "-quantized")  # the checkpoint's files, and `tfcli quantize`'s beside them
    stored.mkdir()
    for f in ckpt.iterdir():
        (stored / f.name).symlink_to(f.resolve())
    quantize = [sys.executable, "-m", "tfcli", "quantize", str(stored), "--dtype"]
    if subprocess.run(quantize + ["fp32"], capture_output=True).returncode == 0:  # (where the row kernel runs)
        cmds["tfcli_quantized"] = tfcli(stored)
    if int8_dir is not None:
        subprocess.run(quantize + ["int8"], check=True, capture_output=True)
        cmds |= {"tfcli_int8": tfcli(ckpt) + ["--dtype", "int8"],
                 "tfcli_int8_quantized": tfcli(stored) + ["--dtype", "int8"],
                 "ct2_int8": ct2 + [str(int8_dir), "int8", threads, b, L, line]}
    runs: dict[str, list] = {name: [] for name in cmds}
    for _ in range(args.first_line_repeats):
        for name, cmd in cmds.items():
            runs[name].append(first_line(cmd, line + "\n"))
    out = {name: {"seconds": min(r[0] for r in rs), "times_s": [r[0] for r in rs],
                  "peak_rss_mb": max(r[1] for r in rs) / 2**20, "line": rs[0][2]} for name, rs in runs.items()}
    for name in cmds:
        if name not in ("tfcli", "import_torch"):
            out[name]["same_line_as_tfcli"] = out[name]["line"] == out["tfcli"]["line"]
    if "tfcli_int8_quantized" in out:
        stored = out["tfcli_int8_quantized"]
        stored["same_line_as_tfcli_int8"] = stored["line"] == out["tfcli_int8"]["line"]
    return out


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t, out


def compare(runners, batches, beam, length, alpha, repeats, forced=True,
            most: dict | None = None) -> tuple[dict, dict]:
    """Best-of-`repeats` sentences/s per runner (each an `Isolated` process; one runs at a time), interleaved; plus
    output agreement and lengths. Returns the figures and each runner's outputs (token ids per sentence). `most`:
    runner name -> the sentences it translates at most: every k-th batch, so that they span the lengths (its speed
    and its agreement with tfcli are over those)."""
    for r in runners:  # warm-up: first calls allocate, pick kernels, fill caches
        r.run([batches[0][:4]], beam, length, alpha, forced)
    picked = {}  # runner name -> the batches it translates
    for r in runners:
        limit = (most or {}).get(r.name)
        picked[r.name] = list(range(len(batches)))[:: max(1, len(batches) * len(batches[0]) // limit)] if limit \
            else list(range(len(batches)))
    times = {r.name: [] for r in runners}
    outputs = {}
    for _ in range(repeats):
        for r in runners:
            dt, outputs[r.name] = r.run([batches[i] for i in picked[r.name]], beam, length, alpha, forced)
            times[r.name].append(dt)
    res = {"sentences": sum(len(b) for b in batches), "beam": beam,
           ("output_len" if forced else "max_output_len"): length}
    for r in runners:
        lens = {len(o) for o in outputs[r.name]}
        n = len(outputs[r.name])
        res[r.name] = {
            "sentences": n, "sent_per_s": n / min(times[r.name]), "best_s": min(times[r.name]),
            "median_s": float(np.median(times[r.name])), "times_s": times[r.name], "output_lengths": sorted(lens),
        }
    starts = np.cumsum([0] + [len(b) for b in batches])
    for r in runners[1:]:
        ref = [outputs["tfcli"][j] for i in picked[r.name] for j in range(starts[i], starts[i + 1])]
        theirs = outputs[r.name]
        res[r.name]["same_output_as_tfcli"] = sum(a == b for a, b in zip(ref, theirs)) / len(theirs)
        res[f"tfcli_over_{r.name}"] = res["tfcli"]["sent_per_s"] / res[r.name]["sent_per_s"]
    if "tfcli_int8" in outputs:
        for peer in ("tfcli", "hf", "ct2_int8"):
            res[f"tfcli_int8_over_{peer}"] = res["tfcli_int8"]["sent_per_s"] / res[peer]["sent_per_s"]
    return res, outputs


def linear_gflop(cfg, src_lens: list[int], out_len: int, beam: int) -> float:
    """The linear layers' arithmetic (2 x multiply-adds, GFLOP) that translating sentences of `src_lens` source
    tokens (</s> included) to exactly `out_len` tokens takes at the least, whatever the implementation: each source
    token through the encoder's layers and each decoder layer's source key/value projection; each decoding step of
    each hypothesis (one at the first step, `beam` after) through the decoder's layers and the output layer.
    Attention, norms, softmax and search are left out: the floor is lower than any real run's work."""
    d, f, dkv, V = cfg.d_model, cfg.d_ff, cfg.kv_heads * cfg.d_head, cfg.tgt_vocab_size
    ffn = (3 if cfg.activation in ("swiglu", "geglu") else 2) * d * f  # (a gated FFN: three projections)
    encoder = cfg.n_encoder_layers * (d * (d + 2 * dkv) + d * d + ffn) + cfg.n_decoder_layers * 2 * d * dkv
    decoder = cfg.n_decoder_layers * (d * (d + 2 * dkv) + 3 * d * d + ffn) + d * V
    rows = len(src_lens) * (1 + beam * (out_len - 1))
    return 2 * (sum(src_lens) * encoder + rows * decoder) / 1e9


def arithmetic_floor(run: dict, gflop: float, peak: float) -> dict:
    """What the linear layers' `gflop` take at this CPU's FMA `peak` (GFLOP/s over the run's threads), against the
    run's times: the most any fp32 system could be faster than HF here, and the share of the peak tfcli ran at."""
    floor_s = gflop / peak
    return {"linear_gflop": gflop, "floor_s": floor_s, "hf_over_floor": run["hf"]["best_s"] / floor_s,
            "tfcli_share_of_peak": floor_s / run["tfcli"]["best_s"]}


# --- the parts -------------------------------------------------------------------------------------------------


def synthetic(args, tmp: Path) -> dict:
    torch.manual_seed(0)
    shape = SHAPES.get(args.shape, {})
    layers = dict(n_encoder_layers=shape["layers"], n_decoder_layers=shape["layers"]) if shape else {}
    cfg = preset(args.arch, src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, norm=shape.get("norm", "post"),
                 positions=shape.get("positions", "sinusoidal"), dropout=0.0, share_embeddings=True,
                 tie_output=True, max_len=512, activation=args.activation, **layers)
    model = build_model(cfg).eval()
    vocab = SPECIAL_TOKENS + [f"w{i}" for i in range(len(SPECIAL_TOKENS), args.vocab)]
    hf_dir, ct2_dir = export_peers(model, vocab, tmp)
    diff = check_same_function(model, hf_runner(str(hf_dir)).marian)
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.src_len - 5, args.src_len + 6, size=args.sentences)
    sents = sorted(([int(t) for t in rng.integers(4, args.vocab, size=n)] for n in lengths), key=len)
    int8_dir = None
    if args.int8 and args.device == "cpu":
        from tfcli.interop import export

        int8_dir = tmp / "ct2_int8"
        export(tmp / "ckpt", "ctranslate2", int8_dir, quantization="int8")
    runners = start_runners(tmp / "ckpt", hf_dir, ct2_dir, vocab, args.threads, int8=int8_dir, device=args.device)
    out = {"model": f"{args.shape or args.arch}-shaped random seq2seq, {cfg.norm}-norm, {cfg.positions} positions, "
                    f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers} x {cfg.d_model}, ffn {cfg.d_ff}, {cfg.n_head} "
                    f"heads, {cfg.activation}, vocab {args.vocab}",
           "max_logit_difference_tfcli_vs_marian": diff, "sentences": len(sents),
           "mean_src_len_with_eos": float(np.mean([len(s) + 1 for s in sents])), "runs": []}
    for bs in args.batch_sizes:
        batches = [sents[i : i + bs] for i in range(0, len(sents), bs)]
        run = {"batch_size": bs}
        for beam in (args.beam, 1):
            print(f"synthetic: batch size {bs}, beam {beam} ...", file=sys.stderr, flush=True)
            run[f"beam{beam}"], _ = compare(runners, batches, beam, args.out_len, args.alpha, args.repeats,
                                            most={"hf": args.hf_sentences} if args.hf_sentences else None)
        out["runs"].append(run)
    out["peak_rss_mb"] = {r.name: r.peak_rss() / 2**20 for r in runners}
    for r in runners:
        r.close()
    if args.profile:
        out["profile"] = profile_tfcli(args, tmp / "ckpt", [" ".join(vocab[t] for t in s) for s in sents])
    if args.device != "cpu":  # (the fp32 floor and `tfcli translate`'s first line are the CPU's questions)
        return out
    out["fma_peak_gflops"] = peak = fma_peak_gflops(args.threads)  # (nothing else running)
    if peak:
        src_lens = [len(s) + 1 for s in sents]
        for run in out["runs"]:
            for beam in (args.beam, 1):
                gflop = linear_gflop(cfg, src_lens, args.out_len, beam)
                run[f"beam{beam}"]["fp32_floor"] = arithmetic_floor(run[f"beam{beam}"], gflop, peak)
    if args.shape:
        print("synthetic: time to the first line ...", file=sys.stderr, flush=True)
        out["first_line"] = first_lines(tmp / "ckpt", ct2_dir, int8_dir, " ".join(vocab[t] for t in sents[0]), args)
    return out


def profile_tfcli(args, ckpt: Path, texts: list[str]) -> str:
    """One more tfcli pass (beam --beam, the largest batch size; bf16 on a GPU) under torch.profiler, in this
    process once the timed ones are closed; its op tables beside the results (gpu_translate_speed's profile_pass).
    Returns the file's name."""
    import tfcli
    from gpu_translate_speed import profile_pass

    device = torch.device(args.device)
    translator = tfcli.load(str(ckpt), device=args.device, dtype="fp32" if device.type == "cpu" else "bf16")
    size = max(args.batch_sizes)
    return profile_pass(lambda: translator.translate(
        texts, beam_size=args.beam, len_penalty=args.alpha, min_len=args.out_len, max_len_a=0.0,
        max_len_b=args.out_len, batch_size=size, max_tokens=10**9, raw=True), device, Path(args.out)).name


def real(args) -> dict:
    data = Path(args.data) / "multi30k" / "test2016.de"
    if not data.exists():
        return {"skipped": f"{data} not found"}
    if not args.checkpoint:
        return {"skipped": "no trained checkpoint given (--checkpoint CKPT)"}
    import tfcli
    from tfcli import checkpoint_meta
    from tfcli.runtime import tune_process

    tune_process("cpu")  # as `tfcli translate` does
    translator = tfcli.load(args.checkpoint, device="cpu")
    lines = data.read_text(encoding="utf-8").splitlines()
    n = len(lines)
    out = {"checkpoint": str(checkpoint_meta.resolve(args.checkpoint)), "data": str(data), "sentences": n}
    ref = Path(args.data) / "multi30k" / "test2016.en"
    for beam in (args.beam, 1):
        best, hyps = float("inf"), []
        for _ in range(args.repeats):
            dt, hyps = timed(lambda: translator.translate(lines, beam_size=beam, batch_size=args.batch_sizes[0]))
            best = min(best, dt)
        entry = {"sent_per_s": n / best, "best_s": best}
        if ref.exists():
            import sacrebleu

            entry["bleu"] = sacrebleu.corpus_bleu(hyps, [ref.read_text(encoding="utf-8").splitlines()]).score
        out[f"tfcli_translate_beam{beam}"] = entry
    return out


def real_peers(args, tmp: Path) -> dict:
    """The 1,000 test2016 sentences through all three systems, with a trained checkpoint exported to transformers
    and CTranslate2: natural output lengths (stop at </s>, at most --real-max-len tokens), no length
    normalisation (alpha 0: HF, CT2 and tfcli define the length penalty differently, but all three rank by summed
    log-probability with it off), the same pre-tokenised batches of --batch-sizes[0] sentences, sorted by length."""
    data = Path(args.data) / "multi30k"
    if not (data / "test2016.de").exists():
        return {"skipped": f"{data / 'test2016.de'} not found"}
    if not args.peer_checkpoint:
        return {"skipped": "no post-norm checkpoint given (--peer-checkpoint CKPT)"}
    import sacrebleu

    from tfcli import checkpoint as ckpt_mod
    from tfcli import checkpoint_meta
    from tfcli.data import decode_batch, encode_batch
    from tfcli.interop import export

    model, meta = ckpt_mod.load(args.peer_checkpoint)
    cfg = model.cfg
    hf_dir, ct2_dir = tmp / "peer-hf", tmp / "peer-ct2"
    try:
        export(args.peer_checkpoint, "hf", hf_dir)
    except TfcliError as e:
        return {"skipped": f"{args.peer_checkpoint}: {e}"}
    export(args.peer_checkpoint, "ctranslate2", ct2_dir)
    diff = check_same_function(model, hf_runner(str(hf_dir)).marian)
    src_tok, tgt_tok = ckpt_mod.tokenizer(meta, "src"), ckpt_mod.tokenizer(meta, "tgt")
    vocab = [tgt_tok.id_to_token(i) for i in range(cfg.tgt_vocab_size)]
    lines = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    refs = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    ids = encode_batch(src_tok, lines)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    bs = args.batch_sizes[0]
    batches = [[ids[i] for i in order[j : j + bs]] for j in range(0, len(order), bs)]
    runners = start_runners(Path(args.peer_checkpoint), hf_dir, ct2_dir, vocab, args.threads,
                            {tuple(i): line for i, line in zip(ids, lines)})
    out = {"checkpoint": str(checkpoint_meta.resolve(args.peer_checkpoint)), "sentences": len(lines), "batch_size": bs,
           "max_logit_difference_tfcli_vs_marian": diff, "alpha": 0.0, "max_output_len": args.real_max_len}
    for beam in (args.beam, 1):
        print(f"real (peers): beam {beam} ...", file=sys.stderr, flush=True)
        res, outputs = compare(runners, batches, beam, args.real_max_len, 0.0, args.real_repeats, forced=False)
        for r in runners:
            hyps = [""] * len(lines)
            for i, text in zip(order, decode_batch(tgt_tok, outputs[r.name])):
                hyps[i] = text
            res[r.name]["bleu"] = sacrebleu.corpus_bleu(hyps, [refs]).score
            res[r.name]["mean_output_len"] = float(np.mean([len(o) for o in outputs[r.name]]))
        out[f"beam{beam}"] = res
    for r in runners:
        r.close()
    return out


def _speeds(r: dict) -> str:
    """The sent/s of each system and tfcli's ratios, as Markdown table cells."""
    return (f"{r['tfcli']['sent_per_s']:.1f} | {r['hf']['sent_per_s']:.1f} | {r['ct2']['sent_per_s']:.1f} | "
            f"{r['tfcli_over_hf']:.2f}x | {r['tfcli_over_ct2']:.2f}x")


def _agreement(r: dict) -> str:
    """The share of sentences each peer translates exactly as tfcli does (never rounded up to 100%)."""
    shares = (r[system]["same_output_as_tfcli"] for system in ("hf", "ct2"))
    return ", ".join("100%" if x == 1 else f"{min(x, 0.999):.1%}" for x in shares)


def _cases(syn: dict, beam: int):
    """(batch size, "beam N" or "greedy", that run's figures) of each synthetic run, beam search first."""
    for run in syn["runs"]:
        for key in (f"beam{beam}", "beam1"):
            r = run[key]
            yield run["batch_size"], "greedy" if r["beam"] == 1 else f"beam {r['beam']}", r


def markdown(res: dict) -> str:
    gpu = res.get("gpu")
    lines = [f"# Translation speed ({'GPU: ' + gpu if gpu else 'CPU'})", "", f"Command: `{res['command']}`", "",
             f"Machine: {res['nproc']} CPUs ({res['cpu']}){', ' + gpu if gpu else ''}, torch {res['torch']}, "
             f"transformers {res['transformers']}, ctranslate2 {res['ctranslate2']}, threads {res['threads']}. "
             f"Measured {res['date']}.", ""]
    syn = res["synthetic"]
    lines += ["## Synthetic: same weights in tfcli, HF (its family's class) and CTranslate2, forced output length", "",
              f"{syn['model']}; {syn['sentences']} sentences of mean source length "
              f"{syn['mean_src_len_with_eos']:.1f} (with </s>), output length forced to {res['out_len']} tokens. "
              f"Best of {res['repeats']} interleaved runs.", "",
              "| batch size | decoding | tfcli sent/s | HF generate sent/s | CT2 sent/s | tfcli / HF | tfcli / CT2 | "
              "same output as tfcli (HF, CT2) |",
              "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for bs, name, r in _cases(syn, res["beam"]):
        lines.append(f"| {bs} | {name} | {_speeds(r)} | {_agreement(r)} |")
    first = syn["runs"][0][f"beam{res['beam']}"]
    if first["hf"].get("sentences", first["sentences"]) < first["sentences"]:
        lines += ["", f"HF translated every k-th batch, {first['hf']['sentences']:,} of the {first['sentences']:,} "
                  "sentences (--hf-sentences): its sent/s and its agreement with tfcli are over those."]
    lines += ["", f"Targets: tfcli/CT2 >= {CT2_TARGET} at every batch size, beam {res['beam']} and greedy (CTranslate2's "
              f"speed); tfcli/HF >= {HF_TARGET} with beam {res['beam']}."]
    for run in syn["runs"]:
        b, g = run[f"beam{res['beam']}"], run["beam1"]
        ct2 = [f"{name} **{r['tfcli_over_ct2']:.2f}** ({'met' if r['tfcli_over_ct2'] >= CT2_TARGET else 'NOT met'})"
               for name, r in ((f"beam {res['beam']}", b), ("greedy", g))]
        lines.append(f"- batch size {run['batch_size']}: tfcli/CT2 {', '.join(ct2)}; tfcli/HF beam {res['beam']} "
                     f"**{b['tfcli_over_hf']:.2f}** ({'met' if b['tfcli_over_hf'] >= HF_TARGET else 'NOT met'})")
    others = [name for name, v in syn["runs"][0][f"beam{res['beam']}"].items()
              if isinstance(v, dict) and "sent_per_s" in v and name not in ("tfcli", "hf", "ct2", "tfcli_int8",
                                                                             "ct2_int8")]
    if others:  # (a GPU's: tfcli fp16, CTranslate2 int8_float16)
        lines += ["", "The other systems of the same runs (tfcli above: bf16; HF: fp16; CT2: float16):", "",
                  "| batch size | decoding | system | sent/s | tfcli / it | same output as tfcli |",
                  "| ---: | --- | --- | ---: | ---: | ---: |"]
        for bs, name, r in _cases(syn, res["beam"]):
            for system in others:
                lines.append(f"| {bs} | {name} | {system} | {r[system]['sent_per_s']:.1f} | "
                             f"{r['tfcli_over_' + system]:.2f}x | {r[system]['same_output_as_tfcli']:.1%} |")
    if syn.get("fma_peak_gflops"):
        lines += ["", f"fp32 arithmetic floor: this CPU's FMA peak over {res['threads']} threads, measured in this run "
                  f"(independent multiply-adds of its widest vectors, one process a thread), is "
                  f"{syn['fma_peak_gflops']:.0f} GFLOP/s; the linear layers' least arithmetic for these sentences "
                  "(encoder, source keys/values, one hypothesis at the first step and every beam after, output "
                  "layer; attention and search left out) takes the floor time at that rate. No fp32 system can "
                  "beat HF here by more than HF's time over the floor:", "",
                  "| batch size | decoding | linear GFLOP | floor (s) | HF (s) | most any fp32 system can be over HF "
                  "| tfcli (s) | tfcli's share of the peak |",
                  "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for run in syn["runs"]:
            for key in (f"beam{res['beam']}", "beam1"):
                r, f = run[key], run[key].get("fp32_floor")
                if f:
                    name = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
                    lines.append(f"| {run['batch_size']} | {name} | {f['linear_gflop']:,.0f} | {f['floor_s']:.2f} | "
                                 f"{r['hf']['best_s']:.2f} | {f['hf_over_floor']:.2f}x | {r['tfcli']['best_s']:.2f} | "
                                 f"{f['tfcli_share_of_peak']:.0%} |")
    int8 = [(run["batch_size"], run[key]) for run in syn["runs"] for key in (f"beam{res['beam']}", "beam1")
            if "tfcli_int8" in run[key]]
    if int8:
        lines += ["", "int8 (tfcli `--dtype int8` on the fp32 checkpoint, CTranslate2 `compute_type=int8` on its "
                  "int8-converted model), the same runs:", "",
                  "| batch size | decoding | tfcli int8 sent/s | CT2 int8 sent/s | tfcli int8 / CT2 int8 | "
                  "tfcli int8 / tfcli fp32 | tfcli int8 / HF |", "| ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
        for bs, r in int8:
            name = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            lines.append(f"| {bs} | {name} | {r['tfcli_int8']['sent_per_s']:.1f} | {r['ct2_int8']['sent_per_s']:.1f} | "
                         f"{r['tfcli_int8_over_ct2_int8']:.2f}x | {r['tfcli_int8_over_tfcli']:.2f}x | "
                         f"{r['tfcli_int8_over_hf']:.2f}x |")
    if "peak_rss_mb" in syn:
        lines += ["", "Peak memory of each system's process (RSS; each process also holds torch's libraries, which "
                  "CTranslate2's users do not load: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in
                                                               syn["peak_rss_mb"].items()) + ")."]
        peak = syn["peak_rss_mb"]
        if "tfcli_int8" in peak:
            x = peak["tfcli_int8"] / peak["ct2_int8"]
            lines.append(f"- int8: tfcli {peak['tfcli_int8']:,.0f} MB, CT2 {peak['ct2_int8']:,.0f} MB: **{x:.2f}x** "
                         f"({'met' if x <= 1.1 else 'NOT met'}: at most CTranslate2's int8 + 10%)")
    if "profile" in syn:
        lines += ["", f"One more tfcli pass (beam {res['beam']}, the largest batch size) ran under torch.profiler: "
                  f"`{syn['profile']}` (its ops by host time, then by device time on a GPU)."]
    if "first_line" in syn:
        fl = syn["first_line"]
        lines += ["", f"Time from a command's start to its first output line (one sentence, beam {res['beam']}, "
                  f"{res['out_len']} tokens; load included; best of "
                  f"{res.get('first_line_repeats', res['repeats'])} fresh processes) and that "
                  "process's peak memory (GNU time's maximum RSS): `tfcli translate` (stdin to stdout) and a "
                  "CTranslate2 script that imports ctranslate2 alone; CT2 int8 reads a model converted to int8, "
                  "tfcli_int8 quantises the fp32 checkpoint at load; tfcli_quantized and tfcli_int8_quantized map "
                  "the layers `tfcli quantize --dtype fp32` and `--dtype int8` stored beside it (fp32: the "
                  "decoder's in the row kernel's layout, which tfcli packs at load).", "",
                  "| system | first line (s) | peak RSS (MB) | same line as tfcli |", "| --- | ---: | ---: | --- |"]
        for name, r in fl.items():
            same = "yes" if r.get("same_line_as_tfcli") else "" if name in ("tfcli", "import_torch") else "no"
            lines.append(f"| {name} | {r['seconds']:.2f} | {r['peak_rss_mb']:,.0f} | {same} |")
        for ours, peer in (("tfcli", "ct2"), ("tfcli_quantized", "ct2"), ("tfcli_int8", "ct2_int8"),
                           ("tfcli_int8_quantized", "ct2_int8")):
            if ours in fl:
                x = fl[peer]["seconds"] / fl[ours]["seconds"]
                lines.append(f"- {ours} first line {fl[ours]['seconds']:.2f} s, {peer} {fl[peer]['seconds']:.2f} s: "
                             f"**{x:.2f}x** CTranslate2's speed to the first line ({'met' if x >= 1 else 'NOT met'}: "
                             f"no slower than CTranslate2)")
        if "tfcli_int8_quantized" in fl:
            same = "the same" if fl["tfcli_int8_quantized"]["same_line_as_tfcli_int8"] else "NOT the same"
            lines.append(f"- tfcli_int8_quantized's line is {same} as tfcli_int8's")
        if "import_torch" in fl:
            t = fl["import_torch"]["seconds"]
            peer = f" (CT2 int8's whole first line: {fl['ct2_int8']['seconds']:.2f} s)" if "ct2_int8" in fl else ""
            lines.append(f"- import_torch: Python starting, importing torch alone and echoing its input line: "
                         f"{t:.2f} s, before any of tfcli's own work; a program on torch cannot print sooner{peer}")
    load = f"at start {res['load_average_at_start']}, at end {res['load_average_at_end']}"
    lines += ["", f"Max logit difference tfcli vs its transformers export: {syn['max_logit_difference_tfcli_vs_marian']:.1e}. "
              f"Load average (1, 5, 15 min) {load}: the machine may have been shared.", ""]
    rp = res["real_peers"]
    lines += ["## Real: Multi30k test2016 (de->en), a trained model in all three systems", ""]
    if "skipped" in rp:
        lines.append(f"Skipped: {rp['skipped']}.")
    else:
        lines += [f"Checkpoint `{rp['checkpoint']}`, exported with `tfcli export` to transformers and CTranslate2 "
                  f"(max logit difference {rp['max_logit_difference_tfcli_vs_marian']:.1e})."
                  f" {rp['sentences']} sentences in batches of {rp['batch_size']} sorted by length, pre-tokenised for "
                  "HF and CT2 (tfcli is given the text and tokenises it in its timed call, as `tfcli translate` does); "
                  f"natural lengths (stop at </s>, at most {rp['max_output_len']} tokens), alpha 0 (no length "
                  "normalisation, so all three rank hypotheses alike). "
                  f"Best of {res['real_repeats']} interleaved runs.", "",
                  "| decoding | tfcli sent/s | HF sent/s | CT2 sent/s | tfcli / HF | tfcli / CT2 | BLEU (tfcli, HF, CT2) "
                  "| same output as tfcli (HF, CT2) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
        for key in (f"beam{res['beam']}", "beam1"):
            r = rp[key]
            name = "greedy" if r["beam"] == 1 else f"beam {r['beam']}"
            bleu = ", ".join(f"{r[system]['bleu']:.1f}" for system in ("tfcli", "hf", "ct2"))
            lines.append(f"| {name} | {_speeds(r)} | {bleu} | {_agreement(r)} |")
        ratios = [(f"beam {res['beam']}", rp[f"beam{res['beam']}"]["tfcli_over_ct2"]),
                  ("greedy", rp["beam1"]["tfcli_over_ct2"])]
        lines += ["", f"Target: tfcli/CT2 >= {CT2_TARGET}: " + ", ".join(
            f"{name} **{x:.2f}** ({'met' if x >= CT2_TARGET else 'NOT met'})" for name, x in ratios)]
    lines.append("")
    rl = res["real"]
    lines += ["## Real: Multi30k test2016 (de), trained checkpoint, full `tfcli translate` path", ""]
    if "skipped" in rl:
        lines.append(f"Skipped: {rl['skipped']}.")
    else:
        lines.append(f"Checkpoint `{rl['checkpoint']}`, {rl['sentences']} sentences.")
        lines += ["", "| decoding | sent/s | BLEU |", "| --- | ---: | ---: |"]
        for key in (f"tfcli_translate_beam{res['beam']}", "tfcli_translate_beam1"):
            e = rl[key]
            name = key.replace("tfcli_translate_", "")
            lines.append(f"| {name} | {e['sent_per_s']:.1f} | {e.get('bleu', float('nan')):.1f} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--sentences", type=int, default=160)
    p.add_argument("--src-len", type=int, default=20, help="mean source length (tokens, uniform +-5)")
    p.add_argument("--out-len", type=int, default=20, help="forced output length")
    p.add_argument("--batch-sizes", default="64,16,4", help="comma-separated batch sizes (sentences) to compare at")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--arch", default="small", help="the synthetic model's preset (base: the OPUS-MT base shape)")
    p.add_argument("--activation", default="relu", help="the synthetic model's FFN activation (silu: OPUS-MT's swish)")
    p.add_argument("--shape", default=None, choices=sorted(SHAPES),
                   help="a published family's shape for the synthetic model (sets --arch, --vocab, layers, norm)")
    p.add_argument("--int8", action="store_true", help="also tfcli --dtype int8 and CTranslate2 int8 (synthetic part)")
    p.add_argument("--skip-real", action="store_true", help="the synthetic part only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--real-repeats", type=int, default=None,
                   help="interleaved runs of the Multi30k side-by-side part (default: --repeats; its runs are short, "
                        "and a best of few moves with the machine's load)")
    p.add_argument("--first-line-repeats", type=int, default=5,
                   help="fresh processes a system's time to the first line is the best of (each a few seconds; a "
                        "best of two moved by 0.3 s between runs on a noisy machine)")
    p.add_argument("--checkpoint", default=None, help="trained checkpoint for the Multi30k `tfcli translate` part")
    p.add_argument("--peer-checkpoint", default=None,
                   help="trained post-norm de->en checkpoint for the Multi30k side-by-side part")
    p.add_argument("--real-max-len", type=int, default=80, help="most output tokens in the Multi30k side-by-side part")
    p.add_argument("--data", default=SHARED_DATA)
    p.add_argument("--profile", action="store_true",
                   help="one more tfcli pass of the synthetic part under torch.profiler: OUT_profile.txt")
    p.add_argument("--hf-sentences", type=int, default=0,
                   help="HF translates only the first N sentences (its speed is over those; 0: all)")
    p.add_argument("--device", default="cpu",
                   help="cuda: the synthetic part on a GPU, CTranslate2's GPU table's systems (tfcli bf16 and fp16, HF "
                        "fp16, CTranslate2 float16 and int8_float16); implies --skip-real")
    p.add_argument("--out", default=str(RESULTS / "translate_speed"))
    args = p.parse_args()
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    args.skip_real = args.skip_real or args.device != "cpu"
    if args.shape:
        args.arch, args.vocab = SHAPES[args.shape]["arch"], SHAPES[args.shape]["vocab"]
    args.real_repeats = args.real_repeats or args.repeats

    import ctranslate2
    import transformers

    torch.set_num_threads(args.threads)
    res = {
        "command": shlex.join([".venv/bin/python", "benchmarks/translate_speed.py", *sys.argv[1:]]),
        "nproc": os.cpu_count(), "cpu": cpu_name(), "torch": torch.__version__,
        "transformers": transformers.__version__, "ctranslate2": ctranslate2.__version__, "threads": args.threads,
        "date": time.strftime("%Y-%m-%d %H:%M"), "beam": args.beam, "out_len": args.out_len, "repeats": args.repeats,
        "real_repeats": args.real_repeats, "first_line_repeats": args.first_line_repeats,
        "load_average_at_start": os.getloadavg(),
    }
    if args.device != "cpu":
        res["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    with tempfile.TemporaryDirectory() as tmp:
        res["synthetic"] = synthetic(args, Path(tmp))
    if args.skip_real:
        res["real_peers"] = res["real"] = {"skipped": "--skip-real"}
    else:
        with tempfile.TemporaryDirectory() as tmp:
            res["real_peers"] = real_peers(args, Path(tmp))
        res["real"] = real(args)
    res["load_average_at_end"] = os.getloadavg()
    write_results(args.out, res, markdown(res))


if __name__ == "__main__":
    main()
