"""translate --prefix / translate(prefixes=...): each output starts with its line's target prefix and continues from
it (CTranslate2's target_prefix, fairseq's --prefix-size). The copier model copies source position t to output
position t whatever came before, so after a prefix it continues with the source's next words."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

import tfcli
from helpers import WORDS, save_random_translator
from tfcli.cli import app
from tfcli.generate.config import TranslateConfig
from tfcli.generate.translate import translate


def cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory) -> Path:
    return save_random_translator(tmp_path_factory.mktemp("random"), 2)


def test_the_output_starts_with_the_prefix_and_continues(copier):
    translator = tfcli.load(str(copier), device="cpu")
    texts = ["cat dog egg", "cat dog egg", "tree sun", "", "moon"]
    prefixes = ["moon", "", "tree sun rat", "owl", "moon"]
    want = ["moon dog egg", "cat dog egg", "tree sun rat", "owl", "moon"]
    for options in (dict(beam_size=5), dict(beam_size=1), dict(sampling=True, topk=1)):
        assert translator.translate(texts, prefixes=prefixes, batch_size=2, **options) == want, options
    best = translator.translate_nbest(["cat dog egg"], n=2, scores=True, prefixes=["moon"])[0][0]
    assert best.text == "moon dog egg"
    assert best.token_scores[0] < -10 < min(best.token_scores[1:])  # the forced word, scored as the model sees it


def test_prefix_file_from_the_command_line(copier, tmp_path):
    src, pre = tmp_path / "in.txt", tmp_path / "prefix.txt"
    src.write_text("cat dog egg\nmoon nest\n")
    pre.write_text("hat\n\n")
    res = cli("translate", "-m", copier, src, "--prefix", pre, "-o", tmp_path / "out.txt")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "out.txt").read_text() == "hat dog egg\nmoon nest\n"
    pre.write_text("hat\n")
    res = cli("translate", "-m", copier, src, "--prefix", pre, "-o", tmp_path / "bad.txt")
    assert res.exit_code == 1 and "1 prefixes for 2 input lines" in res.output and not (tmp_path / "bad.txt").exists()
    res = cli("translate", "-m", copier, "--prefix", pre, "-o", tmp_path / "bad.txt", input="a\nb\n")
    assert res.exit_code == 1 and "prefixes" in res.output and not (tmp_path / "bad.txt").exists()
    with pytest.raises(ValueError, match="prefixes"):
        tfcli.load(str(copier), device="cpu").translate(["cat", "dog"], prefixes=["cat"])


def test_prefixed_outputs_do_not_depend_on_the_batch_or_the_parts(random_ckpt, tmp_path):
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 8))) for _ in range(25)]
    prefixes = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 4))) for _ in range(25)]
    translator = tfcli.load(str(random_ckpt), device="cpu")
    want = translator.translate(texts, prefixes=prefixes, batch_size=64)
    for out, prefix in zip(want, prefixes):
        assert out.split()[: len(prefix.split())] == prefix.split()
    assert translator.translate(texts, prefixes=prefixes, batch_size=1) == want
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    (tmp_path / "pre.txt").write_text("\n".join(prefixes) + "\n")
    translate(str(random_ckpt), [str(tmp_path / "in.txt")], str(tmp_path / "out.txt"),
              TranslateConfig(device="cpu", part_lines=6), resume=True, prefix_file=str(tmp_path / "pre.txt"))
    assert (tmp_path / "out.txt").read_text().splitlines() == want
