"""translate --sampling (back-translation): each line drawn with random numbers keyed by (seed, its index in the
input), so a line's sample never depends on its batch, the buffer, the input order or the number of processes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import tfcli
from helpers import WORDS, save_random_translator
from tfcli.cli import app
from tfcli.generate.config import TranslateConfig
from tfcli.generate.sampling import line_uniforms, sample_by_uniforms
from tfcli.generate.translate import translate


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory) -> Path:
    return save_random_translator(tmp_path_factory.mktemp("random"), 1)


def lines(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(n)]


def cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def test_uniforms_are_keyed_by_seed_line_and_step_and_sampling_follows_the_distribution():
    u = line_uniforms(3, torch.arange(20000), 7)
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0
    assert torch.equal(line_uniforms(3, torch.tensor([11, 5]), 7), u[[11, 5]])  # a row's number is its own
    assert not torch.equal(line_uniforms(4, torch.arange(5), 7), u[:5])
    assert not torch.equal(line_uniforms(3, torch.arange(5), 8), u[:5])
    # inverse transform on a grid of uniforms: token i takes exactly its share
    probs = torch.tensor([0.125, 0.0, 0.375, 0.5])
    grid = (torch.arange(1000, dtype=torch.float64) + 0.5) / 1000
    ids = sample_by_uniforms(probs.log().expand(1000, 4), grid)
    assert torch.bincount(ids, minlength=4).tolist() == [125, 0, 375, 500]


def test_sampling_from_the_top_token_is_greedy_search(copier, random_ckpt):
    texts = lines(12)
    for ckpt in (copier, random_ckpt):
        translator = tfcli.load(str(ckpt), device="cpu")
        assert translator.translate(texts, sampling=True, topk=1, seed=5) == translator.translate(texts, beam_size=1)


def test_a_lines_sample_does_not_depend_on_batch_buffer_order_or_parts(random_ckpt, tmp_path):
    texts = lines(30, seed=2)
    translator = tfcli.load(str(random_ckpt), device="cpu")
    options = dict(sampling=True, temperature=1.5, seed=9)
    want = translator.translate(texts, batch_size=64, **options)
    assert len(set(want)) > 20  # the draws differ from line to line
    for batch, buffer in ((1, 10000), (4, 7), (64, 3)):
        assert translator.translate(texts, batch_size=batch, buffer_size=buffer, **options) == want
    # the same text at another index is another draw; each index keeps its own
    other = translator.translate(texts[::-1], **options)
    assert other != want[::-1]
    assert translator.translate(texts, **{**options, "seed": 10}) != want
    # in parts (as several processes translate a file): the one-process bytes
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    cfg = TranslateConfig(device="cpu", sampling=True, temperature=1.5, seed=9, part_lines=7)
    translate(str(random_ckpt), [str(src)], str(tmp_path / "parts.txt"), cfg, resume=True)
    assert (tmp_path / "parts.txt").read_text().splitlines() == want


def test_sampling_options_are_checked(copier, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("cat dog\n")
    ok = cli("translate", "-m", copier, src, "--sampling", "--top-k", "1")
    assert ok.exit_code == 0 and ok.stdout == "cat dog\n"
    for args, flag in ((["--top-k", "3"], "--top-k"), (["--topk", "3"], "--top-k"), (["--seed", "2"], "--seed"),
                       (["--sampling", "--beam-size", "4"], "--beam-size"), (["--sampling", "--nbest", "2"], "--nbest")):
        res = cli("translate", "-m", copier, src, *args)
        assert res.exit_code == 2 and flag in res.output, args
    res = cli("translate", "-m", copier, src, "--sampling", "--top-p", "1.5")
    assert res.exit_code == 1 and "--top-p" in res.output
    with pytest.raises(ValueError, match="beam_size"):
        tfcli.load(str(copier), device="cpu").translate(["cat"], sampling=True, beam_size=3)


def test_line_uniforms_with_a_step_per_row_are_the_ones_with_one_step():
    """With continuous batching each row is at its own step: the per-row form draws exactly the numbers the one-step
    form draws for that row (the int64 arithmetic wraps as the Python ints are reduced, modulo 2^64)."""
    from tfcli.generate.sampling import line_uniforms

    lines = torch.tensor([0, 3, 17, 2**40, 9999, 5])
    steps = torch.tensor([1, 7, 2, 3, 2**33, 1])
    for seed in (1, 2**61 + 12345):
        per_row = line_uniforms(seed, lines, steps)
        for i in range(len(lines)):
            assert per_row[i] == line_uniforms(seed, lines[i : i + 1], int(steps[i]))[0]


def test_a_few_rows_draw_in_python_ints_the_numbers_of_the_tensor_form():
    """line_uniforms computes up to _HOST_ROWS rows on the CPU in Python ints: the same bits as the int64 tensor form
    (used for more rows, and on a GPU), for any seed (negative ones too), line and step, one step or a step a row."""
    from tfcli.generate import sampling

    rng = random.Random(0)
    pad = torch.zeros(sampling._HOST_ROWS, dtype=torch.long)  # (more rows than the host form takes)
    for _ in range(300):
        seed = rng.choice([rng.randrange(2**62), rng.randrange(100), -rng.randrange(2**40)])
        R = rng.randint(1, sampling._HOST_ROWS)
        lines = torch.tensor([rng.choice([rng.randrange(2**40), rng.randrange(100)]) for _ in range(R)])
        steps = torch.tensor([rng.choice([rng.randrange(2**34), rng.randrange(300)]) for _ in range(R)])
        for step, tensor_step in ((steps, torch.cat([steps, pad])), (int(steps[0]), int(steps[0]))):
            tensor_form = sampling.line_uniforms(seed, torch.cat([lines, pad]), tensor_step)[:R]
            assert torch.equal(sampling.line_uniforms(seed, lines, step), tensor_form)
