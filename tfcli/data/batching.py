"""Batching: where <s> and </s> are added, and token-based, length-bucketed batches.

Conventions (shared by training, evaluation and decoding):
  source      x_1 .. x_n </s>
  target in   <s> y_1 .. y_m        (teacher forcing: the decoder input)
  target out  y_1 .. y_m </s>       (what the model must predict)
  LM stream   </s> s_1 </s> s_2 </s> .. s_n </s>   (every text starts after a </s>, as a prompt does)
Padding is PAD_ID on the right.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from tfcli.specials import BOS_ID, EOS_ID, PAD_ID


def lm_stream(flat: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """A language model's texts (ids `flat`, text i at flat[offsets[i]:offsets[i+1]]) as one stream
    </s> s_1 </s> s_2 </s> ... s_n </s>, in flat's dtype: training, perplexity and lm-generate (which starts every
    prompt with </s>) all see a text begin after a </s>."""
    body = np.insert(flat, offsets[1:], EOS_ID)  # one </s> after each text (empty ones included)
    return np.concatenate([np.array([EOS_ID], dtype=flat.dtype), body])


def pad(seqs: Sequence[Sequence[int]], pad_id: int = PAD_ID, length: int | None = None) -> torch.Tensor:
    """Right-pad a list of id sequences into a (B, T) int64 tensor; T: the longest, or `length` if that is more."""
    T = max(max((len(s) for s in seqs), default=0), length or 0)
    out = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return torch.from_numpy(out)


def source_ids(ids: Sequence[int], max_len: int | None = None) -> list[int]:
    """x_1 .. x_n </s>, truncated to max_len tokens in all."""
    ids = list(ids)
    if max_len is not None:
        ids = ids[: max_len - 1]
    return ids + [EOS_ID]


def collate_seq2seq(src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]], max_len: int | None = None):
    """(src, tgt_in, tgt_out) tensors for teacher forcing."""
    src_b = pad([source_ids(s, max_len) for s in src])
    tgt = [list(t)[: max_len - 1] if max_len else list(t) for t in tgt]
    tgt_in = pad([[BOS_ID] + t for t in tgt])
    tgt_out = pad([t + [EOS_ID] for t in tgt])
    return src_b, tgt_in, tgt_out


def token_batches(
    lengths: np.ndarray,
    max_tokens: int,
    max_sentences: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
) -> list[np.ndarray]:
    """Group example indices into batches of at most `max_tokens` padded tokens (batch size x longest example).

    Examples are sorted by length (ties broken by a seeded shuffle) so each batch holds similar lengths and padding
    stays small; with `shuffle`, the order of the batches is shuffled by (seed, epoch) — deterministic, so a resumed
    run sees the same batches as an uninterrupted one.
    """
    lengths = np.asarray(lengths)
    n = len(lengths)
    if n == 0:
        return []
    rng = np.random.default_rng([seed, epoch])
    tiebreak = rng.permutation(n) if shuffle else np.arange(n)
    order = tiebreak[np.argsort(lengths[tiebreak], kind="stable")]
    batches, start, longest = [], 0, 0
    for i, idx in enumerate(order):
        longest_if_added = max(longest, int(lengths[idx]))
        size = i - start + 1
        if size > 1 and (longest_if_added * size > max_tokens or (max_sentences and size > max_sentences)):
            batches.append(order[start:i])
            start, longest_if_added = i, int(lengths[idx])
        longest = longest_if_added
    batches.append(order[start:])
    if shuffle:
        perm = rng.permutation(len(batches))
        batches = [batches[j] for j in perm]
    return batches


def width_groups(lengths: Sequence[int], max_tokens: int, max_sentences: int,
                 width: int = 16) -> list[tuple[np.ndarray, int, int]]:
    """For continuous batching (a fixed-shape decoder, whose places new sentences take as others finish): the
    indices sorted by length, in groups of one padded width (lengths rounded up to a multiple of `width`), as
    (indices, padded width, places): min(max_sentences, max_tokens // padded width, the group's size) places, so
    that a group's padded source tokens in flight stay within max_tokens. Each width gives one shape."""
    lengths = np.asarray(lengths)
    order = np.argsort(lengths, kind="stable")
    padded = -(-lengths[order] // width) * width
    groups = []
    for w in np.unique(padded):
        idx = order[padded == w]
        groups.append((idx, int(w), max(1, min(max_sentences, max_tokens // int(w), len(idx)))))
    return groups
