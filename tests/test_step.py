"""generate/step.py: the incremental decoder computes what the model's full forward computes, whatever the beams'
reordering, sentences leaving, norm placement, activation, positions, and packed or plain weights."""

from pathlib import Path

import pytest
import torch

from tfcli.generate.runtime import pack_linear_weights
from tfcli.generate.step import IncrementalDecoder, free_memory
from tfcli.model import BOS_ID, PAD_ID, build_model, preset

V = 40


def model_for(packed=False, **overrides):
    torch.manual_seed(0)
    cfg = preset("tiny", src_vocab_size=V, tgt_vocab_size=V, d_model=32, n_head=4, **overrides)
    model = build_model(cfg).eval()
    if packed and not pack_linear_weights(model):
        pytest.skip("oneDNN is not available in this torch build")
    return model


def full_logits(model, src_row: torch.Tensor, prefix: list[int]) -> torch.Tensor:
    """Next-token logits after <s> + prefix for one source sentence: the plain full forward, no cache."""
    tgt = torch.tensor([[BOS_ID, *prefix]])
    return model(src_row[None], tgt)[0, -1]


@pytest.mark.parametrize(
    "overrides",
    [dict(norm="pre"), dict(norm="post"), dict(activation="gelu", positions="learned"), dict(packed=True),
     dict(packed=True, norm="post", activation="gelu")],
)
def test_beams_reordered_and_sentences_leaving_match_the_full_forward(overrides):
    model = model_for(**overrides)
    K, steps = 3, 6
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 4:] = PAD_ID  # a padded source
    with torch.inference_mode():
        dec = IncrementalDecoder(model, *model.encode(src), beam_size=K, max_steps=steps)
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
        with pytest.raises(RuntimeError, match="decoded past"):
            dec.step(tok)
        dec.release()


def test_greedy_rows_and_memory_reuse():
    """beam_size 1 is greedy decoding; a second decoder reuses the released key/value memory and still matches."""
    model = model_for(packed=True)
    src = torch.randint(4, V, (2, 5))
    with torch.inference_mode():
        for _ in range(2):
            dec = IncrementalDecoder(model, *model.encode(src), beam_size=1, max_steps=4)
            tok, prefix = torch.full((2,), BOS_ID), [[], []]
            for _t in range(4):
                logits = dec.step(tok)
                for r in range(2):
                    torch.testing.assert_close(logits[r], full_logits(model, src[r], prefix[r]), atol=1e-4, rtol=1e-4)
                tok = logits.argmax(-1)
                prefix = [p + [w] for p, w in zip(prefix, tok.tolist())]
            dec.release()
        assert "_decode_workspace" in model.__dict__
        free_memory(model)
        assert "_decode_workspace" not in model.__dict__


def test_bf16_autocast_runs_close_to_fp32():
    model = model_for()
    src = torch.randint(4, V, (2, 5))
    with torch.inference_mode():
        ref = IncrementalDecoder(model, *model.encode(src), beam_size=2, max_steps=2).step(torch.full((2,), BOS_ID))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dec = IncrementalDecoder(model, *model.encode(src), beam_size=2, max_steps=2)
            out = dec.step(torch.full((2,), BOS_ID))
    torch.testing.assert_close(out.float(), ref, atol=0.1, rtol=0.05)


HEAP_PROBE = """
import ctypes, ctypes.util, sys
from tfcli.generate.runtime import keep_freed_memory
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
print(before, ok, in_heap(libc.malloc(4 << 20)))
"""


def test_freed_memory_is_kept_on_glibc():
    """keep_freed_memory's effect, seen in a process of its own: a 4 MiB block, which glibc serves with a fresh
    mmap by default (and unmaps on free), comes from the reusable heap afterwards."""
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc" or not Path("/proc/self/maps").exists():
        pytest.skip("mallopt tuning is for glibc on Linux")
    res = subprocess.run([sys.executable, "-c", HEAP_PROBE], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", "True", "True"]
