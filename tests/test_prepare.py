"""`tfcli prepare`: readers, cleaning, tokenizers, the prepared directory, re-runs, and bad input."""

import gzip
import json
import random
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from tfcli.cli import app
from tfcli.data import cleaning, loading
from tfcli.data.config import PrepareConfig, prepare_config
from tfcli.data.prepare import prepare
from tfcli.data.prepared import PreparedData
from tfcli.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    TOKENIZER_TYPES,
    UNK_ID,
    decode_batch,
    encode_batch,
    load_tokenizer,
    lowercases,
    train_tokenizer,
    unk_rate,
)
from tfcli.errors import ConfigError, InputError, TfcliError

runner = CliRunner()

DE = "der die das ein eine Hund Katze Mann Frau Kind läuft springt sitzt über unter neben Straße Wiese großen " \
     "kleinen roten blauen Ball Hut spielt mit im am schön".split()
EN = "the a an dog cat man woman child runs jumps sits over under next to street meadow big small red blue " \
     "ball hat plays with in on nice".split()


def sentences(words, n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        s = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        out.append(s[0].upper() + s[1:] + rng.choice([".", "!", ", ja.", " (gut)."]))
    return out


def parallel(n, seed):
    """Aligned German-ish and English-ish sentences of the same length (so that no length-ratio filter fires)."""
    rng = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        k = rng.randint(3, 12)
        de.append(" ".join(rng.choice(DE) for _ in range(k)).capitalize() + ".")
        en.append(" ".join(rng.choice(EN) for _ in range(k)).capitalize() + ".")
    return de, en


def write(path, lines, end="\n"):
    path.write_text("".join(line + end for line in lines), encoding="utf-8")
    return path


@pytest.fixture
def pair(tmp_path):
    """Train/valid/test aligned files of a small synthetic corpus."""
    files = {}
    for split, n, seed in (("train", 300, 1), ("valid", 40, 2), ("test", 30, 3)):
        de, en = parallel(n, seed)
        files[f"{split}.de"] = write(tmp_path / f"{split}.de", de)
        files[f"{split}.en"] = write(tmp_path / f"{split}.en", en)
    return files


def pair_cfg(pair, out, **kw):
    kw.setdefault("vocab_size", 200)
    return PrepareConfig(
        out=str(out), src=str(pair["train.de"]), tgt=str(pair["train.en"]), valid_src=str(pair["valid.de"]),
        valid_tgt=str(pair["valid.en"]), test_src=str(pair["test.de"]), test_tgt=str(pair["test.en"]), **kw
    )


def leftovers(directory, name):
    """Anything named like the output or its temp dirs."""
    return sorted(p.name for p in directory.iterdir() if p.name == name or p.name.startswith(f".{name}."))


# --- tokenizers ----------------------------------------------------------------------------------------------


def test_prepare_does_not_import_torch():
    """The special ids live in the torch-free tfcli.specials, so `tfcli prepare` starts fast."""
    import subprocess
    import sys

    code = "import sys, tfcli.data.prepare; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("kind", TOKENIZER_TYPES)
def test_tokenizer_round_trip_and_special_ids(kind, tmp_path):
    train = sentences(DE, 400, 1) + sentences(EN, 400, 2)
    tok = train_tokenizer(kind, train, 300)
    path = tmp_path / "tok.json"
    tok.save(str(path))
    tok = load_tokenizer(path)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    held_out = sentences(DE, 50, 7) + sentences(EN, 50, 8) + ["Der  Hund, (läuft)!"]
    ids = encode_batch(tok, held_out)
    assert all(i not in (PAD_ID, BOS_ID, EOS_ID) for seq in ids for i in seq)  # no specials added
    assert decode_batch(tok, ids) == held_out
    assert unk_rate(ids) == 0.0
    # special-token strings in the text are text, not control tokens
    (ids,) = encode_batch(tok, ["a </s> b <pad>"])
    assert EOS_ID not in ids and PAD_ID not in ids


def test_subword_vocab_size_is_respected():
    train = sentences(DE, 400, 1)
    for kind in ("bpe", "wordpiece"):
        assert train_tokenizer(kind, train, 150).get_vocab_size() == 150
    # Unigram's size is an upper bound: it stops when this small corpus has no more pieces worth keeping
    assert 60 < train_tokenizer("unigram", train, 150).get_vocab_size() <= 150


@pytest.mark.parametrize("kind", TOKENIZER_TYPES)
def test_long_text_is_encoded_in_pieces_with_the_same_ids(kind):
    text = " ".join(sentences(EN, 3000, 3))  # ~100k characters: several pieces
    assert len(text) > 3 * (1 << 15)
    tok = train_tokenizer(kind, [text], 300)
    (ids,) = encode_batch(tok, [text])
    assert ids == tok.encode(text, add_special_tokens=False).ids
    assert decode_batch(tok, [ids]) == [text]


def test_char_tokenizer_keeps_every_character_and_newlines():
    text = "First Citizen:\nBefore we proceed, hear me speak.\n\nAll: Speak, speak. ÄÖÜ ☃\n"
    tok = train_tokenizer("char", [text], vocab_size=10)  # the cap is ignored
    assert tok.get_vocab_size() == 4 + len(set(text))
    (ids,) = encode_batch(tok, [text])
    assert len(ids) == len(text)
    assert decode_batch(tok, [ids]) == [text]
    (ids,) = encode_batch(tok, ["Z"])  # never seen
    assert ids == [UNK_ID]
    assert unk_rate([ids, [5, 6, 7]]) == 0.25


def test_bytelevel_has_no_unknowns_and_needs_256_bytes():
    tok = train_tokenizer("bytelevel", sentences(EN, 200, 1), 300)
    text = "Ünïcödé ☃ \t tabs  and  spaces\n日本語"
    (ids,) = encode_batch(tok, [text])
    assert UNK_ID not in ids and decode_batch(tok, [ids]) == [text]
    with pytest.raises(TfcliError, match="at least 260"):
        train_tokenizer("bytelevel", ["x"], 100)


def test_decode_drops_pad_bos_eos_and_shows_unk():
    tok = train_tokenizer("bpe", sentences(EN, 200, 1), 200)
    (ids,) = encode_batch(tok, ["the dog"])
    assert decode_batch(tok, [[BOS_ID] + ids + [EOS_ID, PAD_ID, PAD_ID]]) == ["the dog"]
    assert decode_batch(tok, [ids + [UNK_ID]])[0].startswith("the dog")
    assert "<unk>" in decode_batch(tok, [ids + [UNK_ID]])[0]


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(TfcliError, match="not found"):
        load_tokenizer(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TfcliError, match="bad.json: not a valid tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(tmp_path / "other.json"))
    with pytest.raises(TfcliError, match="'<pad>' must have id 0"):
        load_tokenizer(tmp_path / "other.json")


# --- cleaning ------------------------------------------------------------------------------------------------


def test_normalize_nfc_strip_and_line_breaks():
    decomposed = "Cafe\u0301  \t"
    assert cleaning.normalize([decomposed]) == ["Café"]
    assert cleaning.normalize([decomposed], nfc=False) == ["Cafe\u0301"]
    assert cleaning.normalize([decomposed], strip=False) == ["Café  \t"]
    assert cleaning.normalize(["a\nb\r\nc\u2028d"]) == ["a b c d"]
    assert cleaning.normalize(["a\nb"], one_line=False) == ["a\nb"]


@pytest.mark.parametrize("kind", TOKENIZER_TYPES)
def test_training_a_tokenizer_twice_gives_the_same_one(kind):
    """The Rust Unigram and WordPiece trainers number pieces in hash-map order (and Unigram's scores differ in
    the last bits from run to run): train_tokenizer puts them in a canonical order."""
    train = sentences(EN, 40, 1)  # small: several characters are kept only as the trainer's last resort
    size = 300 if kind == "bytelevel" else 80
    assert len({train_tokenizer(kind, train, size).to_str() for _ in range(6)}) == 1


def test_filters_count_what_they_drop():
    cols = [["a", "", "b", "a", " ", "c"], ["x", "y", "", "x", "z", "w"]]
    counts = cleaning.new_counts(6)
    cols = cleaning.drop_empty(cols, counts)
    assert cols == [["a", "a", "c"], ["x", "x", "w"]]
    cols = cleaning.Deduper()(cols, counts)
    assert cols == [["a", "c"], ["x", "w"]]
    assert (counts["empty"], counts["duplicate"], counts["kept"]) == (3, 1, 2)

    src = [[1] * 3, [1] * 10, [1] * 2, [1] * 9, [1]]
    tgt = [[1] * 3, [1] * 2, [1] * 8, [1] * 3, []]
    counts = cleaning.new_counts(5)
    keep = cleaning.length_filter(src, tgt, counts, max_length=9, max_ratio=3.0)
    # 10 tokens: too long; 2 vs 8: ratio 4; 9 vs 3: ratio 3 is kept; 1 vs 0: ratio 1/max(1, 0) = 1
    assert keep == [0, 3, 4]
    assert (counts["too_long"], counts["ratio"], counts["kept"]) == (1, 1, 3)


def test_cleaning_report_per_split(tmp_path):
    src = ["Ein Hund.", "", "Ein Hund.", "Eine Katze.", "ja", "Cafe\u0301 am Morgen."]
    tgt = ["A dog.", "Empty source.", "A dog.", "A cat.", "yes " * 20, "Coffee in the morning."]
    write(tmp_path / "a.de", src)
    write(tmp_path / "a.en", tgt)
    write(tmp_path / "v.de", ["Ein Hund.", "", "Ein Hund."])
    write(tmp_path / "v.en", ["A dog.", "", "A dog."])
    cfg = PrepareConfig(out=str(tmp_path / "p"), src=str(tmp_path / "a.de"), tgt=str(tmp_path / "a.en"),
                        valid_src=str(tmp_path / "v.de"), valid_tgt=str(tmp_path / "v.en"), vocab_size=100,
                        dedupe=True, max_ratio=3.0)
    data = PreparedData(prepare(cfg))
    report = data.meta["cleaning"]
    assert report["train"] == {"input": 6, "empty": 1, "duplicate": 1, "too_long": 0, "ratio": 1, "kept": 3}
    # valid and test keep duplicates and ratio outliers: only empty rows go
    assert report["valid"] == {"input": 3, "empty": 1, "duplicate": 0, "too_long": 0, "ratio": 0, "kept": 2}
    assert data.text_file("valid", "src").read_text(encoding="utf-8") == "Ein Hund.\nEin Hund.\n"
    tok = load_tokenizer(data.tokenizer_file("src"))
    texts = decode_batch(tok, [data.sequences("train", "src")[i] for i in range(3)])
    assert texts == ["Ein Hund.", "Eine Katze.", "Café am Morgen."]  # NFC


# --- readers and the prepared directory ----------------------------------------------------------------------


def test_parallel_files_to_prepared_dir(pair, tmp_path):
    out = prepare(pair_cfg(pair, tmp_path / "prep"))
    data = PreparedData(out)
    assert data.kind == "parallel" and data.splits == ["train", "valid", "test"]
    meta = data.meta
    assert meta["joint_vocab"] is True and meta["tokenizer"] == {"type": "bpe", "vocab_size": 200}
    assert meta["vocab"] == {"src": 200, "tgt": 200}
    assert set(meta["inputs"]) == {str(p) for p in pair.values()}
    assert meta["settings"]["tokenizer"] == "bpe" and "src" not in meta["settings"]
    assert (out / "tokenizer.src.json").read_bytes() == (out / "tokenizer.tgt.json").read_bytes()
    for split, n in (("train", 300), ("valid", 40), ("test", 30)):
        for side, lang in (("src", "de"), ("tgt", "en")):
            info = meta["splits"][split][side]
            assert info["count"] == n and info["dtype"] == "uint16"
            lines = pair[f"{split}.{lang}"].read_text(encoding="utf-8").splitlines()
            seqs = data.sequences(split, side)
            # compact storage: uint16 ids back to back, int64 offsets (count + 1)
            offsets = np.fromfile(out / f"{split}.{side}.idx", dtype=np.int64)
            assert len(offsets) == n + 1 and offsets[0] == 0 and offsets[-1] == info["tokens"]
            assert (out / f"{split}.{side}.bin").stat().st_size == 2 * info["tokens"]
            tok = load_tokenizer(data.tokenizer_file(side))
            assert [s.tolist() for s in (seqs[i] for i in range(n))] == encode_batch(tok, lines)
            assert decode_batch(tok, [seqs[i] for i in range(n)]) == lines
        if split != "train":
            assert data.text_file(split, "tgt").read_text(encoding="utf-8").splitlines() == lines
    assert data.text_file("train", "src") is None


@pytest.mark.parametrize("kind", TOKENIZER_TYPES)
def test_lowercase_text_and_a_tokenizer_that_lowercases_what_it_encodes(kind, tmp_path):
    """--lowercase: the prepared ids are what the saved tokenizer makes of the raw, cased text (what translate will
    feed it), the valid references are lowercased, and decoding gives lowercase text."""
    files = {}
    for split, n, seed in (("train", 300, 1), ("valid", 40, 2), ("test", 30, 3)):
        de, en = parallel(n, seed)
        de[0], en[0] = "ÜBER DIE STRASSE", "ΟΔΟΣ ΚΑΙ Ἄρτος."  # a capital sigma at a word's end; a composed capital
        files[split] = write(tmp_path / f"{split}.de", de), write(tmp_path / f"{split}.en", en)
    cfg = PrepareConfig(out=str(tmp_path / "prep"), src=str(files["train"][0]), tgt=str(files["train"][1]),
                        valid_src=str(files["valid"][0]), valid_tgt=str(files["valid"][1]),
                        test_src=str(files["test"][0]), test_tgt=str(files["test"][1]), tokenizer=kind,
                        vocab_size=300, lowercase=True)
    data = PreparedData(prepare(cfg))
    assert data.meta["settings"]["lowercase"] is True
    for side, i in (("src", 0), ("tgt", 1)):
        tok = load_tokenizer(data.tokenizer_file(side))
        assert lowercases(tok)
        for split in ("train", "valid", "test"):
            raw = files[split][i].read_text(encoding="utf-8").splitlines()
            seqs = data.sequences(split, side)
            ids = [seqs[j].tolist() for j in range(len(raw))]
            assert ids == encode_batch(tok, raw)
            lower = [cleaning.LOWERCASE.normalize_str(t) for t in raw]
            assert lower[0] != raw[0] and decode_batch(tok, ids) == lower
            if split != "train":
                assert data.text_file(split, side).read_text(encoding="utf-8").splitlines() == lower

    # a tokenizer reused from it lowercases the new text too; --lowercase beside --tokenizer-from is refused
    again = PrepareConfig(out=str(tmp_path / "again"), test_src=str(files["test"][0]), test_tgt=str(files["test"][1]),
                          tokenizer_from=str(data.path))
    second = PreparedData(prepare(again))
    assert np.array_equal(second.sequences("test", "tgt").flat, data.sequences("test", "tgt").flat)
    assert second.text_file("test", "tgt").read_bytes() == data.text_file("test", "tgt").read_bytes()
    with pytest.raises(ConfigError, match=r"prepare.lowercase \(--lowercase\) is not used"):
        prepare(PrepareConfig(out=str(tmp_path / "x"), test=str(files["test"][1]), tokenizer_from=str(data.path),
                              lowercase=True))


def test_the_normaliser_is_dropped_only_where_the_cleaning_did_each_of_its_steps():
    from tokenizers import normalizers

    from tfcli.data.tokenizer import for_clean_text

    tok = train_tokenizer("bpe", sentences(EN, 50, 1), 100, lowercase=True)  # NFC, then Lowercase
    assert for_clean_text(tok, nfc=True, lowercase=True).normalizer is None
    for nfc, lowercase in ((True, False), (False, True), (False, False)):
        assert for_clean_text(tok, nfc, lowercase).normalizer is not None
    assert for_clean_text(train_tokenizer("bpe", sentences(EN, 50, 1), 100), True, True).normalizer is None
    tok.normalizer = normalizers.Sequence([normalizers.Lowercase(), normalizers.NFC()])  # another order
    assert for_clean_text(tok, True, True).normalizer is not None
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.StripAccents()])  # another step
    assert for_clean_text(tok, True, True).normalizer is not None


def test_keeping_case_is_the_default_and_leaves_older_fingerprints_alone(pair, tmp_path):
    """An option added later, at its default, is not in the settings a prepared directory is fingerprinted by."""
    data = PreparedData(prepare(pair_cfg(pair, tmp_path / "prep")))
    assert "lowercase" not in data.meta["settings"]
    assert not lowercases(load_tokenizer(data.tokenizer_file("src")))
    result = runner.invoke(app, ["prepare", "--src", str(pair["train.de"]), "--tgt", str(pair["train.en"]),
                                 "--vocab-size", "200", "--lowercase", "-o", str(tmp_path / "lc")])
    assert result.exit_code == 0, result.output
    assert lowercases(load_tokenizer(PreparedData(tmp_path / "lc").tokenizer_file("tgt")))


def test_separate_vocabularies(pair, tmp_path):
    data = PreparedData(prepare(pair_cfg(pair, tmp_path / "prep", joint_vocab=False, vocab_size=120)))
    assert data.meta["joint_vocab"] is False
    src, tgt = (load_tokenizer(data.tokenizer_file(s)) for s in ("src", "tgt"))
    assert src.get_vocab() != tgt.get_vocab()
    assert {"ä", "ß", "ü"} <= set(src.get_vocab()) and not {"ä", "ß", "ü"} & set(tgt.get_vocab())


def test_uint32_for_large_vocabularies(tmp_path):
    from tfcli.data.prepared import dtype_for

    assert dtype_for(65535) == np.uint16 and dtype_for(65536) == np.uint32


def test_tsv_columns_and_gzip(tmp_path):
    rows = [f"{i}\t{d}\t{e}" for i, (d, e) in enumerate(zip(*parallel(60, 1)))]
    with gzip.open(tmp_path / "c.tsv.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(rows) + "\n")
    cfg = PrepareConfig(out=str(tmp_path / "p"), train=str(tmp_path / "c.tsv.gz"), src_field="2", tgt_field="3",
                        vocab_size=150)
    data = PreparedData(prepare(cfg))
    assert data.kind == "parallel" and len(data.sequences("train", "src")) == 60
    tok = load_tokenizer(data.tokenizer_file("tgt"))
    assert decode_batch(tok, [data.sequences("train", "tgt")[0]]) == [rows[0].split("\t")[2]]
    src, tgt = zip(*loading.iter_tsv(str(tmp_path / "c.tsv.gz")))  # default columns 1 and 2
    assert src[0] == "0" and tgt[0] == rows[0].split("\t")[1]


def test_jsonl_dotted_fields_and_mono_field(tmp_path):
    rows = [{"id": i, "translation": {"de": d, "en": e}} for i, (d, e) in
            enumerate(zip(*parallel(50, 1)))]
    write(tmp_path / "t.jsonl", [json.dumps(r, ensure_ascii=False) for r in rows] + [""])  # blank line skipped
    src, tgt = zip(*loading.iter_jsonl(str(tmp_path / "t.jsonl"), ["translation.de", "translation.en"]))
    assert list(src) == [r["translation"]["de"] for r in rows] and tgt[-1] == rows[-1]["translation"]["en"]
    write(tmp_path / "m.jsonl", [json.dumps({"text": s}) for s in sentences(EN, 40, 3)])
    data = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "p"), train=str(tmp_path / "m.jsonl"),
                                              vocab_size=100)))
    assert data.kind == "mono" and list(data.meta["vocab"]) == ["tgt"] and len(data.sequences("train", "tgt")) == 40


def test_mono_line_and_paragraph_modes(tmp_path):
    wiki = [" = Title = ", " ", " First paragraph , one line . ", " ", " ", " = = Section = = ", " ",
            " Second paragraph line one .", " line two ."]
    write(tmp_path / "w.txt", wiki)
    assert list(loading.iter_mono(str(tmp_path / "w.txt"), "line")) == wiki
    assert list(loading.iter_mono(str(tmp_path / "w.txt"), "paragraph")) == [
        " = Title = ", " First paragraph , one line . ", " = = Section = = ", " Second paragraph line one .\n line two ."
    ]
    data = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "p"), train=str(tmp_path / "w.txt"),
                                              mono_mode="paragraph", vocab_size=60)))
    assert data.meta["mono_mode"] == "paragraph" and data.meta["cleaning"]["train"]["kept"] == 4
    line = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "l"), train=str(tmp_path / "w.txt"), vocab_size=60)))
    assert line.meta["cleaning"]["train"] == {"input": 9, "empty": 4, "duplicate": 0, "too_long": 0, "ratio": 0,
                                              "kept": 5}


def test_document_mode_keeps_the_whole_text_and_cuts_valid_by_characters(tmp_path):
    text = "".join(f"SPEAKER {i}:\nLine {i}, with  two  spaces.\n\n" for i in range(200))
    (tmp_path / "input.txt").write_text(text, encoding="utf-8")
    cfg = PrepareConfig(out=str(tmp_path / "p"), train=str(tmp_path / "input.txt"), mono_mode="document",
                        tokenizer="char", valid_ratio=0.1)
    data = PreparedData(prepare(cfg))
    cut = int(len(text) * 0.9)  # nanoGPT: data[:int(n*0.9)], data[int(n*0.9):]
    train, valid = data.sequences("train", "tgt"), data.sequences("valid", "tgt")
    assert len(train) == len(valid) == 1 and len(train[0]) == cut and len(valid[0]) == len(text) - cut
    tok = load_tokenizer(data.tokenizer_file("tgt"))
    assert decode_batch(tok, [train[0]])[0] + decode_batch(tok, [valid[0]])[0] == text
    assert data.text_file("valid", "tgt").read_text(encoding="utf-8") == text[cut:]


def test_keep_empty_lines_for_wikitext_style_eval(tmp_path):
    lines = [" = Title = ", " ", " Some text here . ", " ", " More text . "]
    write(tmp_path / "t.txt", lines)
    data = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "p"), train=str(tmp_path / "t.txt"),
                                              test=str(tmp_path / "t.txt"), drop_empty=False, vocab_size=60)))
    seqs = data.sequences("test", "tgt")
    assert len(seqs) == 5 and len(seqs[1]) == 0 and len(seqs[3]) == 0
    assert data.text_file("test", "tgt").read_text(encoding="utf-8").split("\n")[:5] == [l.strip() for l in lines]


def test_tokenizer_from_prepared_dir_or_file(pair, tmp_path):
    first = PreparedData(prepare(pair_cfg(pair, tmp_path / "a")))
    cfg = PrepareConfig(out=str(tmp_path / "b"), test_src=str(pair["test.de"]), test_tgt=str(pair["test.en"]),
                        tokenizer_from=str(first.path))
    second = PreparedData(prepare(cfg))
    assert second.splits == ["test"] and second.meta["tokenizer"]["type"] == "pretrained"
    assert second.tokenizer_file("src").read_bytes() == first.tokenizer_file("src").read_bytes()
    assert np.array_equal(second.sequences("test", "tgt").flat, first.sequences("test", "tgt").flat)
    # a single tokenizer.json serves a monolingual split too
    cfg = PrepareConfig(out=str(tmp_path / "c"), test=str(pair["test.en"]), tokenizer_from=str(first.tokenizer_file("tgt")))
    assert np.array_equal(PreparedData(prepare(cfg)).sequences("test", "tgt").flat, first.sequences("test", "tgt").flat)


# --- datasets.load_dataset on local files --------------------------------------------------------------------


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def test_datasets_json_gives_the_same_ids_as_the_jsonl_reader(tmp_path, hf_cache):
    for split, n, seed in (("train", 80, 1), ("valid", 20, 2)):
        rows = [{"translation": {"de": d, "en": e}} for d, e in zip(*parallel(n, seed))]
        write(tmp_path / f"{split}.jsonl", [json.dumps(r, ensure_ascii=False) for r in rows])
    fields = ["--src-field", "translation.de", "--tgt-field", "translation.en", "--vocab-size", "150"]
    r = runner.invoke(app, ["prepare", "--dataset", "json", "--data-files", f"train={tmp_path}/train.jsonl",
                            "--data-files", f"valid={tmp_path}/valid.jsonl", "-o", str(tmp_path / "hf"), *fields])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["prepare", "--train", f"{tmp_path}/train.jsonl", "--valid", f"{tmp_path}/valid.jsonl",
                            "-o", str(tmp_path / "js"), *fields])
    assert r.exit_code == 0, r.output
    hf, js = PreparedData(tmp_path / "hf"), PreparedData(tmp_path / "js")
    assert hf.splits == js.splits == ["train", "valid"]
    for split in hf.splits:
        for side in ("src", "tgt"):
            assert np.array_equal(hf.sequences(split, side).flat, js.sequences(split, side).flat)
    assert str(tmp_path / "train.jsonl") in hf.meta["inputs"]
    # the same again is up to date
    r = runner.invoke(app, ["prepare", "--dataset", "json", "--data-files", f"train={tmp_path}/train.jsonl",
                            "--data-files", f"valid={tmp_path}/valid.jsonl", "-o", str(tmp_path / "hf"), *fields])
    assert r.exit_code == 0 and "up to date" in r.stderr


def test_datasets_text_and_missing_field(tmp_path, hf_cache):
    write(tmp_path / "lm.txt", sentences(EN, 100, 1))
    cfg = PrepareConfig(out=str(tmp_path / "hf"), dataset="text", data_files=[f"train={tmp_path}/lm.txt"],
                        dataset_splits=["train=train[:80]", "valid=train[80:]"], vocab_size=80)
    data = PreparedData(prepare(cfg))
    own = PreparedData(prepare(PrepareConfig(out=str(tmp_path / "own"), train=str(tmp_path / "lm.txt"),
                                             valid_ratio=0.2, vocab_size=80)))
    assert data.kind == "mono"
    for split in ("train", "valid"):
        assert np.array_equal(data.sequences(split, "tgt").flat, own.sequences(split, "tgt").flat)
    with pytest.raises(InputError, match=r"text\[train\]:1: no field 'body'"):
        prepare(PrepareConfig(out=str(tmp_path / "x"), dataset="text", data_files=[str(tmp_path / "lm.txt")],
                              text_field="body"))
    assert not (tmp_path / "x").exists()


# --- re-runs -------------------------------------------------------------------------------------------------


def test_rerun_is_a_noop_unless_force(pair, tmp_path):
    cfg = pair_cfg(pair, tmp_path / "prep")
    out = prepare(cfg)
    meta_stat = (out / "meta.json").stat()
    messages = []
    prepare(cfg, log=messages.append)
    assert messages == [f"{out}: up to date (same inputs and settings); use --force to rebuild it"]
    assert (out / "meta.json").stat().st_mtime_ns == meta_stat.st_mtime_ns
    assert (out / "meta.json").stat().st_ino == meta_stat.st_ino

    prepare(cfg, force=True, log=messages.append)
    assert len(messages) == 1 and (out / "meta.json").stat().st_ino != meta_stat.st_ino

    # other settings: an error naming the change, the old directory untouched
    with pytest.raises(TfcliError, match=r"other settings \(vocab_size 200 -> 150\); use --force"):
        prepare(pair_cfg(pair, tmp_path / "prep", vocab_size=150))
    assert PreparedData(out).vocab_size("src") == 200
    # changed input contents count as other settings too
    write(pair["test.en"], parallel(30, 99)[1])
    with pytest.raises(TfcliError, match="other input files or contents"):
        prepare(cfg)
    prepare(pair_cfg(pair, tmp_path / "prep", vocab_size=150), force=True)
    assert PreparedData(out).vocab_size("src") == 150
    assert leftovers(tmp_path, "prep") == ["prep"]


def test_never_overwrites_a_directory_that_is_not_prepared(pair, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    for force in (False, True):
        with pytest.raises(TfcliError, match="not a tfcli prepared directory; refusing"):
            prepare(pair_cfg(pair, tmp_path / "mine"), force=force)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"
    (tmp_path / "empty").mkdir()
    prepare(pair_cfg(pair, tmp_path / "empty"))  # an empty directory is fine
    assert PreparedData(tmp_path / "empty").kind == "parallel"


def test_config_file_section_and_flag_overrides(pair, tmp_path):
    (tmp_path / "c.yaml").write_text(
        "model: {d_model: 64}\nprepare:\n  tokenizer: unigram\n  vocab_size: 150\n  joint_vocab: false\n"
        f"  src: {pair['train.de']}\n  tgt: {pair['train.en']}\n"
    )
    cfg = prepare_config(tmp_path / "c.yaml", out=str(tmp_path / "p"), vocab_size=120)
    assert (cfg.tokenizer, cfg.vocab_size, cfg.joint_vocab, cfg.src) == ("unigram", 120, False, str(pair["train.de"]))
    (tmp_path / "bad.yaml").write_text("prepare:\n  vocab_sise: 100\n")
    with pytest.raises(ConfigError, match="did you mean 'vocab_size'"):
        prepare_config(tmp_path / "bad.yaml")


# --- bad input through the CLI -------------------------------------------------------------------------------


def invoke(tmp_path, *args):
    return runner.invoke(app, ["prepare", *map(str, args), "-o", str(tmp_path / "out"), "--vocab-size", "100"])


def bad_inputs(tmp_path):
    write(tmp_path / "a.de", ["eins", "zwei", "drei"])
    write(tmp_path / "a.en", ["one", "two"])
    write(tmp_path / "b.en", ["one", "two", "three"])
    (tmp_path / "bad.en").write_bytes(b"one\ntwo \xc3\x28 broken\nthree\n")
    (tmp_path / "empty.en").write_bytes(b"")
    write(tmp_path / "rows.jsonl", ['{"translation": {"de": "Hallo", "en": "Hello"}}', '{"translation": {"de": "Ja"}}'])
    write(tmp_path / "broken.jsonl", ['{"translation": {"de": "Hallo", "en": "Hello"}}', '{"translation": '])
    write(tmp_path / "rows.tsv", ["eins\tone", "zwei\ttwo", "drei three"])
    fields = ["--src-field", "translation.de", "--tgt-field", "translation.en"]
    return {
        "mismatch": (["--src", "a.de", "--tgt", "a.en"], "a.de has 3 lines but .*a.en has 2"),
        "utf8": (["--src", "a.de", "--tgt", "bad.en"], r"bad.en:2: invalid UTF-8"),
        "empty": (["--src", "a.de", "--tgt", "empty.en"], r"empty.en: empty input"),
        "missing": (["--src", "a.de", "--tgt", "nope.en"], r"nope.en: no such file"),
        "jsonl-field": (["--train", "rows.jsonl", *fields], r"rows.jsonl:2: no field 'translation.en'"),
        "jsonl-syntax": (["--train", "broken.jsonl", *fields], r"broken.jsonl:2: not valid JSON"),
        "tsv-no-tab": (["--train", "rows.tsv"], r"rows.tsv:3: expected 2 tab-separated columns, found no tab"),
        "valid-mismatch": (["--src", "a.de", "--tgt", "b.en", "--valid-src", "a.de", "--valid-tgt", "a.en"],
                           "a.de has 3 lines but .*a.en has 2"),
    }


@pytest.mark.parametrize("case", ["mismatch", "utf8", "empty", "missing", "jsonl-field", "jsonl-syntax", "tsv-no-tab",
                                  "valid-mismatch"])
def test_bad_input_is_one_line_with_file_and_line_and_leaves_nothing(tmp_path, case):
    args, pattern = bad_inputs(tmp_path)[case]
    args = [a if a.startswith("-") or a.startswith("translation") else tmp_path / a for a in args]
    r = invoke(tmp_path, *args)
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert re.search(pattern, r.stderr), r.stderr
    assert "Traceback" not in r.output
    assert leftovers(tmp_path, "out") == []


def test_existing_dir_with_other_settings_fails_through_the_cli(pair, tmp_path):
    args = ["--src", pair["train.de"], "--tgt", pair["train.en"]]
    assert invoke(tmp_path, *args).exit_code == 0
    r = runner.invoke(app, ["prepare", *map(str, args), "-o", str(tmp_path / "out"), "--vocab-size", "90"])
    assert r.exit_code == 1 and "already prepared with other settings (vocab_size 100 -> 90)" in r.stderr
    assert PreparedData(tmp_path / "out").vocab_size("src") == 100
    r = invoke(tmp_path, *args)
    assert r.exit_code == 0 and "up to date" in r.stderr
    assert leftovers(tmp_path, "out") == ["out"]


def test_cli_prints_the_cleaning_table_on_stderr_only(pair, tmp_path):
    r = invoke(tmp_path, "--src", pair["train.de"], "--tgt", pair["train.en"], "--valid-src", pair["valid.de"],
               "--valid-tgt", pair["valid.en"])
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    for word in ("split", "empty", "duplicate", "too long", "ratio", "kept", "train", "valid", "300", "40"):
        assert word in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--src", "x"], "--src and --tgt go together"),
        ([], "no training data"),
        (["--train", "x.txt", "--tokenizer", "sentencepiece"], "--tokenizer sentencepiece: unknown; choose from bpe"),
        (["--train", "x.txt", "--valid-ratio", "1.5"], "valid_ratio: must be in [0, 1)"),
        (["--train", "x.txt", "--dataset", "json"], "--dataset gives all splits"),
        (["--src", "x", "--tgt", "y", "--mono-mode", "document"], "document is for monolingual text"),
    ],
)
def test_bad_options(tmp_path, args, message):
    r = invoke(tmp_path, *args)
    assert r.exit_code == (2 if "unknown; choose" in message else 1) and message in r.stderr  # a bad flag: usage
    assert leftovers(tmp_path, "out") == []


# --- real data -----------------------------------------------------------------------------------------------


@pytest.mark.shared_data
@pytest.mark.slow
def test_multi30k(shared_data, tmp_path):
    d = shared_data / "multi30k"
    r = runner.invoke(app, [
        "prepare", "--src", f"{d}/train.de", "--tgt", f"{d}/train.en", "--valid-src", f"{d}/valid.de",
        "--valid-tgt", f"{d}/valid.en", "--test-src", f"{d}/test2016.de", "--test-tgt", f"{d}/test2016.en",
        "--vocab-size", "8000", "--joint-vocab", "-o", str(tmp_path / "m30k"),
    ])
    assert r.exit_code == 0, r.output
    data = PreparedData(tmp_path / "m30k")
    report = data.meta["cleaning"]
    assert report["train"]["input"] == 29000 and report["valid"]["kept"] == 1014 and report["test"]["kept"] == 1000
    dropped = sum(report["train"][k] for k in ("empty", "duplicate", "too_long", "ratio"))
    assert dropped < 20  # Multi30k is clean: a handful of odd pairs (e.g. "@@" for a full sentence)
    for split, n in (("train", 29000 - dropped), ("valid", 1014), ("test", 1000)):
        assert len(data.sequences(split, "src")) == len(data.sequences(split, "tgt")) == n
    assert data.vocab_size("src") == data.vocab_size("tgt") == 8000
    assert data.meta["splits"]["train"]["src"]["dtype"] == "uint16"
    tok = load_tokenizer(data.tokenizer_file("src"))
    for lang in ("de", "en"):
        lines = (d / f"test2016.{lang}").read_text(encoding="utf-8").splitlines()[:300]
        ids = encode_batch(tok, lines)
        assert decode_batch(tok, ids) == lines
        assert unk_rate(ids) < 0.001
        assert 5 < sum(map(len, ids)) / sum(len(s.split()) for s in lines) * 5 < 10  # 1-2 tokens a word


@pytest.mark.shared_data
def test_tiny_shakespeare_char_split_matches_nanogpt(shared_data, tmp_path):
    path = shared_data / "tinyshakespeare" / "input.txt"
    cfg = PrepareConfig(out=str(tmp_path / "shakes"), train=str(path), mono_mode="document", tokenizer="char",
                        valid_ratio=0.1)
    data = PreparedData(prepare(cfg))
    # nanoGPT's shakespeare_char: 65 characters, 1,003,854 train and 111,540 val tokens
    assert data.vocab_size("tgt") == 4 + 65
    assert len(data.sequences("train", "tgt")[0]) == 1003854 and len(data.sequences("valid", "tgt")[0]) == 111540
    text = path.read_text(encoding="utf-8")
    tok = load_tokenizer(data.tokenizer_file("tgt"))
    assert decode_batch(tok, [data.sequences("valid", "tgt")[0]]) == [text[1003854:]]
