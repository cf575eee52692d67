"""Cleaning: normalise text, drop bad rows, and count what each filter dropped.

A row is one sequence (monolingual) or one aligned pair (parallel; both sides are kept or dropped together).
Filters run in this order and a dropped row is counted once, under the first filter that caught it:
  empty       a side is empty after normalisation                                     (every split)
  duplicate   the same row appeared earlier in the split (optional, --dedupe; Deduper)  (train only)
  too_long    a side has more than max_length tokens                                  (train only, parallel)
  ratio       longer side / shorter side > max_ratio, in tokens                       (train only, parallel)
Valid and test sets keep everything but empty rows, so that scores stay comparable with published ones.
The two token filters run after the tokenizer is trained, so lengths are in the units the model sees.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from typing import Sequence

import numpy as np
from tokenizers import normalizers

# the saved tokenizer's own lowercasing (Rust's per-character lowercase), so that prepared text and text encoded
# later agree exactly (Python's str.lower differs from it, e.g. on a word-final capital sigma)
LOWERCASE = normalizers.Lowercase()

COLUMNS = ("input", "empty", "duplicate", "too_long", "ratio", "kept")
_LINE_BREAKS = re.compile(r"\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def new_counts(n: int = 0) -> dict[str, int]:
    """One split's row of the cleaning report; "kept" starts at the input count and drops with each filter."""
    counts = dict.fromkeys(COLUMNS, 0)
    counts["input"] = counts["kept"] = n
    return counts


def add_input(counts: dict[str, int], n: int) -> None:
    """`n` more rows read (a split is cleaned chunk by chunk)."""
    counts["input"] += n
    counts["kept"] += n


def normalize(
    texts: Sequence[str], nfc: bool = True, strip: bool = True, one_line: bool = True, lowercase: bool = False
) -> list[str]:
    """Unicode NFC, lowercased (`lowercase`), line breaks inside a row turned into spaces (`one_line`),
    surrounding whitespace stripped.

    `one_line` keeps the {split}.{side}.txt files aligned with the sequences; document and paragraph modes turn it
    off (their newlines are part of the text).
    """
    out = []
    for t in texts:
        if nfc:
            t = unicodedata.normalize("NFC", t)
        if lowercase:
            t = LOWERCASE.normalize_str(t)
        if one_line:
            t = _LINE_BREAKS.sub(" ", t)
        if strip:
            t = t.strip()
        out.append(t)
    return out


def _take(cols: list[list], keep: list[int]) -> list[list]:
    return [[col[i] for i in keep] for col in cols]


def drop_empty(cols: list[list[str]], counts: dict[str, int]) -> list[list[str]]:
    """Drop rows where any side is empty or only whitespace."""
    keep = [i for i, row in enumerate(zip(*cols)) if all(s.strip() for s in row)]
    return _record(cols, keep, counts, "empty")


class Deduper:
    """Drops exact repeats of an earlier row (the whole pair for parallel data), chunk after chunk.

    It remembers 8 bytes per distinct row: 64-bit BLAKE2b hashes (not the rows, and not Python's salted hash(): the
    same corpus always keeps the same rows), in sorted runs whose sizes at least double from one to the next, so
    that adding a chunk costs O(log n) per row however long the corpus (one sorted array would be copied whole at
    every chunk). Two distinct rows share a hash with probability about n^2 / 2^65: one in 2 million for 4 million
    rows.
    """

    def __init__(self):
        self.runs: list[np.ndarray] = []  # sorted uint64 arrays, largest first

    def __call__(self, cols: list[list[str]], counts: dict[str, int]) -> list[list[str]]:
        hashes = np.fromiter(
            (int.from_bytes(hashlib.blake2b("\0".join(row).encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                            "little") for row in zip(*cols)),
            dtype=np.uint64, count=len(cols[0]),
        )
        new = np.zeros(len(hashes), dtype=bool)
        new[np.unique(hashes, return_index=True)[1]] = True  # the first of each hash within the chunk ...
        for run in self.runs:  # ... that no earlier chunk had
            at = np.minimum(np.searchsorted(run, hashes), len(run) - 1)
            new &= run[at] != hashes
        keep = np.flatnonzero(new)
        self._add(np.sort(hashes[keep]))
        return _record(cols, keep.tolist(), counts, "duplicate")

    def _add(self, run: np.ndarray) -> None:
        if not len(run):
            return
        while self.runs and len(self.runs[-1]) <= 2 * len(run):
            run = np.sort(np.concatenate([self.runs.pop(), run]), kind="stable")  # two sorted runs: a merge
        self.runs.append(run)

    def __len__(self) -> int:
        return sum(len(run) for run in self.runs)


def length_filter(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    counts: dict[str, int],
    max_length: int = 0,
    max_ratio: float = 0.0,
) -> list[int]:
    """Indices of pairs to keep: no side longer than `max_length` tokens, length ratio at most `max_ratio`.

    0 turns a filter off. ratio = max(|x|, |y|) / max(1, min(|x|, |y|)), so a 1-token vs 4-token pair has ratio 4.
    """
    keep = []
    for i, (x, y) in enumerate(zip(src_ids, tgt_ids)):
        lx, ly = len(x), len(y)
        if max_length and max(lx, ly) > max_length:
            counts["too_long"] += 1
        elif max_ratio and max(lx, ly) / max(1, min(lx, ly)) > max_ratio:
            counts["ratio"] += 1
        else:
            keep.append(i)
    counts["kept"] -= len(src_ids) - len(keep)
    return keep


def _record(cols: list[list], keep: list[int], counts: dict[str, int], reason: str) -> list[list]:
    dropped = len(cols[0]) - len(keep)
    counts[reason] += dropped
    counts["kept"] -= dropped
    return _take(cols, keep) if dropped else cols
