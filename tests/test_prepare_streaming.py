"""`tfcli prepare` streams in chunks: the prepared directory must not depend on where the chunks fall.

The oracle of every test is the same corpus prepared in one chunk (CHUNK_ROWS larger than the corpus): exact bytes,
nothing learnt, so these hold on every CPU."""

import json
from pathlib import Path

import numpy as np
import pytest

from test_prepare import EN, parallel, sentences, write
from tfcli.data import cleaning
from tfcli.data import prepare as prepare_module
from tfcli.data import tokenizer as tokenizer_module
from tfcli.data.config import PrepareConfig
from tfcli.data.prepare import prepare
from tfcli.data.prepared import PreparedData
from tfcli.errors import InputError


def files_of(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(directory).iterdir())}


@pytest.fixture
def messy(tmp_path):
    """21 train pairs (a multiple of 7 and 3, not of 4 or 5) with what every filter drops, some of it at chunk
    boundaries; a valid and a test split."""
    de, en = parallel(14, 1)
    de_rows = [de[0], "", de[1], de[0], de[2], "x " * 300, de[3], de[1], de[4], de[5],
               "   ", de[6], de[7], de[8], de[2], "ein", de[9], de[10], de[11], de[12], de[13]]
    en_rows = [en[0], en[9], en[1], en[0], en[2], "x", en[3], en[1], en[4], en[5],
               en[6], en[6], en[7], en[8], en[2], "the a a a a a a a a a a", en[9], en[10], en[11], en[12], en[13]]
    assert len(de_rows) == len(en_rows) == 21
    write(tmp_path / "train.de", de_rows)
    write(tmp_path / "train.en", en_rows)
    for split, n, seed in (("valid", 9, 2), ("test", 5, 3)):
        d, e = parallel(n, seed)
        write(tmp_path / f"{split}.de", d[:4] + [""] + d[4:])  # an empty row, dropped in valid/test too
        write(tmp_path / f"{split}.en", e[:4] + ["empty on the other side"] + e[4:])
    return tmp_path


def messy_cfg(d: Path, out: str, **kw) -> PrepareConfig:
    return PrepareConfig(out=str(d / out), src=str(d / "train.de"), tgt=str(d / "train.en"),
                         valid_src=str(d / "valid.de"), valid_tgt=str(d / "valid.en"), test_src=str(d / "test.de"),
                         test_tgt=str(d / "test.en"), **{"vocab_size": 120, "dedupe": True, "max_length": 50,
                                                         "max_ratio": 3.0, **kw})


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 7, 21])
def test_chunk_boundaries_change_nothing(messy, chunk, monkeypatch):
    whole = files_of(prepare(messy_cfg(messy, "whole")))
    monkeypatch.setattr(prepare_module, "CHUNK_ROWS", chunk)
    monkeypatch.setattr(tokenizer_module, "BATCH_CHARS", 40)  # several Rust batches in every chunk, too
    assert files_of(prepare(messy_cfg(messy, f"chunk{chunk}"))) == whole
    report = json.loads(whole["meta.json"])["cleaning"]
    # 2 empty (rows 2 and 11), 3 duplicates (rows 4, 8, 15: of rows 1, 3, 5), 1 too long (row 6), 1 ratio (row 16)
    assert report["train"] == {"input": 21, "empty": 2, "duplicate": 3, "too_long": 1, "ratio": 1, "kept": 14}
    assert report["valid"]["empty"] == report["test"]["empty"] == 1


@pytest.mark.parametrize("mode", ["line", "paragraph"])
def test_monolingual_chunks_change_nothing(tmp_path, mode, monkeypatch):
    lines = sentences(EN, 40, 1)
    text = [x for i, s in enumerate(lines) for x in ([s, ""] if i % 3 == 2 else [s])]  # paragraphs of 3 lines
    write(tmp_path / "lm.txt", text)

    def cfg(out):
        return PrepareConfig(out=str(tmp_path / out), train=str(tmp_path / "lm.txt"), mono_mode=mode,
                             valid_ratio=0.2, vocab_size=80, tokenizer="unigram")

    whole = files_of(prepare(cfg("whole")))
    monkeypatch.setattr(prepare_module, "CHUNK_ROWS", 2)
    assert files_of(prepare(cfg("chunked"))) == whole


def test_deduper_keeps_the_first_of_each_row_across_chunks():
    rows = [(f"s{i % 7}", f"t{i % 5}") for i in range(60)]  # repeats with period 35
    dedupe, counts, kept = cleaning.Deduper(), cleaning.new_counts(60), []
    for start in range(0, 60, 8):
        chunk = rows[start:start + 8]
        kept += list(zip(*dedupe([list(c) for c in zip(*chunk)], counts)))
    assert kept == list(dict.fromkeys(rows)) and counts["duplicate"] == 60 - 35 and counts["kept"] == 35
    assert len(dedupe) == 35 and all(run.dtype == np.uint64 for run in dedupe.runs)  # 8 bytes a distinct row
    assert all(np.all(run[1:] > run[:-1]) for run in dedupe.runs) and len(dedupe.runs) < 5  # sorted, merged


def test_tokenizer_sample(messy, monkeypatch):
    full = PreparedData(prepare(messy_cfg(messy, "full")))
    # a sample at least as large as the train split is all of it, in order: the same tokenizer
    same = PreparedData(prepare(messy_cfg(messy, "same", tokenizer_sample=1000)))
    assert same.tokenizer_file("src").read_bytes() == full.tokenizer_file("src").read_bytes()
    assert same.meta["tokenizer"]["sample"] == 16  # the rows cleaned and deduplicated (token filters come later)
    # a smaller one: 5 rows learn the vocabulary, every row is still encoded, and the sample does not depend on
    # the chunks
    small = PreparedData(prepare(messy_cfg(messy, "small", tokenizer_sample=5, vocab_size=60)))
    assert small.meta["tokenizer"]["sample"] == 5
    monkeypatch.setattr(prepare_module, "CHUNK_ROWS", 2)
    again = prepare(messy_cfg(messy, "again", tokenizer_sample=5, vocab_size=60))
    assert files_of(again) == files_of(small.path)
    report = small.meta["cleaning"]["train"]
    assert len(small.sequences("train", "src")) == report["kept"] == 16 - report["too_long"] - report["ratio"]
    assert small.tokenizer_file("src").read_bytes() != full.tokenizer_file("src").read_bytes()


def test_a_nul_inside_a_jsonl_string_is_refused_with_its_line(tmp_path):
    rows = [{"de": d, "en": e} for d, e in zip(*parallel(5, 1))]
    rows[3]["en"] = "a\u0000b"
    write(tmp_path / "t.jsonl", [json.dumps(r) for r in rows])
    with pytest.raises(InputError, match=r"t\.jsonl:4: contains a NUL character"):
        prepare(PrepareConfig(out=str(tmp_path / "p"), train=str(tmp_path / "t.jsonl"), src_field="de",
                              tgt_field="en", vocab_size=60))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_datasets_streaming_gives_the_same_directory(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    rows = [{"translation": {"de": d, "en": e}} for d, e in zip(*parallel(40, 1))]
    write(tmp_path / "train.jsonl", [json.dumps(r, ensure_ascii=False) for r in rows])

    def cfg(out, streaming):
        return PrepareConfig(out=str(tmp_path / out), dataset="json", data_files=[f"train={tmp_path}/train.jsonl"],
                             src_field="translation.de", tgt_field="translation.en", vocab_size=100,
                             streaming=streaming, valid_ratio=0.25)

    loaded = PreparedData(prepare(cfg("loaded", False)))
    streamed = PreparedData(prepare(cfg("streamed", True)))
    for split in ("train", "valid"):
        for side in ("src", "tgt"):
            assert np.array_equal(loaded.sequences(split, side).flat, streamed.sequences(split, side).flat)
    assert len(streamed.sequences("valid", "src")) == 10
