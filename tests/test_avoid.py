"""Negative lexical constraints (`avoid=`): phrases a translation never holds, in beam search, greedy search and
sampling, per text, the same at any batch size and with fixed shapes (continuous batching)."""

from __future__ import annotations

import random

import pytest
import torch

import tfcli
from helpers import WORDS, holds, random_translator
from tfcli.errors import ConfigError
from helpers import beam_search, greedy_decode
from tfcli.generate.rules import avoid_tensor, avoided
from tfcli.generate.step import StepModel
from tfcli.specials import EOS_ID, PAD_ID


def test_the_banned_token_completes_a_phrase_the_output_ends_with():
    """avoided: for each beam, the last token of each phrase whose other tokens end its output so far; <pad>
    elsewhere, and for a phrase longer than the output."""
    av = avoid_tensor([[[5, 6, 7], [9]], [[4, 4]]], "cpu")
    assert av.tolist() == [[[5, 6, 7], [-1, -1, 9]], [[-1, 4, 4], [-1, -1, PAD_ID]]]
    tokens = torch.tensor([[8, 5, 6, 0], [5, 6, 0, 0], [4, 0, 0, 0], [4, 4, 0, 0]])  # 2 sentences x 2 beams
    at = torch.tensor([4, 3, 2, 3])  # the position each beam chooses now (its tokens before it)
    assert avoided(av, tokens, at, 2).tolist() == [[7, 9], [7, 9], [4, PAD_ID], [4, PAD_ID]]
    assert avoided(av[:1], tokens[:1], 2, 1).tolist() == [[PAD_ID, 9]]  # (an int position: "8" alone)
    assert avoid_tensor([[], []], "cpu") is None


def test_avoided_phrases_never_appear_and_the_rest_is_copied(copier):
    """The copier outputs its input; told to avoid a phrase of it, it outputs every other word and never that
    phrase, in beam search, greedy search and sampling (which word of a two-word phrase gives way is the search's
    choice); phrases not in the input change nothing; one list a text."""
    c = tfcli.load(copier)
    rng = random.Random(1)
    texts = [" ".join(rng.sample(WORDS, 8)) for _ in range(40)]
    avoid = []
    for t in texts:
        w = t.split()
        x = next(v for v in WORDS if v not in w)
        avoid.append([" ".join(w[2:4]), w[6], f"{x} {x}"])  # two words, one word, one never there
    for options in (dict(beam_size=4), dict(beam_size=1), dict(sampling=True, seed=2, topk=3)):
        got = c.translate(texts, avoid=avoid, **options)
        for t, g, phrases in zip(texts, got, avoid):
            assert not any(holds(g, p) for p in phrases), (t, g, phrases)
            kept = [w for i, w in enumerate(t.split()) if i not in (2, 3, 6)]
            assert [w for i, w in enumerate(g.split()) if i not in (2, 3, 6)] == kept
    assert c.translate(texts[:5], avoid=[["apple apple"]] * 5) == texts[:5]
    with pytest.raises(ConfigError, match="avoid: give one list of phrases a text"):
        c.translate(texts[:2], avoid=[["cat"]])


def test_avoiding_does_not_depend_on_the_batch(random_checkpoint):
    """A random model, told to avoid phrases of its own unconstrained outputs: none appears, and each text's
    translation is the same at batch 1, 7 and 64 and in reverse order."""
    t = tfcli.load(random_checkpoint)
    rng = random.Random(2)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(30)]
    free = t.translate(texts, max_len_a=1.0, max_len_b=3)
    avoid = [[" ".join(f.split()[1:3])] if len(f.split()) > 2 else [] for f in free]
    for beam in (1, 4):
        runs = [t.translate(texts, avoid=avoid, beam_size=beam, batch_size=b, max_len_a=1.0, max_len_b=3)
                for b in (64, 7, 1)]
        rev = t.translate(texts[::-1], avoid=avoid[::-1], beam_size=beam, max_len_a=1.0, max_len_b=3)[::-1]
        assert runs[0] == runs[1] == runs[2] == rev
        assert not any(holds(g, p) for g, ps in zip(runs[0], avoid) for p in ps)
        assert any(g != f for g, f in zip(runs[0], free))  # (the constraints bind)


def test_fixed_shape_decoding_avoids_as_the_shrinking_decoder_does():
    """StaticDecoder with sentences taking finished ones' places (3 places for 9 sentences): the phrases of each
    sentence follow it into its place, and the outputs are the shrinking decoder's."""
    model = random_translator(5)
    g = torch.Generator().manual_seed(4)
    src = torch.randint(4, model.cfg.src_vocab_size, (9, 6), generator=g)
    src[:, -1] = EOS_ID
    shrinking, static = StepModel(model), StepModel(model, static=True)
    free = [h.tokens for h in greedy_decode(shrinking, src, 1.0, 3)]
    av = avoid_tensor([[f[1:3]] if len(f) > 2 else [[4]] for f in free], "cpu")
    for search in (lambda sm, **kw: [h.tokens for h in greedy_decode(sm, src, 1.0, 3, avoid=av, **kw)],
                   lambda sm, **kw: [[h.tokens for h in hs] for hs in beam_search(sm, src, 3, 0.0, 1.0, 3, nbest=2,
                                                                                   avoid=av, **kw)]):
        assert search(static, slots=3) == search(shrinking)
    got = [h.tokens for h in greedy_decode(shrinking, src, 1.0, 3, avoid=av)]

    def contains(seq, phrase):
        return any(seq[i : i + len(phrase)] == phrase for i in range(len(seq)))

    assert got != free and not any(contains(o, f[1:3]) for f, o in zip(free, got) if len(f) > 2)


def test_avoid_file_and_jsonl_field(copier, tmp_path):
    """`--avoid FILE` (one line a line of the input, phrases tab-separated, an empty line: none) and the JSONL
    field "avoid" give each line its phrases; a file with another number of lines is one line of error and no
    output; so is an "avoid" that is not a list of strings."""
    import json
    import subprocess
    import sys

    from tfcli.errors import TfcliError
    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.translate import translate

    src, avoid, out = tmp_path / "in.txt", tmp_path / "avoid.txt", tmp_path / "out.txt"
    src.write_text("cat dog egg fish\ngoat hat ice\napple bird\n")
    avoid.write_text("dog egg\tfish\n\nbird\n")
    res = subprocess.run([sys.executable, "-m", "tfcli", "translate", "-m", str(copier), str(src), "-o", str(out),
                          "--avoid", str(avoid)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    got = out.read_text().splitlines()
    assert got[1] == "goat hat ice" and got[0].split()[:2] == ["cat", "dog"]
    assert not holds(got[0], "dog egg") and not holds(got[0], "fish") and not holds(got[2], "bird")
    avoid.write_text("dog egg\n")
    out.unlink()
    cfg = TranslateConfig(device="cpu")
    with pytest.raises(TfcliError, match=f"{avoid}: 1 lines for 3 input lines"):
        translate(str(copier), [str(src)], str(out), cfg, avoid_file=str(avoid))
    assert not out.exists()
    rows = [{"text": "cat dog egg fish", "avoid": ["dog egg"]}, {"text": "goat hat"}]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TranslateConfig(device="cpu", input_format="jsonl")
    assert translate(str(copier), [str(jsonl)], str(out), cfg) == 2
    first, second = out.read_text().splitlines()
    assert not holds(first, "dog egg") and first.split()[:2] == ["cat", "dog"] and second == "goat hat"
    jsonl.write_text(json.dumps({"text": "cat", "avoid": "dog"}) + "\n")
    out.unlink()
    with pytest.raises(TfcliError, match='field "avoid" must be a list of strings'):
        translate(str(copier), [str(jsonl)], str(out), cfg)
    assert not out.exists()
