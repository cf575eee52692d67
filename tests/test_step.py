"""generate/step.py, the one incremental decoding path: it computes what the model's full forward computes, whatever
the beams' reordering, rows leaving, norm placement, activation, positions, left-padded prompts, and packed or plain
weights."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tfcli.device import int8_available, onednn_available
from tfcli.generate.step import StaticDecoder, StepModel
from tfcli.model.config import preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID
from tfcli.model.transformer import build_model

V = 40


def model_for(packed=False, static=False, **overrides):
    """A random encoder-decoder and its StepModel (packed: weights pre-packed for oneDNN; static: fixed-shape steps,
    StaticDecoder)."""
    if packed and not onednn_available():
        pytest.skip("oneDNN is not available in this torch build")
    torch.manual_seed(0)
    cfg = preset("toy", src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_head=4, **overrides)
    model = build_model(cfg).eval()
    return model, StepModel(model, pack=packed, static=static)


def start(sm, src, beam_size, steps):
    return sm.start(src.size(0), beam_size, steps, *sm.encode(src))


def full_logits(model, src_row: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """Next-token logits after <s> + prefix for one source sentence: the plain full forward, no cache."""
    tgt = torch.tensor([[BOS_ID, *prefix]])
    return model(src_row[None], tgt)[0, -1]


@pytest.mark.parametrize(
    "overrides",
    [dict(norm="pre"), dict(norm="post"), dict(activation="gelu", positions="learned"), dict(packed=True),
     dict(packed=True, norm="post", activation="gelu"), dict(rms_norm=True, activation="swiglu"),
     dict(activation="geglu", norm="post"), dict(packed=True, rms_norm=True, activation="relu2"),
     dict(packed=True, activation="swiglu"), dict(qk_norm=True), dict(packed=True, qk_norm=True, rms_norm=True),
     dict(n_kv_head=2), dict(packed=True, n_kv_head=1, qk_norm=True, norm="post"), dict(static=True),
     dict(static=True, norm="post", n_kv_head=2, positions="learned"), dict(static=True, packed=True, qk_norm=True),
     dict(packed=True, activation="silu", norm="post"), dict(activation="silu", static=True)],
)
def test_beams_reordered_and_sentences_leaving_match_the_full_forward(overrides):
    model, sm = model_for(**overrides)
    K, steps = 3, 6
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 4:] = PAD_ID  # a padded source
    with torch.inference_mode():
        dec = start(sm, src, K, steps)
        alive = [0, 1, 2]
        prefixes = {s: [[]] for s in alive}  # per live sentence, its beams' tokens so far
        tok = torch.full((3,), BOS_ID)
        for t in range(steps):
            logits = dec.step(tok)
            k = len(prefixes[alive[0]])
            assert logits.shape == (len(alive) * k, V)
            for s_i, s in enumerate(alive):
                for j, prefix in enumerate(prefixes[s]):
                    ref = full_logits(model, src[s], prefix)
                    torch.testing.assert_close(logits[s_i * k + j], ref, atol=1e-4, rtol=1e-4)
            # the next beams: random parents within each sentence (beams may die or be copied), random tokens
            keep = None
            if t == 2:  # sentence 1 leaves the batch
                keep = torch.tensor([0, 2])
                alive = [0, 2]
            parent = torch.randint(0, k, (len(alive), K), generator=g)
            new_tok = torch.randint(4, V, (len(alive), K), generator=g)
            for s_i, s in enumerate(alive):
                prefixes[s] = [prefixes[s][p] + [w] for p, w in zip(parent[s_i].tolist(), new_tok[s_i].tolist())]
            dec.select(keep, parent)
            tok = new_tok.flatten()
        if not dec.fixed:  # (a fixed-shape decoder's caller keeps its rows within max_steps: see the next test)
            with pytest.raises(RuntimeError, match="decoded past"):
                dec.step(tok)
        dec.release()


@pytest.mark.parametrize("overrides", [dict(), dict(norm="post", n_kv_head=2, positions="learned"),
                                       dict(packed=True, qk_norm=True, activation="swiglu")])
def test_a_sentence_admitted_into_a_finished_ones_place_matches_the_full_forward(overrides):
    """Continuous batching: StaticDecoder.admit puts new sentences (another source, padded to the batch's width) in
    the places of finished ones at any step; each starts at position 0 with nothing in its history, its steps wrap
    round the ring of key/value slots past max_steps, and it gets the full forward's logits, beams reordered."""
    model, sm = model_for(static=True, **overrides)
    K, M = 2, 5
    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, V, (6, 6), generator=g)
    src[1, 3:] = PAD_ID
    src[4, 2:] = PAD_ID
    with torch.inference_mode():
        memory, mask = sm.encode(src[:3])
        dec = sm.start(3, K, M, memory, mask)
        held = [0, 1, 2]  # the sentence in each place
        beams = {s: [[]] for s in held}
        tok = torch.full((3,), BOS_ID)
        joins = {2: ([1], [3]), 4: ([0, 2], [4, 5]), 7: ([1], [0])}  # after step t: places <- sentences
        for t in range(10):  # steps 5 to 9 go round the ring of M slots
            k = len(beams[held[0]])
            assert all(len(beams[s][0]) < M for s in held)  # each within its M positions
            logits = dec.step(tok)
            assert logits.shape == (3 * k, V)
            for p, s in enumerate(held):
                for j, prefix in enumerate(beams[s]):
                    torch.testing.assert_close(logits[p * k + j], full_logits(model, src[s], prefix),
                                               atol=1e-4, rtol=1e-4)
            parent = torch.randint(0, k, (3, K), generator=g)
            new_tok = torch.randint(4, V, (3, K), generator=g)
            for p, s in enumerate(held):
                beams[s] = [beams[s][a] + [w] for a, w in zip(parent[p].tolist(), new_tok[p].tolist())]
            dec.select(None, parent)
            if t in joins:
                places, sentences = joins[t]
                dec.admit(torch.tensor(places), *sm.encode(src[sentences]))
                for p, s in zip(places, sentences):
                    held[p] = s
                    beams[s] = [[] for _ in range(K)]  # every beam of a new sentence starts from <s>
                    new_tok[p] = BOS_ID
            tok = new_tok.flatten()
        dec.release()


def test_greedy_rows_and_memory_reuse():
    """beam_size 1 is greedy decoding; a second decoder reuses the released key/value memory and still matches."""
    model, sm = model_for(packed=True)
    src = torch.randint(4, V, (2, 5))
    with torch.inference_mode():
        for _ in range(2):
            dec = start(sm, src, 1, 4)
            tok, prefix = torch.full((2,), BOS_ID), [[], []]
            for _t in range(4):
                logits = dec.step(tok)
                for r in range(2):
                    torch.testing.assert_close(logits[r], full_logits(model, src[r], prefix[r]), atol=1e-4, rtol=1e-4)
                tok = logits.argmax(-1)
                prefix = [p + [w] for p, w in zip(prefix, tok.tolist())]
            dec.release()
            kept = sm._workspace
            assert kept is not None
        sm.free_memory()
        assert sm._workspace is None


def test_bf16_autocast_runs_close_to_fp32():
    model, sm = model_for()
    src = torch.randint(4, V, (2, 5))
    with torch.inference_mode():
        ref = start(sm, src, 2, 2).step(torch.full((2,), BOS_ID))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = start(sm, src, 2, 2).step(torch.full((2,), BOS_ID))
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.05)


def test_packed_and_plain_weights_give_the_same_logits_and_leave_the_model_as_it_was():
    """The oneDNN path and its plain F.linear fallback compute the same thing; packing copies the weights beside the
    model, whose parameters stay the same tensors with the same values."""
    model, plain = model_for(norm="post")
    before = {k: (v, v.clone()) for k, v in model.state_dict(keep_vars=True).items()}
    packed = StepModel(model, pack=True)
    if packed.plan.encoder != "packed":
        pytest.skip("oneDNN is not available in this torch build")
    src = torch.randint(4, V, (3, 6))
    with torch.inference_mode():
        a, b = start(plain, src, 2, 3), start(packed, src, 2, 3)
        tok = torch.full((3,), BOS_ID)
        for _ in range(3):
            la, lb = a.step(tok), b.step(tok)
            torch.testing.assert_close(lb, la, atol=1e-4, rtol=1e-4)
            a.select(None, torch.zeros(3, 2, dtype=torch.long))
            b.select(None, torch.zeros(3, 2, dtype=torch.long))
            tok = la.argmax(-1).view(3, -1)[:, :1].expand(3, 2).flatten()
    after = model.state_dict(keep_vars=True)
    assert after.keys() == before.keys()
    assert all(after[k] is t and torch.equal(t, saved) for k, (t, saved) in before.items())
    assert all(isinstance(p, torch.nn.Parameter) for p in model.parameters())



@pytest.mark.parametrize("mode", ["packed", "int8"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("modern", [False, True])
def test_packed_and_int8_encoders_match_the_models_own(mode, norm, modern):
    """StepModel.encode runs the encoder through its own (packed or int8) linear layers: the same output as the
    model's encoder at real source positions, padding masked the same way (int8 within its rounding). `modern`:
    RMSNorm, QK-norm, grouped-query attention and a SwiGLU FFN."""

    if mode == "int8" and not int8_available():
        pytest.skip("this torch build has no quantised int8 linear layers")
    activation = "swiglu" if modern else "gelu" if mode == "packed" else "relu"
    model, _ = model_for(packed=mode == "packed", norm=norm, activation=activation, rms_norm=modern, qk_norm=modern,
                          n_kv_head=2 if modern else None)
    sm = StepModel(model, pack=mode == "packed", int8=mode == "int8")
    assert sm.encoder_layers is not None
    src = torch.randint(4, V, (3, 7), generator=torch.Generator().manual_seed(2))
    src[1, 4:] = PAD_ID
    src[2, 2:] = PAD_ID
    with torch.inference_mode():
        out, mask = sm.encode(src)
        ref, ref_mask = model.encode(src)
    assert torch.equal(mask, ref_mask)
    real = src != PAD_ID
    if mode == "packed":
        torch.testing.assert_close(out[real], ref[real], atol=1e-4, rtol=1e-4)
    else:
        err = (out[real] - ref[real]).abs().max()
        assert 0 < err <= 0.05 * ref[real].abs().max()


@pytest.mark.parametrize("mode", ["packed", "int8"])
def test_the_encoder_and_the_source_keys_run_on_real_tokens_only_with_the_same_bits(mode, monkeypatch):
    """The encoder's linear layers and norms, and the decoder's cross-attention keys and values, run on the real
    tokens' rows only (padding removed, as CTranslate2 does); the encoder output at real tokens and every step's
    logits are the same bit for bit as with the padding computed."""
    from tfcli.generate import step

    if mode == "int8" and not int8_available():
        pytest.skip("this torch build has no quantised int8 linear layers")
    model, _ = model_for(packed=mode == "packed", n_kv_head=2)
    sm = StepModel(model, pack=mode == "packed", int8=mode == "int8")
    src = torch.randint(4, V, (3, 7), generator=torch.Generator().manual_seed(3))
    src[1, 4:] = PAD_ID
    src[2, 2:] = PAD_ID
    real = src != PAD_ID
    rows = []
    for layer in (sm.encoder_layers[0], sm.layers[0]):
        for name in ("qkv", "cross_kv"):
            if hasattr(layer, name) and (layer is sm.layers[0]) == (name == "cross_kv"):
                f = getattr(layer, name)
                monkeypatch.setattr(layer, name, lambda x, *a, f=f: rows.append(x.size(0)) or f(x, *a))

    def run():
        with torch.inference_mode():
            out, _ = sm.encode(src)
            dec = start(sm, src, 2, 3)
            tok, logits = torch.full((3,), BOS_ID), []
            for t in range(3):
                logits.append(dec.step(tok))
                dec.select(None, torch.tensor([[0, 0]] * 3) if t == 0 else torch.tensor([[1, 0]] * 3))
                tok = torch.arange(5, 11)
        return out[real], logits

    out, logits = run()
    assert rows == [int(real.sum())] * 3  # the encoder's first layer (encode twice) and the source's keys
    monkeypatch.setattr(step, "_real_rows", lambda mask: None)
    rows.clear()
    padded_out, padded_logits = run()
    assert rows == [src.numel()] * 3
    assert torch.equal(out, padded_out)
    assert all(torch.equal(a, b) for a, b in zip(logits, padded_logits))


# --- language models: prompts of different lengths, left-padded ---------------------------------------------------


def lm_for(static=False, **overrides):
    torch.manual_seed(0)
    model = build_model(preset("lm-toy", tgt_vocab_size=V, d_model=32, n_head=4, **overrides)).eval()
    return model, StepModel(model, static=static)


@pytest.mark.parametrize("overrides", [dict(positions="learned"), dict(positions="sinusoidal"),
                                       dict(positions="rope"), dict(positions="rope", norm="post"),
                                       dict(positions="rope", rms_norm=True, activation="swiglu"),
                                       dict(activation="relu2", rms_norm=True, norm="post"),
                                       dict(positions="rope", qk_norm=True), dict(positions="rope", n_kv_head=2),
                                       dict(n_kv_head=1), dict(static=True, positions="rope"),
                                       dict(static=True, positions="learned", n_kv_head=2)])
def test_lm_prefill_of_left_padded_prompts_then_steps_match_the_full_forward(overrides):
    """Prompts of 3, 7 and 5 tokens in one batch, padded on the left: after the prefill and after each step, every
    row's logits are those of the full forward over that row's own tokens, without padding. A row then leaves."""
    model, sm = lm_for(**overrides)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, V, (n,), generator=g).tolist() for n in (3, 7, 5)]
    T = max(map(len, prompts))
    ids = torch.tensor([[PAD_ID] * (T - len(p)) + p for p in prompts])
    with torch.inference_mode():
        dec = sm.start(3, 1, T + 4)
        logits = dec.prefill(ids, ids != PAD_ID)
        rows = [0, 1, 2]
        for t in range(4):
            for r_i, r in enumerate(rows):
                full = model(torch.tensor([prompts[r]]))[0, -1]
                torch.testing.assert_close(logits[r_i], full, atol=1e-4, rtol=1e-4)
            nxt = torch.randint(4, V, (len(rows),), generator=g)
            for r_i, r in enumerate(rows):
                prompts[r] = prompts[r] + [int(nxt[r_i])]
            if t == 1:  # the longest prompt's row leaves
                dec.select(torch.tensor([0, 2]))
                rows, nxt = [0, 2], nxt[[0, 2]]
            if t < 3:
                logits = dec.step(nxt)
        dec.release()


@pytest.mark.parametrize("overrides", [dict(positions="rope"), dict(positions="learned", n_kv_head=2),
                                       dict(positions="rope", qk_norm=True, norm="post")])
def test_lm_prompts_admitted_into_places_match_the_full_forward(overrides):
    """StaticDecoder.admit_prompts prefills new prompts (left-padded) into finished rows' places at any step: the
    keys/values land in the ring slots before the step's, wrapping past max_steps, and every row's logits after the
    prefill and after each step are the full forward's over its own tokens."""
    model, sm = lm_for(static=True, **overrides)
    g = torch.Generator().manual_seed(5)
    M = 9
    texts = [torch.randint(4, V, (n,), generator=g).tolist() for n in (3, 4, 2)]
    T = max(map(len, texts))
    with torch.inference_mode():
        dec = sm.start(3, 1, M)
        ids = torch.tensor([[PAD_ID] * (T - len(p)) + p for p in texts])
        logits = dec.prefill(ids, ids != PAD_ID)
        held = list(texts)
        joins = {2: [0], 4: [1, 2], 5: [0], 7: [1, 2]}  # after step t: these places take new prompts (6, 4 tokens)
        for t in range(9):  # 4 + 9 positions: round the ring of 9 slots
            for r in range(3):
                full = model(torch.tensor([held[r]]))[0, -1]
                torch.testing.assert_close(logits[r], full, atol=1e-4, rtol=1e-4)
                assert len(held[r]) < M  # each within its positions
            nxt = torch.randint(4, V, (3,), generator=g)
            held = [h + [int(x)] for h, x in zip(held, nxt.tolist())]
            logits = dec.step(nxt)
            if t in joins:
                places = joins[t]
                new = [torch.randint(4, V, (n,), generator=g).tolist() for n in (6, 4)[: len(places)]]
                width = max(map(len, new))
                ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in new])
                logits = logits.clone()
                logits[places] = dec.admit_prompts(torch.tensor(places), ids, ids != PAD_ID)
                for r, p in zip(places, new):
                    held[r] = p
        dec.release()


def test_lm_prefill_without_padding_is_the_full_forward():
    model, sm = lm_for(positions="learned")
    ids = torch.randint(4, V, (2, 6))
    with torch.inference_mode():
        got = sm.start(2, 1, 6).prefill(ids)
        torch.testing.assert_close(got, model(ids)[:, -1], atol=1e-4, rtol=1e-4)


HEAP_PROBE = """
import ctypes, ctypes.util, sys
from tfcli.runtime import keep_freed_memory
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p

def in_heap(ptr):  # is the block in the brk heap ([heap]), not a separate mmap?
    for line in open("/proc/self/maps"):
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= ptr < hi:
            return line.rstrip().endswith("[heap]")
    return False

before = in_heap(libc.malloc(4 << 20))
ok = keep_freed_memory()
big = in_heap(libc.malloc(64 << 20))  # a training step's logits: 2,000 tokens x 8,000 words of fp32
takes_1gib = libc.mallopt(-3, 1 << 30) == 1  # M_MMAP_THRESHOLD: does this glibc take a 1 GiB threshold?
print(before, ok, in_heap(libc.malloc(4 << 20)), big == takes_1gib)
"""


def test_freed_memory_is_kept_on_glibc():
    """keep_freed_memory's effect, seen in a process of its own: a 4 MiB block, which glibc serves with a fresh
    mmap by default (and unmaps on free), comes from the reusable heap afterwards; so does a 64 MiB one wherever
    glibc takes the 1 GiB threshold."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc" or not Path("/proc/self/maps").exists():
        pytest.skip("mallopt tuning is for glibc on Linux")
    res = subprocess.run([sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True", "True", "True"]


@pytest.mark.parametrize("activation", ["relu", "gelu"])  # (GELU by rows.c where its kernels run)
def test_int8_steps_stay_close_to_the_full_forward(activation):
    if not int8_available():
        pytest.skip("this torch build has no quantised int8 linear layers")
    model, _ = model_for(activation=activation)
    sm = StepModel(model, int8=True)
    src = torch.randint(4, V, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        dec = start(sm, src, 1, 3)
        logits = dec.step(torch.full((2,), BOS_ID))
        ref = torch.stack([full_logits(model, src[i], []) for i in range(2)])
    assert (logits - ref).abs().max() <= 0.05 * ref.abs().max()


def test_the_fixed_shape_step_is_one_graph_per_batch_shape():
    """StaticDecoder's step (what a GPU captures as a CUDA graph) traces into one graph without a break (a read of
    the position on the host would split it), the same graph at every position and for every batch of the same
    shape, and gives the eager step's logits. The `eager` backend: only the capture is under test."""
    from torch._dynamo.utils import counters

    model, sm = model_for(static=True)
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(StaticDecoder._static_step, fullgraph=True, backend="eager", dynamic=False)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for _batch in range(3):  # three batches of one shape: (4 sentences, 6 source tokens, 5 steps, 3 beams)
            src = torch.randint(4, V, (4, 6), generator=g)
            compiled, eager = start(sm, src, 3, 5), start(StepModel(model, static=True), src, 3, 5)
            compiled._static_step = lambda d=compiled: step(d)
            tok = torch.full((4,), BOS_ID)
            for t in range(5):
                got, want = compiled.step(tok), eager.step(tok)
                torch.testing.assert_close(got, want)
                nxt = torch.randint(4, V, (4, 3), generator=g)
                parent = torch.randint(0, 1 if t == 0 else 3, (4, 3), generator=g)
                compiled.select(None, parent)
                eager.select(None, parent)
                tok = nxt.flatten()
            compiled.release()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]
    torch._dynamo.reset()


def test_fixed_shape_steps_under_autocast_match_the_shrinking_ones():
    """Validation during bf16 training decodes the fp32 model under autocast: the fixed-shape decoder writes bf16 keys
    and values into the cache that keeps the weights' dtype, as the shrinking decoder does."""
    model, static = model_for(static=True)
    eager = StepModel(model, static=False)
    g = torch.Generator().manual_seed(2)
    src = torch.randint(4, V, (3, 7), generator=g)
    toks = torch.randint(4, V, (5, 3), generator=g)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        a, b = start(static, src, 1, 6), start(eager, src, 1, 6)
        for tok in [torch.full((3,), BOS_ID), *toks]:
            torch.testing.assert_close(a.step(tok).float(), b.step(tok).float(), atol=3e-2, rtol=3e-2)
            a.select(None, torch.zeros(3, 1, dtype=torch.long))
            b.select(None, torch.zeros(3, 1, dtype=torch.long))
        a.release()
        b.release()


# --- the decoder's fp32 linear layers on rows.c's kernel (tfcli.generate.native) ---------------------------------

def row_kernel(version="linear_rows_avx2"):
    """tfcli.generate.native, where rows.c's `version` runs on this CPU (linear_rows: AVX-512; linear_rows_avx2)."""
    from tfcli.generate import native

    lib = native.library()
    if lib is None or lib.linear_rows_supported() < (2 if version == "linear_rows" else 1):
        pytest.skip(f"rows.c's {version} does not run here (no C compiler, or the CPU lacks its instructions)")
    return native


@pytest.mark.parametrize("version", ["linear_rows", "linear_rows_avx2"])
@pytest.mark.parametrize("n_in, n_out, bias", [(256, 100, True), (37, 64, False), (64, 33, True), (96, 200, True)])
def test_the_row_kernel_is_a_linear_layer_whose_rows_do_not_depend_on_each_other(n_in, n_out, bias, version,
                                                                                monkeypatch):
    """RowLinear computes x W^T + b (+ residual, then ReLU), and a row's result is the same bit for bit whatever the
    number of rows (1 to 41: every mix of each version's row tiles)."""
    native = row_kernel(version)
    monkeypatch.setattr(native, "fp32_kernel", lambda: getattr(native.library(), version))
    torch.manual_seed(1)
    lin = torch.nn.Linear(n_in, n_out, bias=bias)
    x, res = torch.randn(41, n_in), torch.randn(n_out, 41).T  # a strided residual
    with torch.inference_mode():
        for relu, r in ((False, None), (True, res)):
            f = native.RowLinear(lin, relu=relu)
            want = lin(x) if r is None else lin(x) + r
            full = f(x, r) if r is not None else f(x)
            torch.testing.assert_close(full, want.relu() if relu else want, atol=1e-5, rtol=1e-5)
            for m in range(1, 41):
                part = f(x[:m], r[:m]) if r is not None else f(x[:m])
                assert torch.equal(part, full[:m]), m
        assert f(x[:0]).shape == (0, n_out)


@pytest.mark.parametrize("n_out, n_in", [(100, 256), (64, 37), (33, 64), (8300, 9), (130, 1031)])
def test_the_row_kernels_weights_are_w_in_column_blocks_zero_past_its_outputs(n_out, n_in, monkeypatch):
    """RowLinear's copy of W (rows.c's pack_blocks): block b holds W[32b + c, k] at [b, k, c], zero from row N on
    to the padded width; more blocks than one packing call takes (8300 outputs), K not a multiple of 8."""
    native = row_kernel("linear_rows_avx2")
    monkeypatch.setattr(native, "fp32_kernel", lambda: native.library().linear_rows_avx2)
    monkeypatch.setattr(native, "_PACK_BLOCKS", 100)
    lin = torch.nn.Linear(n_in, n_out)
    w = lin.weight.detach()
    blocks = -(-n_out // native.PAD) * native.PAD // native.NB
    want = torch.zeros(blocks * native.NB, n_in)
    want[:n_out] = w
    got = native.RowLinear(lin).wt
    assert torch.equal(got, want.view(blocks, native.NB, n_in).transpose(1, 2))


@pytest.mark.parametrize("version", ["linear_rows", "linear_rows_avx2"])
@pytest.mark.parametrize("norm_input", [True, False])
def test_the_row_kernel_norms_its_input_or_its_output_rows_in_the_same_call(norm_input, version, monkeypatch):
    """RowLinear with a LayerNorm: W LN(x) + b (a pre-norm sublayer's first layer) or LN(x W^T + b + residual) (a
    post-norm sublayer's last), close to torch's, and a row's result the same bit for bit at any row count."""
    native = row_kernel(version)
    monkeypatch.setattr(native, "fp32_kernel", lambda: getattr(native.library(), version))
    torch.manual_seed(3)
    lin, x, res = torch.nn.Linear(40, 72), torch.randn(29, 40) * 3 + 1, torch.randn(29, 72)
    norm = torch.nn.LayerNorm(40 if norm_input else 72)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)
    f = native.RowLinear(lin, norm=norm, norm_input=norm_input)
    with torch.inference_mode():
        want = lin(norm(x)) if norm_input else norm(lin(x) + res)
        full = f(x) if norm_input else f(x, res)
        torch.testing.assert_close(full, want, atol=1e-5, rtol=1e-5)
        for m in range(1, 29):
            assert torch.equal(f(x[:m]) if norm_input else f(x[:m], res[:m]), full[:m]), m
    with pytest.raises(ValueError, match="cannot norm"):
        native.RowLinear(lin, norm=torch.nn.LayerNorm(72), norm_input=True)


def test_the_row_kernels_avx512_and_avx2_versions_give_the_same_bits(monkeypatch):
    """Each output is the same chain of fused multiply-adds in both versions, so a model decodes the same on an
    AVX-512 CPU and on an AVX2 one."""
    native = row_kernel("linear_rows")
    torch.manual_seed(2)
    lin = torch.nn.Linear(72, 130)
    x, res = torch.randn(23, 72), torch.randn(23, 130)
    outs = []
    with torch.inference_mode():
        for version in ("linear_rows", "linear_rows_avx2"):
            monkeypatch.setattr(native, "fp32_kernel", lambda: getattr(native.library(), version))
            outs.append([native.RowLinear(lin)(x[:m]) for m in (1, 5, 23)] + [native.RowLinear(lin, relu=True)(x, res)])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # (torch's, on switching oneDNN off and on)
@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_the_row_kernels_gelu_and_silu_are_torchs_vectorised_kernels_bit_for_bit(act):
    """rows.c's GELU and SiLU (native.activate_, what a row-kernel layer applies, decode_layers too) give the bits of
    ATen's AVX2 and AVX-512 kernels (torch's own: F.gelu runs oneDNN's unless oneDNN is off) over many magnitudes,
    float bit patterns across the whole range, and the edges (+-0, +-inf, NaN, denormals, exp's cut-offs); close to
    the exact function in float64; and a value's result is the same wherever it sits in a tensor of any length."""
    native = row_kernel()
    f = {"gelu": F.gelu, "silu": F.silu}[act]
    torch.manual_seed(5)
    edges = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1e-38, -1e-38, 9.2, -9.2, 15.0, -15.0, 87.5,
             -87.5, 89.0, -89.0, 104.0, -104.0, 150.0, -150.0, 3e38, -3e38]
    x = torch.cat([torch.randn(1 << 16) * s for s in (0.01, 1.0, 4.0, 30.0)]
                  + [torch.arange(-2**31, 2**31, 2**31 // 2**15, dtype=torch.int64).to(torch.int32).view(torch.float32),
                     torch.tensor(edges + [0.0] * (64 - len(edges)))])
    got = native.activate_(x.clone(), act)
    finite = torch.isfinite(x) & (x.abs() < 1e30)
    want64 = f(x[finite].double())
    torch.testing.assert_close(got[finite].double(), want64, atol=1e-6, rtol=1e-6)
    for n in (1, 7, 8, 37, 100):  # a tail of its own, at any offset
        for at in (0, 3, 77):
            assert torch.equal(native.activate_(x[at:at + n].clone(), act), got[at:at + n])
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return  # (torch's generic build computes another erf)
    with torch.backends.mkldnn.flags(enabled=False):  # blocks of 4096: torch's vector loop, one thread, no scalar tail
        want = torch.cat([f(x[i:i + 4096]) for i in range(0, x.numel(), 4096)])
    assert ((got.view(torch.int32) == want.view(torch.int32)) | (got.isnan() & want.isnan())).all()


def test_the_row_kernel_follows_torchs_cpu_capability(monkeypatch):
    native = row_kernel()
    lib = native.library()
    want = {"AVX512": lib.linear_rows if lib.linear_rows_supported() == 2 else lib.linear_rows_avx2,
            "AVX2": lib.linear_rows_avx2, "DEFAULT": None}
    for capability, kernel in want.items():
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        assert native.fp32_kernel() == kernel, capability


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_decoder_steps_on_the_row_kernel_and_on_onednn_match_the_full_forward(norm, monkeypatch):
    """With the row kernel the decoder's layers and the output layer run on it (the encoder stays on oneDNN);
    without it (no compiler) all run on oneDNN. Either way a step's logits are the model's full forward's."""
    from tfcli.generate import native

    model, _ = model_for(packed=True, norm=norm)
    available = native.fp32_kernel() is not None
    sms = [StepModel(model, pack=True)]
    monkeypatch.setattr(native, "fp32_kernel", lambda: None)
    sms.append(StepModel(model, pack=True))
    assert (sms[0].plan.linear == "rows") == available and sms[1].plan.linear == "packed"
    assert isinstance(sms[0].lm_head, native.RowLinear) == available
    assert not isinstance(sms[1].lm_head, native.RowLinear)
    src = torch.randint(4, V, (2, 7))
    prefix = [5, 9, 11]
    with torch.inference_mode():
        for sm in sms:
            dec = start(sm, src, 1, 4)
            tok = torch.full((2,), BOS_ID)
            for i in range(len(prefix) + 1):
                logits = dec.step(tok)
                for row in range(2):
                    torch.testing.assert_close(logits[row], full_logits(model, src[row], prefix[:i]), atol=1e-4,
                                               rtol=1e-4)
                if i < len(prefix):
                    tok = torch.full((2,), prefix[i])


@pytest.mark.parametrize("dh", [8, 24, 32, 40, 72])
@pytest.mark.parametrize("layout", ["by slot", "transposed"])
def test_the_attention_kernel_is_softmax_attention_at_every_head_size_and_length(dh, layout):
    """rows.c's attend_rows against softmax attention in float64, for head sizes that fill its registers or not and
    slot counts around its blocks of 8 and 32, keys by slot (the decoder's own) or transposed (the source's), slots
    masked with -inf (what they hold never read); a row's output the same bits alone as in a batch of three."""
    from tfcli.generate import native
    from tfcli.generate.step import _attend_rows

    kernel = native.attention_kernel()
    if kernel is None:
        pytest.skip("no attention kernel here (no C compiler, no AVX2, or ATEN_CPU_CAPABILITY=default)")
    g = torch.Generator().manual_seed(dh)
    n, r, H_kv, G = 3, 2, 2, 2  # three rows of two queries; two key/value heads, each shared by two query heads
    for L in (1, 7, 8, 9, 31, 33, 40):
        q = torch.randn(n, r, H_kv * G, dh, generator=g)
        keys, values = torch.randn(n, H_kv, L, dh, generator=g), torch.randn(n, H_kv, L, dh, generator=g)
        bias = torch.zeros(n, H_kv, r, L)
        bias[1, :, :, L // 2 + 1:] = float("-inf")  # a padded row
        bias[2, 0, 1, ::3] = float("-inf") if L > 1 else 0.0  # slots one query of one head does not see
        k = keys.contiguous() if layout == "by slot" else keys.transpose(2, 3).contiguous()
        k_strides = (k.stride(0), k.stride(1), *((k.stride(2), 1) if layout == "by slot" else (1, k.stride(2))))

        def attend(rows, k=k, values=values):
            kr, vr, br = k[rows].contiguous(), values[rows].contiguous(), bias[rows].contiguous()
            strides = (kr.stride(0), kr.stride(1), *k_strides[2:])
            return _attend_rows(kernel, q[rows].contiguous(), kr, strides, vr, vr.stride()[:3], br, br.stride()[:3],
                                H_kv, L, dh**-0.5)

        y = attend(slice(None))
        # the padded row's masked slots are never read: their values in both layouts, their keys by slot
        unread_k, unread_v = k.clone(), values.clone()
        unread_v[1, :, L // 2 + 1:] = float("nan")
        if layout == "by slot":
            unread_k[1, :, L // 2 + 1:] = float("nan")
        assert torch.equal(attend(slice(None), unread_k, unread_v), y)
        qh = q.double().view(n, r, H_kv, G, dh)
        scores = torch.einsum("nrhgd,nhsd->nhgrs", qh, keys.double()) * dh**-0.5 + bias.double()[:, :, None]
        ref = torch.einsum("nhgrs,nhsd->nrhgd", scores.softmax(-1), values.double()).reshape(n * r, -1)
        torch.testing.assert_close(y.double(), ref, atol=1e-5, rtol=1e-5)
        for i in range(n):
            assert torch.equal(attend(slice(i, i + 1)), y[i * r : (i + 1) * r])


@pytest.mark.parametrize("overrides", [dict(), dict(n_kv_head=2), dict(qk_norm=True, norm="post")])
def test_the_attention_kernel_gives_a_sentence_the_same_bits_alone_and_beside_longer_ones(overrides, monkeypatch):
    """rows.c's attend_rows, in the encoder and in the decoder's steps: a sentence's encoder output and step logits
    are the same bit for bit alone and in a batch with longer sources (its own padded) and other beams, and close
    to torch's attention (the kernels off)."""
    from tfcli.generate import native

    if native.attention_kernel() is None:
        pytest.skip("no attention kernel here (no C compiler, no AVX2, or ATEN_CPU_CAPABILITY=default)")
    model, sm = model_for(packed=True, **overrides)
    assert sm.attend_rows is not None
    monkeypatch.setattr(native, "fp32_kernel", lambda: None)
    torch_sm = StepModel(model, pack=True)
    assert torch_sm.attend_rows is None
    short, wide = torch.randint(4, V, (1, 5)), torch.randint(4, V, (2, 9))
    short[0, -1] = wide[:, -1] = EOS_ID
    both = torch.cat([F.pad(short, (0, 4), value=PAD_ID), wide])
    with torch.inference_mode():
        alone, batch = sm.encode(short)[0], sm.encode(both)[0]
        assert torch.equal(alone[0], batch[0, :5])
        torch.testing.assert_close(alone, torch_sm.encode(short)[0], atol=1e-5, rtol=1e-5)
        runs = [start(sm, short, 2, 4), start(sm, both, 2, 4), start(torch_sm, short, 2, 4)]
        tok = {1: torch.full((1,), BOS_ID), 3: torch.full((3,), BOS_ID)}
        for t in range(3):
            alone, batch, ref = (dec.step(tok[dec.n]) for dec in runs)
            assert torch.equal(alone, batch[: alone.size(0)])
            torch.testing.assert_close(alone, ref, atol=1e-4, rtol=1e-4)
            for dec in runs:  # two beams a row from the first step on, the second following the first
                dec.select(None, torch.tensor([[0, 0]] * dec.n) if t == 0 else torch.tensor([[1, 0]] * dec.n))
            tok = {1: torch.tensor([5, 6]), 3: torch.tensor([5, 6, 7, 8, 9, 10])}


@pytest.mark.parametrize("kind, overrides", [
    ("seq2seq", dict(norm="pre")), ("seq2seq", dict(norm="post", n_kv_head=2)), ("seq2seq", dict(qk_norm=True)),
    ("seq2seq", dict(n_kv_head=1, qk_norm=True, norm="post")), ("lm", dict(activation="relu2", qk_norm=True)),
    ("lm", dict(activation="relu2", positions="sinusoidal", norm="post", n_kv_head=2)),
    ("lm", dict(activation="gelu", positions="learned")), ("seq2seq", dict(activation="silu", norm="post"))])
def test_a_steps_layers_in_one_c_call_are_its_kernels_one_call_at_a_time(kind, overrides):
    """rows.c's decode_layers runs what the step would run through RowLinear and attend_rows one call at a time, so
    the logits are the same bit for bit, through beams reordered, rows leaving and (language models) left-padded
    prompts; with QK-norm (its RMSNorm in C, torch's otherwise) close, and the same alone and in a batch."""
    from tfcli.generate import native

    if native.layers_kernel() is None:
        pytest.skip("no C kernels here (no C compiler, no AVX2, or ATEN_CPU_CAPABILITY=default)")
    if not onednn_available():
        pytest.skip("oneDNN is not available in this torch build")
    torch.manual_seed(0)
    vocab = dict(src_vocab_size=V, tgt_vocab_size=V) if kind == "seq2seq" else dict(tgt_vocab_size=V)
    model = build_model(preset("toy" if kind == "seq2seq" else "lm-toy", d_model=32, n_head=4, **vocab,
                               **overrides)).eval()
    fused, ops = StepModel(model, pack=True), StepModel(model, pack=True, allow=("rows", "c_attention"))
    assert fused.plan.whole and not ops.plan.whole
    exact = not overrides.get("qk_norm")
    g = torch.Generator().manual_seed(4)
    K = 2
    with torch.inference_mode():
        if kind == "seq2seq":
            src = torch.randint(4, V, (3, 6), generator=g)
            src[1, 3:] = PAD_ID
            decs = [start(sm, src, K, 6) for sm in (fused, ops)] + [start(fused, src[2:], K, 6)]
            logits = [dec.step(torch.full((dec.n,), BOS_ID)) for dec in decs]
        else:
            ids = torch.randint(4, V, (3, 5), generator=g)
            ids[0, :2] = PAD_ID
            decs = [sm.start(n, 1, 9) for sm, n in ((fused, 3), (ops, 3), (fused, 1))]
            logits = [dec.prefill(ids[-dec.n:], ids[-dec.n:] != PAD_ID) for dec in decs]
            K = 1
        for t in range(4):  # (the last row, alone in the third decoder, gets the same parents and tokens)
            a, b, alone = logits
            assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-4, rtol=1e-4)
            assert torch.equal(alone, a[-alone.size(0):])
            parent = torch.randint(0, K if t else 1, (3, K), generator=g)  # (at first one beam a row)
            for dec in decs:
                keep = torch.tensor([0, 2]) if t == 1 and dec.n == 3 else None
                dec.select(keep, parent[-(dec.n if keep is None else 2):] if K > 1 else None)
            tok = torch.randint(4, V, (decs[0].n * K,), generator=g)
            logits = [dec.step(tok[-dec.n * K:]) for dec in decs]
        for dec in decs:
            dec.release()


def test_the_c_structs_layout_is_held_to_ctypes_at_load(monkeypatch):
    """rows.c reports how its compiler laid out linear_t and layer_t; a library whose layout differs from
    LinearArgs/LayerArgs is not used (a warning, the torch path), since decode_layers would read wrong pointers."""
    import ctypes

    from tfcli.generate import native

    lib = native.library()
    if lib is None:
        pytest.skip("no C library here (no compiler)")
    assert native.layout_mismatch(lib) == ""

    class Wider(ctypes.Structure):
        _fields_ = [*native.LinearArgs._fields_, ("extra", ctypes.c_int64)]

    monkeypatch.setattr(native, "LinearArgs", Wider)
    assert native.layout_mismatch(lib).startswith("sizeof linear_t")
    with pytest.warns(UserWarning, match="laid out otherwise"):
        assert native.library.__wrapped__() is None


def test_best_next_refuses_in_c_what_its_buffers_cannot_hold():
    """best_next keeps the k best in a buffer of 64 and the banned logits in one of 8 (seven ids and </s>): called
    past them directly (not through native.best_next, which checks first) it returns -1 and writes nothing."""
    from tfcli.generate import native

    if native.fp32_kernel() is None:
        pytest.skip("no C kernels here (no C compiler, no AVX2, or ATEN_CPU_CAPABILITY=default)")
    lib = native.library()
    x = torch.randn(2, 300)
    for k, n_ban, status in ((64, 7, 0), (65, 0, -1), (0, 0, -1), (3, 8, -1)):
        ban = torch.arange(n_ban, dtype=torch.long)
        values, ids = torch.full((130,), 7.0), torch.full((130,), -5, dtype=torch.long)  # (R x k, row-major)
        before = x.clone()
        assert lib.best_next(x.data_ptr(), 2, 300, ban.data_ptr(), n_ban, None, 2, None, None, k, values.data_ptr(),
                             ids.data_ptr(), None) == status
        if status:
            assert torch.equal(x, before) and (values == 7.0).all() and (ids == -5).all()
        else:
            best = before.masked_fill(torch.arange(300) < n_ban, float("-inf")).topk(k).indices
            assert torch.equal(ids[: 2 * k].view(2, k), best)
        x = before
