"""`tfcli prepare`: corpus in, prepared directory out (see tfcli/data/prepared.py for the format).

    read splits -> (--valid-ratio: cut valid off the end of train) -> normalise, drop empty, dedupe
    -> train tokenizer(s) on train -> encode every split (Rust, parallel) -> length/ratio filters on train
    -> write ids, tokenizers, cleaned valid/test text and meta.json into a temp dir -> rename it into place

meta.json records a fingerprint of the settings and the input files' SHA-256, so a re-run with the same inputs and
settings is a no-op, and a directory prepared with other settings is never overwritten without --force.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import itertools
import json
import random
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

from tfcli import checkpoint_meta
from tfcli.config import to_dict
from tfcli.data.config import PrepareConfig
from tfcli.data import cleaning, loading
from tfcli.data.conventions import (
    CHAT_FIELD, Convention, encode_segments, new_languages, pair_messages, read_conversation, segments,
)
from tfcli.data.languages import language_tags, named_source_language, tag, target_languages
from tfcli.data.prepared import FORMAT, FORMAT_VERSION, PreparedData, SequenceWriter, new_meta
from tfcli.data.tokenizer import (
    SENTENCEPIECE_SUFFIXES, encode_chunks, for_clean_text, load_tokenizer, lowercases, save_tokenizer,
    train_tokenizer,
)
from tfcli.errors import ConfigError, InputError, TfcliError
from tfcli.io import atomic_dir, encoding_errors, refuse_overwriting_inputs, run_lock

SPLITS = ("train", "valid", "test")
# Options that name input files: their content enters the fingerprint through "inputs", not "settings".
PATH_OPTIONS = (
    "out", "src", "tgt", "valid_src", "valid_tgt", "test_src", "test_tgt", "train", "valid", "test", "data_files",
    "tokenizer_from", "train_prefix", "valid_prefix", "test_prefix",
)


# --- what to read --------------------------------------------------------------------------------------------


@dataclass
class _Source:
    """How to read one split from files: `fmt` is pair, tsv, jsonl or text."""

    fmt: str
    paths: tuple[str, ...]


def base_split(split: str) -> str:
    """train, valid or test: a multilingual directory's splits are one per direction, named train.de-en ..."""
    return split.split(".", 1)[0]


def _direction_files(prefix: str, direction: str) -> tuple[str, str]:
    """The aligned files of one direction: fairseq's PREFIX.SRC-TGT.LANG (either order of the pair), else the
    multi-way PREFIX.LANG (Multi30k's train.de, train.en, train.fr)."""
    src, tgt = direction.split("-")
    tried = [(f"{prefix}.{pair}.{src}", f"{prefix}.{pair}.{tgt}") for pair in (direction, f"{tgt}-{src}")]
    tried.append((f"{prefix}.{src}", f"{prefix}.{tgt}"))
    for s, t in tried:
        if Path(s).is_file() and Path(t).is_file():
            return s, t
    raise ConfigError(f"{direction}: no files for it under {prefix} (looked for "
                      f"{', '.join(' and '.join(Path(p).name for p in pair) for pair in tried)})")


def _multilingual_sources(cfg: PrepareConfig) -> dict[str, _Source]:
    prefixes = {"train": cfg.train_prefix, "valid": cfg.valid_prefix, "test": cfg.test_prefix}
    if not cfg.lang_pairs:
        raise ConfigError("--train-prefix/--valid-prefix/--test-prefix read one file per language: give the "
                          "directions with --lang-pairs, e.g. de-en,en-de")
    if len(cfg.lang_pairs) == 1 and not any(prefixes.values()):  # one direction's files, its languages named
        if cfg.valid_ratio:
            raise ConfigError("--valid-ratio: with --lang-pairs, give the valid split's files (--valid-src/--valid-tgt)")
        return {f"{split}.{cfg.lang_pairs[0]}": s for split, s in _split_sources(replace(cfg, lang_pairs=[])).items()}
    others = [name for name in ("src", "tgt", "valid_src", "valid_tgt", "test_src", "test_tgt", "train", "valid",
                                "test", "dataset") if getattr(cfg, name) is not None]
    if others:
        raise ConfigError(f"--lang-pairs reads its files from --train-prefix/--valid-prefix/--test-prefix; drop "
                          f"--{others[0].replace('_', '-')}")
    if cfg.valid_ratio:
        raise ConfigError("--valid-ratio: a multilingual directory takes its valid split per direction from "
                          "--valid-prefix")
    return {f"{split}.{d}": _Source("pair", _direction_files(prefix, d))
            for split, prefix in prefixes.items() if prefix is not None for d in cfg.lang_pairs}


def _corpus_sources(cfg: PrepareConfig) -> dict[str, _Source]:
    others = [name for name in ("src", "tgt", "valid_src", "valid_tgt", "train", "valid", "test", "dataset",
                                "train_prefix", "valid_prefix", "test_prefix") if getattr(cfg, name) is not None]
    if others or cfg.lang_pairs:
        raise ConfigError(f"--corpus names every training corpus; drop --{(others or ['lang-pairs'])[0].replace('_', '-')} "
                          "(a valid set per corpus: --valid-corpus; a test set: --test-src/--test-tgt)")
    if cfg.valid_ratio:
        raise ConfigError("--valid-ratio: with --corpus, give each corpus's valid set with --valid-corpus")
    sources = {split: _Source("pair", files) for split, files in cfg.corpus_files().items()}
    if (cfg.test_src is None) != (cfg.test_tgt is None):
        raise ConfigError("--test-src and --test-tgt go together: give both aligned files")
    if cfg.test_src is not None:
        sources["test"] = _Source("pair", (cfg.test_src, cfg.test_tgt))
    return sources


def _split_sources(cfg: PrepareConfig) -> dict[str, _Source]:
    if cfg.corpora or cfg.valid_corpora:
        return _corpus_sources(cfg)
    if cfg.lang_pairs or cfg.train_prefix or cfg.valid_prefix or cfg.test_prefix:
        return _multilingual_sources(cfg)
    pairs = {"train": (cfg.src, cfg.tgt), "valid": (cfg.valid_src, cfg.valid_tgt), "test": (cfg.test_src, cfg.test_tgt)}
    singles = {"train": cfg.train, "valid": cfg.valid, "test": cfg.test}
    sources = {}
    for split in SPLITS:
        (s, t), one = pairs[split], singles[split]
        opt = "" if split == "train" else f"{split}-"
        if (s is None) != (t is None):
            raise ConfigError(f"--{opt}src and --{opt}tgt go together: give both aligned files")
        if s is not None and one is not None:
            raise ConfigError(f"give either --{opt}src/--{opt}tgt or --{split}, not both")
        if s is not None:
            sources[split] = _Source("pair", (s, t))
        elif one is not None:
            sources[split] = _Source(loading.detect_format(one, cfg.format), (one,))
    return sources


def _kind_of(fmt: str, cfg: PrepareConfig) -> str:
    if fmt in ("pair", "tsv"):
        return "parallel"
    if fmt == "jsonl" or fmt == "dataset":
        if (cfg.src_field is None) != (cfg.tgt_field is None):
            raise ConfigError("--src-field and --tgt-field go together (or give --text-field for monolingual data)")
        return "parallel" if cfg.src_field else "mono"
    return "mono"


def _plan(cfg: PrepareConfig) -> tuple[str, dict[str, _Source]]:
    """The data kind (parallel|mono) and the file sources per split; checks that the options fit together."""
    if not cfg.out:
        raise ConfigError("no output directory: give -o/--out DIR")
    sources = _split_sources(cfg)
    if cfg.dataset:
        if sources:
            raise ConfigError("--dataset gives all splits; it cannot be combined with --src/--tgt/--train/--valid/--test")
        kind = _kind_of("dataset", cfg)
    else:
        if cfg.data_files or cfg.dataset_splits or cfg.dataset_config or cfg.streaming:
            raise ConfigError("--data-files/--dataset-split/--dataset-config/--streaming need --dataset NAME")
        if not any(base_split(s) == "train" for s in sources) and not (cfg.tokenizer_from and sources):
            raise ConfigError("no training data: give --src/--tgt (aligned files), --train FILE, --dataset NAME, or "
                              "--lang-pairs with --train-prefix")
        kinds = {split: _kind_of(s.fmt, cfg) for split, s in sources.items()}
        first, kind = next(iter(kinds.items()))
        for split, k in kinds.items():
            if k != kind:
                raise ConfigError(f"the {first} data is {kind} but the {split} data is {k}; use one kind for all splits")
        for s in sources.values():
            if "-" in s.paths:
                raise ConfigError("prepare reads its inputs twice (hash, then load); give files, not '-' (stdin)")
    if cfg.mono_mode == "document" and kind == "parallel":
        raise ConfigError("--mono-mode document is for monolingual text (language models)")
    _refuse_unused(cfg, kind, sources)
    return kind, sources


def _refuse_unused(cfg: PrepareConfig, kind: str, sources: dict[str, _Source]) -> None:
    """A setting the data at hand does not use is an error naming it, never silently ignored (a user who set
    --separate-vocab on a monolingual corpus, or --valid-ratio beside a valid file, expects it to matter)."""
    default = PrepareConfig()
    unused: list[tuple[str, str]] = []
    if kind == "parallel":
        unused += [("text_field", "names the field of monolingual rows"), ("mono_mode", "groups monolingual text")]
    else:
        unused += [("joint_vocab", "is for parallel data; this corpus has one side"),
                   ("max_ratio", "compares the two sides of a pair; this corpus has one side")]
    if cfg.tokenizer_from:
        unused += [(name, "trains a tokenizer; --tokenizer-from reuses one")
                   for name in ("tokenizer", "vocab_size", "tokenizer_sample", "joint_vocab")]
        unused.append(("lowercase", "makes the trained tokenizer lowercase; with --tokenizer-from the text is "
                                    "lowercased exactly when the reused tokenizer lowercases"))
    if "valid" in sources:
        unused.append(("valid_ratio", "cuts a valid split from train; a valid split is given"))
    if sources and all(s.fmt == "pair" for s in sources.values()):
        unused += [(name, "reads --train/--valid/--test files; --src/--tgt are plain aligned text")
                   for name in ("format", "src_field", "tgt_field", "text_field")]
    for name, why in unused:
        if getattr(cfg, name) != getattr(default, name):
            flag = {"joint_vocab": "--joint-vocab/--separate-vocab"}.get(name, "--" + name.replace("_", "-"))
            raise ConfigError(f"prepare.{name} ({flag}) is not used: it {why}")


# --- fingerprint ---------------------------------------------------------------------------------------------


def _sha256_file(path: str) -> str:
    p = Path(path)
    if not p.exists():
        raise TfcliError(f"{path}: no such file")
    if p.is_dir():
        raise TfcliError(f"{path}: is a directory, expected a text file")
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pretrained_tokenizer_files(path: str, sides: list[str]) -> dict[str, str]:
    """The tokenizer file per side in `path`: a tokenizer.json (for every side), a prepared dir or a checkpoint."""
    p = Path(path)
    if p.is_file():
        return {side: path for side in sides}
    if (p / "meta.json").is_file():
        found = {side: str(f) for side, f in PreparedData(p).tokenizer_files().items()}
    else:

        meta = checkpoint_meta.read_meta(p)
        found = {side: str(checkpoint_meta.tokenizer_path(meta, side)) for side in meta.get("tokenizers", {})}
    missing = [side for side in sides if side not in found]
    if missing:
        raise TfcliError(f"--tokenizer-from {path}: has no {' or '.join(missing)} tokenizer (it has: {', '.join(found) or 'none'})")
    return {side: found[side] for side in sides}


def _input_files(cfg: PrepareConfig, kind: str, sources: dict[str, _Source]) -> dict[str, str]:
    """{role: path} of every input file, e.g. {"train.src": "train.de", "tokenizer.tgt": "run/tokenizer.tgt.json"}."""
    files = {}
    if cfg.tokenizer_from:
        for side, path in pretrained_tokenizer_files(cfg.tokenizer_from, _sides(kind)).items():
            files[f"tokenizer.{side}"] = path
    if cfg.dataset:
        for split, paths in loading.parse_assignments(cfg.data_files, "--data-files", "train").items():
            matched = [m for p in paths for m in (sorted(glob.glob(p)) if glob.has_magic(p) else [p])]
            if not matched:
                raise TfcliError(f"--data-files {split}={','.join(paths)}: no such file")
            files.update({f"{split}.{i}": m for i, m in enumerate(matched)})
        return files
    for split, s in sources.items():
        if s.fmt == "pair":
            files[f"{split}.src"], files[f"{split}.tgt"] = s.paths
        else:
            files[split] = s.paths[0]
    return files


# Options added after prepared directories existed: left out of the fingerprint at their default, so that a
# directory prepared before them is still up to date.
ADDED_LATER = {"tokenizer_sample": 0, "encoding_errors": "strict", "lowercase": False, "lang_pairs": []}


def _settings(cfg: PrepareConfig) -> dict:
    settings = {k: v for k, v in to_dict(cfg).items() if k not in PATH_OPTIONS}
    for key, default in ADDED_LATER.items():
        if settings[key] == default:
            del settings[key]
    return settings


def _fingerprint(settings: dict, roles: dict[str, str]) -> str:
    blob = json.dumps({"format_version": FORMAT_VERSION, "settings": settings, "inputs": roles}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _existing_state(out: Path, fingerprint: str, settings: dict, inputs: dict, force: bool) -> str:
    """"new" (nothing there), "same" (up to date), "replace" (--force, or an empty dir); else an error."""
    if not out.exists():
        return "new"
    if not out.is_dir():
        raise TfcliError(f"{out}: exists and is not a directory")
    meta_path = out / "meta.json"
    meta = None
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            meta = {}
    if meta is None or meta.get("format") != FORMAT:
        if meta is None and not any(out.iterdir()):
            return "replace"
        raise TfcliError(f"{out}: exists and is not a tfcli prepared directory; refusing to overwrite it")
    if meta.get("fingerprint") == fingerprint and not force:
        return "same"
    if force:
        return "replace"
    old = meta.get("settings", {})
    changed = [f"{k} {old.get(k)!r} -> {v!r}" for k, v in settings.items() if old.get(k) != v]
    if meta.get("inputs") != inputs:
        changed.append("other input files or contents")
    what = "; ".join(changed) or "other inputs"
    raise TfcliError(f"{out}: already prepared with other settings ({what}); use --force to overwrite it")


# --- reading and cleaning ------------------------------------------------------------------------------------

Row = tuple  # one text per side: (src, tgt) for parallel data, (text,) for monolingual
Rows = Callable[[], Iterator[Row]]  # a split's rows, read afresh at each call

CHUNK_ROWS = 20_000  # rows cleaned, encoded and written at a time: memory is bounded by this, not by the corpus


def _source_rows(s: _Source, kind: str, cfg: PrepareConfig) -> Rows:
    if s.fmt == "pair":
        return lambda: loading.iter_parallel_files(*s.paths)
    path = s.paths[0]
    if s.fmt == "tsv":
        return lambda: loading.iter_tsv(path, cfg.src_field, cfg.tgt_field)
    if s.fmt == "jsonl":
        if kind == "parallel":
            return lambda: loading.iter_jsonl(path, [cfg.src_field, cfg.tgt_field])
        if cfg.text_field == CHAT_FIELD:
            return lambda: _conversations(path)
        return lambda: _mono_rows(t for (t,) in loading.iter_jsonl(path, [cfg.text_field]))
    return lambda: _mono_rows(loading.iter_mono(path, cfg.mono_mode))


def _mono_rows(texts: Iterable[str]) -> Iterator[Row]:
    return ((t,) for t in texts)


def _conversations(path: str) -> Iterator[Row]:
    """A chat dataset's conversations, each as one JSON text (checked line by line, `read_conversation`)."""
    from tfcli.io import iter_lines

    for lineno, line in enumerate(iter_lines(path), 1):
        if line.strip():
            yield (json.dumps(read_conversation(line, path, lineno), ensure_ascii=False),)


def _rows(cfg: PrepareConfig, kind: str, sources: dict[str, _Source]) -> tuple[dict[str, Rows], dict[str, str]]:
    """The rows of each split (read lazily), and a label per split for messages (its file names)."""
    if not cfg.dataset:
        rows = {split: _source_rows(s, kind, cfg) for split, s in sources.items()}
        return rows, {split: " / ".join(s.paths) for split, s in sources.items()}
    fields = [cfg.src_field, cfg.tgt_field] if kind == "parallel" else [cfg.text_field]
    splits = {k: v[-1] for k, v in loading.parse_assignments(cfg.dataset_splits, "--dataset-split").items()}
    found = loading.load_hf(
        cfg.dataset,
        fields,
        config=cfg.dataset_config,
        data_files=loading.parse_assignments(cfg.data_files, "--data-files", "train") or None,
        splits=splits or None,
        streaming=cfg.streaming,
    )
    if kind == "mono":
        found = {split: functools.partial(_grouped, rows, cfg.mono_mode) for split, rows in found.items()}
    return found, {split: f"{cfg.dataset}[{split}]" for split in found}


def _grouped(rows: Rows, mode: str) -> Iterator[Row]:
    return _mono_rows(loading.group_mono((t for (t,) in rows()), mode))


def _cut_valid(rows: dict[str, Rows], labels: dict[str, str], ratio: float, mode: str) -> None:
    """Move the last `ratio` of train into valid: rows, or characters of a single document (nanoGPT's split).
    Train is read once more to count its rows."""
    if "valid" in rows:
        raise ConfigError(f"{labels['valid']}: a valid split is given, so --valid-ratio has nothing to do; drop one")
    if "train" not in rows:
        raise ConfigError("--valid-ratio cuts valid off the train split, and there is none")
    train = rows["train"]
    n = sum(1 for _ in train())
    if mode == "document" and n == 1:
        ((text,),) = list(train())
        cut = int(len(text) * (1 - ratio))
        rows["train"], rows["valid"] = (lambda: iter([(text[:cut],)])), (lambda: iter([(text[cut:],)]))
    else:
        cut = int(n * (1 - ratio))
        if cut == 0 or cut == n:
            raise TfcliError(f"{labels['train']}: {n} rows are too few to cut a --valid-ratio {ratio} valid split from")
        rows["train"] = lambda: itertools.islice(train(), cut)
        rows["valid"] = lambda: itertools.islice(train(), cut, None)
    labels["valid"] = f"the last {ratio:g} of {labels['train']}"


def _chunks(rows: Iterable[Row], size: int) -> Iterator[list[list[str]]]:
    """Columns (one list per side) of `size` rows at a time; the last chunk may be shorter."""
    it = iter(rows)
    while chunk := list(itertools.islice(it, size)):
        yield [list(col) for col in zip(*chunk)]


def _clean(cols: list[list[str]], kind: str, cfg: PrepareConfig, counts: dict, dedupe) -> list[list[str]]:
    """One chunk of a split, cleaned (see tfcli/data/cleaning.py); `counts` and `dedupe` carry over between chunks."""
    one_line = kind == "parallel" or cfg.mono_mode == "line"
    strip = cfg.strip and cfg.mono_mode != "document"
    cols = [cleaning.normalize(c, nfc=cfg.nfc, strip=strip, one_line=one_line, lowercase=cfg.lowercase) for c in cols]
    cleaning.add_input(counts, len(cols[0]))
    if cfg.drop_empty:
        cols = cleaning.drop_empty(cols, counts)
    if dedupe is not None:
        cols = dedupe(cols, counts)
    return cols


# --- staging: the cleaned text of each split, in the temp directory --------------------------------------------
# Each side's texts, each ended by a NUL (texts may hold newlines; NUL is refused on input). Reading them back is
# cheap, so the tokenizer can be trained on the cleaned train split and every split encoded without parsing or
# cleaning the input twice, and without holding it in memory.


def _stage_path(tmp: Path, split: str, side: str) -> Path:
    return tmp / f"stage.{split}.{side}"


def _stage(tmp: Path, split: str, rows: Rows, sides: list[str], kind: str, cfg: PrepareConfig, label: str,
           hasher=None, sample: _Sample | None = None, convert=None) -> dict:
    """Read, clean and stage one split; returns its cleaning counts. `hasher` sees every row as read (a hub
    dataset's fingerprint); `sample` every row kept; `convert(cols, split, label)`, where given, turns the cleaned
    rows into the one column staged as "tgt" (a chat model's conversations)."""
    counts = cleaning.new_counts()
    dedupe = cleaning.Deduper() if base_split(split) == "train" and cfg.dedupe else None
    staged = ["tgt"] if convert is not None else sides
    files = [open(_stage_path(tmp, split, side), "w", encoding="utf-8", newline="") for side in staged]
    try:
        for cols in _chunks(rows(), CHUNK_ROWS):
            if hasher is not None:
                for row in zip(*cols):
                    hasher.update("\t".join(row).encode("utf-8", "surrogatepass") + b"\n")
            _check_nul(cols, label, counts["input"])
            cols = _clean(cols, kind, cfg, counts, dedupe)
            if convert is not None:
                cols = convert(cols, split, label)
            for f, col in zip(files, cols):
                for text in col:
                    f.write(text)
                    f.write("\0")
            if sample is not None:
                sample.add(zip(*cols))
    finally:
        for f in files:
            f.close()
    return counts


def _check_nul(cols: list[list[str]], label: str, rows_before: int) -> None:
    for col in cols:
        if "\0".join(col).count("\0") != len(col) - 1:
            i = next(i for i, text in enumerate(col) if "\0" in text)
            raise InputError(label, rows_before + i + 1, "contains a NUL character")


def _staged_lists(tmp: Path, split: str, side: str, size: int = 1 << 30) -> Iterator[list[str]]:
    """The staged texts of one split/side, in order, `size` at a time (the last list may be shorter)."""
    with open(_stage_path(tmp, split, side), encoding="utf-8", newline="") as f:
        texts: list[str] = []
        rest = ""
        for block in iter(lambda: f.read(1 << 20), ""):
            *done, rest = (rest + block).split("\0")
            texts += done
            while len(texts) >= size:
                yield texts[:size]
                texts = texts[size:]
        if texts:
            yield texts


def _staged(tmp: Path, split: str, side: str) -> Iterator[str]:
    for texts in _staged_lists(tmp, split, side, 1 << 16):
        yield from texts


def _staged_chunks(tmp: Path, split: str, sides: list[str], size: int) -> Iterator[list[list[str]]]:
    """Columns of `size` staged rows at a time, as _chunks gives them."""
    return (list(cols) for cols in zip(*(_staged_lists(tmp, split, side, size) for side in sides)))


class _Sample:
    """A uniform random sample of `size` rows of a stream (reservoir sampling, Vitter's algorithm R), seeded: the
    tokenizer of --tokenizer-sample is trained on it."""

    def __init__(self, size: int, seed: int = 0):
        self.size, self.rows, self.seen = size, [], 0
        self.rng = random.Random(seed)

    def add(self, rows: Iterable[Row]) -> None:
        for row in rows:
            self.seen += 1
            if len(self.rows) < self.size:
                self.rows.append(row)
            else:
                j = self.rng.randrange(self.seen)
                if j < self.size:
                    self.rows[j] = row


def _write_text(tmp: Path, split: str, side: str, mode: str) -> None:
    """{split}.{side}.txt: the cleaned text of valid/test, a row a line (paragraphs separated by a blank line; a
    document as it is)."""
    sep = "\n\n" if mode == "paragraph" else "\n"
    with open(tmp / f"{split}.{side}.txt", "w", encoding="utf-8", newline="") as f:
        if mode == "document":
            f.writelines(_staged(tmp, split, side))
            return
        for i, text in enumerate(_staged(tmp, split, side)):
            f.write(sep + text if i else text)
        f.write("\n")


# --- the command ---------------------------------------------------------------------------------------------

UP_TO_DATE = "{out}: up to date (same inputs and settings); use --force to rebuild it"


class _UpToDate(Exception):
    """A hub dataset turned out to be prepared already, same settings and same text (known only once it is read)."""


def _noop(_: str) -> None:
    pass


def prepare(
    cfg: PrepareConfig,
    force: bool = False,
    progress: Callable[[str], None] = _noop,
    log: Callable[[str], None] = _noop,
) -> Path:
    """Build the prepared directory `cfg.out` and return its path (see `_prepare`); a second prepare of the same
    directory while this one runs is refused (io.run_lock)."""
    cfg.validate()  # (a config built in code: its lang_pairs from "de-en,en-de" to a list)
    with encoding_errors(cfg.encoding_errors):
        if not cfg.out:
            return _prepare(cfg, force, progress, log)  # (its own error: no output directory)
        with run_lock(cfg.out, "prepare"):
            return _prepare(cfg, force, progress, log)


def _prepare(
    cfg: PrepareConfig,
    force: bool = False,
    progress: Callable[[str], None] = _noop,
    log: Callable[[str], None] = _noop,
) -> Path:
    """Build the prepared directory `cfg.out` and return its path.

    Everything is streamed, CHUNK_ROWS rows at a time, so memory does not grow with the corpus: each split is read,
    cleaned and staged in the temp dir (pass 1), the tokenizers are trained on the staged train split, and each split
    is encoded and written from its staged text (pass 2).

    `progress(stage)` is told what is happening (the CLI shows it on a terminal); `log(message)` gets what the
    user should always see (the directory is up to date). With `force`, rebuild even when up to date and replace a
    directory prepared with other settings.
    """
    kind, sources = _plan(cfg)
    conv = _convention(cfg, kind)
    out_kind = "chat" if conv.kind == "chat" else kind  # (a chat model's conversations, from pairs or chats)
    out, settings = Path(cfg.out), _settings(cfg)

    # Files are hashed before anything is read, so an up-to-date directory costs one read of each input. A hub
    # dataset has no file to hash: its text is hashed as it is read, and compared once read.
    progress("hashing inputs")
    files = _input_files(cfg, out_kind, sources)
    refuse_overwriting_inputs([out], [*files.values(), cfg.tokenizer_from], "choose another -o")
    inputs = {path: _sha256_file(path) for path in dict.fromkeys(files.values())}
    roles = {role: inputs[path] for role, path in files.items()}
    hub_only = bool(cfg.dataset) and not cfg.data_files
    state = "replace"  # a hub dataset: known once read
    if not hub_only:
        fingerprint = _fingerprint(settings, roles)
        state = _existing_state(out, fingerprint, settings, inputs, force)
        if state == "same":
            log(UP_TO_DATE.format(out=out))
            return out

    reused = _reused(cfg, files, out_kind, conv)
    if reused:  # a reused tokenizer that lowercases: the prepared text (valid references too) follows it
        cfg = replace(cfg, lowercase=any(lowercases(tok) for tok in reused.values()))
    rows, labels = _rows(cfg, kind, sources)
    if cfg.valid_ratio:
        _cut_valid(rows, labels, cfg.valid_ratio, cfg.mono_mode)
    convert = _chat_converter(conv, cfg) if out_kind == "chat" else None
    mode = cfg.mono_mode if kind == "mono" else "line"
    try:
        with atomic_dir(out, overwrite=state == "replace") as tmp:
            report = {}
            sample = _Sample(cfg.tokenizer_sample) if cfg.tokenizer_sample and not cfg.tokenizer_from else None
            for split in sorted(rows, key=lambda s: SPLITS.index(base_split(s))):  # directions in the given order
                progress(f"reading and cleaning {split}")
                hasher = hashlib.sha256() if hub_only else None
                report[split] = _stage(tmp, split, rows[split], _sides(kind), kind, cfg, labels[split], hasher,
                                       sample if base_split(split) == "train" else None, convert)
                if not report[split]["kept"]:
                    raise InputError(labels[split], None, f"no {split} rows left after cleaning ({_dropped(report[split])})")
                if hasher is not None:
                    inputs[labels[split]] = roles[split] = hasher.hexdigest()
            if hub_only:
                fingerprint = _fingerprint(settings, roles)
                if _existing_state(out, fingerprint, settings, inputs, force) == "same":
                    raise _UpToDate

            toks, joint, tokenizer_meta, tagged, added = _tokenizers(tmp, cfg, out_kind, reused, files, inputs, report,
                                                                     sample, progress, conv)
            encoded = _encode_all(tmp, cfg, out_kind, toks, report, labels, mode, progress, conv)
            progress("writing")
            tokenizer_files = _save_tokenizers(tmp, _sides(out_kind), toks, files, cfg, tagged)
            meta = new_meta(out_kind, fingerprint=fingerprint, splits=encoded["splits"], vocab=encoded["vocab"],
                            tokenizers=tokenizer_files, joint_vocab=joint, tokenizer=tokenizer_meta,
                            **_described(cfg, kind, conv, added), settings=settings, inputs=inputs, cleaning=report)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except _UpToDate:
        log(UP_TO_DATE.format(out=out))
    return out


def _convention(cfg: PrepareConfig, kind: str) -> Convention:
    """The family conventions of the checkpoint --tokenizer-from names, checked against the data and options."""
    conv = Convention.of(cfg.tokenizer_from, kind == "parallel", cfg.text_field)
    if cfg.add_languages and (conv.kind == "chat" or conv.checkpoint is None
                              or conv.kind == "plain" and not cfg.lang_pairs):
        raise ConfigError("--add-language: gives a checkpoint (--tokenizer-from) a language token it lacks, for "
                          "--lang-pairs in it; a chat model is told its languages by name")
    if conv.kind in ("tokens", "chat") and kind == "parallel" and not cfg.lang_pairs:
        what = "its language tokens" if conv.kind == "tokens" else "the languages its instruction names"
        raise ConfigError(f"--tokenizer-from {cfg.tokenizer_from}: the model needs {what}: give the data's "
                          "direction(s) with --lang-pairs, e.g. --lang-pairs de-en")
    return conv


def _chat_converter(conv: Convention, cfg: PrepareConfig):
    """convert(cols, split, label) for _stage: each pair (the split's direction's languages) or conversation as the
    chat template's pieces, one JSON text a row."""
    def convert(cols: list[list[str]], split: str, label: str) -> list[list[str]]:
        if len(cols) == 2:
            src_lang, tgt_lang = split.split(".", 1)[1].split("-")
            chats = [pair_messages(s, t, src_lang, tgt_lang) for s, t in zip(*cols)]
        else:
            chats = [json.loads(text) for text in cols[0]]
        return [[json.dumps(segments(conv.text, m, label), ensure_ascii=False) for m in chats]]

    return convert


def _reused(cfg: PrepareConfig, files: dict, kind: str, conv: Convention) -> dict:
    """{side: tokenizer} of --tokenizer-from (read as its checkpoint reads them), {} without it."""
    return {side: load_tokenizer(files[f"tokenizer.{side}"], **conv.tokenizer_options) for side in _sides(kind)} \
        if cfg.tokenizer_from else {}


def _described(cfg: PrepareConfig, kind: str, conv: Convention, added: dict) -> dict:
    """What meta.json says of the data besides its splits: a monolingual directory's mode, a multilingual one's
    directions, a parallel one's source language (translate's sentence splitter reads it through the
    checkpoint), the family's convention it is written in and the languages it adds."""
    extra = {"mono_mode": cfg.mono_mode} if kind == "mono" else {"directions": cfg.lang_pairs} if cfg.lang_pairs else {}
    if conv.kind != "plain":
        extra["convention"] = conv.kind
    if added:
        extra["new_languages"] = added
    if cfg.corpora:
        extra["corpora"] = cfg.corpus_weights()
    if kind == "parallel":
        extra["src_lang"] = named_source_language(cfg.src, cfg.src_field, cfg.lang_pairs)
    return extra


def _encode_all(tmp: Path, cfg: PrepareConfig, kind: str, toks: dict, report: dict, labels: dict, mode: str,
                progress, conv: Convention) -> dict:
    """Every staged split encoded and written (pass 2): {"splits": each split's meta, "vocab": each side's size}."""
    sides = _sides(kind)
    vocab = {side: toks[side].get_vocab_size() for side in sides}
    splits_meta = {}
    for split in report:
        progress(f"encoding {split}")
        direction = split.split(".", 1)[1] if "." in split and cfg.lang_pairs else None  # (not a corpus)
        splits_meta[split] = _encode_staged(tmp, split, sides, toks, vocab, kind, cfg, report[split], labels[split],
                                            mode, direction, conv)
    return {"splits": splits_meta, "vocab": vocab}


def _tokenizers(tmp: Path, cfg: PrepareConfig, kind: str, reused: dict, files: dict, inputs: dict, report: dict,
                sample, progress, conv: Convention) -> tuple[dict, bool, dict, set[str], dict]:
    """(tokenizers, whether joint, what meta.json records of them, the sides given language tokens, the new
    languages): the reused ones, or trained on the staged train split(s); a multilingual directory's tags added,
    and the languages --add-language names."""
    if cfg.tokenizer_from:
        toks = reused
        joint = kind == "parallel" and inputs[files["tokenizer.src"]] == inputs[files["tokenizer.tgt"]]
        tokenizer_meta = {"type": "pretrained", "from": cfg.tokenizer_from, "model": type(toks["tgt"].model).__name__}
    else:
        progress(f"training {cfg.tokenizer} tokenizer")
        train_splits = [s for s in report if base_split(s) == "train"]
        toks, joint, tokenizer_meta = _train_on_staged(tmp, cfg, kind, _sides(kind), train_splits, sample)
    side = _sides(kind)[0]
    added = new_languages(cfg.add_languages, conv, toks[side], files.get(f"tokenizer.{side}"))
    changed = set()
    if added:
        for s in ("src", "tgt") if conv.kind == "tokens" or joint else ("src",):
            toks[s].add_special_tokens([a["token"] for a in added.values()])
            changed.add(s)
    if conv.kind == "tokens":
        _check_language_tokens(cfg.lang_pairs, conv, added)
    if conv.kind != "plain":  # (a chat model is told its languages by name)
        return toks, joint, tokenizer_meta, changed, added
    if conv.kind == "plain" and cfg.lang_pairs and conv.checkpoint is not None:
        _check_tags(toks["src"], files["tokenizer.src"], cfg)
    return toks, joint, tokenizer_meta, changed | _add_tags(toks, joint, cfg.lang_pairs), added


def _check_language_tokens(directions: list[str], conv: Convention, added: dict) -> None:
    """Every language of the directions is one the M2M-100/NLLB model has, or one --add-language adds."""
    for lang in sorted({code for d in directions for code in d.split("-")}):
        if lang not in conv.tokens and lang not in added:
            near = sorted(c for c in conv.tokens if c.split("_")[0][:2] == lang.split("_")[0][:2])[:6]
            raise ConfigError(f"--lang-pairs: the model has no language '{lang}'"
                              f"{' (close: ' + ', '.join(near) + ')' if near else ''}; a new one: --add-language "
                              f"{lang}[=LIKE]")


def _check_tags(tok, file: str, cfg: PrepareConfig) -> None:
    """A checkpoint's data: every target language of the directions has its >>xx<< tag, or --add-language adds it
    (a tag the model never saw is a new row, which train --init-from must grow)."""
    have = set(language_tags(tok, file)) | {str(a).partition("=")[0] for a in cfg.add_languages}
    missing = [lang for lang in target_languages(cfg.lang_pairs) if lang not in have]
    if missing:
        raise ConfigError(f"--lang-pairs: --tokenizer-from {cfg.tokenizer_from} has no {tag(missing[0])} tag; a "
                          f"new target language: --add-language {missing[0]}[=LIKE]")


def _train_on_staged(tmp: Path, cfg: PrepareConfig, kind: str, sides: list[str], train_splits: list[str],
                     sample) -> tuple[dict, bool, dict]:
    """(tokenizers, whether joint, what meta.json records of them), trained on the staged train split(s) (or on
    `sample`, a _Sample of their rows)."""
    def train_texts(i: int, side: str) -> Iterable[str]:
        if sample:
            return (row[i] for row in sample.rows)
        return itertools.chain.from_iterable(_staged(tmp, split, side) for split in train_splits)

    texts = {side: functools.partial(train_texts, i, side) for i, side in enumerate(sides)}
    toks, joint = _train_tokenizers(cfg, kind, texts)
    tokenizer_meta = {"type": cfg.tokenizer, "vocab_size": cfg.vocab_size}
    if sample is not None:
        tokenizer_meta["sample"] = len(sample.rows)
    return toks, joint, tokenizer_meta


def _encode_staged(tmp: Path, split: str, sides: list[str], toks: dict, vocab: dict, kind: str, cfg: PrepareConfig,
                   counts: dict, label: str, mode: str, direction: str | None, conv: Convention) -> dict:
    """Encode one staged split (`_encode`; a direction's sources start with its target language's tag, or with
    M2M-100's language tokens both sides with their language's), write the text of a split other than train, and
    drop its staged copy; returns what meta.json records of it."""
    firsts = [None, None]
    if direction is not None and conv.kind == "tokens":
        firsts = [toks[side].token_to_id(conv.token(lang)) for side, lang in zip(sides, direction.split("-"))]
    elif direction is not None and kind == "parallel":
        firsts[0] = toks["src"].token_to_id(tag(direction.split("-")[1]))
    meta = (_encode_chat(tmp, split, toks["tgt"], cfg, counts) if kind == "chat"
            else _encode(tmp, split, sides, toks, vocab, kind, cfg, counts, firsts))
    if not meta[sides[0]]["count"]:
        raise InputError(label, None, f"no {split} rows left after cleaning ({_dropped(counts)})")
    if base_split(split) != "train" and kind != "chat":
        for side in sides:
            _write_text(tmp, split, side, mode)
    for side in ["tgt"] if kind == "chat" else sides:
        _stage_path(tmp, split, side).unlink()
    return meta


def _save_tokenizers(tmp: Path, sides: list[str], toks: dict, files: dict, cfg: PrepareConfig,
                     tagged: set[str]) -> dict[str, str]:
    """Write each side's tokenizer.json; returns {side: file name}. `tagged`: the sides given language tags."""
    tokenizer_files = {side: f"tokenizer.{side}.json" for side in sides}
    for side, name in tokenizer_files.items():
        source = files.get(f"tokenizer.{side}", "")
        if cfg.tokenizer_from and not source.endswith(SENTENCEPIECE_SUFFIXES) and side not in tagged:
            # the very same bytes, so that eval can tell it is the checkpoint's tokenizer
            shutil.copyfile(source, tmp / name)
        else:
            save_tokenizer(toks[side], tmp / name)
    return tokenizer_files


def _encode(tmp: Path, split: str, sides: list[str], toks: dict, vocab: dict, kind: str, cfg: PrepareConfig,
            counts: dict, firsts: list[int | None]) -> dict:
    """Encode one staged split chunk by chunk (the Rust library uses every core), apply the token-length filters
    to train pairs, and write the ids, each side's after its `firsts` id (a language token) where given; returns
    {side: what meta.json records}."""
    toks = {side: for_clean_text(tok, cfg.nfc, cfg.lowercase) for side, tok in toks.items()}  # the staged text is clean
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(SequenceWriter(tmp, split, side, vocab[side])) for side in sides]
        for ids in encode_chunks([toks[side] for side in sides], _staged_chunks(tmp, split, sides, CHUNK_ROWS)):
            if kind == "parallel" and base_split(split) == "train":
                keep = cleaning.length_filter(ids[0], ids[1], counts, cfg.max_length, cfg.max_ratio)
                if len(keep) < len(ids[0]):
                    ids = [[seqs[i] for i in keep] for seqs in ids]
            for i, first in enumerate(firsts[: len(ids)]):
                if first is not None:
                    ids[i] = [[first, *seq] for seq in ids[i]]
            for w, seqs in zip(writers, ids):
                w.append(seqs)
        return {side: w.close() for side, w in zip(sides, writers)}


def _encode_chat(tmp: Path, split: str, tok, cfg: PrepareConfig, counts: dict) -> dict:
    """A chat model's staged conversations encoded whole (`encode_segments`): their ids as "tgt", and as "mask"
    1 on each reply token (the ones trained on); train conversations over --max-length tokens dropped."""
    with SequenceWriter(tmp, split, "tgt", tok.get_vocab_size()) as ids_out, SequenceWriter(tmp, split, "mask", 2) as mask_out:
        for texts in _staged_lists(tmp, split, "tgt", CHUNK_ROWS):
            ids, masks = encode_segments(tok, [json.loads(t) for t in texts])
            if base_split(split) == "train" and cfg.max_length:
                keep = [i for i, seq in enumerate(ids) if len(seq) <= cfg.max_length]
                counts["too_long"] += len(ids) - len(keep)
                counts["kept"] -= len(ids) - len(keep)
                ids, masks = [ids[i] for i in keep], [masks[i] for i in keep]
            ids_out.append(ids)
            mask_out.append(masks)
        return {"tgt": ids_out.close(), "mask": mask_out.close()}


def _add_tags(toks: dict, joint: bool, directions: list[str]) -> set[str]:
    """Each target language's tag (>>fr<<) added to the source vocabulary as a special token, after the trained
    pieces (a reused tokenizer that has it keeps its id); the target's too where the vocabulary is joint. Returns
    the sides whose tokenizer changed."""
    if not directions:
        return set()
    tags = [tag(lang) for lang in target_languages(directions)]
    changed = set()
    for side in ("src", "tgt") if joint else ("src",):
        missing = [t for t in tags if toks[side].token_to_id(t) is None]
        if missing:
            toks[side].add_special_tokens(missing)
            changed.add(side)
    return changed


def _sides(kind: str) -> list[str]:
    """The tokenizers' sides (a chat model's data: its one tokenizer's ids, "tgt", and their loss "mask")."""
    return ["src", "tgt"] if kind == "parallel" else ["tgt"]


def _train_tokenizers(cfg: PrepareConfig, kind: str, texts: dict[str, Callable[[], Iterable[str]]]):
    """Tokenizers trained on the train split (`texts`: each side's, read afresh at each call): one shared (joint) or
    one per side. Returns ({side: tok}, joint)."""
    if kind == "parallel" and cfg.joint_vocab:
        both = itertools.chain(texts["src"](), texts["tgt"]())
        tok = train_tokenizer(cfg.tokenizer, both, cfg.vocab_size, nfc=cfg.nfc, lowercase=cfg.lowercase)
        return {"src": tok, "tgt": tok}, True
    return {side: train_tokenizer(cfg.tokenizer, col(), cfg.vocab_size, nfc=cfg.nfc, lowercase=cfg.lowercase)
            for side, col in texts.items()}, False


def _dropped(counts: dict) -> str:
    parts = [f"{counts[k]} {k}" for k in cleaning.COLUMNS[1:-1] if counts[k]]
    return f"{counts['input']} read, dropped: {', '.join(parts) or 'none'}"
