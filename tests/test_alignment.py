"""translate --alignment (tfcli/generate/alignment.py): Pharaoh word alignments from the cross-attention. The copier
model's decoder attends from output position t to source position t by construction, so its alignment is the
diagonal."""

from __future__ import annotations

from typer.testing import CliRunner

import tfcli
from tfcli.cli import app
from tfcli.generate.alignment import default_layer, pharaoh, word_of_token


def cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def test_the_copier_aligns_each_word_to_itself(copier, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("cat dog egg\n\nmoon\ntree sun rat queen pig owl\n")
    res = cli("translate", "-m", copier, src, "--alignment")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == [
        "cat dog egg\t0-0 1-1 2-2", "\t", "moon\t0-0", "tree sun rat queen pig owl\t0-0 1-1 2-2 3-3 4-4 5-5"]
    greedy = cli("translate", "-m", copier, src, "--alignment", "--greedy", "--raw")
    assert greedy.stdout.splitlines() == res.stdout.splitlines()  # word-level tokenizer: tokens are the words
    nbest = cli("translate", "-m", copier, src, "--alignment", "--nbest", "2", "--scores")
    first = nbest.stdout.splitlines()[0].split("\t")
    assert first[0] == "0" and first[2] == "cat dog egg" and first[-1] == "0-0 1-1 2-2" and len(first) == 5


def test_the_api_gives_alignment_pairs(copier):
    translator = tfcli.load(str(copier), device="cpu")
    nbest = translator.translate_nbest(["cat dog", ""], n=1, alignment=True)
    assert nbest[0][0].text == "cat dog" and nbest[0][0].alignment == [(0, 0), (1, 1)]
    assert nbest[1][0].alignment == []
    assert translator.translate_nbest(["cat"], n=1)[0][0].alignment is None


def test_alignment_options_are_checked(copier, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("cat\n")
    res = cli("translate", "-m", copier, src, "--alignment", "--alignment-layer", "3")
    assert res.exit_code == 1 and "decoder has 2 layers" in res.output
    res = cli("translate", "-m", copier, src, "--alignment-layer", "1")
    assert res.exit_code == 2 and "--alignment-layer is for --alignment" in res.output
    assert default_layer(6) == 5 and default_layer(1) == 1


class Pieces:
    """A stand-in tokenizer: ids index `pieces`; decoding joins them, a leading "_" starting a new word."""

    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.pieces[i] for i in ids).replace("_", " ").strip()


def test_subword_tokens_map_to_their_words_and_pairs_merge():
    tok = Pieces(["_un", "believ", "able", "_story", "_a", "!"])
    assert word_of_token(tok, [0, 1, 2, 3, 4, 5], raw=False) == [0, 0, 0, 1, 2, 2]
    assert word_of_token(tok, [0, 1, 2], raw=True) == [0, 1, 2]
    assert pharaoh([(1, 0), (0, 0), (1, 0), (2, 1), (0, 2)]) == "0-0 1-0 2-1 0-2"
