"""Positive lexical constraints (`constraints=`, `--constraints`): phrases every translation must hold, by dynamic
beam allocation inside the one beam search. Checked against the slow reference constrained search, for every
phrase in every output, at any batch size and order, with fixed shapes and refilled places, beside prefixes,
phrases to avoid, ensembles and int8."""

from __future__ import annotations

import random

import pytest
import torch

import tfcli
from helpers import WORDS, holds, random_translator, save_model, save_word_tokenizer
from reference_search import reference_constrained_beam_search
from tfcli.errors import ConfigError, InputError
from tfcli.generate import native
from helpers import beam_search
from tfcli.generate.constraints import (
    UNMET_PENALTY, advanced, constraint_state, constraint_tensor, has_alternatives, has_waits, pick_by_banks, ready,
)
from tfcli.generate.step import StepModel
from tfcli.specials import EOS_ID, PAD_ID


def contains(seq: list[int], phrase: list[int]) -> bool:
    return any(seq[i : i + len(phrase)] == phrase for i in range(len(seq)))


def met(seq: list[int], con: list) -> bool:
    """A constraint (a phrase, or a list of alternatives) in `seq`."""
    return any(contains(seq, p) for p in con) if con and not isinstance(con[0], int) else contains(seq, con)


def test_a_phrase_advances_starts_again_and_stays_met():
    """constraint_tensor: each phrase its constraint's number, the one it waits for (-1: none), its length, then its
    tokens (a set of alternatives: one number for its forms; an empty phrase a constraint of its own); advanced: a
    phrase's progress."""
    con = constraint_tensor([[[5, 6, 7], [9]], [[4, 4]]], "cpu")
    assert con.tolist() == [[[0, -1, 3, 5, 6, 7], [1, -1, 1, 9, -1, -1]],
                            [[0, -1, 2, 4, 4, -1], [3, -1, 0, -1, -1, -1]]]
    assert constraint_tensor([[[[5], [6, 7]], [8]]], "cpu").tolist() == [
        [[0, -1, 1, 5, -1], [0, -1, 2, 6, 7], [1, -1, 1, 8, -1]]]
    prog = torch.tensor([[[1, 0]], [[1, 0]]])  # (2 sentences, 1 candidate, C = 2)
    assert advanced(con[:, None], prog, torch.tensor([[6], [4]])).tolist() == [[[2, 0]], [[2, 0]]]
    assert advanced(con[:, None], prog, torch.tensor([[5], [7]])).tolist() == [[[1, 0]], [[0, 0]]]  # again; lost
    done = torch.tensor([[[3, 1]], [[2, 0]]])
    assert advanced(con[:, None], done, torch.tensor([[8], [8]])).tolist() == [[[3, 1]], [[2, 0]]]  # met for good
    assert constraint_tensor([[], []], "cpu") is None


def test_a_constraint_given_twice_waits_for_its_first_time():
    """The same constraint twice in a row: the second copy waits for the first (column 1) and moves on only once
    it is met, so one occurrence meets one copy; an alternative set given twice waits as a set."""
    con = constraint_tensor([[[5, 6], [7], [5, 6]], [[[8], [9]], [[8], [9]]]], "cpu")
    assert con[0, :3, :2].tolist() == [[0, -1], [1, -1], [2, 0]] and con[1, :, :2].tolist() == [
        [0, -1], [0, -1], [1, 0], [1, 0]]
    assert has_waits(con) and not has_waits(constraint_tensor([[[5, 6], [7]]], "cpu"))
    prog = torch.zeros(1, 4, dtype=torch.long)  # (the row's fourth phrase: an empty one, met from the start)
    for tok, want in [(5, [1, 0, 0, 0]), (6, [2, 0, 0, 0]), (5, [2, 0, 1, 0]), (6, [2, 0, 2, 0])]:
        prog = advanced(con[:1], prog, torch.tensor([tok]), ready(con[:1], prog))
        assert prog.tolist() == [want]
    prog = torch.zeros(1, 4, dtype=torch.long)
    for tok, want in [(9, [0, 1, 0, 0]), (8, [1, 1, 1, 0])]:  # (the first set met by 9, then 8 meets the second)
        prog = advanced(con[1:], prog, torch.tensor([tok]), ready(con[1:], prog))
        assert prog.tolist() == [want]


def test_the_state_without_alternatives_is_the_general_one():
    """constraint_state's shortcut for rows of plain phrases (no (C, C) pairing of forms) gives exactly the general
    computation's values, at every progress; has_alternatives tells the two kinds of batch apart."""
    rng = random.Random(5)
    rows = [[[rng.randrange(4, 20) for _ in range(rng.randint(1, 4))] for _ in range(rng.randint(0, 4))]
            for _ in range(9)]
    con = constraint_tensor(rows, "cpu")
    assert not has_alternatives(con) and has_alternatives(constraint_tensor([[[[5], [6]]], [[7]]], "cpu"))
    lens = con[..., 2]
    for _ in range(20):
        prog = (torch.rand(con.shape[:2]) * (lens + 1)).long()
        general, plain = constraint_state(con, prog), constraint_state(con, prog, alternatives=False)
        assert all(torch.equal(general[k], plain[k]) for k in general)


def _sources(n: int, seed: int, V: int):
    rng = random.Random(seed)
    srcs = [[rng.randrange(4, V) for _ in range(rng.randint(2, 7))] + [EOS_ID] for _ in range(n)]
    def phrase():
        return [rng.randrange(4, V) for _ in range(rng.randint(1, 3))]

    # a constraint: a phrase, or one time in four a set of two alternatives; a row's constraint given twice one
    # time in three (the second copy waits for the first)
    cons = [[[phrase(), phrase()] if rng.random() < 0.25 else phrase() for _ in range(rng.randint(0, 3))]
            for _ in srcs]
    for row in cons:
        if row and rng.random() < 1 / 3:
            row.append(rng.choice(row))
    width = max(map(len, srcs))
    return srcs, cons, torch.tensor([s + [PAD_ID] * (width - len(s)) for s in srcs])


@pytest.mark.parametrize("seed", range(4))
def test_rows_c_picks_the_candidates_its_torch_form_picks(seed, monkeypatch):
    """pick_by_banks on the CPU (rows.c's constrained_pick) gives the same integers as its torch form, on random
    states: plain phrases, alternatives, a constraint given twice, empty places; candidates that end, score -inf,
    tie, or repeat a token."""
    if native.library() is None:
        pytest.skip("rows.c is not built here (no C compiler)")
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)

    def phrase():
        return [rng.randrange(4, 12) for _ in range(rng.randint(1, 3))]

    rows = []
    for _ in range(6):
        row = [phrase() if rng.random() < 0.7 else [phrase(), phrase()] for _ in range(rng.randint(0, 3))]
        rows.append(row + row[:1] if row and rng.random() < 0.5 else row)  # (given twice: the copy waits)
    con = constraint_tensor(rows, "cpu")
    n, C = con.shape[:2]
    k, K = 3, 3
    M = k * (2 * K + C)
    prog = (torch.rand(n * k, C, generator=g) * (con[:, None, :, 2].expand(n, k, C).reshape(n * k, C) + 1)).long()
    beam_con = con[:, None].expand(n, k, -1, -1).reshape(n * k, C, -1)
    alternatives = has_alternatives(con)
    open_ = constraint_state(beam_con, prog, alternatives)["open"]
    waits = ready(beam_con, prog) if has_waits(con) else None
    scores = torch.randn(n, M, generator=g).round(decimals=1).sort(1, descending=True).values  # (ties)
    scores[:, -3:] = float("-inf")
    tok = torch.randint(4, 12, (n, M), generator=g)
    tok[torch.rand(n, M, generator=g) < 0.1] = EOS_ID
    beam = torch.randint(0, k, (n, M), generator=g)
    args = (scores, tok, beam, con, prog, waits, open_, alternatives, K, k)
    fast = native.constrained_pick(scores, tok, beam, EOS_ID, con, prog, waits, open_, alternatives, K, k)
    assert fast is not None
    monkeypatch.setattr(native, "constrained_pick", lambda *a: None)
    slow = pick_by_banks(*args)
    for name, a, b in zip(("pick", "missing", "progress", "open", "fresh"), fast, slow):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("which", ["plain", "packed", "static"])
def test_the_batched_search_is_the_slow_reference(which):
    """Every sentence's 2-best with 0-3 constraints of 1-3 tokens each, in one batch (fixed shapes: 4 places for 12
    sentences), equal the reference's, one sentence at a time without a cache: the same tokens and scores (a
    hypothesis that misses a constraint at the length limit scores about -1e4: float32's precision there)."""
    model = random_translator(3).eval()
    srcs, cons, src = _sources(12, 0, model.cfg.tgt_vocab_size)
    sm = StepModel(model, pack=which == "packed", static=which == "static")
    slots = 4 if which == "static" else None
    hyps = beam_search(sm, src, 4, 0.6, 1.2, 10, nbest=2, token_scores=True, slots=slots,
                       constraints=constraint_tensor(cons, "cpu"))
    unmet = 0
    for s, c, h in zip(srcs, cons, hyps):
        ref = reference_constrained_beam_search(model, s, c, 4, 0.6, 1.2, 10, nbest=2)
        assert [x.tokens for x in h] == [x.tokens for x in ref]
        for x, r in zip(h, ref):
            assert x.score == pytest.approx(r.score, rel=1e-6, abs=1e-4)
            assert x.token_scores == pytest.approx(r.token_scores, abs=1e-4)
        assert all(met(h[0].tokens, con) for con in c)  # the best holds every constraint
        unmet += sum(x.score < -UNMET_PENALTY / 2 for x in h)
    assert unmet  # (the second best sometimes misses one: the reference's penalised hypotheses are matched too)


def test_every_constraint_appears_and_the_output_does_not_depend_on_the_batch(random_checkpoint):
    """300 texts, 1-3 phrases each (one to three words: one token a word here), drawn from the words the model does
    not output for them: every phrase in every output, at beam 4 and 1, and each text's output the same at batch
    64, 7 and 1 and in reverse order."""
    t = tfcli.load(random_checkpoint)
    rng = random.Random(5)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8))) for _ in range(300)]
    free = t.translate(texts, max_len_a=1.0, max_len_b=3)
    cons = []
    for f in free:
        unused = [w for w in WORDS if w not in f.split()]
        cons.append([" ".join(rng.sample(unused, rng.randint(1, 3))) for _ in range(rng.randint(1, 3))])
    opts = dict(max_len_a=1.0, max_len_b=3)
    for beam in (4, 1):
        got = t.translate(texts, constraints=cons, beam_size=beam, **opts)
        assert all(holds(g, p) for g, ps in zip(got, cons) for p in ps)
        if beam == 4:
            small = texts[:40]
            runs = [t.translate(small, constraints=cons[:40], beam_size=beam, batch_size=b, **opts) for b in (7, 1)]
            rev = t.translate(small[::-1], constraints=cons[:40][::-1], beam_size=beam, **opts)[::-1]
            assert runs[0] == runs[1] == rev == got[:40]
    assert t.translate(texts[:20], constraints=[[]] * 20, **opts) == t.translate(texts[:20], **opts)


def test_the_copier_keeps_its_input_and_adds_the_constraints(copier):
    """The copier outputs its input; told to hold words it was not given, it still outputs its input, with the
    constraints in it; constraints it already outputs change nothing."""
    c = tfcli.load(copier)
    rng = random.Random(3)
    texts = [" ".join(rng.sample(WORDS, 5)) for _ in range(30)]
    cons = [[next(w for w in WORDS if w not in t.split())] for t in texts]
    got = c.translate(texts, constraints=cons, beam_size=5)
    for t, g, (phrase,) in zip(texts, got, cons):
        assert holds(g, phrase) and [w for w in g.split() if w != phrase] == t.split()
    assert c.translate(texts, constraints=[[t.split()[1]] for t in texts]) == texts


def test_constraints_with_avoid_prefixes_ensembles_and_int8(random_checkpoint, tmp_path):
    """A text's constraints hold beside its phrases to avoid and its target prefix; an ensemble and int8 decode
    under constraints too."""
    from tfcli.device import int8_available

    t = tfcli.load(random_checkpoint)
    texts = ["cat dog bird", "tree egg fish goat", "hat ice"]
    cons = [["jam kite"], ["lamp"], ["cat", "dog"]]
    avoid = [["tree"], ["fish"], ["hat"]]
    got = t.translate(texts, constraints=cons, avoid=avoid, prefixes=["egg", "", "bird"], beam_size=4)
    for g, ps, qs, pre in zip(got, cons, avoid, ["egg", "", "bird"]):
        assert all(holds(g, p) for p in ps) and not any(holds(g, q) for q in qs) and g.startswith(pre)
    other = save_model(tmp_path / "other", random_translator(4), save_word_tokenizer(tmp_path / "tok", WORDS))
    both = tfcli.load([random_checkpoint, other])
    assert all(holds(g, p) for g, ps in zip(both.translate(texts, constraints=cons), cons) for p in ps)
    if int8_available():
        q = tfcli.load(random_checkpoint, dtype="int8")
        assert all(holds(g, p) for g, ps in zip(q.translate(texts, constraints=cons), cons) for p in ps)


def test_bad_constraints_are_one_line_and_nothing_is_written(copier, tmp_path):
    """--constraints FILE with the wrong line count, a phrase the vocabulary lacks, constraints longer than the
    model's outputs, a JSONL "constraints" that is not a list of strings: one line naming the file (and line),
    status 1, no output; sampling refuses them."""
    import json

    from tfcli.errors import TfcliError
    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.translate import translate

    src, cons, out = tmp_path / "in.txt", tmp_path / "cons.txt", tmp_path / "out.txt"
    src.write_text("cat dog\ngoat hat\n")
    cfg = TranslateConfig(device="cpu")
    cons.write_text("egg\n")
    with pytest.raises(TfcliError, match=f"{cons}: 1 lines for 2 input lines"):
        translate(str(copier), [str(src)], str(out), cfg, constraint_file=str(cons))
    cons.write_text("egg\tzebra\n\n")
    with pytest.raises(InputError, match=f"{src}:1: the phrase to hold 'zebra' has a piece"):
        translate(str(copier), [str(src)], str(out), cfg, constraint_file=str(cons))
    cons.write_text("\n" + " ".join(["egg"] * 40) + "\n")  # (the copier's max_len is 32)
    with pytest.raises(InputError, match=f"{src}:2: its constraints and prefix are 40 target tokens"):
        translate(str(copier), [str(src)], str(out), cfg, constraint_file=str(cons))
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(json.dumps({"text": "cat", "constraints": "dog"}) + "\n")
    with pytest.raises(TfcliError, match='field "constraints" must be a list of phrases'):
        translate(str(copier), [str(jsonl)], str(out), TranslateConfig(device="cpu", input_format="jsonl"))
    with pytest.raises(InputError, match="constraints need beam search, not --sampling"):
        tfcli.load(copier).translate(["cat"], constraints=[["dog"]], sampling=True)
    assert not out.exists()
    cons.write_text("egg\tfish\n\n")
    assert translate(str(copier), [str(src)], str(out), cfg, constraint_file=str(cons)) == 2
    first, second = out.read_text().splitlines()
    assert holds(first, "egg") and holds(first, "fish") and second == "goat hat"
    jsonl.write_text(json.dumps({"text": "cat dog", "constraints": ["egg"]}) + "\n")
    translate(str(copier), [str(jsonl)], str(out), TranslateConfig(device="cpu", input_format="jsonl"))
    assert holds(out.read_text().strip(), "egg")


def test_no_piece_continues_the_word_a_constraint_ends():
    """With `continuing` (the pieces that would continue a word: SentencePiece's without "▁"), the token after a
    constraint's last one is never such a piece, even where the model prefers one; without it, it may be."""
    model = random_translator(3).eval()
    srcs, cons, src = _sources(12, 1, model.cfg.tgt_vocab_size)
    cons = [[con for con in c if isinstance(con[0], int)] or [[5]] for c in cons]  # (phrases only, here)
    sm, tensor = StepModel(model), constraint_tensor(cons, "cpu")
    free = beam_search(sm, src, 4, 0.6, 1.2, 10, constraints=tensor)
    after = {t for h, c in zip(free, cons) for phrase in c for i in range(len(h[0].tokens) - len(phrase))
             if h[0].tokens[i : i + len(phrase)] == phrase for t in [h[0].tokens[i + len(phrase)]]}
    after -= {phrase[0] for c in cons for phrase in c}  # (a phrase starts a word: its first piece never continues)
    assert after  # (tokens do follow the constraints)
    continuing = torch.zeros(model.cfg.tgt_vocab_size, dtype=torch.bool)
    continuing[sorted(after)] = True
    got = beam_search(sm, src, 4, 0.6, 1.2, 10, constraints=tensor, continuing=continuing)
    for h, c in zip(got, cons):
        toks = h[0].tokens
        assert all(contains(toks, phrase) for phrase in c)
        for phrase in c:
            ends = [i + len(phrase) for i in range(len(toks) - len(phrase) + 1) if toks[i : i + len(phrase)] == phrase]
            first = ends[0]  # (where the phrase was met: later repeats of it are free)
            assert first == len(toks) or not continuing[toks[first]]


def test_the_translator_finds_the_pieces_that_continue_a_word(tmp_path):
    """SentencePiece-style vocabularies: pieces without "▁" that start with a letter, digit, hyphen or apostrophe;
    punctuation and specials do not; a word-level vocabulary has none."""
    from tokenizers import Tokenizer, models

    from tfcli.generate.loader import load
    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.translate import Pipeline
    from tfcli.specials import SPECIAL_TOKENS

    pieces = SPECIAL_TOKENS + ["▁dog", "s", "▁cat", ".", "-like", "'s", "▁a", "4"]
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(pieces)}, unk_token="<unk>"))
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.save(str(tmp_path / "tok.json"))
    from tfcli.model.config import preset
    from tfcli.model.transformer import build_model

    ckpt = save_model(tmp_path / "ckpt", build_model(preset("toy", src_vocab_size=len(pieces),
                                                            tgt_vocab_size=len(pieces))), tmp_path / "tok.json")
    t = Pipeline(load(str(ckpt), torch.device("cpu"), "seq2seq"), TranslateConfig(device="cpu"), torch.device("cpu"))
    assert [pieces[i] for i in t.continuing().nonzero().flatten().tolist()] == ["s", "-like", "'s", "4"]
    words = Pipeline(load(str(save_model(tmp_path / "w", random_translator(1), save_word_tokenizer(
        tmp_path / "wt", WORDS))), torch.device("cpu"), "seq2seq"), TranslateConfig(device="cpu"), torch.device("cpu"))
    assert words.continuing() is None


def test_a_set_of_alternatives_is_met_by_any_one_form(copier, tmp_path):
    """A constraint given as alternatives (API: a list; FILE: forms joined by " ||| "; JSONL: a list): one form
    appears, the one the search finds best; a form the input already holds changes nothing."""
    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.translate import translate

    c = tfcli.load(copier)
    texts = ["cat dog bird", "tree cat", "egg fish goat"]
    cons = [[["egg", "dog"]], [["fish", "kite lamp"], "moon"], [["hat ice", "jam"]]]
    got = c.translate(texts, constraints=cons, beam_size=5)
    assert got[0] == "cat dog bird"
    assert holds(got[1], "moon") and (holds(got[1], "fish") or holds(got[1], "kite lamp"))
    assert holds(got[2], "hat ice") or holds(got[2], "jam")
    src, file, out = tmp_path / "in.txt", tmp_path / "cons.txt", tmp_path / "out.txt"
    src.write_text("\n".join(texts) + "\n")
    file.write_text("egg ||| dog\nfish ||| kite lamp\tmoon\nhat ice ||| jam\n")
    translate(str(copier), [str(src)], str(out), TranslateConfig(device="cpu"), constraint_file=str(file))
    assert out.read_text().splitlines() == got
    with pytest.raises(ConfigError, match=r"constraints\[0\]: a set of alternatives needs at least one phrase"):
        c.translate(texts[:1], constraints=[[[]]])
