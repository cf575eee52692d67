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


def test_word_starts_from_metaspace_pieces_are_those_of_decoding_each_prefix():
    """The one-pass word count over SentencePiece-style pieces equals the definition (the words of each prefix's
    decoding) on trained tokenizers, over random ids: lone "▁" pieces, special tokens and all."""
    import random
    from pathlib import Path

    from tfcli.data.tokenizer import train_tokenizer
    from tfcli.generate.alignment import _metaspace

    text = (Path(__file__).parent / "data" / "formats" / "markdown-it-py.md").read_text().splitlines()
    rng = random.Random(0)
    for kind in ("bpe", "unigram"):
        tok = train_tokenizer(kind, text, 300)
        assert _metaspace(tok) == "▁"
        for _ in range(200):
            ids = [rng.randrange(tok.get_vocab_size()) for _ in range(rng.randrange(1, 25))]
            slow = [max(len(tok.decode(ids[: i + 1], skip_special_tokens=False).split()), 1) - 1
                    for i in range(len(ids))]
            assert word_of_token(tok, ids, raw=False) == slow, [tok.id_to_token(i) for i in ids]


def test_the_aligning_layers_weights_are_the_full_forwards():
    """Decoder.cross_weights (the layers up to the aligning one, then its attention alone) gives the weights a
    full teacher-forced forward hands back, in every layer placement the models use."""
    import torch

    from tfcli.model.config import preset
    from tfcli.model.transformer import build_model

    for kw in ({}, {"norm": "pre"}, {"norm": "pre", "n_kv_head": 2, "qk_norm": True}):
        model = build_model(preset("toy", src_vocab_size=40, tgt_vocab_size=40, **kw)).eval()
        src = torch.randint(4, 40, (3, 7))
        src[1, 5:] = 0
        tgt = torch.randint(4, 40, (3, 6))
        attn = {"encoder": [], "self": [], "cross": []}
        with torch.inference_mode():
            memory, mask = model.encode(src, attn_out=attn)
            model.decode(tgt, memory, mask, attn_out=attn)
            for layer in range(1, model.cfg.n_decoder_layers + 1):
                ours = model.decoder.cross_weights(tgt, memory, mask, layer)
                torch.testing.assert_close(ours, attn["cross"][layer - 1].float(), atol=1e-5, rtol=1e-4)


def test_alignment_reads_the_encoder_output_the_search_computed(copier):
    """The alignment pass takes each row's encoder output from the search's own encoding (Remembered), and encodes
    only rows the search never saw."""
    import torch

    from tfcli.generate.alignment import Remembered
    from tfcli.generate.step import step_model
    from tfcli import checkpoint

    model, _ = checkpoint.load(copier)
    inner = step_model(model)
    sm, encoded = Remembered(inner), []
    encode = inner.encode
    inner.encode = lambda src: encoded.append(len(src)) or encode(src)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0], [10, 2, 0, 0]])
    with torch.inference_mode():
        sm.encode(src[:2])
        sm.encode(src[2:])
        memory, mask = sm.recall(src[[2, 0, 0]])
        assert encoded == [2, 1]
        direct, direct_mask = encode(src[[2, 0, 0]])
        torch.testing.assert_close(memory, direct)
        assert torch.equal(mask, direct_mask)
        other = torch.tensor([[11, 12, 2, 0]])
        torch.testing.assert_close(sm.recall(other)[0], encode(other)[0])
        assert encoded == [2, 1, 1]


def test_an_ensemble_aligns_with_its_first_model(copier):
    translator = tfcli.load([str(copier), str(copier)], device="cpu")
    nbest = translator.translate_nbest(["cat dog egg"], n=1, alignment=True)
    assert nbest[0][0].text == "cat dog egg" and nbest[0][0].alignment == [(0, 0), (1, 1), (2, 2)]
