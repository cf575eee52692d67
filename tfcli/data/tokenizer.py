"""Subword tokenizers (Hugging Face `tokenizers`): train, save/load, encode and decode.

Every tokenizer is trained with SPECIAL_TOKENS first, so <pad>=0, <s>=1, </s>=2, <unk>=3 everywhere. Encoding never
adds <s>/</s> (batching does), and special-token strings in the input are read as plain text: a sentence containing
"</s>" must not end early.

The pre-tokenizers and decoders are chosen so that decode(encode(text)) == text for normal text (NFC, no leading or
trailing space, only characters seen in training):
  bpe, unigram, wordpiece   Metaspace (a space becomes "▁" and starts a new piece, as in SentencePiece), then
                            punctuation split off on its own; decoding turns "▁" back into spaces.
  bytelevel                 GPT-2's byte-level BPE: every string round-trips exactly (no <unk>).
  char                      one token per Unicode code point seen in training, newlines included (for
                            character-level language models such as Tiny Shakespeare).
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tfcli.errors import TfcliError

from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID  # noqa: F401  (torch-free)

TOKENIZER_TYPES = ("bpe", "unigram", "wordpiece", "bytelevel", "char")
BYTELEVEL_MIN_VOCAB = len(SPECIAL_TOKENS) + 256

# encode_batch splits very long texts (whole documents) into pieces of about this many characters, cut just before
# a space that follows a non-space character. Every tokenizer here starts a new pre-token there anyway, so the ids
# are the same as for the whole text, but memory stays bounded (a `tokenizers` Encoding costs ~400 bytes a token).
CHUNK_CHARS = 1 << 15
BATCH_CHARS = 1 << 21  # characters handed to one Rust encode_batch call (larger batches keep both cores busier)
# Tokenizer training sees runs of non-space characters (base64, hashes, minified code) cut to this length: a subword
# trainer re-scans a whole word for every merge that touches it, so one 1 MB "word" takes it hours. Only training
# is affected; text is encoded as it is.
TRAIN_WORD_CHARS = 100
_LONG_WORD = re.compile(r"\S{%d}(?=\S)" % TRAIN_WORD_CHARS)


def train_tokenizer(
    kind: str, texts: Sequence[str], vocab_size: int, nfc: bool = True, lowercase: bool = False
) -> Tokenizer:
    """Train a tokenizer of type `kind` on `texts`; `vocab_size` counts the special tokens (ignored for `char`).

    With `nfc` the tokenizer normalises what it encodes to NFC, with `lowercase` it then lowercases it. `texts` are
    taken as normalised so already (prepare's cleaning made them so): the normaliser is attached after training,
    which spares the Rust library a pass over the corpus.
    """
    if kind not in TOKENIZER_TYPES:
        raise TfcliError(f"unknown tokenizer type '{kind}' (choose from {', '.join(TOKENIZER_TYPES)})")
    if kind == "char":
        tok = _char_tokenizer(texts)
    else:
        tok, trainer = _subword_tokenizer(kind, vocab_size)
        try:
            tok.train_from_iterator(_pieces(texts), trainer=trainer)
        except Exception as e:  # e.g. Unigram: "The vocabulary is not large enough to contain all chars"
            raise TfcliError(f"cannot train a {kind} tokenizer with --vocab-size {vocab_size}: {e}") from None
    if kind in ("unigram", "wordpiece"):
        tok = _canonical(tok)
    steps = [normalizers.NFC()] * nfc + [normalizers.Lowercase()] * lowercase
    if steps:
        tok.normalizer = steps[0] if len(steps) == 1 else normalizers.Sequence(steps)
    tok.encode_special_tokens = True
    return tok


def lowercases(tok: Tokenizer) -> bool:
    """Whether `tok` lowercases what it encodes (`tfcli prepare --lowercase`, or an uncased tokenizer reused)."""
    return tok.normalizer is not None and tok.normalizer.normalize_str("AÉ") == "aé"


def _canonical(tok: Tokenizer) -> Tokenizer:
    """The same tokenizer, its ids in an order that does not change from run to run.

    The Rust library's Unigram and WordPiece trainers number the pieces in hash-map order, and Unigram's parallel EM
    leaves its log-probabilities differing in the last bits, so two runs on the same text gave different ids (and
    so different models from the same seed). WordPiece pieces are numbered in string order (its encoding looks up
    strings, not ids); Unigram scores are rounded to 1e-9 and pieces sorted by score, then string."""
    spec = json.loads(tok.to_str())
    model = spec["model"]
    n = len(SPECIAL_TOKENS)
    if model["type"] == "Unigram":
        rest = sorted(((piece, round(score, 9)) for piece, score in model["vocab"][n:]), key=lambda x: (-x[1], x[0]))
        # The characters the trainer adds last (those it kept no piece for) get scores 1e-4 apart (or equal) in
        # hash-set order: they take those scores in string order instead.
        chars = [x for x in rest if len(x[0]) == 1]
        run = 1
        while run < len(chars) and min(abs(chars[-run - 1][1] - chars[-run][1] - d) for d in (0, 1e-4)) < 1e-7:
            run += 1
        if run > 1:
            fixed = dict(zip(sorted(c for c, _ in chars[-run:]), [score for _, score in chars[-run:]]))
            rest = sorted(((p, fixed.get(p, score)) for p, score in rest), key=lambda x: (-x[1], x[0]))
        model["vocab"] = model["vocab"][:n] + [list(x) for x in rest]
    else:
        rest = sorted(piece for piece, i in model["vocab"].items() if i >= n)
        model["vocab"] = {**{s: i for i, s in enumerate(SPECIAL_TOKENS)}, **{p: n + i for i, p in enumerate(rest)}}
    return Tokenizer.from_str(json.dumps(spec))


def _subword_tokenizer(kind: str, vocab_size: int):
    common = dict(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    metaspace = pre_tokenizers.Sequence([pre_tokenizers.Metaspace(), pre_tokenizers.Punctuation("isolated")])
    if kind == "bytelevel":
        if vocab_size < BYTELEVEL_MIN_VOCAB:
            raise TfcliError(f"--vocab-size must be at least {BYTELEVEL_MIN_VOCAB} for bytelevel (4 specials + 256 bytes)")
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok, trainers.BpeTrainer(initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), **common)
    if vocab_size <= len(SPECIAL_TOKENS):
        raise TfcliError(f"--vocab-size must be larger than {len(SPECIAL_TOKENS)} (the special tokens)")
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(**common)
        tok.decoder = decoders.Metaspace()
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(unk_token="<unk>", **common)
        tok.decoder = decoders.Metaspace()
    else:  # wordpiece: word-internal pieces start with "##"; strip that prefix, then undo Metaspace
        tok = Tokenizer(models.WordPiece(unk_token="<unk>"))
        trainer = trainers.WordPieceTrainer(continuing_subword_prefix="##", **common)
        tok.decoder = decoders.Sequence([decoders.Replace(Regex(r"\A##"), ""), decoders.Metaspace()])
    tok.pre_tokenizer = metaspace
    return tok, trainer


def _char_tokenizer(texts: Sequence[str]) -> Tokenizer:
    """Specials, then every code point of `texts` in code point order (like nanoGPT's `sorted(set(text))`)."""
    chars: set[str] = set()
    for t in texts:
        chars.update(t)
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for c in sorted(chars):
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # every code point, newlines too
    tok.decoder = decoders.Fuse()  # join tokens with nothing between them
    return tok


def save_tokenizer(tok: Tokenizer, path: os.PathLike | str) -> None:
    try:
        tok.save(str(path))
    except Exception as e:  # the Rust library's I/O errors (a full disk) are plain Exceptions
        raise OSError(str(e)) from None


SENTENCEPIECE_SUFFIXES = (".spm", ".model")


def load_tokenizer(path: os.PathLike | str, any_names: bool = False, specials_in_text: bool = False) -> Tokenizer:
    """Load a tokenizer.json (or convert a SentencePiece unigram .spm/.model file), with a clear error for a
    missing or invalid file. `any_names`: the special ids may have other names than tfcli's (an imported language
    model's own, which its prompts write). `specials_in_text`: special tokens written in a text are read as those
    tokens, as transformers reads them (an imported language model's chat templates rely on it); else as text."""
    path = Path(path)
    if not path.is_file():
        raise TfcliError(f"{path}: tokenizer file not found")
    try:
        if path.suffix in SENTENCEPIECE_SUFFIXES:
            from tfcli.data.spm import sentencepiece_tokenizer

            tok = Tokenizer.from_str(json.dumps(sentencepiece_tokenizer(path)))
        else:
            tok = Tokenizer.from_file(str(path))
    except TfcliError:
        raise
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TfcliError(f"{path}: not a valid tokenizer.json ({first})") from None
    for i, s in enumerate(SPECIAL_TOKENS):
        if (tok.id_to_token(i) is None) if any_names else tok.token_to_id(s) != i:
            raise TfcliError(f"{path}: token '{s}' must have id {i}; train tokenizers with `tfcli prepare`")
    tok.encode_special_tokens = not specials_in_text  # not saved in tokenizer.json
    return tok


def _split_long(text: str, size: int = CHUNK_CHARS) -> list[str]:
    if len(text) <= size:
        return [text]
    pieces, start = [], 0
    while len(text) - start > size:
        cut = text.find(" ", start + size)
        while cut != -1 and text[cut - 1] == " ":
            cut = text.find(" ", cut + 1)
        if cut == -1:
            break
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _pieces(texts: Iterable[str]) -> Iterable[str]:
    """Training input: long texts split at spaces, over-long words cut (a space after every TRAIN_WORD_CHARS)."""
    for t in texts:
        for piece in _split_long(t):
            yield _LONG_WORD.sub(r"\g<0> ", piece) if len(piece) > TRAIN_WORD_CHARS else piece


def for_clean_text(tok: Tokenizer, nfc: bool, lowercase: bool) -> Tokenizer:
    """`tok` without its normaliser, for texts that prepare's cleaning normalised already (`nfc`: to NFC,
    `lowercase`: lowercased after that): the same ids, less work. A normaliser with any other step is kept whole."""
    spec = json.loads(tok.to_str())
    norm = spec.get("normalizer")
    if norm is None:
        return tok
    steps = norm["normalizers"] if norm["type"] == "Sequence" else [norm]
    types = [step["type"] for step in steps]
    done = ["NFC"] * nfc + ["Lowercase"] * lowercase  # what the cleaning did, in this order
    if [t for t in done if t in types] != types:  # a step the cleaning did not do, or another order
        return tok
    bare = Tokenizer.from_str(tok.to_str())
    bare.normalizer = None
    bare.encode_special_tokens = tok.encode_special_tokens
    return bare


def encode_batch(tok: Tokenizer, lines: Sequence[str]) -> list[list[int]]:
    """Token ids of each line, without <s>/</s>; encoded in parallel by the Rust library, in bounded batches."""
    return _ids(_encodings(tok, lines))


def encode_chunks(toks: Sequence[Tokenizer], chunks: Iterable[list[list[str]]]) -> Iterator[list[list[list[int]]]]:
    """encode_batch of each column of each chunk (`toks[i]` encodes column i), as a pipeline: the Rust library
    encodes the next chunk (on every core, without the GIL) while the caller works on this one."""

    def encode(cols):
        return [_encodings(tok, col) for tok, col in zip(toks, cols)]

    with ThreadPoolExecutor(1) as pool:
        pending = None
        for cols in chunks:
            ahead = pool.submit(encode, cols)
            if pending is not None:
                yield [_ids(batches) for batches in pending.result()]
            pending = ahead
        if pending is not None:
            yield [_ids(batches) for batches in pending.result()]


def _encodings(tok: Tokenizer, lines: Sequence[str]) -> list[list]:
    """Rust's encodings of `lines`, one per line, in batches of whole lines of about BATCH_CHARS characters; a
    batch holding a line longer than CHUNK_CHARS comes as id lists (see _encode_long)."""
    lines = lines if isinstance(lines, list) else list(lines)
    batches = []
    start = chars = 0
    for end, n in enumerate(map(len, lines), 1):
        chars += n
        if chars >= BATCH_CHARS or end == len(lines):
            group = lines[start:end]
            if max(map(len, group)) <= CHUNK_CHARS:
                batches.append(_encode_batch(tok)(group, add_special_tokens=False))
            else:
                batches.append(_encode_long(tok, group))
            start, chars = end, 0
    return batches


def _encode_batch(tok: Tokenizer):
    """The library's encode_batch_fast where it has one (tokenizers >= 0.20: the same ids without character
    offsets, so less work), else encode_batch."""
    return getattr(tok, "encode_batch_fast", tok.encode_batch)


def _ids(batches: list[list]) -> list[list[int]]:
    return [x if isinstance(x, list) else x.ids for batch in batches for x in batch]


def _encode_long(tok: Tokenizer, lines: list[str]) -> list[list[int]]:
    """Lines, some longer than CHUNK_CHARS: those are cut at spaces and encoded piece by piece (a 1 GB document in
    bounded batches)."""
    out: list[list[int]] = [[] for _ in lines]
    batch: list[str] = []
    owners: list[int] = []
    chars = 0

    def flush():
        for owner, enc in zip(owners, _encode_batch(tok)(batch, add_special_tokens=False)):
            out[owner].extend(enc.ids)
        batch.clear()
        owners.clear()

    for i, line in enumerate(lines):
        for piece in _split_long(line):
            batch.append(piece)
            owners.append(i)
            chars += len(piece)
            if chars >= BATCH_CHARS:
                flush()
                chars = 0
    if batch:
        flush()
    return out


def decode_batch(tok: Tokenizer, id_lists: Iterable[Sequence[int]]) -> list[str]:
    """Text of each id list; <pad>, <s> and </s> are dropped, <unk> shows as "<unk>"."""
    drop = {PAD_ID, BOS_ID, EOS_ID}
    cleaned = [[int(i) for i in ids if int(i) not in drop] for ids in id_lists]
    return tok.decode_batch(cleaned, skip_special_tokens=False)


def unk_rate(id_lists: Iterable[Sequence[int]]) -> float:
    """Fraction of ids that are <unk> (0.0 for no tokens); translate warns when raw input gives many."""
    total = unk = 0
    for ids in id_lists:
        total += len(ids)
        unk += sum(1 for i in ids if i == UNK_ID)
    return unk / total if total else 0.0


class BpeDropout:
    """BPE-dropout (Provilkov et al. 2020): a text cut into subwords as the BPE tokenizer cuts it, except that each
    merge the algorithm would apply is skipped with probability p, so the same word comes out in different pieces
    from epoch to epoch. With p = 0 the cut is the tokenizer's own. The random choices come from the caller's
    numpy Generator (seeded per sentence and epoch, so a resumed run repeats them)."""

    def __init__(self, tok: Tokenizer, p: float):
        model = json.loads(tok.to_str())["model"]
        if model.get("type") != "BPE":
            raise TfcliError(f"--bpe-dropout needs a BPE tokenizer; this one is {model.get('type')}")
        self.tok, self.p = tok, p
        self.vocab: dict[str, int] = model["vocab"]
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
        self.rank = {pair: r for r, pair in enumerate(merges)}
        self.unk = self.vocab.get(model.get("unk_token") or "", UNK_ID)

    def encode(self, text: str, rng) -> list[int]:
        norm = self.tok.normalizer.normalize_str(text) if self.tok.normalizer is not None else text
        words = [w for w, _ in self.tok.pre_tokenizer.pre_tokenize_str(norm)]
        ids: list[int] = []
        for word in words:
            ids += [self.vocab.get(s, self.unk) for s in self._merge(list(word), rng)]
        return ids

    def _merge(self, symbols: list[str], rng) -> list[str]:
        while len(symbols) > 1:
            best, at = None, -1
            keep = rng.random(len(symbols) - 1) >= self.p if self.p > 0 else None
            for i in range(len(symbols) - 1):
                r = self.rank.get((symbols[i], symbols[i + 1]))
                if r is not None and (keep is None or keep[i]) and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
        return symbols


def _word_mark(vocab: dict[str, int]) -> str | None:
    """The mark a vocabulary's word-initial tokens carry: SentencePiece's "▁", byte-level BPE's "Ġ", or None."""
    return next((m for m in ("▁", "Ġ") if any(t.startswith(m) for t in vocab)), None)


def continuing_ids(tok: Tokenizer) -> set[int]:
    """The ids of the tokens that continue the word before them: SentencePiece pieces without "▁" (byte-level BPE
    tokens without "Ġ") that start with a letter, a digit, a hyphen, an apostrophe or "_"; WordPiece's "##"; none
    for a word-level vocabulary. (A model's own added tokens too, a language's fra_Latn: they are decoded unspaced.)"""
    vocab = tok.get_vocab(with_added_tokens=True)
    mark = _word_mark(vocab)
    out = set()
    for t, i in vocab.items():
        if i in (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            continue
        if mark:
            continues = not t.startswith(mark) and (t[:1].isalnum() or t[:1] in "-'’_")
        else:
            continues = t.startswith("##")
        if continues:
            out.add(i)
    return out


def word_start_ids(tok: Tokenizer) -> set[int] | None:
    """The ids of the tokens that start a word: SentencePiece pieces with "▁" (byte-level BPE's with "Ġ"), WordPiece's
    without "##"; None for a word-level vocabulary, where every token is a word."""
    vocab = tok.get_vocab(with_added_tokens=True)
    mark = _word_mark(vocab)
    if mark:
        return {i for t, i in vocab.items() if t.startswith(mark)}
    if any(t.startswith("##") for t in vocab):
        return {i for t, i in vocab.items() if not t.startswith("##")}
    return None


CLAUSE_ENDS = frozenset(",;:")  # where a window of a long sentence is best cut (after one of these)


def clause_end_ids(tok: Tokenizer) -> set[int]:
    """The ids of the tokens that are a comma, semicolon or colon (with a word boundary mark or without)."""
    return {i for t, i in tok.get_vocab(with_added_tokens=True).items() if t.lstrip("▁Ġ") in CLAUSE_ENDS}
