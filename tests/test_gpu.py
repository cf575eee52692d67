"""On a GPU: mixed precision, torch.compile, resume, and decoding on CUDA against the CPU (marker `gpu`; the CUDA
cases skip without one). Where a case also runs on the CPU (bf16 autocast), it runs here too, so that the test
itself is known to work before a GPU session spends minutes on it.

Tolerances, not equality: CUDA kernels (and bf16/fp16) round differently from the CPU's, and SDPA's backward on
CUDA is not deterministic, so a resumed or compiled run follows the reference run closely, not bit for bit. The
hand-built models (tests/helpers.py) decide every token by 20 logits or more, so their outputs must match exactly.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tfcli
from tfcli.data.tokenizer import encode_batch
from helpers import make_parallel_prepared, poisoned, tiny_train_config
from tfcli.train.trainer import run as run_cli_config
from tfcli.train.trainer import train

pytestmark = pytest.mark.gpu

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
CUDA = pytest.param("cuda", marks=needs_cuda)
TEXTS = ["cat dog egg", "moon", "", "tree sun rat queen pig owl", "ice jam kite lamp moon nest owl pig"]


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    return make_parallel_prepared(tmp_path_factory.mktemp("par"), n_train=400, task="reverse")


def _losses(run: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in lines if r["split"] == "train"}


def _run(parallel, out: Path, device: str, steps: int = 30, model: dict | None = None, **train_cfg) -> dict[int, float]:
    cfg = tiny_train_config(parallel, out, device=device, max_steps=steps, valid_every=steps, log_every=1,
                            valid_bleu=False, **train_cfg)
    train(cfg, {"d_model": 64, "d_ff": 128, **(model or {})})
    return _losses(out)


# --- training ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device,precision",
    [("cpu", "bf16"), pytest.param("cuda", "bf16", marks=needs_cuda), pytest.param("cuda", "fp16", marks=needs_cuda)],
)
def test_mixed_precision_follows_fp32(tmp_path, parallel, device, precision):
    """The first step's loss (the same weights, the same batch) within 2% of fp32's; after 30 updates within 10%
    (20% for fp16, whose loss scaler skips its first steps while it finds a scale that does not overflow)."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    ref = _run(parallel, tmp_path / "fp32", device, dtype="fp32")
    low = _run(parallel, tmp_path / precision, device, dtype=precision)
    assert torch.backends.cuda.matmul.allow_tf32 == tf32  # the trainer's TF32 is its own, not the process's
    assert low.keys() == ref.keys()
    assert low[1] == pytest.approx(ref[1], rel=0.02)
    assert low[30] == pytest.approx(ref[30], rel=0.10 if precision == "bf16" else 0.20)
    assert low[30] < 0.8 * low[1]  # it learns


@pytest.mark.parametrize(
    "device,precision",
    [("cpu", "bf16"), pytest.param("cuda", "bf16", marks=needs_cuda), pytest.param("cuda", "fp16", marks=needs_cuda)],
)
def test_validation_bleu_decodes_under_mixed_precision(tmp_path, parallel, device, precision):
    """Validation's greedy decoding of the fp32 model under autocast (on CUDA: the fixed-shape decoder, whose cache
    keeps the weights' dtype) runs and is scored at each validation."""
    cfg = tiny_train_config(parallel, tmp_path / "run", device=device, dtype=precision, max_steps=8,
                            valid_every=4, log_every=4, valid_bleu=True, bleu_max_sentences=16)
    train(cfg, {"d_model": 64, "d_ff": 128})
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    bleu = [r["bleu"] for r in lines if r["split"] == "valid"]
    assert len(bleu) == 2 and all(0.0 <= b <= 100.0 for b in bleu)


@pytest.mark.parametrize("device", [CUDA])
def test_compiled_training_follows_eager(tmp_path, parallel, device):
    """torch.compile of the model and its loss: the same losses as eager within float rounding of fused kernels
    (eager batched as --compile batches: lengths padded to multiples of 8)."""
    eager = _run(parallel, tmp_path / "eager", device, steps=20, dtype="fp32", pad_multiple=8)
    compiled = _run(parallel, tmp_path / "compiled", device, steps=20, dtype="fp32", compile=True)
    assert compiled[1] == pytest.approx(eager[1], rel=1e-4)
    assert compiled[20] == pytest.approx(eager[20], rel=1e-2)


@pytest.mark.parametrize("device", [CUDA])
def test_resume_on_the_gpu_continues_the_run(tmp_path, parallel, device):
    """Stopped at step 12 and resumed to 24: the loss curve follows the uninterrupted run's (closely, not exactly:
    CUDA's attention backward is not deterministic)."""
    full = _run(parallel, tmp_path / "full", device, steps=24, dtype="bf16", model={"dropout": 0.1})
    _run(parallel, tmp_path / "part", device, steps=12, dtype="bf16", model={"dropout": 0.1})
    result = run_cli_config(None, {"out": str(tmp_path / "part"), "resume": True, "max_steps": 24})
    assert result.step == 24
    part = _losses(tmp_path / "part")
    assert part.keys() == full.keys()
    for s in full:
        assert part[s] == pytest.approx(full[s], rel=0.05)


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_nan_step_on_the_gpu_makes_no_update(tmp_path, parallel, monkeypatch, device, precision):
    """A NaN loss at step 3: fused AdamW skips the update on the device (fp16: the GradScaler does), the weights
    stay finite, and the log counts the skip and leaves the loss out."""
    changed = poisoned(monkeypatch, lambda step: step == 3)
    losses = _run(parallel, tmp_path / "run", device, steps=5, dtype=precision)
    assert changed[3] is False and (changed[5] is True or precision == "fp16")  # (fp16: perhaps an overflow)
    assert math.isnan(losses[3]) and all(math.isfinite(losses[s]) for s in (1, 2, 4, 5))
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in records if r["split"] == "train" and r["step"] == 3] == [1]


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("arch", ["toy", "lm-toy"])
def test_the_gpu_objective_is_the_cpus(device, arch):
    """On a GPU the objective runs the output projection and the loss fused, by blocks of rows (no logits held):
    the CPU's loss and gradients, in fp32 and (loosely) under bf16 autocast."""
    from tfcli.model.config import preset
    from tfcli.model.transformer import build_model
    from tfcli.specials import PAD_ID
    from tfcli.train.loss import Objective

    torch.manual_seed(0)
    V = 50
    model = build_model(preset(arch, src_vocab_size=0 if arch == "lm-toy" else V, tgt_vocab_size=V))
    src = None if arch == "lm-toy" else torch.randint(4, V, (4, 9))
    inputs, targets = torch.randint(4, V, (4, 8)), torch.randint(4, V, (4, 8))
    targets[2, 5:] = PAD_ID
    results = []
    for dev in ("cpu", device):
        m = model.to(dev)
        m.zero_grad()
        loss, nll = Objective(m, 0.1)(src.to(dev) if src is not None else None, inputs.to(dev), targets.to(dev))
        loss.backward()
        # copies: moving the model to the GPU next moves its gradients, the tensors themselves on the CPU
        results.append((loss.item(), nll.item(), {n: p.grad.to("cpu", copy=True) for n, p in m.named_parameters()}))
    (cpu_loss, cpu_nll, cpu_grads), (gpu_loss, gpu_nll, gpu_grads) = results
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4) and gpu_nll == pytest.approx(cpu_nll, rel=1e-4)
    for name, g in cpu_grads.items():
        torch.testing.assert_close(gpu_grads[name], g, rtol=1e-3, atol=1e-4)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low = Objective(model.to(device), 0.1)(
            src.to(device) if src is not None else None, inputs.to(device), targets.to(device))[0]
    assert low.item() == pytest.approx(cpu_loss, rel=0.02)


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_one_torchrun_process_trains_as_a_plain_run(tmp_path, parallel, device):
    """`torchrun --nproc_per_node 1` joins a process group of one (NCCL on a GPU, gloo on the CPU) and trains through
    DistributedDataParallel: the losses of a plain run, one set of checkpoints."""
    common = dict(arch="toy", max_tokens=200, lr=3e-3, warmup=5, log_every=1, valid_every=4, valid_bleu=False,
                  max_epochs=0, max_steps=8, device=device, dtype="fp32", tensorboard=False)
    run_cli_config(None, {**common, "data": str(parallel), "out": str(tmp_path / "plain")})
    args = [f"--{k.replace('_', '-')}={v}" for k, v in common.items() if not isinstance(v, bool)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "tfcli.cli",
           "train", str(parallel), "-o", str(tmp_path / "ddp"), *args, "--no-valid-bleu", "--set",
           "train.tensorboard=false"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
    plain, ddp = _losses(tmp_path / "plain"), _losses(tmp_path / "ddp")
    assert ddp.keys() == plain.keys()
    for step in plain:  # CUDA's attention backward is not deterministic: close, not equal
        assert ddp[step] == pytest.approx(plain[step], rel=1e-3, abs=1e-4)
    assert sorted(p.name for p in (tmp_path / "ddp" / "checkpoints").iterdir()) == [
        "BEST", "LATEST", "step-0000004", "step-0000008"]


# --- decoding ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", CUDA])
def test_half_weight_decoding_gives_the_fp32_outputs(copier, counter, device):
    """bf16 decoding on a GPU runs on a bf16 copy of the weights, without autocast (no casts inside a step; the
    key/value memory in bf16); on the CPU the same path runs when asked (half=True). The hand-built models decide
    every token by a wide margin: their outputs are fp32's; the loaded model itself stays fp32."""
    from tfcli.generate.config import GenerateConfig, TranslateConfig
    from tfcli.generate.lm import continuations
    from tfcli.generate.loader import half_weights, load, load_ensemble
    from tfcli.request import Request
    from tfcli.generate.translate import Pipeline

    dev = torch.device(device)
    assert half_weights(torch.device("cuda"), "bf16") and not half_weights(torch.device("cpu"), "bf16")
    fp32 = load_ensemble([str(copier)], dev, "fp32")
    half = load_ensemble([str(copier)], dev, "bf16", half=True)
    assert half.steps.half and not fp32.steps.half
    assert all(p.dtype == torch.float32 for p in half.model.parameters())  # what the caller holds stays fp32
    src = [ids + [2] for ids in encode_batch(half.src_tok, TEXTS)]
    for beam in (1, 5):
        cfg = TranslateConfig(beam_size=beam, dtype="bf16")
        requests = [Request(t, "<text>", i + 1) for i, t in enumerate(TEXTS)]
        want = [ts for _, ts in Pipeline(fp32, TranslateConfig(beam_size=beam, nbest=1), dev).translations(requests)]
        translator = Pipeline(half, dataclasses.replace(cfg, nbest=1), dev)
        assert translator.precision.__class__.__name__ == "nullcontext"  # no autocast
        got = [ts for _, ts in translator.translations(requests)]
        assert [[h.text for h in hyps] for hyps in got] == [[h.text for h in hyps] for hyps in want]
        for a, b in zip(got, want):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=0.05)
    with torch.inference_mode():  # as the search runs it
        decoder = half.steps.start(1, 5, 4, *half.steps.encode(torch.tensor([src[0]], device=dev)))
    assert decoder.kv[0].dtype == torch.bfloat16
    prompts = ["cat dog", "ice", "sun", "apple bird cat dog"]
    cfg = GenerateConfig(max_new_tokens=12, dtype="bf16", greedy=True)
    want = list(continuations(load(str(counter), dev, "lm", "fp32"), prompts, GenerateConfig(max_new_tokens=12,
                                                                                             greedy=True), dev))
    assert list(continuations(load(str(counter), dev, "lm", "bf16", half=True), prompts, cfg, dev)) == want


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_translation_on_the_gpu_is_the_cpus(copier, device, dtype):
    """Greedy and beam search give the CPU's translations; the n-best lists hold the same texts, with the same
    scores in fp32."""
    cpu = tfcli.load(str(copier), device="cpu")
    gpu = tfcli.load(str(copier), device=device, dtype=dtype)
    for beam in (1, 5):
        assert gpu.translate(TEXTS, beam_size=beam, batch_size=3) == cpu.translate(TEXTS, beam_size=beam) == TEXTS
    want = cpu.translate_nbest(TEXTS, n=3, beam_size=5, scores=True)
    got = gpu.translate_nbest(TEXTS, n=3, beam_size=5, scores=True)
    assert [[h.text for h in hyps] for hyps in got] == [[h.text for h in hyps] for hyps in want]
    if dtype == "fp32":
        for a, b in zip(got, want):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-3)


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_model_computing_nan_stops_decoding_on_the_gpu(tmp_path, device, dtype):
    """Weights holding NaN: translation (greedy, beam, through the CUDA graph of the fixed-shape search) and
    generation raise NotANumber instead of returning what such a model chose (on the CPU too: bf16 autocast)."""
    from helpers import WORDS, random_translator, save_counter, save_model, save_word_tokenizer
    from safetensors.torch import load_file, save_file

    from tfcli.errors import NotANumber

    model = random_translator(3)
    with torch.no_grad():
        model.decoder.layers[0].ffn.w1.weight[5, 7] = float("nan")
    ckpt = save_model(tmp_path / "ckpt", model, save_word_tokenizer(tmp_path / "tok", WORDS))
    translator = tfcli.load(str(ckpt), device=device, dtype=dtype)
    for beam in (1, 4):
        with pytest.raises(NotANumber, match="not numbers"):
            translator.translate([f"{WORDS[0]} {WORDS[1]}", WORDS[2]], beam_size=beam)
    lm = save_counter(tmp_path, WORDS[:6])
    weights = load_file(str(lm / "model.safetensors"))
    weights["decoder.layers.0.ffn.w1.weight"][0, 0] = float("nan")
    save_file(weights, str(lm / "model.safetensors"))
    with pytest.raises(NotANumber, match="not numbers"):
        tfcli.load(str(lm), device=device, dtype=dtype).generate([WORDS[0]], max_new_tokens=4, greedy=True)


@pytest.mark.parametrize("device", [CUDA])
def test_constraints_on_the_gpu_are_the_cpus(copier, device):
    """Constrained beam search in the fixed-shape decoder (refilled places, CUDA graphs): the CPU's translations,
    every phrase held; with phrases to avoid beside them."""
    cpu = tfcli.load(str(copier), device="cpu")
    gpu = tfcli.load(str(copier), device=device)
    cons = [["kite"], ["lamp moon"], [], ["egg", "fish"]] * (len(TEXTS) // 4) + [["kite"]] * (len(TEXTS) % 4)
    opts = dict(beam_size=5, constraints=cons[: len(TEXTS)], avoid=[["dog"]] * len(TEXTS))
    want = cpu.translate(TEXTS, **opts)
    assert gpu.translate(TEXTS, batch_size=3, **opts) == want
    assert all(f" {p} " in f" {w} " for w, ps in zip(want, cons) for p in ps)


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_generation_on_the_gpu_is_the_cpus(counter, device, dtype):
    cpu = tfcli.load(str(counter), device="cpu")
    gpu = tfcli.load(str(counter), device=device, dtype=dtype)
    prompts = ["cat dog", "ice", "sun", "apple bird cat dog"]
    want = cpu.generate(prompts, greedy=True, max_new_tokens=30)
    assert gpu.generate(prompts, greedy=True, max_new_tokens=30) == want
    # two places for four prompts: each finished one's place goes to the next (prefilled into it), the CUDA graph
    # replayed throughout; read every 8 steps, or every 3
    assert gpu.generate(prompts, greedy=True, max_new_tokens=30, batch_size=2) == want
    assert gpu.generate(prompts, greedy=True, max_new_tokens=30, batch_size=2, check_every=3) == want


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_steps_give_the_eager_steps_outputs(device, dtype):
    """On CUDA an encoder-decoder's steps are captured once per batch as a CUDA graph and replayed
    (StaticDecoder): greedy and beam search give what the same fixed-shape step gives run eagerly, and what the
    shrinking-batch decoder gives (the same kernels, so equal ids; scores within rounding), with every sentence in
    a place of its own or in 3 places refilled as sentences finish."""
    from helpers import random_translator
    from helpers import beam_search, greedy_decode
    from tfcli.generate.step import StaticDecoder, StepModel
    from tfcli.specials import EOS_ID, PAD_ID

    model = random_translator(3).to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, model.cfg.src_vocab_size, (9, 8), generator=g)
    for i, n in enumerate([8, 3, 1, 6, 5, 8, 2, 7, 4]):  # right-padded, each ending in </s>
        src[i, n - 1], src[i, n:] = EOS_ID, PAD_ID
    src = src.to(device)
    graph, eager, shrinking = StepModel(model), StepModel(model, static=True), StepModel(model, static=False)
    assert graph.static and not shrinking.static
    eager_start = eager.start
    eager.start = lambda *a: _eager(eager_start(*a))
    with torch.inference_mode():
        decoder = graph.start(9, 4, 6, *graph.encode(src))
        for _ in range(2):  # a warm-up step, then the captured one
            decoder.step(torch.full((9,), 1, device=device))
        assert isinstance(decoder, StaticDecoder) and decoder.graph.graph is not None
        decoder.release()
    # (in bf16 the shrinking decoder's shorter attention rounds differently: a near tie may go the other way)
    # slots=3: continuous batching, new sentences written into the captured graph's tensors as others finish
    for sm_a, sm_b in ((graph, eager), (graph, shrinking)) if dtype == torch.float32 else ((graph, eager),):
        for slots in (None, 3):
            b_slots = slots if sm_b.static else None
            a, b = greedy_decode(sm_a, src, slots=slots), greedy_decode(sm_b, src, slots=b_slots)
            assert [h.tokens for h in a] == [h.tokens for h in b]
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-4)
            a = beam_search(sm_a, src, beam_size=4, nbest=4, slots=slots)
            b = beam_search(sm_b, src, beam_size=4, nbest=4, slots=b_slots)
            assert [[h.tokens for h in hs] for hs in a] == [[h.tokens for h in hs] for hs in b]
            assert [h.score for hs in a for h in hs] == pytest.approx([h.score for hs in b for h in hs], abs=1e-4)


def _eager(decoder):
    decoder.graph.on = False
    return decoder
