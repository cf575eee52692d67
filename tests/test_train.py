"""Training: schedules, loss, config resolution, the loop, checkpoints, exact resume, interrupts, DDP, bad input."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from helpers import make_mono_prepared, make_parallel_prepared, poisoned, tiny_train_config, train_tiny_checkpoint
from tfcli import checkpoint
from tfcli import checkpoint_meta
from tfcli.data.batching import lm_stream
from tfcli.data.prepared import PreparedData
from tfcli.errors import CheckpointError, ConfigError, TfcliError
from tfcli.model.config import preset
from tfcli.specials import EOS_ID, PAD_ID
from tfcli.model.transformer import build_model
from tfcli.train.average import average_checkpoints
from tfcli.train.config import load_train_config
from tfcli.train.data import ParallelData, StreamData
from tfcli.train.flops import gpu_peak_flops, matmul_params
from tfcli.train.loss import label_smoothed_loss
from tfcli.train.schedule import learning_rate
from tfcli.train.trainer import run as run_cli_config
from tfcli.train.checkpoints import step_name as checkpoint_name
from tfcli.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
TRAIN_KEYS = {"step", "epoch", "time", "split", "loss", "nll", "ppl", "lr", "src_tokens_per_s", "tgt_tokens_per_s",
              "padding_fraction", "grad_norm", "skipped"}
VALID_KEYS = {"step", "epoch", "time", "split", "loss", "ppl"}


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    return make_parallel_prepared(tmp_path_factory.mktemp("par"), n_train=200, task="reverse")


@pytest.fixture(scope="module")
def mono(tmp_path_factory):
    return make_mono_prepared(tmp_path_factory.mktemp("mono"))


def weights(run_dir: Path) -> dict:
    return load_file(str(_latest(run_dir) / "model.safetensors"))


def _latest(run_dir: Path) -> Path:
    ckpts = Path(run_dir) / "checkpoints"
    return ckpts / (ckpts / "LATEST").read_text().strip()


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# --- pieces ---------------------------------------------------------------------------------------------------------


def test_inverse_sqrt_is_the_papers_formula():
    d_model, warmup = 512, 4000
    peak = d_model**-0.5 * warmup**-0.5  # the paper's lr at step = warmup
    for step in (1, 100, 3999, 4000, 4001, 20000, 100000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert learning_rate(step, "inverse_sqrt", peak, warmup) == pytest.approx(paper, rel=1e-12)


def test_cosine_and_constant_schedules():
    lrs = [learning_rate(s, "cosine", 1.0, 10, total_steps=110, min_lr=0.1) for s in range(1, 111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)  # linear warmup to the peak at step 10
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # then monotone down
    assert lrs[-1] == pytest.approx(0.1)  # to min_lr at the last step
    assert learning_rate(60, "cosine", 1.0, 10, 110, 0.0) == pytest.approx(0.5)  # halfway: cos(pi/2)
    assert learning_rate(5, "constant", 2.0, 10) == pytest.approx(1.0)
    assert learning_rate(500, "constant", 2.0, 10) == 2.0


def test_label_smoothed_loss_matches_pytorch_and_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(4, 11, (3, 5))
    target[0, 3:] = PAD_ID
    target[2, 1:] = PAD_ID
    loss, nll = label_smoothed_loss(logits, target, 0.1)
    flat_logits, flat_target = logits.flatten(0, 1), target.flatten()
    ref = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum")
    ref_nll = F.cross_entropy(flat_logits, flat_target, ignore_index=PAD_ID, reduction="sum")
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref_nll)
    # padded positions have no influence, whatever their logits
    logits2 = logits.clone()
    logits2[target == PAD_ID] = 100.0
    torch.testing.assert_close(label_smoothed_loss(logits2, target, 0.1)[0], loss)
    # gradients flow through the smoothed loss
    logits.requires_grad_(True)
    label_smoothed_loss(logits, target, 0.1)[0].backward()
    assert (logits.grad[target == PAD_ID] == 0).all() and logits.grad.abs().sum() > 0


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_label_smoothed_loss_gradient_is_autograds(eps, dtype):
    """The closed-form gradient (p - q, by blocks of rows) against autograd through PyTorch's own cross-entropy, over
    several row blocks, with padding rows; bf16 logits get fp32 arithmetic and a gradient in their dtype."""
    from tfcli.train.loss import BLOCK_ROWS

    g = torch.Generator().manual_seed(1)
    n, V = 2 * BLOCK_ROWS + 37, 301
    logits = (4 * torch.randn(n, V, generator=g)).to(dtype)
    target = torch.randint(4, V, (n,), generator=g)
    target[torch.rand(n, generator=g) < 0.2] = PAD_ID
    a = logits.clone().requires_grad_(True)
    loss, nll = label_smoothed_loss(a, target, eps)
    (3.0 * loss).backward()
    b = logits.float().clone().requires_grad_(True)
    ref = F.cross_entropy(b, target, ignore_index=PAD_ID, label_smoothing=eps, reduction="sum")
    (3.0 * ref).backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(nll, F.cross_entropy(b.detach(), target, ignore_index=PAD_ID, reduction="sum"))
    assert a.grad.dtype == dtype and not nll.requires_grad
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(a.grad.float(), b.grad, **tol)
    assert (a.grad[target == PAD_ID] == 0).all()
    # reuse_logits (as the objective calls it): the gradient written over the logits of an intermediate tensor
    w = torch.eye(V).to(dtype).requires_grad_(True)  # (torch 2.2 has no bf16 eye)
    c = logits.clone().requires_grad_(True)
    label_smoothed_loss(c @ w, target, eps, reuse_logits=True)[0].mul(3.0).backward()
    torch.testing.assert_close(c.grad.float(), b.grad, **tol)
    if dtype == torch.float32:  # and the layer before gets the gradient through it
        torch.testing.assert_close(w.grad, logits.T @ b.grad, rtol=1e-4, atol=1e-4)


def _rdrop_batch(kind: str, dropout: float = 0.3):
    """A random toy model with dropout, and a padded batch (src, inputs, targets) for it (src None for an LM)."""
    V = 23
    cfg = preset("toy" if kind == "seq2seq" else "lm-toy", src_vocab_size=V, tgt_vocab_size=V, dropout=dropout)
    torch.manual_seed(3)
    model = build_model(cfg).train()
    g = torch.Generator().manual_seed(4)
    src = torch.randint(4, V, (3, 6), generator=g) if kind == "seq2seq" else None
    targets = torch.randint(4, V, (3, 7), generator=g)
    targets[1, 5:] = PAD_ID
    targets[2, 3:] = PAD_ID
    inputs = torch.cat([torch.full((3, 1), 1), targets[:, :-1]], 1).masked_fill(targets == PAD_ID, PAD_ID)
    return model, src, inputs, targets


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_rdrop_is_its_formula_with_its_gradient(kind):
    """train.rdrop = alpha: the batch twice through the model (one forward of both copies, each its own dropout
    masks), the mean of the two passes' label-smoothed cross-entropies plus alpha / 2 times the symmetric KL of
    their output distributions, over the real target tokens; the loss and every parameter's gradient against that
    formula written with PyTorch's own cross-entropy and KL, under the same dropout draws."""
    from tfcli.train.loss import Objective

    model, src, inputs, targets = _rdrop_batch(kind)
    eps, alpha = 0.1, 2.5

    def formula():
        doubled = torch.cat([inputs, inputs])
        h = model.features(doubled) if src is None else model.features(torch.cat([src, src]), doubled)
        z1, z2 = model.lm_head(h).flatten(0, 1).chunk(2)
        t = targets.flatten()
        ce = [F.cross_entropy(z, t, ignore_index=PAD_ID, label_smoothing=eps, reduction="sum") for z in (z1, z2)]
        real = t != PAD_ID
        lp1, lp2 = z1[real].log_softmax(-1), z2[real].log_softmax(-1)
        kl = (F.kl_div(lp2, lp1, log_target=True, reduction="sum") + F.kl_div(lp1, lp2, log_target=True,
                                                                               reduction="sum"))
        nll = sum(F.cross_entropy(z.detach(), t, ignore_index=PAD_ID, reduction="sum") for z in (z1, z2)) / 2
        kls.append(kl.item())
        return (ce[0] + ce[1]) / 2 + alpha * kl / 2, nll

    results, kls = [], []
    for f in (lambda: Objective(model, eps, alpha)(src, inputs, targets), formula):
        model.zero_grad()
        torch.manual_seed(7)  # the same dropout masks
        loss, nll = f()
        loss.backward()
        results.append((loss.detach(), nll, [p.grad.clone() for p in model.parameters()]))
    (loss, nll, grads), (want, want_nll, want_grads) = results
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, want_nll, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert kls[0] > 0.01  # two dropout masks: the passes' distributions differ, and the KL term counts


def test_rdrop_off_is_the_plain_loss_and_without_dropout_changes_nothing():
    """rdrop 0 runs the batch once: the loss is the plain one bit for bit. With dropout off both passes are one, so
    R-Drop's loss is the plain loss (the KL is 0); in eval mode (validation) it is the plain loss too."""
    from tfcli.train.loss import Objective

    model, src, inputs, targets = _rdrop_batch("seq2seq")
    torch.manual_seed(7)
    plain = Objective(model, 0.1)(src, inputs, targets)
    torch.manual_seed(7)
    off = Objective(model, 0.1, 0.0)(src, inputs, targets)
    assert all(torch.equal(a, b) for a, b in zip(plain, off))
    model.eval()
    with torch.no_grad():
        plain = Objective(model, 0.1)(src, inputs, targets)
        assert all(torch.equal(a, b) for a, b in zip(Objective(model, 0.1, 3.0)(src, inputs, targets), plain))
        model, src, inputs, targets = _rdrop_batch("seq2seq", dropout=0.0)
        rdrop = Objective(model, 0.1, 3.0)(src, inputs, targets)
        plain = Objective(model, 0.1)(src, inputs, targets)
        torch.testing.assert_close(rdrop[0], plain[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(rdrop[1], plain[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_projection_and_loss_is_the_plain_loss_and_gradient(eps, bias):
    """linear_label_smoothed_loss (the GPU's objective: no (N, V) logits held) against PyTorch's cross-entropy over
    F.linear: the loss, the nll and the gradients of h, W and b, over blocks of rows that do not divide N, with
    padding; and through torch.compile (aot_eager) in one graph."""
    from torch._dynamo.utils import counters

    from tfcli.train.loss import linear_label_smoothed_loss

    g = torch.Generator().manual_seed(2)
    h = torch.randn(3, 13, 16, generator=g)
    w = torch.randn(41, 16, generator=g) / 4
    b = torch.randn(41, generator=g) if bias else None
    target = torch.randint(4, 41, (3, 13), generator=g)
    target[0, 9:] = PAD_ID
    target[2, 2:] = PAD_ID

    def plain(h, w, b):
        z = F.linear(h, w, b).flatten(0, 1)
        loss = F.cross_entropy(z, target.flatten(), ignore_index=PAD_ID, label_smoothing=eps, reduction="sum")
        return loss, F.cross_entropy(z.detach(), target.flatten(), ignore_index=PAD_ID, reduction="sum")

    def fused(h, w, b):
        return linear_label_smoothed_loss(h, w, b, target, eps, block_rows=7)

    results = []
    torch._dynamo.reset()
    counters.clear()
    for f in (plain, fused, torch.compile(fused, backend="aot_eager")):
        args = [t.clone().requires_grad_(True) if t is not None else None for t in (h, w, b)]
        loss, nll = f(*args)
        (2.5 * loss).backward()
        results.append((loss.detach(), nll, *(a.grad for a in args if a is not None)))
    assert not counters["graph_break"]
    torch._dynamo.reset()
    for got in results[1:]:
        for x, y in zip(got, results[0]):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_fused_loss_follows_autocast_and_trains_tied_weights():
    """Under bf16 autocast the products run in bf16 as the plain projection's do (the loss within bf16 rounding of
    the plain one); with the output projection tied to the embedding (the model's own weights), the whole model's
    gradients are those of the plain path."""
    from tfcli.train.loss import linear_label_smoothed_loss

    torch.manual_seed(0)
    V = 30
    model = build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V, tie_output=True))
    src, inputs = torch.randint(4, V, (3, 7)), torch.randint(4, V, (3, 6))
    targets = torch.randint(4, V, (3, 6))
    targets[1, 4:] = PAD_ID
    grads = []
    for fused in (False, True):
        model.zero_grad()
        h = model.features(src, inputs)
        if fused:
            loss = linear_label_smoothed_loss(h, model.lm_head.weight, model.lm_head.bias, targets, 0.1)[0]
        else:
            loss = label_smoothed_loss(model.lm_head(h), targets, 0.1)[0]
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-5)
    h = torch.randn(40, 64)
    w = torch.randn(V, 64) / 8
    target = torch.randint(4, V, (40,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = label_smoothed_loss(F.linear(h, w), target, 0.1)[0]
        got = linear_label_smoothed_loss(h, w, None, target, 0.1, block_rows=16)[0]
    torch.testing.assert_close(got, want.float(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("arch", ["toy", "lm-toy"])
def test_objective_equals_the_loss_of_the_full_logits(arch):
    """On the CPU the objective drops padding rows before the output projection; the loss must not change."""
    from tfcli.train.loss import Objective

    torch.manual_seed(0)
    V = 30
    model = build_model(preset(arch, src_vocab_size=0 if arch == "lm-toy" else V, tgt_vocab_size=V)).eval()
    src = torch.randint(4, V, (3, 7))
    src[1, 4:] = PAD_ID
    inputs, targets = torch.randint(4, V, (3, 6)), torch.randint(4, V, (3, 6))
    targets[0, 3:] = PAD_ID
    if arch == "lm-toy":
        src, logits = None, model(inputs)
    else:
        logits = model(src, inputs)
    got = Objective(model, 0.1)(src, inputs, targets)
    want = label_smoothed_loss(logits, targets, 0.1)
    torch.testing.assert_close(got, want)


def test_token_batches_are_bucketed_deterministic_and_cover_every_pair(parallel):
    data = ParallelData(PreparedData(parallel), "train", 64, max_tokens=60, max_sentences=0, seed=3)
    b1, b2, other = data.batches(0), data.batches(0), data.batches(1)
    assert [x.tolist() for x in b1] == [x.tolist() for x in b2]  # same seed and epoch: same batches
    assert [x.tolist() for x in b1] != [x.tolist() for x in other]  # next epoch: reshuffled
    assert sorted(np.concatenate(b1).tolist()) == list(range(len(data)))
    lengths = np.maximum(data.src_len, data.tgt_len)
    assert all(len(b) * lengths[b].max() <= 60 for b in b1)
    batch = data.collate(b1[0])
    assert batch.src_tokens == int(data.src_len[b1[0]].sum()) == int((batch.src != PAD_ID).sum())
    assert batch.tgt_tokens == int((batch.targets != PAD_ID).sum())


def test_lm_stream_blocks(mono):
    data = StreamData(PreparedData(mono), "valid", 16, max_tokens=64, max_sentences=0, seed=1)
    valid = data.batches(0, shuffle=False)
    targets = np.concatenate([data.collate(b).targets.flatten().numpy() for b in valid])
    # validation scores every id after the first exactly once, in order
    assert targets.tolist() == data.stream[1:].astype(np.int64).tolist()
    # the stream is the one perplexity scores, and each text starts after a </s>, as lm-generate's prompts do
    seqs = PreparedData(mono).sequences("valid", "tgt")
    assert data.stream.tolist() == lm_stream(np.asarray(seqs.flat, dtype=np.int64), seqs.offsets).tolist()
    assert data.stream[0] == EOS_ID and data.stream[1 + len(seqs[0])] == EOS_ID
    train_blocks = data.batches(0)
    assert all(len(b) <= 64 // 16 for b in train_blocks)
    b = data.collate(train_blocks[0])
    assert torch.equal(b.inputs[:, 1:], b.targets[:, :-1])  # targets are the inputs shifted by one
    assert data.batches(0)[0].tolist() == train_blocks[0].tolist() != data.batches(1)[0].tolist()


@pytest.mark.parametrize("arch,fields", [("toy", {}), ("lm-toy", {}), ("toy", dict(n_kv_head=2, activation="swiglu")),
                                         ("lm-toy", dict(n_kv_head=1))])
def test_flops_count_every_matmul_weight(arch, fields):
    """6N: N must be the weights multiplied per token; compare with the model's own Linear layers."""
    cfg = preset(arch, src_vocab_size=0 if arch == "lm-toy" else 50, tgt_vocab_size=50, **fields)
    model = build_model(cfg)
    per_src, per_tgt = matmul_params(cfg)
    linears = {n: m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    src_side = sum(v for n, v in linears.items() if n.startswith("encoder.") or "cross_attn.kv_proj" in n)
    assert per_src == src_side
    assert per_tgt == sum(linears.values()) - src_side


def test_mfu_divides_by_the_peak_of_the_gpu_and_precision():
    """The datasheet's dense figure for the named GPU: the specific names are not taken for the general ones."""
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "bf16") == 989.4e12
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp32") == 494.7e12  # TF32
    assert gpu_peak_flops("NVIDIA H100 PCIe", "fp16") == 756e12
    assert gpu_peak_flops("NVIDIA H200", "bf16") == 989.4e12
    assert gpu_peak_flops("NVIDIA L40S", "bf16") == 362e12 and gpu_peak_flops("NVIDIA L4", "bf16") == 121e12
    assert gpu_peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert gpu_peak_flops("NVIDIA GeForce GTX 1080", "bf16") is None  # unknown: no MFU rather than a wrong one


def test_native_bf16_is_bf16_on_a_cpu_with_native_bf16_products_only(monkeypatch):
    """native-bf16: bf16 on a CPU whose oneDNN multiplies bf16 natively, fp32 on another CPU; auto stays fp32 on
    every CPU (tests and users get the same numbers on every CPU unless they ask)."""
    from tfcli.train import trainer

    cpu = torch.device("cpu")
    for native in (True, False):
        monkeypatch.setattr(trainer, "cpu_has_native_bf16", lambda native=native: native)
        assert trainer.train_precision("native-bf16", cpu) == ("bf16" if native else "fp32")
        assert trainer.train_precision("auto", cpu) == "fp32"
        assert trainer.train_precision("bf16", cpu) == "bf16"
    with pytest.raises(ConfigError, match="fp16 needs a CUDA GPU"):
        trainer.train_precision("fp16", cpu)


def test_native_bf16_needs_amx_or_avx512_bf16_within_onednns_isa_setting(monkeypatch):
    """bf16 counts as native where the CPU has AMX tiles or AVX-512 BF16 and ONEDNN_MAX_CPU_ISA lets oneDNN use
    them."""
    from tfcli import torch_compat

    for amx, avx512_bf16 in [(False, False), (False, True), (True, False)]:
        monkeypatch.setattr(torch_compat, "cpu_has_amx", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda b=avx512_bf16: b, raising=False)
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        assert torch_compat.cpu_has_native_bf16() == (amx or avx512_bf16)
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
        assert torch_compat.cpu_has_native_bf16() == (amx or avx512_bf16)
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")
        assert torch_compat.cpu_has_native_bf16() == amx  # cpu_has_amx reads the setting itself


# --- config ---------------------------------------------------------------------------------------------------------


def test_config_file_sections_and_precedence(tmp_path):
    (tmp_path / "c.yaml").write_text("train:\n  lr: 0.001\n  warmup: 100\nmodel:\n  dropout: 0.3\n")
    cfg, model = load_train_config(tmp_path / "c.yaml", {"warmup": 7, "lr": None}, ["train.seed=9"])
    assert (cfg.lr, cfg.warmup, cfg.seed) == (0.001, 7, 9)  # file < --set < flags; None = flag not given
    assert model == {"dropout": 0.3}
    (tmp_path / "c.toml").write_text('[train]\nschedule = "cosine"\nmax_steps = 10\n')
    cfg, _ = load_train_config(tmp_path / "c.toml", {})
    assert cfg.schedule == "cosine" and cfg.max_steps == 10


@pytest.mark.parametrize(
    "text, match",
    [
        ("train:\n  warmpu: 10\n", r"train\.warmpu: unknown config key \(did you mean 'warmup'"),
        ("model:\n  d_modle: 64\n", r"model\.d_modle: unknown config key \(did you mean 'd_model'"),
        ("trian:\n  lr: 0.1\n", "unknown section 'trian'"),
        ("train:\n  schedule: linear\n", "must be one of"),
        ("train:\n  max_tokens: 0\n", "max_tokens: must be positive"),
        ("train:\n  label_smoothing: 1.5\n", "label_smoothing"),
    ],
)
def test_config_errors_name_the_key(tmp_path, text, match):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_train_config(tmp_path / "c.yaml", {})


def test_impossible_model_and_wrong_data_kind_are_clear_errors_and_write_nothing(tmp_path, parallel, mono):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"d_model \(30\) must be divisible by n_head \(4\)"):
        train(tiny_train_config(parallel, out), {"d_model": 30})
    with pytest.raises(ConfigError, match="monolingual.*is an encoder-decoder.*lm-toy"):
        train(tiny_train_config(mono, out, arch="toy"))
    separate = tmp_path / "separate"  # a decoder-only translator reads both sides with one vocabulary
    shutil.copytree(parallel, separate)
    meta = json.loads((separate / "meta.json").read_text())
    (separate / "meta.json").write_text(json.dumps({**meta, "joint_vocab": False}))
    with pytest.raises(ConfigError, match="decoder-only translator.*--joint-vocab"):
        train(tiny_train_config(separate, out, arch="lm-toy"))
    with pytest.raises(ConfigError, match="unknown architecture preset 'huge'"):
        train(tiny_train_config(parallel, out, arch="huge"))
    with pytest.raises(TfcliError, match="not a prepared directory"):
        train(tiny_train_config(tmp_path, out))
    assert not out.exists()


# --- the loop -------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_translation_run_layout_metrics_and_checkpoint(tmp_path):
    run = train_tiny_checkpoint(tmp_path)  # the copy task, 300 steps
    ckpts = run / "checkpoints"
    assert (ckpts / "LATEST").read_text().strip() == "step-0000300" == (ckpts / "BEST").read_text().strip()
    assert (run / "config.yaml").exists()
    lines = metrics(run)
    train_lines = [r for r in lines if r["split"] == "train"]
    valid_lines = [r for r in lines if r["split"] == "valid"]
    assert [r["step"] for r in train_lines] == list(range(25, 301, 25)) and len(valid_lines) == 1
    for r in train_lines:
        assert TRAIN_KEYS <= r.keys() and "mfu" not in r  # no MFU on a CPU
        assert r["tgt_tokens_per_s"] > 0 and r["src_tokens_per_s"] > 0 and 0 <= r["padding_fraction"] < 0.5
    assert VALID_KEYS | {"bleu"} <= valid_lines[0].keys()
    # the logged BLEU is what translating the valid sources greedily with the saved checkpoint scores
    import sacrebleu

    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.translate import translate

    prep, hyp = run.parent / "prep", tmp_path / "valid.hyp"
    translate(str(run), [str(prep / "valid.src.txt")], str(hyp), TranslateConfig(device="cpu", beam_size=1))
    refs = (prep / "valid.tgt.txt").read_text().splitlines()
    assert valid_lines[0]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyp.read_text().splitlines(), [refs]).score)
    # the checkpoint stands alone: config, tokenizers, weights
    model, meta = checkpoint.load(run)
    assert meta["step"] == 300 and meta["data"]["kind"] == "parallel" and meta["train"]["arch"] == "toy"
    assert meta["model"]["share_embeddings"] is True  # joint vocabulary
    # what translate's --split-sentences auto holds a line to: the training sources' lengths (with </s>)
    lengths = PreparedData(prep).sequences("train", "src").lengths
    assert meta["data"]["src_len"] == {"p99": int(np.percentile(lengths, 99)) + 1, "max": int(lengths.max()) + 1}
    assert checkpoint_meta.tokenizer_path(meta, "src").exists() and checkpoint_meta.tokenizer_path(meta, "tgt").exists()


def test_lm_training_logs_and_checkpoints(tmp_path, mono):
    cfg = tiny_train_config(mono, tmp_path / "run", arch="lm-toy", max_len=16, max_steps=30, log_every=10,
                            valid_every=15, schedule="constant", warmup=5)
    result = train(cfg)
    assert result.step == 30 and not result.interrupted
    lines = metrics(cfg.out)
    assert [r["step"] for r in lines] == [10, 15, 20, 30, 30]
    assert all(TRAIN_KEYS <= r.keys() and r["src_tokens_per_s"] == 0 for r in lines if r["split"] == "train")
    valid = [r for r in lines if r["split"] == "valid"]
    assert all(VALID_KEYS <= r.keys() and "bleu" not in r for r in valid)
    assert valid[-1]["ppl"] == pytest.approx(math.exp(valid[-1]["nll"]))
    model, meta = checkpoint.load(cfg.out)
    assert meta["model"]["kind"] == "lm" and list(meta["tokenizers"]) == ["tgt"]


def test_keep_last_best_and_early_stopping(tmp_path, parallel):
    # a learning rate too small to change the valid loss: no improvement after the first validation
    cfg = tiny_train_config(parallel, tmp_path / "run", lr=1e-12, max_steps=100, valid_every=2, log_every=2,
                            patience=2, keep_last=1, valid_bleu=False)
    result = train(cfg)
    assert result.early_stopped and result.step == 6  # validations at 2 (best), 4, 6 (2 without improvement)
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert ckpts == ["step-0000002", "step-0000006"]  # the best and the last one
    assert (tmp_path / "run" / "checkpoints" / "BEST").read_text().strip() == "step-0000002"
    assert checkpoint_meta.resolve(tmp_path / "run").name == "step-0000002"


def test_refuses_to_overwrite_a_run_and_resume_needs_one(tmp_path, parallel):
    cfg = tiny_train_config(parallel, tmp_path / "run", max_steps=2, valid_every=2, valid_bleu=False)
    train(cfg)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(TfcliError, match="already holds a training run; pass --resume"):
        train(cfg)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    with pytest.raises(CheckpointError, match="nothing to resume"):
        run_cli_config(None, {"data": str(parallel), "out": str(tmp_path / "run" / "metrics.jsonl"), "resume": True})


# --- resume ---------------------------------------------------------------------------------------------------------

RESUME = dict(max_steps=14, valid_every=5, log_every=1, grad_accum=2, max_tokens=200, label_smoothing=0.1,
              valid_bleu=False)


@pytest.mark.parametrize("optimizer,rdrop", [("adamw", 0.0), ("muon", 0.0), ("adamw", 1.0)])
def test_resume_reaches_the_same_weights_as_an_uninterrupted_run(tmp_path, parallel, optimizer, rdrop):
    model = {"dropout": 0.1}  # dropout on: the RNG state must round-trip too (R-Drop draws two masks a step)
    full = tiny_train_config(parallel, tmp_path / "full", **RESUME, optimizer=optimizer, rdrop=rdrop)
    train(full, model)
    part = tiny_train_config(parallel, tmp_path / "part", **{**RESUME, "max_steps": 8}, optimizer=optimizer,
                             rdrop=rdrop)
    train(part, model)
    # continue with a longer max_steps, as a user would; everything else comes from the saved run
    result = run_cli_config(None, {"out": str(tmp_path / "part"), "resume": True, "max_steps": 14})
    assert result.step == 14
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the resumed metrics continue the log; the loss curve is the uninterrupted one
    full_loss = [(r["step"], r["loss"]) for r in metrics(tmp_path / "full") if r["split"] == "train"]
    part_loss = [(r["step"], r["loss"]) for r in metrics(tmp_path / "part") if r["split"] == "train"]
    assert full_loss == part_loss


def test_muon_trains_and_checkpoints_its_momenta(tmp_path, parallel):
    """optimizer muon: the loss falls, and the checkpoint holds a Muon momentum for each layer matrix beside AdamW's
    moments for the rest."""
    cfg = tiny_train_config(parallel, tmp_path / "run", max_steps=40, valid_every=40, log_every=5, valid_bleu=False,
                            optimizer="muon", muon_lr=0.02)
    train(cfg)
    losses = [r["loss"] for r in metrics(tmp_path / "run") if r["split"] == "train"]
    assert losses[-1] < losses[0] - 0.5
    names = load_file(str(_latest(tmp_path / "run") / "trainer_state.safetensors")).keys()
    assert any(n.endswith(".momentum_buffer") for n in names) and any(n.endswith(".exp_avg") for n in names)


def test_resume_rejects_a_changed_architecture_and_corrupt_checkpoints(tmp_path, parallel):
    train(tiny_train_config(parallel, tmp_path / "run", max_steps=2, valid_every=2, valid_bleu=False))
    flags = {"out": str(tmp_path / "run"), "resume": True, "max_steps": 4}
    with pytest.raises(ConfigError, match="architecture cannot change.*d_ff: 64 -> 128"):
        run_cli_config(None, flags, ["model.d_ff=128"])
    with pytest.raises(ConfigError, match="--arch toy; it cannot change to small"):
        run_cli_config(None, {**flags, "arch": "small"})
    ckpt = _latest(tmp_path / "run")
    files = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    weights_file = ckpt / "model.safetensors"
    weights_file.write_bytes(files["model.safetensors"][:-100])  # truncated
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt or truncated"):
        run_cli_config(None, flags)
    weights_file.write_bytes(files["model.safetensors"])
    (ckpt / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt trainer state"):
        run_cli_config(None, flags)
    (ckpt / "trainer_state.json").write_bytes(files["trainer_state.json"])
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == files  # nothing else was touched
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["BEST", "LATEST", ckpt.name]


# --- updates whose gradients are not finite -------------------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_step_with_nan_gradients_makes_no_update_and_is_logged(tmp_path, parallel, monkeypatch, optimizer):
    """AdamW (torch's fused: skipped on the device) and Muon (skipped on the host): a NaN step leaves the weights
    and every moment as they were, the run goes on, and the log counts it, its loss left out."""
    changed = poisoned(monkeypatch, lambda step: step in (3, 5))
    train(tiny_train_config(parallel, tmp_path / "run", max_steps=8, valid_every=8, log_every=1, valid_bleu=False,
                            optimizer=optimizer))
    assert changed == {step: step not in (3, 5) for step in range(1, 9)}
    assert all(torch.isfinite(t).all() for t in weights(tmp_path / "run").values())
    records = [r for r in metrics(tmp_path / "run") if r["split"] == "train"]
    assert [r["skipped"] for r in records] == [int(r["step"] in (3, 5)) for r in records]
    assert all(math.isnan(r["loss"]) == (r["step"] in (3, 5)) for r in records)
    if optimizer == "adamw":  # AdamW's step count: the updates made
        state = load_file(str(_latest(tmp_path / "run") / "trainer_state.safetensors"))
        assert {float(v) for k, v in state.items() if k.endswith(".step")} == {6.0}


def test_a_diverged_run_stops_before_its_good_checkpoints_are_rotated_out(tmp_path, parallel, monkeypatch):
    """NaN from step 5 on, DIVERGED_AFTER 3: steps 5 and 6 are skipped (the checkpoint at 6 holds step 4's weights),
    step 7 is the third in a row: a one-line error that says what to do, and no checkpoint after 6. Resumed, the
    count goes on from the checkpoint's (the same error at step 7); resumed once the loss is sound, it trains on."""
    import tfcli.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "DIVERGED_AFTER", 3)
    poisoned(monkeypatch, lambda step: step >= 5)
    run = tmp_path / "run"
    cfg = dict(max_steps=12, valid_every=2, log_every=1, valid_bleu=False, keep_last=2)
    message = r"training diverged: the last 3 updates \(to step 7\) were skipped.*lower --lr.*step-0*6 is whole"
    with pytest.raises(TfcliError, match=message):
        train(tiny_train_config(parallel, run, **cfg))
    assert _latest(run).name.endswith("6") and sorted(p.name for p in (run / "checkpoints").glob("step-*"))[-1] \
        == _latest(run).name
    four = load_file(str(run / "checkpoints" / _latest(run).name.replace("6", "4") / "model.safetensors"))
    assert all(torch.equal(four[k], v) for k, v in weights(run).items())
    assert json.loads((_latest(run) / "trainer_state.json").read_text())["skipped_in_row"] == 2
    with pytest.raises(TfcliError, match=message):
        run_cli_config(None, {"out": str(run), "resume": True})
    monkeypatch.undo()
    result = run_cli_config(None, {"out": str(run), "resume": True})
    assert result.step == 12 and all(torch.isfinite(t).all() for t in weights(run).values())


def test_no_checkpoint_is_deleted_while_updates_are_skipped(tmp_path, parallel, monkeypatch):
    """keep_last 1, a checkpoint every step, NaN from step 4 on: the checkpoints of steps 4 and 5 (written while
    updates were skipped) delete none of the earlier ones, so step 3's, from before the divergence, is still there."""
    import tfcli.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "DIVERGED_AFTER", 3)
    poisoned(monkeypatch, lambda step: step >= 4)
    run = tmp_path / "run"
    with pytest.raises(TfcliError, match=r"the last 3 updates \(to step 6\)"):
        train(tiny_train_config(parallel, run, max_steps=12, valid_every=1, log_every=1, valid_bleu=False,
                                keep_last=1))
    names = {p.name for p in (run / "checkpoints").glob("step-*")}
    assert {checkpoint_name(3), checkpoint_name(4), checkpoint_name(5)} <= names
    assert checkpoint_name(2) not in names or checkpoint_name(2) == (run / "checkpoints" / "BEST").read_text().strip()


def _cli(*args, **kw):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "tfcli.cli", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


@pytest.mark.slow
def test_sigint_saves_a_checkpoint_exits_130_and_resumes_exactly(tmp_path, parallel):
    run = tmp_path / "run"
    common = ["--arch", "toy", "--max-tokens", "200", "--lr", "3e-3", "--warmup", "10", "--log-every", "1",
              "--valid-every", "1000", "--no-valid-bleu", "--max-epochs", "0", "--device", "cpu", "--threads", "1",
              "--set", "model.dropout=0.1", "--set", "train.tensorboard=false"]
    proc = _cli("train", str(parallel), "-o", str(run), "--max-steps", "5000", *common)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at step" in err and "--resume" in err
    stopped = json.loads((_latest(run) / "trainer_state.json").read_text())["step"]
    assert 3 <= stopped < 5000
    # resume to a few steps further; compare with one uninterrupted run to the same step
    target = stopped + 3
    proc = _cli("train", "-o", str(run), "--resume", "--max-steps", str(target), "--threads", "1")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == str(run / "checkpoints" / f"step-{target:07d}")
    flags = dict(data=str(parallel), out=str(tmp_path / "full"), arch="toy", max_tokens=200, lr=3e-3, warmup=10,
                 log_every=1, valid_every=1000, valid_bleu=False, max_epochs=0, device="cpu", threads=1,
                 max_steps=target, tensorboard=False)
    run_cli_config(None, flags, ["model.dropout=0.1"])
    a, b = weights(tmp_path / "full"), weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- several processes ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_twice_the_batch(tmp_path, parallel):
    """torchrun with 2 CPU processes (each its share of every step's batches) vs 1 process accumulating both."""
    common = dict(arch="toy", max_tokens=200, lr=3e-3, warmup=5, log_every=1, valid_every=4, valid_bleu=False,
                  max_epochs=0, max_steps=8, device="cpu", label_smoothing=0.1, tensorboard=False)
    run_cli_config(None, {**common, "data": str(parallel), "out": str(tmp_path / "one"), "grad_accum": 2})
    args = [f"--{k.replace('_', '-')}={v}" for k, v in common.items() if not isinstance(v, bool)]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "tfcli.cli",
           "train", str(parallel), "-o", str(tmp_path / "two"), *args, "--no-valid-bleu", "--set",
           "train.tensorboard=false"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [(r["step"], r["split"]) for r in one] == [(r["step"], r["split"]) for r in two]
    for r1, r2 in zip(one, two):
        assert r2["loss"] == pytest.approx(r1["loss"], rel=1e-4, abs=1e-5)
        if r1["split"] == "train":
            assert r2["tgt_tokens_per_s"] > 0  # counted over both processes
    # Same function, not bit-identical weights: key biases have an exactly zero gradient (softmax ignores a constant
    # added to every score), so Adam turns their float-noise gradients into lr-sized steps; outputs do not see them.
    (m1, _), (m2, _) = checkpoint.load(tmp_path / "one"), checkpoint.load(tmp_path / "two")
    src, tgt = torch.randint(4, 20, (4, 7)), torch.randint(4, 20, (4, 6))
    torch.testing.assert_close(m1(src, tgt), m2(src, tgt), atol=1e-4, rtol=1e-4)
    # rank 0 alone wrote: one metrics file, one set of checkpoints
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == [
        "BEST", "LATEST", "step-0000004", "step-0000008"]


@pytest.mark.slow
def test_fsdp_processes_train_what_one_process_trains_and_resume_exactly(tmp_path, parallel):
    """torchrun --fsdp, 2 CPU processes (gloo): each holds half of every parameter, gradient and AdamW moment, and
    the run computes what one process accumulating both shares computes; its checkpoints are whole models, and a
    run stopped halfway and resumed reaches the uninterrupted run's weights bit for bit."""
    common = dict(arch="toy", max_tokens=200, lr=3e-3, warmup=5, log_every=1, valid_every=4, valid_bleu=False,
                  max_epochs=0, max_steps=8, device="cpu", label_smoothing=0.1, tensorboard=False)
    run_cli_config(None, {**common, "data": str(parallel), "out": str(tmp_path / "one"), "grad_accum": 2})
    args = [f"--{k.replace('_', '-')}={v}" for k, v in common.items() if not isinstance(v, bool)]

    def torchrun(*more):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
               "tfcli.cli", "train", *more, "--no-valid-bleu", "--set", "train.tensorboard=false"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert proc.returncode == 0, proc.stderr[-3000:]

    torchrun(str(parallel), "-o", str(tmp_path / "two"), *args, "--fsdp")
    assert "shard of the parameters (FSDP)" in (tmp_path / "two" / "train.log").read_text()
    one, two = metrics(tmp_path / "one"), metrics(tmp_path / "two")
    assert [(r["step"], r["split"]) for r in one] == [(r["step"], r["split"]) for r in two]
    for r1, r2 in zip(one, two):
        assert r2["loss"] == pytest.approx(r1["loss"], rel=1e-4, abs=1e-5)
    (m1, _), (m2, _) = checkpoint.load(tmp_path / "one"), checkpoint.load(tmp_path / "two")
    src, tgt = torch.randint(4, 20, (4, 7)), torch.randint(4, 20, (4, 6))
    torch.testing.assert_close(m1(src, tgt), m2(src, tgt), atol=1e-4, rtol=1e-4)

    half = [a if not a.startswith("--max-steps") else "--max-steps=4" for a in args]
    torchrun(str(parallel), "-o", str(tmp_path / "half"), *half, "--fsdp")
    torchrun("-o", str(tmp_path / "half"), "--resume", "--max-steps=8")
    a, b = weights(tmp_path / "two"), weights(tmp_path / "half")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- averaging ------------------------------------------------------------------------------------------------------


def test_average_checkpoints_is_the_elementwise_mean(tmp_path, parallel):
    run = tmp_path / "run"
    train(tiny_train_config(parallel, run, max_steps=6, valid_every=2, keep_last=3, valid_bleu=False))
    dirs = [run / "checkpoints" / f"step-{s:07d}" for s in (2, 4, 6)]
    out = average_checkpoints(run, 3, tmp_path / "avg")
    avg = load_file(str(out / "model.safetensors"))
    parts = [load_file(str(d / "model.safetensors")) for d in dirs]
    for k in avg:
        torch.testing.assert_close(avg[k], sum(p[k] for p in parts) / 3)
    model, meta = checkpoint.load(out)  # a working checkpoint, without trainer state
    assert meta["averaged_from"] == [str(d) for d in dirs]
    assert not (out / "trainer_state.json").exists()
    with pytest.raises(TfcliError, match="already exists"):
        average_checkpoints(run, 3, tmp_path / "avg")
    with pytest.raises(CheckpointError, match="there are 3"):
        average_checkpoints(run, 5, tmp_path / "avg5")
    # the command: the last K of a run, into RUN/checkpoints/avg-lastK by default
    from typer.testing import CliRunner

    from tfcli.cli import app

    result = CliRunner().invoke(app, ["average-checkpoints", str(run), "--last", "2"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(run / "checkpoints" / "avg-last2")
    avg2 = load_file(str(run / "checkpoints" / "avg-last2" / "model.safetensors"))
    for k in avg2:
        torch.testing.assert_close(avg2[k], (parts[1][k] + parts[2][k]) / 2)
    result = CliRunner().invoke(app, ["average-checkpoints", str(run), "--last", "2"])
    assert result.exit_code == 1 and "already exists" in result.stderr


# --- the command line -----------------------------------------------------------------------------------------------


def test_cli_errors_are_one_line_and_nothing_is_written(tmp_path, mono):
    from typer.testing import CliRunner

    from tfcli.cli import app

    (tmp_path / "bad.yaml").write_text("train:\n  max_tokenz: 10\n")
    cases = {
        "train.max_tokenz: unknown config key (did you mean 'max_tokens'?)": ["--config", str(tmp_path / "bad.yaml")],
        "holds monolingual (language-model) data, but --arch toy": ["--arch", "toy"],
        "d_model (32) must be divisible by n_head (5)": ["--arch", "lm-toy", "--set", "model.n_head=5"],
    }
    for message, args in cases.items():
        result = CliRunner().invoke(app, ["train", str(mono), "-o", str(tmp_path / "run"), *args])
        assert result.exit_code == 1
        assert result.stderr.startswith("error: ") and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert message in result.stderr
    assert not (tmp_path / "run").exists()


# --- a wall-clock budget ---------------------------------------------------------------------------------------------


class FakeClock:
    """time.perf_counter for the trainer: each training step takes `step_s` seconds, each validation 5."""

    def __init__(self, monkeypatch, step_s):
        import tfcli.train.trainer as trainer_module

        self.t, self.step_s = 1000.0, step_s
        monkeypatch.setattr(trainer_module.time, "perf_counter", lambda: self.t)
        step, validate = trainer_module.Trainer._step, trainer_module.Trainer.validate

        def timed_step(trainer, *a):
            self.t += self.step_s(trainer.step + 1)
            return step(trainer, *a)

        def timed_validate(trainer):
            self.t += 5.0
            return validate(trainer)

        monkeypatch.setattr(trainer_module.Trainer, "_step", timed_step)
        monkeypatch.setattr(trainer_module.Trainer, "validate", timed_validate)


BUDGET = dict(max_steps=0, max_minutes=1.0, warmup=10, schedule="cosine", valid_every=20, log_every=5,
              valid_bleu=False, keep_last=5)


def test_time_budget_plans_the_steps_that_fit_and_max_steps_repeats_the_run(tmp_path, parallel, monkeypatch):
    """1 s per step, 5 s per validation, 60 s: at the end of warmup (step 10, validated there: 15 s spent) the plan
    leaves room for the last validation and one every 20 steps: 32 more steps fit, 30 are planned (a multiple of
    10), so 40 in all, and training ends at 55 s with the cosine schedule at its floor."""
    clock = FakeClock(monkeypatch, lambda step: 1.0)
    result = train(tiny_train_config(parallel, tmp_path / "budget", **BUDGET))
    assert result.step == 40 and not result.interrupted
    assert clock.t - 1000.0 == 55.0
    valid = [r["step"] for r in metrics(tmp_path / "budget") if r["split"] == "valid"]
    assert valid == [10, 20, 40]
    assert "max_steps: 40" in (tmp_path / "budget" / "config.yaml").read_text()
    assert checkpoint.load(tmp_path / "budget")[1]["train"]["max_steps"] == 40
    lrs = {r["step"]: r["lr"] for r in metrics(tmp_path / "budget") if r["split"] == "train"}
    assert lrs[40] == pytest.approx(0.0, abs=1e-12)  # the cosine ends at the planned step
    monkeypatch.undo()
    # the planned count, given as max_steps without a budget, repeats the run exactly
    plain = tiny_train_config(parallel, tmp_path / "plain", **{**BUDGET, "max_minutes": 0.0, "max_steps": 40})
    train(plain)
    a, b = weights(tmp_path / "budget"), weights(tmp_path / "plain")
    assert all(torch.equal(a[k], b[k]) for k in a)


def _resume_cut_back(run: Path, part: Path, last: int, back_to: int, minutes: float):
    """A copy of a finished budgeted run as if killed after step `back_to` (its last checkpoint, `last`, gone),
    resumed as the recipes do: the config that started it, max_steps 0."""
    shutil.copytree(run, part)
    ckpts = part / "checkpoints"
    shutil.rmtree(ckpts / f"step-{last:07d}")
    for name in ("LATEST", "BEST"):
        (ckpts / name).write_text(f"step-{back_to:07d}\n")
    config = part.parent / "budget.yaml"
    config.write_text(f"train:\n  max_steps: 0\n  max_minutes: {minutes}\n")
    return run_cli_config(config, {"out": str(part), "resume": True})


def test_resuming_a_time_budgeted_run_keeps_its_planned_steps(tmp_path, parallel, monkeypatch, capsys):
    """A budgeted run killed after planning, resumed as the recipes do (the same config file, max_steps: 0), ends
    at the planned step with the weights of the uninterrupted run: the plan is not thrown away."""
    FakeClock(monkeypatch, lambda step: 1.0)
    train(tiny_train_config(parallel, tmp_path / "full", **BUDGET))
    capsys.readouterr()
    result = _resume_cut_back(tmp_path / "full", tmp_path / "part", last=40, back_to=20, minutes=1.0)
    assert result.step == 40
    a, b = weights(tmp_path / "full"), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    lrs = lambda run: [(r["step"], r["lr"]) for r in metrics(run) if r["split"] == "train"]  # noqa: E731
    assert lrs(tmp_path / "full") == lrs(tmp_path / "part")
    assert "40 steps planned for the time budget" in capsys.readouterr().err


def _lrs(run) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in metrics(run) if r["split"] == "train"}


def test_anchored_cosine_continues_from_where_the_run_was():
    """learning_rate with an anchor (a, lr_a): lr_a at a, then the same cosine from where it gives lr_a, stretched
    to reach min_lr at the new total: an end that did not move gives the plain schedule, one twice as far away
    takes two steps for each of the plain schedule's; it never exceeds lr_a."""
    args = ("cosine", 1e-3, 10)
    at_20 = learning_rate(20, *args, 40, 1e-5)
    assert learning_rate(20, *args, 40, 1e-5, anchor=(20, at_20)) == at_20
    for s in range(21, 41):  # the end unchanged: the plain cosine
        assert learning_rate(s, *args, 40, 1e-5, anchor=(20, at_20)) == pytest.approx(learning_rate(s, *args, 40, 1e-5))
    for k in range(21):  # the end moved from 40 to 60: 2 steps for each
        assert learning_rate(20 + 2 * k, *args, 60, 1e-5, anchor=(20, at_20)) == pytest.approx(
            learning_rate(20 + k, *args, 40, 1e-5))
    lrs = [learning_rate(s, *args, 100, 1e-5, anchor=(20, at_20)) for s in range(20, 101)]
    assert lrs[0] == at_20 and lrs[-1] == pytest.approx(1e-5)
    assert all(b <= a for a, b in zip(lrs, lrs[1:]))
    assert at_20 - lrs[1] < at_20 - learning_rate(21, *args, 40, 1e-5)  # stretched: a slower decay, no jump
    assert learning_rate(20, *args, 20, 0.0, anchor=(20, 5e-4)) == 5e-4  # the end at the anchor: flat
    assert learning_rate(50, "inverse_sqrt", 1e-3, 10, 100, anchor=(20, 5e-4)) == learning_rate(50, "inverse_sqrt",
                                                                                               1e-3, 10, 100)


def test_extending_a_cosine_run_on_resume_never_raises_the_learning_rate(tmp_path, parallel, capsys):
    """A 20-step cosine run resumed with --max-steps 40: the learning rate goes on down from where it was (the
    schedule is not recomputed over 40 steps, which would jump back up), reaches min_lr at 40, and a second
    extension continues the same way."""
    cfg = dict(max_steps=20, warmup=5, schedule="cosine", log_every=1, valid_every=10, valid_bleu=False,
               min_lr=1e-5)
    train(tiny_train_config(parallel, tmp_path / "run", **cfg))
    capsys.readouterr()
    result = run_cli_config(None, {"out": str(tmp_path / "run"), "resume": True, "max_steps": 40})
    assert result.step == 40
    assert "the cosine continues from lr" in capsys.readouterr().err
    lrs = _lrs(tmp_path / "run")
    tail = [lrs[s] for s in range(20, 41)]
    assert all(b <= a for a, b in zip(tail, tail[1:])), tail
    assert tail[-1] == pytest.approx(1e-5) and tail[1] == pytest.approx(tail[0], rel=0.05)
    run_cli_config(None, {"out": str(tmp_path / "run"), "resume": True, "max_steps": 50})
    lrs = _lrs(tmp_path / "run")
    assert max(lrs[s] for s in range(41, 51)) <= lrs[40]
    # resuming an interrupted run without moving its end replays the uninterrupted schedule exactly
    train(tiny_train_config(parallel, tmp_path / "full", **{**cfg, "max_steps": 40}))
    train(tiny_train_config(parallel, tmp_path / "part", **{**cfg, "max_steps": 40, "valid_every": 10}))
    assert _lrs(tmp_path / "full") == _lrs(tmp_path / "part")


def test_resume_with_max_steps_replaces_an_old_time_budget(tmp_path, parallel, monkeypatch, capsys):
    """The reported case: a budgeted run (planned 40 steps, its budget spent) resumed with --max-steps 60 trains to
    step 60; the old budget does not stop it at once, and the learning rate does not jump back up."""
    FakeClock(monkeypatch, lambda step: 1.0)
    train(tiny_train_config(parallel, tmp_path / "run", **{**BUDGET, "min_lr": 1e-5}))
    capsys.readouterr()
    result = run_cli_config(None, {"out": str(tmp_path / "run"), "resume": True, "max_steps": 60})
    assert result.step == 60
    assert "time budget" not in capsys.readouterr().err
    lrs = _lrs(tmp_path / "run")
    assert max(lrs[s] for s in lrs if s > 40) <= lrs[40] * (1 + 1e-9)
    saved = checkpoint.load(tmp_path / "run")[1]["train"]
    assert saved["max_steps"] == 60 and saved["max_minutes"] == 0


def test_resume_with_a_new_time_budget_plans_again(tmp_path, parallel, monkeypatch, capsys):
    """--max-minutes on resume is the whole run's budget (time already spent included): the step count is planned
    again from the speed measured after resuming, and the learning rate goes on down from where it was. A budget
    that is already spent is refused, naming the time spent."""
    FakeClock(monkeypatch, lambda step: 1.0)
    train(tiny_train_config(parallel, tmp_path / "run", **{**BUDGET, "min_lr": 1e-5}))  # 40 steps in 55 s
    with pytest.raises(ConfigError, match=r"trained 0\.9 minutes already.*whole run"):
        run_cli_config(None, {"out": str(tmp_path / "run"), "resume": True, "max_minutes": 0.5})
    capsys.readouterr()
    result = run_cli_config(None, {"out": str(tmp_path / "run"), "resume": True, "max_minutes": 2.0})
    err = capsys.readouterr().err
    assert "steps planned again after resuming" in err and "time budget 2 min:" in err
    assert 60 < result.step <= 100  # 65 s more at ~1.25 s per step with validations
    lrs = _lrs(tmp_path / "run")
    assert max(lrs[s] for s in lrs if s > 40) <= lrs[40] * (1 + 1e-9)


def test_a_run_that_is_mostly_warmup_is_warned_about(tmp_path, parallel, capsys):
    train(tiny_train_config(parallel, tmp_path / "run", max_steps=12, warmup=10, valid_every=12, valid_bleu=False))
    err = capsys.readouterr().err
    assert "warning: the run has 12 steps, of which warmup takes 10 (83%)" in err and "lower --warmup" in err
    train(tiny_train_config(parallel, tmp_path / "ok", max_steps=30, warmup=10, valid_every=30, valid_bleu=False))
    assert "warms up" not in capsys.readouterr().err


def test_time_budget_stops_a_run_that_slows_down(tmp_path, parallel, monkeypatch, capsys):
    """Planned at 1 s per step, the machine slows to 3 s per step after the validation at step 20, the last chance
    to plan again: the run stops when the budget is spent (step 30, at 60 s), validated and saved, short of the
    planned 40."""
    FakeClock(monkeypatch, lambda step: 1.0 if step <= 20 else 3.0)
    result = train(tiny_train_config(parallel, tmp_path / "run", **BUDGET))
    assert not result.interrupted and result.step == 30
    assert "time budget of 1 minutes reached at step 30 of 40 planned" in capsys.readouterr().err
    assert (tmp_path / "run" / "checkpoints" / "LATEST").read_text().strip() == f"step-{result.step:07d}"


def test_time_budget_ends_at_a_validation_that_leaves_no_room_for_ten_more_steps(tmp_path, parallel, monkeypatch,
                                                                                 capsys):
    """A validation every 10 steps; 1 s per step, then 2 s from step 21: planned for 30 at step 10, 40 at step 20
    (the speed held, and the first plan's rounding down to tens left 10 steps' time), and at step 30 the 2 s
    measured leave 5 s, under 10 steps: the run ends there, validated (55 s), instead of starting steps the budget
    cuts off."""
    clock = FakeClock(monkeypatch, lambda step: 1.0 if step <= 20 else 2.0)
    result = train(tiny_train_config(parallel, tmp_path / "run", **{**BUDGET, "valid_every": 10}))
    err = capsys.readouterr().err
    assert result.step == 30 and clock.t - 1000.0 == 55.0
    assert "30 steps planned" in err and "40 steps planned again at step 20" in err
    assert "no room for 10 more steps at 2.000 s per step since step 20: the run ends at step 30 (of 40" in err
    assert "minutes reached" not in err
    assert [r["step"] for r in metrics(tmp_path / "run") if r["split"] == "valid"] == [10, 20, 30]


def test_time_budget_is_planned_again_when_the_speed_changes(tmp_path, parallel, monkeypatch, capsys):
    """2 minutes, 1 s per step until step 20, then 2 s: planned at step 10 for 90 steps (1.25 s a step with
    validations), kept at step 20 (the speed held), planned again at step 40 from the speed measured since that
    plan (50 s for 30 steps: 1.667 s; 45 s left after the last validation, 1.917 s a step: 23, so 20 more: 60).
    The cosine goes on from step 40's learning rate along
    its own shape to its floor at step 60, where the run ends on its budget (120 s) instead of being cut short; a
    run resumed from the checkpoint of step 40 ends as the uninterrupted one, bit for bit."""
    clock = FakeClock(monkeypatch, lambda step: 1.0 if step <= 20 else 2.0)
    cfg = {**BUDGET, "max_minutes": 2.0, "min_lr": 1e-5}
    result = train(tiny_train_config(parallel, tmp_path / "run", **cfg))
    err = capsys.readouterr().err
    assert result.step == 60 and clock.t - 1000.0 == 120.0
    assert "90 steps planned" in err and "60 steps planned again at step 40 (was 90; 1.667 s per step since step 10)" in err
    assert err.count("planned again") == 1
    lrs = _lrs(tmp_path / "run")
    anchor = (40, lrs[40])
    assert lrs[40] == pytest.approx(learning_rate(40, "cosine", 3e-3, 10, 90, 1e-5))  # the first plan's, up to 40
    for s in range(45, 61, 5):
        assert lrs[s] == pytest.approx(learning_rate(s, "cosine", 3e-3, 10, 60, 1e-5, anchor=anchor))
    assert lrs[60] == pytest.approx(1e-5)
    assert checkpoint.load(tmp_path / "run")[1]["train"]["max_steps"] == 60
    # resumed from step 40 (the plan of 60 kept in its checkpoint), on the same clock
    assert _resume_cut_back(tmp_path / "run", tmp_path / "part", last=60, back_to=40, minutes=2.0).step == 60
    a, b = weights(tmp_path / "run"), weights(tmp_path / "part")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _lrs(tmp_path / "part") == lrs


def test_time_budget_measures_the_step_time_after_the_first_steps(tmp_path, parallel, monkeypatch):
    """The first 5 steps take 3 s (one-time costs), then 1 s: the plan uses the second half of warmup (steps 6-10,
    1 s each). At step 10, validated there, 25 s are spent; 30 s are left after the last validation, room for 24
    steps at 1.25 s (a validation every 20): 20 are planned, 30 in all, and training ends at 55 s."""
    clock = FakeClock(monkeypatch, lambda step: 3.0 if step <= 5 else 1.0)
    result = train(tiny_train_config(parallel, tmp_path / "run", **BUDGET))
    assert result.step == 30 and clock.t - 1000.0 == 55.0
    assert [r["step"] for r in metrics(tmp_path / "run") if r["split"] == "valid"] == [10, 20, 30]


def test_time_budget_needs_a_warmup_to_measure(tmp_path, parallel):
    with pytest.raises(ConfigError, match="max_minutes.*warmup to at least 10"):
        tiny_train_config(parallel, tmp_path / "run", **{**BUDGET, "warmup": 5}).validate()
    tiny_train_config(parallel, tmp_path / "run", **{**BUDGET, "warmup": 5, "max_steps": 50}).validate()


def test_profile_records_the_steps_asked_for_and_changes_nothing(tmp_path, parallel):
    """--profile A-B: RUN/profile/ops.txt (the op table) and trace.json (a Chrome trace of those steps); the run's
    losses and weights are the unprofiled run's, bit for bit."""
    plain = train(tiny_train_config(parallel, tmp_path / "plain", max_steps=6, log_every=2, valid_every=6))
    profiled = train(tiny_train_config(parallel, tmp_path / "prof", max_steps=6, log_every=2, valid_every=6,
                                       profile="3-4"))
    ops = (tmp_path / "prof" / "profile" / "ops.txt").read_text()
    assert ops.startswith("steps 3-4, sorted by self_cpu_time_total") and "aten::" in ops
    trace = json.loads((tmp_path / "prof" / "profile" / "trace.json").read_text())
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    assert not (tmp_path / "plain" / "profile").exists()
    losses = [[r["loss"] for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
              for d in (tmp_path / "plain", tmp_path / "prof")]
    assert losses[0] == losses[1]
    a, b = (load_file(str(r.checkpoint / "model.safetensors")) for r in (plain, profiled))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("spec", ["0-2", "5-3", "x", "3-"])
def test_profile_steps_are_checked(tmp_path, spec):
    with pytest.raises(ConfigError, match="train.profile"):
        tiny_train_config(tmp_path, tmp_path / "run", profile=spec).validate()


@pytest.mark.parametrize("reuse", [False, True])
def test_the_loss_and_its_gradient_compile(reuse):
    """torch.compile (AOTAutograd, as `--compile` runs it, without a C++ compiler: aot_eager) of the closed-form loss,
    also when its backward writes over the logits: the eager loss and gradients, one graph."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(70, 16, generator=g), torch.randn(16, 50, generator=g)
    target = torch.randint(4, 50, (70,), generator=g)
    target[::7] = PAD_ID

    def loss_of(h, w):
        return label_smoothed_loss(h @ w, target, 0.1, reuse_logits=reuse)[0]

    grads = []
    torch._dynamo.reset()
    counters.clear()
    for f in (loss_of, torch.compile(loss_of, backend="aot_eager")):
        a, b = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        loss = f(a, b)
        loss.backward()
        grads.append((loss.detach(), a.grad, b.grad))
    for want, got in zip(*grads):
        torch.testing.assert_close(got, want)
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_label_smoothed_loss_takes_a_minus_infinity_logit():
    """A banned token's logit at -inf (its probability 0) leaves the nll and its gradient finite."""
    logits = torch.randn(3, 7)
    logits[:, 0] = float("-inf")
    target = torch.tensor([1, 2, 3])
    a = logits.clone().requires_grad_(True)
    loss, nll = label_smoothed_loss(a, target, 0.0)
    loss.backward()
    b = logits.clone().requires_grad_(True)
    F.cross_entropy(b, target, reduction="sum").backward()
    torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))
    torch.testing.assert_close(a.grad, b.grad)


@pytest.mark.parametrize("kind", ["parallel", "mono"])
def test_shape_buckets_pad_batches_to_few_shapes_without_changing_the_loss(parallel, mono, kind):
    """pad_multiple 8: every batch is (rows for its length) x (a multiple of 8, or max_len); the real token counts,
    the loss and its gradient are those of the unpadded batch (added rows and positions are padding targets)."""
    from tfcli.train.loss import Objective, batch_loss

    torch.manual_seed(0)
    if kind == "parallel":
        prep = PreparedData(parallel)
        plain = ParallelData(prep, "train", 30, max_tokens=100, max_sentences=0, seed=3)
        padded = ParallelData(prep, "train", 30, max_tokens=100, max_sentences=0, seed=3, pad_multiple=8)
        V = prep.vocab_size("tgt")
        model = build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V, d_model=32, d_ff=64, dropout=0.0))
    else:
        prep = PreparedData(mono)
        plain = StreamData(prep, "valid", 13, max_tokens=64, max_sentences=0, seed=1)
        padded = StreamData(prep, "valid", 13, max_tokens=64, max_sentences=0, seed=1, pad_multiple=8)
        model = build_model(preset("lm-toy", tgt_vocab_size=prep.vocab_size("tgt"), d_model=32, d_ff=64, dropout=0.0))
    objective = Objective(model, 0.1)
    shapes = set()
    batches = padded.batches(0, shuffle=kind == "parallel")
    assert [b.tolist() for b in batches] == [b.tolist() for b in padded.batches(0, shuffle=kind == "parallel")]
    for idx in batches[:6] + batches[-2:]:
        a, b = padded.collate(idx), plain.collate(idx)
        shapes.add(tuple(a.targets.shape))
        length = a.targets.size(1)
        assert length % 8 == 0 or length == (30 if kind == "parallel" else 13)
        if a.src is not None:
            assert a.src.shape == a.inputs.shape == a.targets.shape
            assert a.targets.size(0) == 100 // length
        else:
            assert a.targets.size(0) == padded.batch_size
        assert (a.src_tokens, a.tgt_tokens) == (b.src_tokens, b.tgt_tokens) and a.slots >= b.slots
        assert (a.targets[b.targets.size(0):] == PAD_ID).all()
        for batch in (a, b):
            model.zero_grad()
            loss, nll = batch_loss(objective, batch)
            loss.backward()
            batch.result = (loss.detach(), nll, [p.grad.clone() for p in model.parameters() if p.grad is not None])
        torch.testing.assert_close(a.result[0], b.result[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.result[1], b.result[1], rtol=1e-5, atol=1e-5)
        for x, y in zip(a.result[2], b.result[2]):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
    assert len(shapes) <= 4


def test_compiled_training_builds_one_graph_per_bucket_and_none_after_the_first_epoch(tmp_path, parallel, monkeypatch):
    """--compile: batches in shape buckets and static graphs, so every graph is built in the first epoch, at most one
    per bucket, and the second epoch compiles nothing (a counting backend in place of Inductor: the same graphs);
    --compile-shapes dynamic: buckets share symbolic graphs, so fewer are built, also all in the first epoch."""
    from tfcli.train import data as data_module

    epoch = [None]
    batches = data_module.ParallelData.batches

    def tracking(self, e, shuffle=True):
        if shuffle:
            epoch[0] = e
        return batches(self, e, shuffle)

    compiled_in = {"static": [], "dynamic": []}
    shapes = [None]

    def counting(gm, example_inputs):
        compiled_in[shapes[0]].append(epoch[0])
        return gm.forward

    real_compile = torch.compile
    monkeypatch.setattr(data_module.ParallelData, "batches", tracking)
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=counting, **kw))
    for shapes[0] in compiled_in:
        torch._dynamo.reset()
        try:
            train(tiny_train_config(parallel, tmp_path / shapes[0], max_steps=0, max_epochs=2, max_tokens=120,
                                    valid_every=10_000, valid_bleu=False, compile=True, max_len=30,
                                    pad_multiple=2, compile_shapes=shapes[0]))  # many buckets
        finally:
            torch._dynamo.reset()
    static, dynamic = compiled_in["static"], compiled_in["dynamic"]
    assert static and set(static) == {0} and len(static) <= 30 // 2 + 1
    assert dynamic and set(dynamic) == {0} and len(dynamic) < len(static)
    log = (tmp_path / "static" / "train.log").read_text()
    assert "padding" in log or "pad" in log


def test_without_a_terminal_training_says_it_is_alive_between_log_lines(tmp_path, capsys, monkeypatch):
    """`make demo`, a log file, a pipe: no progress bar, so a short `step N/T` line comes whenever no other line
    has for PROGRESS_EVERY_S (10 s; 0 here: after every step)."""
    from helpers import make_parallel_prepared, tiny_train_config
    from tfcli.train import log
    from tfcli.train.trainer import train

    monkeypatch.setattr(log, "PROGRESS_EVERY_S", 0.0)
    data = make_parallel_prepared(tmp_path / "prep", n_train=50)
    train(tiny_train_config(data, tmp_path / "run", max_steps=3, valid_every=3, log_every=100, valid_bleu=False))
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("step ") and "|" not in line] == ["step 1/3", "step 2/3", "step 3/3"]
