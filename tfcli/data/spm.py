"""SentencePiece models as Hugging Face `tokenizers` tokenizers: a Marian or an M2M-100 model's vocabulary (`tfcli
import`) and a plain unigram .spm/.model file (`tfcli prepare --tokenizer-from`).

Marian (Opus-MT) directories ship `source.spm`/`target.spm` (SentencePiece unigram models) and `vocab.json` (piece ->
embedding row, shared by both sides): a text is cut into pieces by the .spm model, and each piece is looked up in
vocab.json. Here the same is one unigram model over vocab.json's pieces in its order, scored as the .spm model scores
them (a piece the .spm model lacks gets ABSENT_SCORE, so it is used only where nothing else fits), behind the .spm
model's own normalisation (its precompiled NFKC-like character map) and SentencePiece's whitespace handling.

M2M-100 directories ship `sentencepiece.bpe.model` (a SentencePiece BPE model) and `vocab.json` (fairseq's
dictionary: piece -> row), the language tokens and "madeup words" numbered after it. SentencePiece's BPE merges, at
each step, the adjacent pair whose merged piece came earliest in training (the .spm model lists its pieces in that
order); a `tokenizers` BPE model with the merges ranked by that order cuts texts the same way.

The .spm file is a protobuf message; the few fields needed are read here directly, so neither the sentencepiece nor
the protobuf package is required.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tfcli.errors import TfcliError

ABSENT_SCORE = -1e4
# sentencepiece_model.proto: ModelProto.pieces = 1, .trainer_spec = 2, .normalizer_spec = 3; SentencePiece.piece = 1,
# .score = 2, .type = 3; TrainerSpec.model_type = 3; NormalizerSpec.precompiled_charsmap = 2, .add_dummy_prefix = 3,
# .remove_extra_whitespaces = 4
_PIECES, _TRAINER, _NORMALIZER = 1, 2, 3
_NORMAL, _UNKNOWN, _CONTROL, _USER, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece.Type


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


def read_spm(path: Path) -> dict:
    """The fields of a SentencePiece model that a conversion needs: pieces [(piece, score, type)] in id order, the
    model type (1 unigram, 2 BPE, 3 word, 4 char), the precompiled charsmap, add_dummy_prefix and
    remove_extra_whitespaces."""
    try:
        buf = Path(path).read_bytes()
        spm = {"pieces": [], "model_type": 1, "charsmap": b"", "dummy_prefix": True, "squeeze": True}
        for field, value in _fields(buf):
            if field == _PIECES:
                piece, score, kind = "", 0.0, _NORMAL
                for f, v in _fields(value):
                    if f == 1:
                        piece = v.decode("utf-8")
                    elif f == 2:
                        score = struct.unpack("<f", v)[0]
                    elif f == 3:
                        kind = v
                spm["pieces"].append((piece, score, kind))
            elif field == _TRAINER:
                for f, v in _fields(value):
                    if f == 3:
                        spm["model_type"] = v
            elif field == _NORMALIZER:
                for f, v in _fields(value):
                    if f == 2:
                        spm["charsmap"] = v
                    elif f == 3:
                        spm["dummy_prefix"] = bool(v)
                    elif f == 4:
                        spm["squeeze"] = bool(v)
    except (OSError, ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise TfcliError(f"{path}: not a readable SentencePiece model ({e})") from None
    if not spm["pieces"]:
        raise TfcliError(f"{path}: not a SentencePiece model (no pieces)")
    return spm


def _unigram(spm: dict, table: list[tuple[str, float]], unk_id: int, specials: list[str]) -> dict:
    """tokenizer.json (a dict): a unigram model over `table` behind the .spm model's normalisation and
    SentencePiece's whitespace handling."""
    from tokenizers import models

    byte_fallback = any(kind == _BYTE for _, _, kind in spm["pieces"])
    return _behind_spm(spm, models.Unigram(table, unk_id=unk_id, byte_fallback=byte_fallback), specials, byte_fallback)


def _behind_spm(spm: dict, model, specials: list[str], byte_fallback: bool = False) -> dict:
    """tokenizer.json (a dict): `model` (a tokenizers model) behind the .spm model's own normalisation (its
    precompiled character map) and SentencePiece's whitespace handling, with `specials` as special tokens."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers

    tok = Tokenizer(model)
    steps = [normalizers.Precompiled(spm["charsmap"])] if spm["charsmap"] else []
    if spm["squeeze"]:
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if steps:
        tok.normalizer = normalizers.Sequence(steps)
    scheme = "always" if spm["dummy_prefix"] else "never"
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)
    metaspace = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), metaspace]) if byte_fallback else metaspace
    tok.add_special_tokens(specials)
    return json.loads(tok.to_str())


def sentencepiece_tokenizer(path: Path) -> dict:
    """A SentencePiece unigram model (`tfcli prepare --tokenizer-from model.spm`) as a tokenizer.json in tfcli's
    layout: its <pad>, <s>, </s> and <unk> at tfcli's ids (added where it lacks them), its other pieces after."""
    from tfcli.data.vocab import reorder_vocabulary
    from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, UNK_ID

    spm = read_spm(path)
    if spm["model_type"] != 1:
        kind = {2: "BPE", 3: "word", 4: "char"}.get(spm["model_type"], str(spm["model_type"]))
        raise TfcliError(f"--tokenizer-from {path}: a SentencePiece {kind} model; only unigram models are converted")
    pieces = [p for p, _, _ in spm["pieces"]]
    unk = next((i for i, (_, _, kind) in enumerate(spm["pieces"]) if kind == _UNKNOWN), None)
    if unk is None:
        raise TfcliError(f"--tokenizer-from {path}: the SentencePiece model has no unknown piece")
    table = [(p, score if kind in (_NORMAL, _USER, _BYTE) else 0.0) for p, score, kind in spm["pieces"]]
    specials = [p for p, _, kind in spm["pieces"] if kind in (_UNKNOWN, _CONTROL)]
    data = _unigram(spm, table, unk, specials)
    index = {p: i for i, p in enumerate(pieces)}
    roles = {PAD_ID: index.get("<pad>"), BOS_ID: index.get("<s>"), EOS_ID: index.get("</s>"), UNK_ID: unk}
    return reorder_vocabulary(data, roles)[0]


def marian_tokenizer(spm_path: Path, vocab: dict[str, int], unk: str = "<unk>") -> dict:
    """tokenizer.json (as a dict) for one side of a Marian model: ids are vocab.json's."""
    spm = read_spm(spm_path)
    scores = {p: score for p, score, kind in spm["pieces"] if kind not in (_UNKNOWN, _CONTROL)}
    if unk not in vocab:
        raise TfcliError(f"{spm_path.parent / 'vocab.json'}: has no {unk} token")
    pieces = [""] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    table = [(p, scores.get(p, ABSENT_SCORE)) for p in pieces]
    return _unigram(spm, table, vocab[unk], [p for p in ("</s>", unk, "<pad>") if p in vocab])


def _merges(spm: dict, known: set[str]) -> list[tuple[str, str]]:
    """The BPE merges of a SentencePiece BPE model, by the rank of the piece they make (its place in the model),
    every way of cutting a piece into two known pieces ranked by the left piece's place; pieces outside `known`
    (the embedding rows) are never made."""
    rank = {p: i for i, (p, _, kind) in enumerate(spm["pieces"]) if kind == _NORMAL and p in known}
    out = []
    for piece in sorted(rank, key=rank.get):
        cuts = [(piece[:j], piece[j:]) for j in range(1, len(piece)) if piece[:j] in rank and piece[j:] in rank]
        out += sorted(cuts, key=lambda c: (rank[c[0]], rank[c[1]]))
    return out


def m2m_tokenizer(spm_path: Path, vocab: dict[str, int], appended: list[str], unk: str = "<unk>") -> dict:
    """tokenizer.json (as a dict) for an M2M-100 directory: vocab.json's ids, then the `appended` tokens (language
    tokens, madeup words) numbered after them, as special tokens."""
    from tokenizers import models

    spm = read_spm(spm_path)
    if spm["model_type"] != 2:
        raise TfcliError(f"{spm_path}: expected a SentencePiece BPE model (M2M-100's), got model type "
                         f"{spm['model_type']}")
    if unk not in vocab:
        raise TfcliError(f"{spm_path.parent / 'vocab.json'}: has no {unk} token")
    bpe = models.BPE(dict(vocab), _merges(spm, set(vocab)), unk_token=unk, fuse_unk=True)
    return _behind_spm(spm, bpe, [t for t in ("<s>", "<pad>", "</s>", unk) if t in vocab] + appended)
