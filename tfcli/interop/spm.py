"""A Marian model's SentencePiece vocabulary as a Hugging Face `tokenizers` tokenizer (what `tfcli import` reads).

Marian (Opus-MT) directories ship `source.spm`/`target.spm` (SentencePiece unigram models) and `vocab.json` (piece ->
embedding row, shared by both sides): a text is cut into pieces by the .spm model, and each piece is looked up in
vocab.json. Here the same is one unigram model over vocab.json's pieces in its order, scored as the .spm model scores
them (a piece the .spm model lacks gets ABSENT_SCORE, so it is used only where nothing else fits), behind the .spm
model's own normalisation (its precompiled NFKC-like character map) and SentencePiece's whitespace handling.

The .spm file is a protobuf message; the few fields needed are read here directly, so neither the sentencepiece nor
the protobuf package is required.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tfcli.errors import TfcliError

ABSENT_SCORE = -1e4
# sentencepiece_model.proto: ModelProto.pieces = 1, .normalizer_spec = 3; SentencePiece.piece = 1, .score = 2,
# .type = 3; NormalizerSpec.precompiled_charsmap = 2, .add_dummy_prefix = 3, .remove_extra_whitespaces = 4
_PIECES, _NORMALIZER = 1, 3
_UNKNOWN, _CONTROL = 2, 3  # SentencePiece.Type


def _fields(buf: bytes):
    """(field number, value) of a protobuf message: ints for varints, bytes for length-delimited fields and for
    fixed 32/64-bit ones."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i : i + n], i + n
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield field, value


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def read_spm(path: Path) -> tuple[dict[str, float], bytes, bool, bool]:
    """(piece -> score of the normal pieces, precompiled charsmap, add_dummy_prefix, remove_extra_whitespaces)."""
    try:
        buf = Path(path).read_bytes()
        scores: dict[str, float] = {}
        charsmap, dummy_prefix, squeeze = b"", True, True
        for field, value in _fields(buf):
            if field == _PIECES:
                piece, score, kind = "", 0.0, 1
                for f, v in _fields(value):
                    if f == 1:
                        piece = v.decode("utf-8")
                    elif f == 2:
                        score = struct.unpack("<f", v)[0]
                    elif f == 3:
                        kind = v
                if kind not in (_UNKNOWN, _CONTROL):
                    scores[piece] = score
            elif field == _NORMALIZER:
                for f, v in _fields(value):
                    if f == 2:
                        charsmap = v
                    elif f == 3:
                        dummy_prefix = bool(v)
                    elif f == 4:
                        squeeze = bool(v)
    except (OSError, ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise TfcliError(f"{path}: not a readable SentencePiece model ({e})") from None
    if not scores:
        raise TfcliError(f"{path}: not a SentencePiece model (no pieces)")
    return scores, charsmap, dummy_prefix, squeeze


def marian_tokenizer(spm_path: Path, vocab: dict[str, int], unk: str = "<unk>") -> dict:
    """tokenizer.json (as a dict) for one side of a Marian model: ids are vocab.json's."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    scores, charsmap, dummy_prefix, squeeze = read_spm(spm_path)
    if unk not in vocab:
        raise TfcliError(f"{spm_path.parent / 'vocab.json'}: has no {unk} token")
    pieces = [""] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    table = [(p, scores.get(p, ABSENT_SCORE)) for p in pieces]
    tok = Tokenizer(models.Unigram(table, unk_id=vocab[unk], byte_fallback=False))
    steps = [normalizers.Precompiled(charsmap)] if charsmap else []
    if squeeze:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if steps:
        tok.normalizer = normalizers.Sequence(steps)
    scheme = "always" if dummy_prefix else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    specials = [p for p in ("</s>", unk, "<pad>") if p in vocab]
    tok.add_special_tokens(specials)
    return json.loads(tok.to_str())
