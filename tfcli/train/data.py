"""Training batches from a prepared directory: a deterministic list of batches per epoch, and collation.

Each epoch's batch list is a pure function of (seed, epoch), so a run resumed at position i of epoch e sees exactly
the batches an uninterrupted run would, and each of several processes can take its own share of the same list.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

import numpy as np
import torch

from tfcli.data.batching import collate_seq2seq, lm_stream, token_batches
from tfcli.data.prepared import PreparedData
from tfcli.errors import TfcliError
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID


@dataclass
class Batch:
    """One micro-batch. `src` is None for a language model; `inputs`/`targets` are the decoder's in/out."""

    src: torch.Tensor | None
    inputs: torch.Tensor
    targets: torch.Tensor
    src_tokens: int  # non-padding source tokens (incl. </s>)
    tgt_tokens: int  # non-padding target tokens (what the loss is averaged over)
    slots: int  # all positions in the batch tensors, padding included (for the padding fraction)
    prefix: torch.Tensor | None = None  # (B,) a decoder-only translator's prompt lengths (PairData), None: none
    # (query, key) pairs scored per attention layer, summed over sentences, for FLOPs: S^2, T^2 and T*S
    src_pairs: int = 0
    tgt_pairs: int = 0
    cross_pairs: int = 0

    def to(self, device: torch.device) -> "Batch":
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return dataclasses.replace(self, src=move(self.src), inputs=move(self.inputs), targets=move(self.targets),
                                   prefix=move(self.prefix))


def round_up(n, multiple: int):
    return -(-n // multiple) * multiple


def to_bucket(batch: Batch, rows: int, length: int) -> Batch:
    """`batch` padded to `rows` x `length` (a shape bucket): positions past the end are padding, and the added rows
    copy the first row's inputs (an all-padding source would give NaN attention) with padding targets, so that
    they add nothing to the loss or its gradient. The token counts stay the real ones; `slots` counts the padding."""
    def pad(t: torch.Tensor | None, fill_rows_from_first: bool) -> torch.Tensor | None:
        if t is None:
            return None
        t = torch.nn.functional.pad(t, (0, length - t.size(1)), value=PAD_ID)
        extra = rows - t.size(0)
        if extra <= 0:
            return t
        more = t[:1].expand(extra, -1) if fill_rows_from_first else torch.full((extra, length), PAD_ID)
        return torch.cat([t, more])

    src, inputs, targets = pad(batch.src, True), pad(batch.inputs, True), pad(batch.targets, False)
    prefix = batch.prefix
    if prefix is not None and rows > prefix.size(0):
        prefix = torch.cat([prefix, prefix[:1].expand(rows - prefix.size(0))])
    slots = (src.numel() if src is not None else 0) + targets.numel()
    return dataclasses.replace(batch, src=src, inputs=inputs, targets=targets, slots=slots, prefix=prefix)


class Joined:
    """Several splits' sequences of one side as one (a multilingual directory's directions, one after another)."""

    def __init__(self, parts: list):
        self.parts = parts
        self.starts = np.cumsum([0] + [len(p) for p in parts])
        self.lengths = np.concatenate([p.lengths for p in parts])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        k = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.parts[k][i - int(self.starts[k])]


class ParallelData:
    """Sentence pairs, batched by tokens in length buckets. With `pad_multiple` > 1 every batch is padded to a
    shape bucket (`to_bucket`): its lengths up to a multiple of pad_multiple (at most max_len), its rows up to what
    max_tokens allows at that length. Several splits (a multilingual directory's directions) are read as one, each
    epoch drawing from them by `temperature` (`epoch_rows`)."""

    kind = "seq2seq"

    def __init__(self, prepared: PreparedData, split: str | list[str], max_len: int, max_tokens: int,
                 max_sentences: int, seed: int, bpe_dropout: float = 0.0, pad_multiple: int = 1,
                 temperature: float = 1.0, weights: list[float] | None = None):
        splits = [split] if isinstance(split, str) else list(split)
        parts = {side: [prepared.sequences(s, side) for s in splits] for side in ("src", "tgt")}
        self.src, self.tgt = (p[0] if len(p) == 1 else Joined(p) for p in parts.values())
        self.counts = np.array([len(p) for p in parts["src"]])
        if len(self.src) != len(self.tgt):
            raise TfcliError(f"{prepared.path}: split '{', '.join(splits)}' has {len(self.src)} source but "
                             f"{len(self.tgt)} target sentences; the prepared directory is corrupt")
        self.temperature, self.weights = temperature, weights
        self.tagged = bool(prepared.directions)  # each source starts with a language tag
        self.max_len, self.max_tokens, self.max_sentences, self.seed = max_len, max_tokens, max_sentences, seed
        self.pad_multiple = pad_multiple
        # lengths as batched: source x.. </s>, target <s> y.. (or y.. </s>), both cut at max_len
        self.src_len = np.minimum(self.src.lengths + 1, max_len)
        self.tgt_len = np.minimum(self.tgt.lengths + 1, max_len)
        self.truncated = int(((self.src.lengths + 1 > max_len) | (self.tgt.lengths + 1 > max_len)).sum())
        # BPE-dropout: every sentence re-cut at the start of each epoch, and the epoch batched by the new lengths
        # (the stored ones would misjudge them: padding); sentences holding <unk> keep their ids (their text does
        # not round-trip)
        self.dropout, self.cut, self.cut_epoch = None, None, None
        if bpe_dropout > 0:
            from tfcli.data.tokenizer import BpeDropout, load_tokenizer

            self.dropout = {side: (load_tokenizer(prepared.tokenizer_file(side)),
                                   BpeDropout(load_tokenizer(prepared.tokenizer_file(side)), bpe_dropout))
                            for side in ("src", "tgt")}

    def __len__(self) -> int:
        return len(self.src)

    def _recut(self, side: str, epoch: int) -> list[list[int]]:
        """This epoch's cut of every sentence of one side: a function of (seed, epoch, sentence), so a resumed run
        and every process of a distributed one see the same."""
        tok, dropout = self.dropout[side]
        seqs = self.src if side == "src" else self.tgt
        cut = []
        keep = 1 if self.tagged and side == "src" else 0  # the language tag stays as it is
        for i in range(len(seqs)):
            ids = [int(t) for t in seqs[i]]
            if UNK_ID not in ids:
                rng = np.random.default_rng([self.seed, epoch, i, side == "tgt"])
                ids = ids[:keep] + dropout.encode(tok.decode(ids[keep:], skip_special_tokens=False), rng)
            cut.append(ids)
        return cut

    def epoch_rows(self, epoch: int) -> np.ndarray | None:
        """The rows epoch `epoch` trains on, or None for every row once. With several splits (directions) of n_d
        rows and temperature T, direction d gets N * p_d of the epoch's N = sum(n_d) rows, p_d proportional to
        n_d^(1/T), or to its corpus's weight where `weights` are given: whole passes over its rows in a seeded
        order, then a seeded part of one more (a function of (seed, epoch), so that a resumed run sees the same)."""
        n = self.counts
        if len(n) < 2 or (self.weights is None and self.temperature == 1):
            return None
        p = np.asarray(self.weights, dtype=np.float64) if self.weights is not None else n ** (1 / self.temperature)
        want = np.maximum(np.round(p / p.sum() * n.sum()).astype(np.int64), 1)
        if (want == n).all():  # balanced directions: every row once, as without sampling
            return None
        rng = np.random.default_rng([self.seed, epoch, 1])
        starts = np.cumsum([0, *n[:-1]])
        picks = []
        for start, count, m in zip(starts, n, want):
            whole, rest = divmod(int(m), int(count))
            picks += [start + rng.permutation(count) for _ in range(whole)] + [start + rng.permutation(count)[:rest]]
        return np.concatenate(picks)

    def batches(self, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
        lengths = self._epoch_lengths(epoch)
        if self.pad_multiple > 1:  # batched at their bucket's length, so that a batch fits its bucket's rows
            lengths = np.minimum(round_up(lengths, self.pad_multiple), self.max_len)
        rows = self.epoch_rows(epoch) if shuffle else None
        if rows is None:
            return token_batches(lengths, self.max_tokens, self.max_sentences or None, shuffle, self.seed, epoch)
        return [rows[b] for b in token_batches(lengths[rows], self.max_tokens, self.max_sentences or None, shuffle,
                                               self.seed, epoch)]

    def _epoch_lengths(self, epoch: int) -> np.ndarray:
        """What each pair takes in a batch in epoch `epoch` (BPE-dropout cuts each epoch anew)."""
        src_len, tgt_len = self.src_len, self.tgt_len
        if self.dropout is not None:
            if self.cut_epoch != epoch:
                self.cut, self.cut_epoch = {side: self._recut(side, epoch) for side in ("src", "tgt")}, epoch
            src_len = np.minimum(np.array([len(x) for x in self.cut["src"]]) + 1, self.max_len)
            tgt_len = np.minimum(np.array([len(x) for x in self.cut["tgt"]]) + 1, self.max_len)
        return self._lengths(src_len, tgt_len)

    def _lengths(self, src_len: np.ndarray, tgt_len: np.ndarray) -> np.ndarray:
        """What a pair takes in a batch, from its source and target lengths as batched."""
        return np.maximum(src_len, tgt_len)

    def _pairs(self, idx: np.ndarray) -> tuple[list, list]:
        """The pairs `idx` (this epoch's BPE-dropout cut where there is one)."""
        if self.cut is not None:
            return [self.cut["src"][i] for i in idx], [self.cut["tgt"][i] for i in idx]
        return [self.src[i] for i in idx], [self.tgt[i] for i in idx]

    def collate(self, idx: np.ndarray) -> Batch:
        srcs, tgts = self._pairs(idx)
        if self.cut is not None:
            s = np.minimum(np.array([len(x) for x in srcs]) + 1, self.max_len)
            t = np.minimum(np.array([len(x) for x in tgts]) + 1, self.max_len)
        else:
            s, t = self.src_len[idx], self.tgt_len[idx]
        src, tgt_in, tgt_out = collate_seq2seq(srcs, tgts, self.max_len)
        batch = Batch(
            src, tgt_in, tgt_out, int(s.sum()), int(t.sum()), src.numel() + tgt_out.numel(),
            src_pairs=int((s * s).sum()), tgt_pairs=int((t * t).sum()), cross_pairs=int((s * t).sum()),
        )
        return self._bucketed(batch, max(src.size(1), tgt_out.size(1)), len(idx))

    def _bucketed(self, batch: Batch, length: int, n: int) -> Batch:
        """With pad_multiple > 1, `batch` (`n` rows, `length` long) padded to its shape bucket: the length up to a
        multiple of pad_multiple (at most max_len), the rows up to what max_tokens allows at that length."""
        if self.pad_multiple <= 1:
            return batch
        length = min(round_up(length, self.pad_multiple), self.max_len)
        rows = max(self.max_tokens // length, 1)
        rows = min(rows, self.max_sentences) if self.max_sentences else rows
        return to_bucket(batch, max(rows, n), length)


class PairData(ParallelData):
    """Sentence pairs for a decoder-only translator: each pair one sequence, batched as ParallelData batches,

        </s> x_1 .. x_m  sep  y_1 .. y_n </s>

    sep: the target's language tag where the prepared sources carry one (multilingual data: taken from the source's
    front), else <s>. The prompt is everything up to sep; the loss is on y_1 .. y_n </s> only (the targets before
    are padding), and `prefix` holds each prompt's length, which a model with prefix_attention sees both ways. A
    pair longer than max_len loses the end of its source first, keeping at least half of max_len of it."""

    kind = "lm"

    def _lengths(self, src_len: np.ndarray, tgt_len: np.ndarray) -> np.ndarray:
        return np.minimum(src_len + tgt_len + (0 if self.tagged else 1), self.max_len)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        total = self.src.lengths + self.tgt.lengths + (1 if self.tagged else 2)
        self.truncated = int((total > self.max_len).sum())

    def sequence(self, src, tgt) -> tuple[list[int], int]:
        """(the pair's ids, its prompt's length), cut to max_len + 1 ids (max_len inputs)."""
        src, tgt = [int(x) for x in src], [int(x) for x in tgt]
        sep = src.pop(0) if self.tagged and src else BOS_ID
        room = self.max_len - 2  # besides </s> before, sep (inputs) and </s> after (a target)
        keep = max(room - len(tgt), room // 2)
        src = src[:keep]
        tgt = tgt[: room - len(src)]
        return [EOS_ID, *src, sep, *tgt, EOS_ID], len(src) + 2

    def prompt(self, src) -> list[int]:
        """A source's prompt, as translate writes it: </s> x_1 .. x_m sep."""
        ids, p = self.sequence(src, [])
        return ids[:p]

    def collate(self, idx: np.ndarray) -> Batch:
        pairs = [self.sequence(x, y) for x, y in zip(*self._pairs(idx))]
        T = max(len(ids) for ids, _ in pairs) - 1
        inputs = torch.full((len(pairs), T), PAD_ID, dtype=torch.long)
        targets = torch.full((len(pairs), T), PAD_ID, dtype=torch.long)
        for row, (ids, p) in enumerate(pairs):
            inputs[row, : len(ids) - 1] = torch.tensor(ids[:-1])
            targets[row, p - 1 : len(ids) - 1] = torch.tensor(ids[p:])
        lengths = np.array([len(ids) - 1 for ids, _ in pairs])
        prefix = torch.tensor([p for _, p in pairs])
        # (src_tokens: the prompts' positions that predict nothing; with the targets, every real input position)
        batch = Batch(None, inputs, targets, int(prefix.sum()) - len(pairs), int((targets != PAD_ID).sum()),
                      inputs.numel(),
                      tgt_pairs=int((lengths * lengths).sum()), prefix=prefix)
        return self._bucketed(batch, T, len(idx))


class ChatData(ParallelData):
    """A chat model's conversations (prepared kind "chat": tfcli/data/conventions.py), each one sequence of ids as
    its template renders it, the loss on the tokens its mask marks (the replies) and the targets elsewhere
    padding; batched by tokens as ParallelData batches pairs, drawn from several directions or corpora as it draws.
    A conversation over max_len + 1 ids loses its end."""

    kind = "lm"

    def __init__(self, prepared: PreparedData, split: str | list[str], max_len: int, max_tokens: int,
                 max_sentences: int, seed: int, pad_multiple: int = 1, temperature: float = 1.0,
                 weights: list[float] | None = None):
        splits = [split] if isinstance(split, str) else list(split)
        parts = {side: [prepared.sequences(s, side) for s in splits] for side in ("tgt", "mask")}
        self.ids, self.mask = (p[0] if len(p) == 1 else Joined(p) for p in parts.values())
        self.src = self.ids  # (len(): the conversations)
        self.counts = np.array([len(p) for p in parts["tgt"]])
        self.temperature, self.weights, self.dropout = temperature, weights, None
        self.max_len, self.max_tokens, self.max_sentences, self.seed = max_len, max_tokens, max_sentences, seed
        self.pad_multiple = pad_multiple
        self.truncated = int((self.ids.lengths - 1 > max_len).sum())

    def _epoch_lengths(self, epoch: int) -> np.ndarray:
        return np.minimum(self.ids.lengths - 1, self.max_len)

    def collate(self, idx: np.ndarray) -> Batch:
        rows = [(np.asarray(self.ids[i][: self.max_len + 1], dtype=np.int64), self.mask[i][1 : self.max_len + 1])
                for i in idx]
        T = max(len(ids) for ids, _ in rows) - 1
        inputs = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
        targets = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
        for row, (ids, mask) in enumerate(rows):
            inputs[row, : len(ids) - 1] = torch.from_numpy(ids[:-1])
            targets[row, : len(ids) - 1] = torch.from_numpy(np.where(mask != 0, ids[1:], PAD_ID))
        lengths = np.array([len(ids) - 1 for ids, _ in rows])
        batch = Batch(None, inputs, targets, 0, int((targets != PAD_ID).sum()), inputs.numel(),
                      tgt_pairs=int((lengths * lengths).sum()))
        return self._bucketed(batch, T, len(idx))


class StreamData:
    """A language model's text as one stream of ids, </s> s_1 </s> s_2 ... </s> (batching.lm_stream), cut into blocks.

    A block holds block_len + 1 ids: inputs block[:-1], targets block[1:]. For training, each epoch starts the blocks
    at a seeded offset and shuffles them; for validation the whole stream is read in consecutive blocks (the last one
    shorter), so every token is scored once.
    """

    kind = "lm"

    def __init__(self, prepared: PreparedData, split: str, block_len: int, max_tokens: int, max_sentences: int, seed: int,
                 pad_multiple: int = 1):
        self.pad_multiple = pad_multiple  # > 1: every batch padded to batch_size rows and block_len (to_bucket)
        seqs = prepared.sequences(split, "tgt")
        self.stream = lm_stream(np.asarray(seqs.flat), seqs.offsets)
        self.block_len, self.seed = block_len, seed
        self.batch_size = max(1, max_tokens // block_len)
        if max_sentences:
            self.batch_size = min(self.batch_size, max_sentences)
        self.truncated = 0

    def __len__(self) -> int:
        return len(self.stream)

    def batches(self, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
        """Each batch: an array of (start, length) rows, one per block.

        Blocks advance by block_len, so consecutive blocks share one id: the last target of one is the first input
        of the next, and every id after the first is a target exactly once.
        """
        bl, total = self.block_len, len(self.stream)
        if shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(bl)) if total > 2 * (bl + 1) else 0
            starts = offset + bl * np.arange(max(0, (total - offset - 1) // bl))
            starts = starts[rng.permutation(len(starts))]
        else:
            starts = np.arange(0, max(total - 1, 0), bl)
        if len(starts) == 0:
            return []
        blocks = np.stack([starts, np.minimum(bl + 1, total - starts)], 1)
        # same-length blocks together: only the final, shorter validation block differs
        out = []
        for length in np.unique(blocks[:, 1])[::-1]:
            same = blocks[blocks[:, 1] == length]
            out += [same[i : i + self.batch_size] for i in range(0, len(same), self.batch_size)]
        return out

    def collate(self, blocks: np.ndarray) -> Batch:
        length = int(blocks[0, 1])
        ids = np.stack([self.stream[s : s + length] for s in blocks[:, 0]]).astype(np.int64)
        ids = torch.from_numpy(ids)
        n = ids.size(0) * (length - 1)
        batch = Batch(None, ids[:, :-1], ids[:, 1:], 0, n, n, tgt_pairs=ids.size(0) * (length - 1) ** 2)
        if self.pad_multiple > 1:  # the last, shorter block and the last, smaller batch: the bucket's shape
            batch = to_bucket(batch, self.batch_size, self.block_len)
        return batch
