"""One model for several directions: target-language tags in prepared data, sampling across directions by
temperature, validation per direction, --tgt-lang in translate/API/eval (mixed-language batches), and the tags
through the CTranslate2 and Hugging Face exports and a Marian import."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import WORDS, copy_model, marian_like_dir, save_model, tiny_train_config
from tfcli.data.config import PrepareConfig
from tfcli.data.languages import language_tags, parse_directions, tag
from tfcli.data.prepare import prepare
from tfcli.data.prepared import PreparedData
from tfcli.data.tokenizer import encode_batch, load_tokenizer
from tfcli.errors import ConfigError, InputError, TfcliError
from tfcli.specials import EOS_ID, SPECIAL_TOKENS

LANGS = ("de", "en", "fr")


def write_multiway(d: Path, split: str, n: int, seed: int) -> None:
    """d/SPLIT.de, .en, .fr: line i says the same in each "language" (word k is de_k, en_k, fr_k)."""
    rng = random.Random(seed)
    lines = [[rng.randrange(12) for _ in range(rng.randint(2, 7))] for _ in range(n)]
    for lang in LANGS:
        (d / f"{split}.{lang}").write_text("".join(" ".join(f"{lang}{k}" for k in ws) + "\n" for ws in lines))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("multiway")
    write_multiway(d, "train", 120, 0)
    write_multiway(d, "valid", 12, 1)
    return d


def prepare_multi(d: Path, out: Path, pairs: str = "de-en,en-de,en-fr", **options) -> PreparedData:
    cfg = PrepareConfig(out=str(out), lang_pairs=[pairs], train_prefix=str(d / "train"),
                        valid_prefix=str(d / "valid"), vocab_size=120, **options)
    cfg.validate()
    return PreparedData(prepare(cfg))


def test_prepare_writes_one_split_per_direction_each_source_after_its_tag(corpus, tmp_path):
    prep = prepare_multi(corpus, tmp_path / "prep")
    assert prep.directions == ["de-en", "en-de", "en-fr"]
    assert set(prep.splits) == {f"{s}.{d}" for s in ("train", "valid") for d in prep.directions}
    assert prep.split_names("train") == ["train.de-en", "train.en-de", "train.en-fr"]
    tok = load_tokenizer(prep.tokenizer_file("src"))
    tags = language_tags(tok)
    v = tok.get_vocab_size()
    assert tags == {"de": v - 3, "en": v - 2, "fr": v - 1}  # added after the trained pieces, in language order
    # found in the file's text, the same; and through the vocabulary where the file escapes > and <
    file = prep.tokenizer_file("src")
    assert language_tags(tok, file) == tags
    escaped = tmp_path / "escaped.json"
    escaped.write_text(Path(file).read_text().replace(">", "\\u003e").replace("<", "\\u003C"))
    assert language_tags(load_tokenizer(escaped), escaped) == tags
    assert prep.vocab_size("src") == v
    # a tag is never read from text: the string ">>fr<<" is plain characters
    assert tags["fr"] not in tok.encode(">>fr<< de1", add_special_tokens=False).ids
    for direction in prep.directions:
        src_lang, tgt_lang = direction.split("-")
        for split in ("train", "valid"):
            name = f"{split}.{direction}"
            src, tgt = prep.sequences(name, "src"), prep.sequences(name, "tgt")
            texts = (corpus / f"{split}.{src_lang}").read_text().splitlines()
            refs = (corpus / f"{split}.{tgt_lang}").read_text().splitlines()
            assert len(src) == len(texts)
            for i in (0, len(texts) - 1):
                assert src[i].tolist() == [tags[tgt_lang]] + encode_batch(tok, [texts[i]])[0]
                assert tgt[i].tolist() == encode_batch(tok, [refs[i]])[0]
        # valid text kept for BLEU, without the tag
        assert prep.text_file(f"valid.{direction}", "tgt").read_text().splitlines() == \
            (corpus / f"valid.{tgt_lang}").read_text().splitlines()
        assert not prep.text_file(f"valid.{direction}", "src").read_text().startswith(">>")


def test_prepare_reads_fairseq_pair_files_and_refuses_what_it_cannot_use(corpus, tmp_path):
    d = tmp_path / "fs"
    d.mkdir()
    for lang in ("de", "en"):  # fairseq's layout: train.de-en.de, train.de-en.en, serving en-de too
        (d / f"train.de-en.{lang}").write_text((corpus / f"train.{lang}").read_text())
    prep = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "p"), lang_pairs=["de-en,en-de"],
                                              train_prefix=str(d / "train"), vocab_size=100)))
    assert prep.sequences("train.en-de", "tgt")[0].tolist() == prep.sequences("train.de-en", "src")[0].tolist()[1:]

    def refused(what, **options):
        with pytest.raises(TfcliError) as e:
            cfg = PrepareConfig(out=str(tmp_path / "x"), **options)
            cfg.validate()
            prepare(cfg)
        assert what in str(e.value) and "\n" not in str(e.value)
        assert not (tmp_path / "x").exists()

    refused("de-fr: no files for it", lang_pairs=["de-fr"], train_prefix=str(d / "train"))
    refused("give the directions with --lang-pairs", train_prefix=str(corpus / "train"))
    refused("drop --src", lang_pairs=["de-en"], train_prefix=str(corpus / "train"), src=str(corpus / "train.de"),
            tgt=str(corpus / "train.en"))
    refused("--valid-prefix", lang_pairs=["de-en"], train_prefix=str(corpus / "train"), valid_ratio=0.1)
    for bad in ("de_en", "de-de", "de-en,de-en", "d e-en"):
        with pytest.raises(ConfigError):
            parse_directions(bad)


def test_sampling_by_temperature_follows_n_to_the_one_over_t(corpus, tmp_path):
    from tfcli.train.data import ParallelData

    small = tmp_path / "small"
    small.mkdir()
    for lang in LANGS:  # en-fr has a tenth of the rows of the others
        (small / f"train.{lang}").write_text("".join((corpus / f"train.{lang}").read_text().splitlines(True)[:12]))
    for lang in ("de", "en"):
        (small / f"train.de-en.{lang}").write_text((corpus / f"train.{lang}").read_text())
    prep = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "p"), lang_pairs=["de-en,en-fr"],
                                              train_prefix=str(small / "train"), vocab_size=120)))
    splits = prep.split_names("train")

    def data(t):
        return ParallelData(prep, splits, 64, 200, 0, seed=3, temperature=t)

    assert data(1.0).epoch_rows(0) is None  # every row once
    n = np.array([120, 12])
    for t in (2.0, 5.0):
        rows = data(t).epoch_rows(4)
        p = n ** (1 / t) / (n ** (1 / t)).sum()
        want = np.round(p * n.sum()).astype(int)
        direction = (rows >= 120).astype(int)
        assert np.bincount(direction, minlength=2).tolist() == want.tolist()
        # whole passes before repeats: no row of a direction twice more often than another
        for d, (start, count) in enumerate(((0, 120), (120, 12))):
            uses = Counter(rows[direction == d].tolist())
            assert set(uses) <= set(range(start, start + count))
            assert max(uses.values()) - min(uses.values()) <= 1 and len(uses) == min(count, want[d])
        again = data(t).epoch_rows(4)
        assert np.array_equal(rows, again) and not np.array_equal(rows, data(t).epoch_rows(5))
        batched = np.concatenate(data(t).batches(4))
        assert sorted(batched.tolist()) == sorted(rows.tolist())  # the epoch's batches hold exactly its rows
        # each sampled row collates to its own direction's pair
        d = data(t)
        b = d.batches(4)[0]
        batch = d.collate(b)
        tags = language_tags(load_tokenizer(prep.tokenizer_file("src")))
        assert [int(x) for x in batch.src[:, 0]] == [tags["en"] if i < 120 else tags["fr"] for i in b]
    # BPE-dropout re-cuts the text and keeps each source's tag in front
    recut = ParallelData(prep, splits, 64, 200, 0, seed=3, temperature=2.0, bpe_dropout=0.5)
    b = recut.batches(1)[0]
    assert [int(x) for x in recut.collate(b).src[:, 0]] == [tags["en"] if i < 120 else tags["fr"] for i in b]
    # balanced directions draw every row once whatever the temperature
    balanced = prepare_multi(corpus, tmp_path / "bal")
    assert ParallelData(balanced, balanced.split_names("train"), 64, 200, 0, seed=3, temperature=5.0).epoch_rows(0) is None


def test_training_validates_each_direction_and_stops_on_their_mean(corpus, tmp_path):
    from tfcli.train.trainer import train

    prep = prepare_multi(corpus, tmp_path / "prep")
    cfg = tiny_train_config(prep.path, tmp_path / "run", max_steps=4, valid_every=4, warmup=2,
                            early_stop_metric="bleu")
    train(cfg)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["split"] == "valid"][-1]
    per = valid["directions"]
    assert list(per) == prep.directions
    for key in ("loss", "nll", "bleu"):
        assert valid[key] == pytest.approx(sum(m[key] for m in per.values()) / len(per))
    assert len({m["nll"] for m in per.values()}) == len(per)  # each scored on its own split


def test_a_resumed_multilingual_run_draws_what_an_uninterrupted_one_draws(corpus, tmp_path):
    """Sampling by temperature across epochs (a small direction repeated): resumed at step 8 of 14, the same
    weights as the run that did not stop."""
    from safetensors.torch import load_file

    from tfcli.train.trainer import run as run_train, train

    d = tmp_path / "files"
    d.mkdir()
    for lang in LANGS:
        (d / f"train.{lang}").write_text("".join((corpus / f"train.{lang}").read_text().splitlines(True)[:10]))
    for lang in ("de", "en"):
        (d / f"train.de-en.{lang}").write_text((corpus / f"train.{lang}").read_text()[:1500])
    prep = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "p"), lang_pairs=["de-en,en-fr"],
                                              train_prefix=str(d / "train"), vocab_size=100)))
    opts = dict(max_steps=14, valid_every=5, log_every=1, max_tokens=120, lang_temperature=3.0, valid_bleu=False)
    train(tiny_train_config(prep.path, tmp_path / "full", **opts), {"dropout": 0.1})
    train(tiny_train_config(prep.path, tmp_path / "part", **{**opts, "max_steps": 8}), {"dropout": 0.1})
    assert run_train(None, {"out": str(tmp_path / "part"), "resume": True, "max_steps": 14}).step == 14
    epochs = {json.loads(x)["epoch"] for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()}
    assert len(epochs) > 2  # several epochs, each its own draw

    def last(run):
        ckpts = run / "checkpoints"
        return load_file(str(ckpts / (ckpts / "LATEST").read_text().strip() / "model.safetensors"))

    a, b = last(tmp_path / "full"), last(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- translating with a tag ---------------------------------------------------------------------------------------

TAGGED = WORDS[:14] + [tag("de"), tag("fr")]


@pytest.fixture(scope="module")
def tag_copier(tmp_path_factory) -> Path:
    """copy_model over WORDS and two tags (special tokens of its vocabulary, as prepare adds them): it copies its
    source, the tag in front included, so its output shows what the model was given."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("tagcopy")
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIAL_TOKENS + TAGGED)}, unk_token="<unk>"))
    tok.add_special_tokens(SPECIAL_TOKENS + TAGGED[-2:])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tok.json"))
    return save_model(d / "copier", copy_model(n_words=len(TAGGED), max_len=32), d / "tok.json")


@pytest.fixture(scope="module")
def tagged_random(tmp_path_factory) -> Path:
    """A random model whose vocabulary has the two tags: what it outputs depends on the tag."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    d = tmp_path_factory.mktemp("tagrandom")
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIAL_TOKENS + TAGGED)}, unk_token="<unk>"))
    tok.add_special_tokens(SPECIAL_TOKENS + TAGGED[-2:])
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tok.json"))
    from tfcli.model.config import preset
    from tfcli.model.transformer import build_model

    torch.manual_seed(7)
    v = len(SPECIAL_TOKENS) + len(TAGGED)
    model = build_model(preset("toy", src_vocab_size=v, tgt_vocab_size=v, d_model=64, d_ff=128, max_len=32,
                               share_embeddings=True, norm="post")).eval()  # (Marian's shape: exports to transformers)
    return save_model(d / "ckpt", model, d / "tok.json")


def test_tgt_lang_puts_the_tag_first(tag_copier):
    import tfcli

    t = tfcli.load(tag_copier)
    assert t.translate(["cat dog egg"], tgt_lang="fr", beam_size=1) == [">>fr<< cat dog egg"]
    assert t.translate(["cat dog", "", "egg"], tgt_lang=["de", "fr", "fr"], beam_size=3) == \
        [">>de<< cat dog", "", ">>fr<< egg"]
    with pytest.raises(ConfigError, match="give the target language"):
        t.translate(["cat"])
    with pytest.raises(ConfigError, match="does not translate into 'en'"):
        t.translate(["cat"], tgt_lang="en")
    with pytest.raises(ConfigError, match="one a text"):
        t.translate(["cat", "dog"], tgt_lang=["de"])


def test_mixed_language_batches_give_what_each_line_gives_alone(tagged_random):
    import tfcli

    t = tfcli.load(tagged_random)
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS[:14]) for _ in range(rng.randint(1, 9))) for _ in range(16)]
    langs = [rng.choice(["de", "fr"]) for _ in texts]
    for model in (t, tfcli.load(tagged_random, dtype="int8"), tfcli.load([tagged_random, tagged_random])):
        for options in (dict(beam_size=1), dict(beam_size=4), dict(sampling=True, seed=2)):
            mixed = model.translate(texts, tgt_lang=langs, batch_size=7, **options)
            if options.get("sampling"):  # a draw is keyed by the line's index: alone, each would be line 0
                assert mixed == model.translate(texts, tgt_lang=langs, batch_size=1, **options)
            else:
                assert mixed == [model.translate([x], tgt_lang=lang, **options)[0] for x, lang in zip(texts, langs)]
    assert t.translate(texts, tgt_lang="de", beam_size=1) != t.translate(texts, tgt_lang="fr", beam_size=1)


def tfcli_cli(*args, stdin: str | None = None):
    return subprocess.run([sys.executable, "-m", "tfcli", *map(str, args)], input=stdin, capture_output=True,
                          text=True)


def test_translate_command_takes_tgt_lang_and_jsonl_lines(tag_copier, copier, tmp_path):
    r = tfcli_cli("translate", "-m", tag_copier, "--tgt-lang", "de", "--greedy", stdin="cat dog\n\negg\n")
    assert r.returncode == 0 and r.stdout == ">>de<< cat dog\n\n>>de<< egg\n", r.stderr
    lines = ['{"text": "cat dog", "tgt_lang": "fr"}', '{"text": "egg"}', "", '{"text": "hat", "tgt_lang": "fr", '
             '"prefix": ">>fr<< hat"}']
    r = tfcli_cli("translate", "-m", tag_copier, "--tgt-lang", "de", "--input-format", "jsonl", "--greedy",
                  stdin="\n".join(lines) + "\n")
    assert r.returncode == 0 and r.stdout == ">>fr<< cat dog\n>>de<< egg\n\n>>fr<< hat\n", r.stderr
    # one line naming the problem, no output file (in this process: the errors come before any translating)
    from typer.testing import CliRunner

    from tfcli.cli import app

    out = tmp_path / "out.txt"
    for args, stdin, what in [
        (["--tgt-lang", "en"], "cat\n", "does not translate into 'en'"),
        ([], "cat\n", "<stdin>:1: the model is multilingual"),
        (["--input-format", "jsonl", "--tgt-lang", "de"], '{"text": "cat"}\n{"txt": "dog"}\n', '<stdin>:2: expected an object'),
        (["--input-format", "jsonl", "--tgt-lang", "de"], '{"text": "cat", "tgt_lang": 3}\n', 'field "tgt_lang" is int'),
    ]:
        r = CliRunner().invoke(app, ["translate", "-m", str(tag_copier), "--greedy", "-o", str(out), *args], input=stdin)
        assert r.exit_code == 1 and what in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not out.exists()
    # in parts (--resume; torchrun's path): the same lines
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    r = tfcli_cli("translate", "-m", tag_copier, "--tgt-lang", "de", "--input-format", "jsonl", "--greedy",
                  "--resume", "--part-lines", "2", "-o", tmp_path / "parts.txt", tmp_path / "in.jsonl")
    assert r.returncode == 0 and (tmp_path / "parts.txt").read_text() == ">>fr<< cat dog\n>>de<< egg\n\n>>fr<< hat\n"
    r = CliRunner().invoke(app, ["translate", "-m", str(copier), "--tgt-lang", "fr"], input="cat\n")
    assert r.exit_code == 1 and "translates into one language only" in r.stderr
    # eval --translate passes it on
    (tmp_path / "src").write_text("cat dog\negg\n")
    (tmp_path / "ref").write_text(">>fr<< cat dog\n>>fr<< egg\n")
    r = tfcli_cli("eval", "-m", tag_copier, "--translate", tmp_path / "src", "--tgt-lang", "fr", "-r",
                  tmp_path / "ref", "--metrics", "bleu", "--score-only")
    assert r.returncode == 0 and float(r.stdout.split()[0]) == pytest.approx(100.0), r.stderr


def test_alignment_skips_the_tag(tag_copier):
    import tfcli

    (hyp,), = tfcli.load(tag_copier).translate_nbest(["cat dog egg"], tgt_lang="fr", beam_size=1, alignment=True)
    # the copier's output word j+1 (after the copied tag) comes from source word j; the tag aligns to no word
    assert hyp.text == ">>fr<< cat dog egg" and set(hyp.alignment) <= {(0, 1), (1, 2), (2, 3)}
    assert (0, 1) in hyp.alignment and (2, 3) in hyp.alignment


# --- exports and import -------------------------------------------------------------------------------------------


def test_ctranslate2_export_translates_tagged_sources_as_tfcli(tag_copier, tmp_path):
    import tfcli
    from tfcli.interop.exporter import export

    ours = tfcli.load(tag_copier)
    texts, langs = ["cat dog egg", "hat", "fish goat cat"], ["fr", "de", "fr"]
    want = ours.translate(texts, tgt_lang=langs, beam_size=1)
    ctranslate2 = pytest.importorskip("ctranslate2")
    export(tag_copier, "ctranslate2", tmp_path / "ct2")
    res = ctranslate2.Translator(str(tmp_path / "ct2")).translate_batch(
        [[tag(lang)] + text.split() for text, lang in zip(texts, langs)], beam_size=1)
    assert [" ".join(r.hypotheses[0]) for r in res] == want


def test_hf_export_reads_the_tag_from_text_and_scores_as_tfcli(tagged_random, tmp_path):
    """The transformers export (Marian: sinusoidal positions, so the random tagged model, not the copier) reads
    `>>fr<< text` into tfcli's ids for --tgt-lang fr, and computes tfcli's logits on them."""
    transformers = pytest.importorskip("transformers")
    from tfcli import checkpoint
    from tfcli.interop.exporter import export

    export(tagged_random, "hf", tmp_path / "hf")
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    model, meta = checkpoint.load(tagged_random)
    ours_tok = checkpoint.tokenizer(meta, "src")
    tags = language_tags(ours_tok)
    for text, lang in (("cat dog egg", "fr"), ("hat", "de")):
        ids = tok(f"{tag(lang)} {text}").input_ids  # Marian's convention: the tag written in front of the text
        assert ids == [tags[lang]] + encode_batch(ours_tok, [text])[0] + [EOS_ID]
        tgt = torch.tensor([[1, 5, 6]])
        with torch.no_grad():
            ours = model(torch.tensor([ids]), tgt)
            theirs = hf(input_ids=torch.tensor([ids]), decoder_input_ids=tgt).logits
        assert float((ours - theirs).abs().max()) < 1e-4


def test_prepared_tags_are_split_from_text_by_the_hf_tokenizer_only(corpus, tmp_path):
    """tfcli never reads a tag from text; a Hugging Face tokenizer made from tfcli's tokenizer.json does (as
    MarianTokenizer does), so `>>fr<< text` there gives tfcli's ids for --tgt-lang fr."""
    transformers = pytest.importorskip("transformers")
    prep = prepare_multi(corpus, tmp_path / "prep")
    hf_tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(prep.tokenizer_file("src")))
    ours = load_tokenizer(prep.tokenizer_file("src"))
    text = "en3 en1 en7"
    assert hf_tok(f">>fr<< {text}", add_special_tokens=False).input_ids == \
        [language_tags(ours)["fr"]] + encode_batch(ours, [text])[0]


def test_import_keeps_an_opus_mt_models_language_tokens(tmp_path):
    """A multilingual OPUS-MT-like Marian directory (its tags plain entries of vocab.json): imported, --tgt-lang
    finds its tags, and the model scores a tagged source as Marian does."""
    import tfcli
    from tfcli import checkpoint
    from tfcli.interop.hf_import import import_model

    d, hf, vocab = marian_like_dir(tmp_path / "opus-mul", [">>fra<<", ">>deu<<"] + WORDS)
    V = len(vocab)
    import_model(d, tmp_path / "ckpt")
    model, meta = checkpoint.load(tmp_path / "ckpt")
    ours_tok = checkpoint.tokenizer(meta, "src")
    tags = language_tags(ours_tok)
    assert set(tags) == {"fra", "deu"}
    src = [tags["deu"]] + [ours_tok.token_to_id(w) for w in ("cat", "dog")] + [EOS_ID]
    hf_src = [vocab.index(">>deu<<"), vocab.index("cat"), vocab.index("dog"), 0]
    with torch.no_grad():
        ours = model(torch.tensor([src]), torch.tensor([[1]])).log_softmax(-1)[0, 0]
        theirs = hf(input_ids=torch.tensor([hf_src]), decoder_input_ids=torch.tensor([[V - 1]])).logits.log_softmax(-1)[0, 0]
    for word in WORDS[:5] + ["</s>"]:
        assert float(ours[ours_tok.token_to_id(word)]) == pytest.approx(float(theirs[vocab.index(word)]), abs=1e-4)
    assert len(tfcli.load(tmp_path / "ckpt").translate(["cat dog"], tgt_lang="fra", beam_size=1)) == 1


def test_attention_pictures_take_the_target_language(tag_copier, tmp_path):
    from tfcli.viz.attention import collect
    from tfcli import checkpoint

    model, meta = checkpoint.load(tag_copier)
    (sample,) = collect(model, meta, ["cat dog"], tgt_lang="fr")
    assert sample.tokens["src"][0] == ">>fr<<" and sample.target_text.startswith(">>fr<< cat dog")
    with pytest.raises(ConfigError, match="give the target language"):
        collect(model, meta, ["cat dog"])
