"""Ensembles (tfcli/generate/ensemble.py): several models decode as one, their next-token probabilities averaged.
Oracles: the slow reference search (tests/reference_search.py) run on a module whose log-probs are the average by
construction; an ensemble of a model with itself is that model."""

from __future__ import annotations

import math
import random

import pytest
import torch
from typer.testing import CliRunner

import tfcli
from helpers import WORDS, random_translator, save_model, save_random_translator, save_word_tokenizer
from reference_search import assert_same_nbest, reference_beam_search, reference_greedy
from tfcli.cli import app
from tfcli.data.batching import pad, source_ids
from tfcli.errors import CheckpointError
from tfcli.generate.ensemble import EnsembleStepModel
from helpers import beam_search, greedy_decode
from tfcli.generate.step import StepModel
from tfcli.specials import SPECIAL_TOKENS

V = len(SPECIAL_TOKENS) + len(WORDS)


class Averaged(torch.nn.Module):
    """The full forward of an ensemble, slowly: log of the mean of the members' probabilities at every position."""

    def __init__(self, members):
        super().__init__()
        self.members = torch.nn.ModuleList(members)
        self.cfg = members[0].cfg

    def forward(self, src, tgt):
        lps = torch.stack([m(src, tgt).float().log_softmax(-1) for m in self.members])
        return torch.logsumexp(lps, 0) - math.log(len(self.members))


def sources(n, seed=0):
    rng = random.Random(seed)
    return [source_ids([rng.randrange(4, V) for _ in range(rng.randint(1, 8))]) for _ in range(n)]


@pytest.mark.parametrize("packed", [False, True])
def test_the_ensembles_search_is_the_reference_on_the_averaged_distribution(packed):
    a, b = random_translator(1), random_translator(2)
    ensemble = EnsembleStepModel([StepModel(a, pack=packed), StepModel(b, pack=packed)])
    averaged = Averaged([a, b])
    srcs = sources(12, seed=4)
    beams = beam_search(ensemble, pad(srcs), beam_size=4, len_penalty=0.6, nbest=3, token_scores=True)
    greedy = greedy_decode(ensemble, pad(srcs))
    differs = 0
    for src, hyps, g in zip(srcs, beams, greedy):
        ref = reference_beam_search(averaged, src, beam_size=4, len_penalty=0.6, nbest=3)
        assert_same_nbest(hyps, ref)
        assert g.tokens == reference_greedy(averaged, src).tokens
        differs += g.tokens != reference_greedy(a, src).tokens
    assert differs  # the second model changes some output: the average is not the first model's


def test_an_ensemble_of_a_model_with_itself_is_the_model(copier, tmp_path):
    ckpt = save_random_translator(tmp_path, 3)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 7))) for _ in range(15)]
    for path in (copier, ckpt):
        one = tfcli.load(str(path), device="cpu").translate_nbest(texts, n=2, beam_size=4)
        two = tfcli.load([str(path), str(path)], device="cpu").translate_nbest(texts, n=2, beam_size=4)
        assert [[h.text for h in hs] for hs in two] == [[h.text for h in hs] for hs in one]
        for hs1, hs2 in zip(one, two):
            assert [h.score for h in hs2] == pytest.approx([h.score for h in hs1], abs=1e-4)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    res = CliRunner().invoke(app, ["translate", "-m", str(copier), "-m", str(copier), str(src)])
    assert res.exit_code == 0 and res.stdout.splitlines() == texts  # the copier copies


def test_models_that_do_not_fit_together_are_one_line(copier, counter, tmp_path):
    other = save_model(tmp_path / "other", random_translator(3), save_word_tokenizer(tmp_path / "tok", WORDS[::-1]))
    src = tmp_path / "in.txt"
    src.write_text("cat\n")
    res = CliRunner().invoke(app, ["translate", "-m", str(copier), "-m", str(other), str(src)])
    assert res.exit_code == 1 and "must share their tokenizers" in res.output and res.output.count("\n") == 1
    res = CliRunner().invoke(app, ["translate", "-m", str(copier), "-m", str(counter), str(src)])
    assert res.exit_code == 1 and "not a translation (seq2seq)" in res.output
    with pytest.raises(CheckpointError, match="lm"):
        tfcli.load([str(copier), str(counter)], device="cpu")
