"""The prepared directory: token ids in memory-mapped arrays, plus meta.json.

    PREP/
      meta.json                  format, kind (parallel|mono), splits with counts, vocab sizes, tokenizer files,
                                 settings, input file hashes, tfcli version
      tokenizer.src.json         Hugging Face `tokenizers` files (a joint vocabulary: both names hold the same model)
      tokenizer.tgt.json         (a language model has only tgt)
      {split}.{side}.bin         all token ids of that split/side back to back (uint16 if vocab < 65536, else uint32);
                                 no <s> or </s>: batching adds them
      {split}.{side}.idx         int64 offsets, count + 1 of them: sequence i is bin[idx[i]:idx[i+1]]
      {split}.{side}.txt         the cleaned text (valid/test only), e.g. references for BLEU during training

Sides are `src` and `tgt` for parallel data; a language model's monolingual data uses `tgt` alone. A multilingual
directory (`prepare --lang-pairs`) has one split per direction, `train.de-en`, `valid.de-en`, ..., meta.json lists
the directions, and each source starts with its target language's tag (tfcli/data/languages.py).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

import tfcli
from tfcli.errors import TfcliError
from tfcli.io import fault_point
from tfcli.specials import UNK_ID

FORMAT = "tfcli-prepared"
FORMAT_VERSION = 1


def dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 2**16 else np.dtype(np.uint32)


class SequenceWriter:
    """Writes one split/side's id sequences as {split}.{side}.bin/.idx, chunk by chunk, in memory bounded by the
    chunk: the ids go to .bin and the running offsets to .idx as they come. `close()` returns what meta.json records:
    {count, tokens, dtype, unk_rate}."""

    def __init__(self, directory: Path, split: str, side: str, vocab_size: int):
        self.dtype = dtype_for(vocab_size)
        self.count = self.tokens = self.unk = 0
        self._files = []
        for suffix in ("bin", "idx"):
            fault_point(f"{split}.{side}.{suffix}")
            self._files.append(open(directory / f"{split}.{side}.{suffix}", "wb"))
        self._bin, self._idx = self._files
        self._write(self._idx, np.zeros(1, dtype=np.int64))  # offsets start at 0

    def append(self, seqs: Sequence[Sequence[int]]) -> None:
        lengths = np.fromiter(map(len, seqs), dtype=np.int64, count=len(seqs))
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=self.dtype, count=int(lengths.sum()))
        self._write(self._bin, flat)
        self._write(self._idx, self.tokens + np.cumsum(lengths))
        self.count += len(seqs)
        self.tokens += len(flat)
        self.unk += int(np.count_nonzero(flat == UNK_ID))

    @staticmethod
    def _write(f, array: np.ndarray) -> None:
        f.write(memoryview(array))  # file.write, not ndarray.tofile, whose errors carry no errno

    def close(self) -> dict:
        for f in self._files:
            f.close()
        unk_rate = round(self.unk / self.tokens, 6) if self.tokens else 0.0
        return {"count": self.count, "tokens": self.tokens, "dtype": self.dtype.name, "unk_rate": unk_rate}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in self._files:
            f.close()


class Sequences:
    """One split/side: `len()`, `[i]` -> np.ndarray of ids, `.lengths`, and `.flat` (all ids, memory-mapped)."""

    def __init__(self, directory: Path, split: str, side: str, dtype: str):
        bin_path, idx_path = directory / f"{split}.{side}.bin", directory / f"{split}.{side}.idx"
        for p in (bin_path, idx_path):
            if not p.exists():
                raise TfcliError(f"{p}: missing from the prepared directory; re-run `tfcli prepare --force`")
        self.offsets = np.fromfile(idx_path, dtype=np.int64)
        size = bin_path.stat().st_size
        itemsize = np.dtype(dtype).itemsize
        if len(self.offsets) == 0 or self.offsets[-1] * itemsize != size:
            raise TfcliError(f"{bin_path}: size does not match {idx_path.name}; the prepared directory is corrupt")
        self.flat = np.memmap(bin_path, dtype=dtype, mode="r") if size else np.zeros(0, dtype=dtype)
        self.lengths = np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]


class PreparedData:
    """Read access to a prepared directory."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        meta_path = self.path / "meta.json"
        if not meta_path.exists():
            raise TfcliError(f"{self.path}: not a prepared directory (no meta.json); run `tfcli prepare` first")
        try:
            self.meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TfcliError(f"{meta_path}: corrupt ({e}); re-run `tfcli prepare --force`") from None
        if self.meta.get("format") != FORMAT:
            raise TfcliError(f"{meta_path}: not a tfcli prepared directory")
        if int(self.meta.get("format_version", 0)) > FORMAT_VERSION:
            raise TfcliError(f"{self.path}: prepared by a newer tfcli ({self.meta.get('tfcli_version')}); upgrade tfcli")

    @property
    def kind(self) -> str:
        return self.meta["kind"]  # "parallel" or "mono"

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    @property
    def directions(self) -> list[str]:
        """A multilingual directory's directions (de-en, ...), each split one per direction; [] for one pair."""
        return list(self.meta.get("directions", []))

    @property
    def parts(self) -> list[str]:
        """The names a split is stored under parts of: a multilingual directory's directions, or the corpora (the
        training corpora, then valid and test sets named otherwise)."""
        if self.directions or not self.meta.get("corpora"):
            return self.directions
        named = [s.split(".", 1)[1] for s in self.meta["splits"] if "." in s]
        return list(dict.fromkeys([*self.meta["corpora"], *named]))

    def split_names(self, split: str) -> list[str]:
        """The stored splits that make up `split`: itself, or one per direction or corpus (train.de-en, ...) that
        it has."""
        if split in self.meta["splits"] or not self.parts:
            return [split]
        return [f"{split}.{d}" for d in self.parts if f"{split}.{d}" in self.meta["splits"]] or [split]

    def vocab_size(self, side: str) -> int:
        return int(self.meta["vocab"][side])

    def tokenizer_file(self, side: str) -> Path:
        return self.path / self.meta["tokenizers"][side]

    def tokenizer_files(self) -> dict[str, Path]:
        return {side: self.path / name for side, name in self.meta["tokenizers"].items()}

    def source_lengths(self) -> dict | None:
        """The training sources' lengths in tokens (with </s>): {"p99": the 99th percentile, "max": the longest},
        what a translator's `--split-sentences auto` holds a line to; None for a language model's data."""
        if self.kind != "parallel":
            return None
        lengths = np.concatenate([self.sequences(name, "src").lengths for name in self.split_names("train")])
        if not len(lengths):
            return None
        return {"p99": int(np.percentile(lengths, 99)) + 1, "max": int(lengths.max()) + 1}

    def sequences(self, split: str, side: str) -> Sequences:
        if split not in self.meta["splits"]:
            raise TfcliError(f"{self.path}: has no '{split}' split (it has: {', '.join(self.splits)})")
        info = self.meta["splits"][split].get(side)
        if info is None:
            raise TfcliError(f"{self.path}: split '{split}' has no '{side}' side")
        seqs = Sequences(self.path, split, side, info["dtype"])
        if len(seqs) != info.get("count", len(seqs)) or len(seqs.flat) != info.get("tokens", len(seqs.flat)):
            raise TfcliError(
                f"{self.path / f'{split}.{side}.idx'}: {len(seqs)} sequences and {len(seqs.flat)} tokens, but "
                f"meta.json says {info['count']} and {info['tokens']}: changed after prepare; re-run `tfcli prepare --force`"
            )
        return seqs

    def text_file(self, split: str, side: str) -> Path | None:
        p = self.path / f"{split}.{side}.txt"
        return p if p.exists() else None


def new_meta(kind: str, **fields) -> dict:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "tfcli_version": tfcli.__version__, "kind": kind, **fields}
