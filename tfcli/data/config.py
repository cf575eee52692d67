"""The settings of `tfcli prepare` (the `prepare:` section of a config file): each key and its default in one
place, importable without torch or the pipeline (tfcli/data/prepare.py runs it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, Optional

from tfcli.config import from_dict, load_config_file, override
from tfcli.errors import ConfigError


@dataclass
class PrepareConfig:
    """Every `tfcli prepare` option. CLI flags and the `prepare:` section of a --config file fill it."""

    out: Optional[str] = None  # the prepared directory to write
    # parallel text: two aligned files per split
    src: Optional[str] = None
    tgt: Optional[str] = None
    valid_src: Optional[str] = None
    valid_tgt: Optional[str] = None
    test_src: Optional[str] = None
    test_tgt: Optional[str] = None
    # several directions into one directory (a multilingual model): each split's files PREFIX.LANG, or fairseq's
    # PREFIX.SRC-TGT.LANG; each source starts with its target language's tag, >>xx<< (tfcli/data/languages.py)
    lang_pairs: list[str] = field(default_factory=list)  # de-en, en-fr, ... (a comma list on the command line)
    # with --tokenizer-from a checkpoint: languages its vocabulary gains, CODE[=LIKE] (the new rows start as LIKE's,
    # or as the mean of the model's rows): tfcli/data/conventions.py
    add_languages: list[str] = field(default_factory=list)
    train_prefix: Optional[str] = None
    valid_prefix: Optional[str] = None
    test_prefix: Optional[str] = None
    # several training corpora in one directory, each drawn from in proportion to its weight (an earlier domain's
    # data replayed beside a new one's): NAME=SRC,TGT[,WEIGHT] (weight 1 by default); and a valid set per corpus,
    # NAME=SRC,TGT, each validated and reported alone
    corpora: list[str] = field(default_factory=list)
    valid_corpora: list[str] = field(default_factory=list)
    # one file per split: TSV (parallel), JSONL (parallel with src_field/tgt_field, else monolingual), or text
    train: Optional[str] = None
    valid: Optional[str] = None
    test: Optional[str] = None
    format: Literal["auto", "tsv", "jsonl", "text"] = "auto"  # auto: from the extension (.tsv, .jsonl/.json)
    src_field: Optional[str] = None  # JSONL/dataset: dotted path (translation.de); TSV: column number
    tgt_field: Optional[str] = None
    text_field: str = "text"  # monolingual JSONL/dataset field; "messages": conversations, for a chat model
    mono_mode: Literal["line", "paragraph", "document"] = "line"
    valid_ratio: float = 0.0  # no valid split given: the LAST fraction of train becomes valid (as nanoGPT does)
    # datasets.load_dataset: a hub name, or a packaged builder (json, text, ...) on local --data-files
    dataset: Optional[str] = None
    dataset_config: Optional[str] = None
    data_files: list[str] = field(default_factory=list)  # SPLIT=PATH
    dataset_splits: list[str] = field(default_factory=list)  # SPLIT=DATASET_SPLIT, e.g. valid=validation
    streaming: bool = False
    # cleaning
    nfc: bool = True
    lowercase: bool = False  # every side lowercased, and the saved tokenizers lowercase what they encode
    strip: bool = True
    drop_empty: bool = True  # keep them for WikiText-style evaluation (an empty line still counts one </s>)
    dedupe: bool = False
    max_length: int = 256  # tokens per side, train pairs; 0 = off
    max_ratio: float = 3.0  # longer/shorter side in tokens, train pairs; 0 = off
    # tokenizer
    tokenizer: Literal["bpe", "unigram", "wordpiece", "bytelevel", "char"] = "bpe"
    vocab_size: int = 8000  # includes the 4 special tokens; a cap for char (every training character is kept)
    joint_vocab: bool = True  # one vocabulary for source and target (parallel data)
    tokenizer_from: Optional[str] = None  # reuse tokenizers (a tokenizer.json or .spm, prepared dir, checkpoint): no training
    tokenizer_sample: int = 0  # train the tokenizer on a random sample of this many train rows (0 = all of them)
    # input that is not UTF-8: strict (stop, naming file, line and column) or replace (U+FFFD for each bad byte)
    encoding_errors: Literal["strict", "replace"] = "strict"

    def validate(self) -> None:
        if self.vocab_size < 1:
            raise ConfigError(f"prepare.vocab_size: must be positive, got {self.vocab_size}")
        if not 0 <= self.valid_ratio < 1:
            raise ConfigError(f"prepare.valid_ratio: must be in [0, 1), got {self.valid_ratio}")
        if self.max_length < 0:
            raise ConfigError(f"prepare.max_length: must be >= 0 (0 = off), got {self.max_length}")
        if self.max_ratio and self.max_ratio < 1:
            raise ConfigError(f"prepare.max_ratio: must be >= 1 (0 = off), got {self.max_ratio}")
        if self.tokenizer_sample < 0:
            raise ConfigError(f"prepare.tokenizer_sample: must be >= 0 (0 = all rows), got {self.tokenizer_sample}")
        if not self.text_field:
            raise ConfigError("prepare.text_field: must not be empty")
        if self.corpora or self.valid_corpora:
            self.corpus_files()
        if self.lang_pairs:
            from tfcli.data.languages import parse_directions

            self.lang_pairs = parse_directions(self.lang_pairs, "prepare.lang_pairs")


    def corpus_files(self) -> dict[str, tuple[str, str]]:
        """{split name (train.NAME, valid.NAME): (source file, target file)} of `corpora` and `valid_corpora`."""
        files = {}
        for key, split in (("corpora", "train"), ("valid_corpora", "valid")):
            for name, src, tgt, _ in (parse_corpus(spec, key) for spec in getattr(self, key)):
                if f"{split}.{name}" in files:
                    raise ConfigError(f"prepare.{key}: {name} is named twice")
                files[f"{split}.{name}"] = (src, tgt)
        if self.valid_corpora and not self.corpora:
            raise ConfigError("prepare.valid_corpora: valid sets per corpus go with training corpora (--corpus)")
        return files

    def corpus_weights(self) -> dict[str, float]:
        return {name: weight for name, _, _, weight in (parse_corpus(s, "corpora") for s in self.corpora)}


def parse_corpus(spec: str, key: str) -> tuple[str, str, str, float]:
    """NAME=SRC,TGT[,WEIGHT] -> (name, src, tgt, weight)."""
    name, eq, files = str(spec).partition("=")
    parts = files.split(",")
    usage = f"prepare.{key}: {spec!r}: expected NAME=SRC,TGT" + (",WEIGHT" if key == "corpora" else "")
    if not eq or not name.replace("_", "").replace("-", "").isalnum() or len(parts) not in (2, 3 if key == "corpora" else 2):
        raise ConfigError(usage + " (a name of letters, digits, - and _)")
    try:
        weight = float(parts[2]) if len(parts) == 3 else 1.0
    except ValueError:
        raise ConfigError(usage + f": the weight {parts[2]!r} is not a number") from None
    if not weight > 0:
        raise ConfigError(f"prepare.{key}: {name}: the weight must be positive, got {parts[2]}")
    return name, parts[0], parts[1], weight


def prepare_config(path: os.PathLike | str | None = None, **flags) -> PrepareConfig:
    """Settings from a config file's `prepare:` section (if any), then the non-None command-line flags."""
    cfg = PrepareConfig()
    if path is not None:
        cfg = from_dict(PrepareConfig, load_config_file(path).get("prepare") or {}, "prepare")
    return override(cfg, "prepare", **flags)
