"""Readers: raw corpora in, rows out, one at a time (a corpus is never held in memory whole).

A row of parallel data is a (source, target) tuple; monolingual data gives one string per sequence. Inputs:
  two aligned text files     line i of one is the translation of line i of the other
  TSV                        SRC<TAB>TGT per line (or other columns, numbered from 1)
  JSONL                      one JSON object a line; fields by dotted path, e.g. translation.de
  text                       monolingual: one sequence a line, a paragraph (blank-line separated, as in
                             WikiText), or the whole file (character-level LMs)
  datasets.load_dataset      hub names, or the packaged builders on local files (json, text, csv, parquet)
Every reader reports bad input as `file:line: message` (tfcli.io does the strict UTF-8 part).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence, TypeVar

from tfcli.errors import InputError, TfcliError
from tfcli.io import iter_lines, open_text

T = TypeVar("T")


def detect_format(path: str, fmt: str = "auto") -> str:
    """tsv / jsonl / text: `fmt` unless it is auto, else from the file name (a .gz suffix is looked through)."""
    if fmt != "auto":
        return fmt
    name = path[:-3] if path.endswith(".gz") else path
    suffix = Path(name).suffix.lower()
    if suffix == ".tsv":
        return "tsv"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "text"


def _nonempty(path: str, rows: Iterable[T], what: str = "empty input (no lines)") -> Iterator[T]:
    """`rows`, passed through; an error naming `path` if there were none."""
    empty = True
    for row in rows:
        empty = False
        yield row
    if empty:
        raise InputError(path, None, what)


def _count(rows: Iterable) -> int:
    return sum(1 for _ in rows)


def iter_parallel_files(src_path: str, tgt_path: str) -> Iterator[tuple[str, str]]:
    """(source line, target line) of two aligned files; their line counts must match."""
    src, tgt = iter_lines(src_path), iter_lines(tgt_path)
    n = 0
    for s in src:
        t = next(tgt, None)
        if t is None:
            if n == 0:
                raise InputError(tgt_path, None, "empty input (no lines)")
            _misaligned(src_path, n + 1 + _count(src), tgt_path, n)
        n += 1
        yield s, t
    if n == 0:
        raise InputError(src_path, None, "empty input (no lines)")
    rest = _count(tgt)
    if rest:
        _misaligned(src_path, n, tgt_path, n + rest)


def _misaligned(src_path: str, n_src: int, tgt_path: str, n_tgt: int):
    raise TfcliError(
        f"{src_path} has {n_src} lines but {tgt_path} has {n_tgt}; "
        "source and target files must be aligned line by line"
    )


def _column(spec: str | None, default: int, option: str) -> int:
    if spec is None:
        return default
    if not spec.isdigit() or int(spec) < 1:
        raise TfcliError(f"{option} {spec}: for a TSV file give a column number (1 is the first column)")
    return int(spec)


def iter_tsv(path: str, src_col: str | None = None, tgt_col: str | None = None) -> Iterator[tuple[str, str]]:
    """(src, tgt) of SRC<TAB>TGT lines; `src_col`/`tgt_col` pick other columns (1-based); blank lines are skipped."""
    i = _column(src_col, 1, "--src-field") - 1
    j = _column(tgt_col, 2, "--tgt-field") - 1
    need = max(i, j) + 1

    def rows():
        for lineno, line in enumerate(iter_lines(path), 1):
            if not line.strip():
                continue
            cols = line.split("\t")
            if len(cols) < need:
                what = "no tab" if len(cols) == 1 else f"{len(cols)} columns"
                raise InputError(path, lineno, f"expected {need} tab-separated columns, found {what}")
            yield cols[i], cols[j]

    return _nonempty(path, rows())


def get_field(row, field: str):
    """row["a"]["b"] for field "a.b"; KeyError if any part is missing."""
    value = row
    for part in field.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(field)
        value = value[part]
    return value


def _field_text(row, field: str, path: str, lineno: int) -> str:
    try:
        value = get_field(row, field)
    except KeyError:
        keys = ", ".join(row) if isinstance(row, dict) else type(row).__name__
        raise InputError(path, lineno, f"no field '{field}' (the row has: {keys})") from None
    if not isinstance(value, str):
        raise InputError(path, lineno, f"field '{field}' is {type(value).__name__}, expected a string")
    return value


def iter_jsonl(path: str, fields: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """The strings at `fields` (dotted paths) of each JSON line, as a tuple (blank lines are skipped)."""

    def rows():
        for lineno, line in enumerate(iter_lines(path), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(path, lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
            yield tuple(_field_text(row, field, path, lineno) for field in fields)

    return _nonempty(path, rows())


def group_mono(lines: Iterable[str], mode: str) -> Iterator[str]:
    """Sequences from lines: each line, each blank-line separated paragraph (lines joined by newlines), or all
    (document mode: the one mode that holds its whole input in memory)."""
    if mode == "line":
        yield from lines
        return
    if mode == "document":
        yield "\n".join(lines)
        return
    current: list[str] = []
    for line in lines:
        if line.strip():
            current.append(line)
        elif current:
            yield "\n".join(current)
            current = []
    if current:
        yield "\n".join(current)


def _ends_with_newline(path: str) -> bool:
    f = open_text(path)
    try:
        last = b""
        for block in iter(lambda: f.read(1 << 20), b""):
            last = block[-1:]
        return last == b"\n"
    finally:
        f.close()


def iter_mono(path: str, mode: str) -> Iterator[str]:
    """A monolingual text file as sequences; in document mode the text is kept whole, final newline included."""
    items = group_mono(_nonempty(path, iter_lines(path)), mode)
    if mode == "document":
        text = next(items)
        if _ends_with_newline(path):
            text += "\n"
        items = iter([text])
    return _nonempty(path, items, "empty input (only blank lines)")


def parse_assignments(items: Iterable[str], option: str, default_key: str | None = None) -> dict[str, list[str]]:
    """["train=a.jsonl", "valid=b.jsonl"] -> {"train": ["a.jsonl"], "valid": ["b.jsonl"]}."""
    out: dict[str, list[str]] = {}
    for item in items:
        if "=" in item:
            key, value = item.split("=", 1)
        elif default_key is not None:
            key, value = default_key, item
        else:
            raise TfcliError(f"{option} {item}: expected SPLIT=VALUE, e.g. valid=validation")
        if key not in ("train", "valid", "test") or not value:
            raise TfcliError(f"{option} {item}: the split must be train, valid or test, with a value after '='")
        out.setdefault(key, []).append(value)
    return out


HUB_SPLIT_NAMES = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


def load_hf(
    name: str,
    fields: Sequence[str],
    config: str | None = None,
    data_files: dict[str, list[str]] | None = None,
    splits: dict[str, str] | None = None,
    streaming: bool = False,
) -> dict[str, Callable[[], Iterator[tuple[str, ...]]]]:
    """Load a dataset with `datasets.load_dataset`; for each of our splits, a function that iterates over its rows
    as tuples of `fields` (dotted paths). With `streaming`, rows come from the files (or the hub) as they are read.

    `splits` maps our split names (train/valid/test) to the dataset's (e.g. valid -> validation, or a slice such as
    train[:10000]); without it, train/validation/test are found by their usual names. Local files work the same way
    through the packaged builders: name "json" or "text" with `data_files` {split: [paths]}.
    """
    import datasets

    datasets.disable_progress_bars()
    where = f"--dataset {name}" + (f" --dataset-config {config}" if config else "")

    def load(**kw):
        try:
            return datasets.load_dataset(name, config, data_files=data_files or None, streaming=streaming, **kw)
        except Exception as e:  # network, unknown name, bad split, unreadable file: one line for the user
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TfcliError(f"{where}: cannot load: {first}") from None

    if splits:
        found = {ours: (theirs, load(split=theirs)) for ours, theirs in splits.items()}
    else:
        dd = load()
        found = {}
        for ours, candidates in HUB_SPLIT_NAMES.items():
            for theirs in candidates:
                if theirs in dd:
                    found[ours] = (theirs, dd[theirs])
                    break
        if "train" not in found:
            raise TfcliError(f"{where}: no train split (it has: {', '.join(dd)}); name one with --dataset-split train=NAME")
    return {ours: functools.partial(_hf_rows, ds, fields, f"{name}[{theirs}]") for ours, (theirs, ds) in found.items()}


def _hf_rows(ds, fields: Sequence[str], label: str) -> Iterator[tuple[str, ...]]:
    def rows():
        for row_no, row in enumerate(ds, 1):
            yield tuple(_field_text(row, field, label, row_no) for field in fields)

    return _nonempty(label, rows())
