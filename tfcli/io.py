"""File helpers: atomic writes and strict line reading with file:line errors.

Every output tfcli writes goes to a temporary file (or directory) next to its destination and is renamed into place
only when complete, so an interrupted or failed run never leaves a half-written file where a good one was.
"""

from __future__ import annotations

import contextlib
import gzip

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator

from tfcli.errors import InputError, TfcliError

BOM = "\ufeff"


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextlib.contextmanager
def atomic_open(path: os.PathLike | str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside `path`; on success fsync and rename it over `path`, on failure remove it."""
    path = Path(path)
    if "b" in mode:
        encoding = None
    _check_writable_dir(path.parent)
    tmp = _tmp_name(path)
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            raise TfcliError(f"{path}: cannot write: {e.strerror or e}") from e
        raise


def atomic_write_text(path: os.PathLike | str, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_json(path: os.PathLike | str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: os.PathLike | str, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory in a temp dir beside `path`, then rename it into place.

    With `overwrite`, an existing `path` is moved aside first and deleted only after the new one is in place.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_writable_dir(path.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        old = None
        if path.exists():
            if not overwrite:
                raise TfcliError(f"{path}: already exists")
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _check_writable_dir(d: Path) -> None:
    if not d.exists():
        raise TfcliError(f"{d}: directory does not exist")
    if not os.access(d, os.W_OK):
        raise TfcliError(f"{d}: directory is not writable")


def open_text(path: os.PathLike | str) -> IO[bytes]:
    """Open a file for reading bytes; `-` is stdin, `.gz` is decompressed."""
    if str(path) == "-":
        import sys

        return sys.stdin.buffer
    path = Path(path)
    if not path.exists():
        raise TfcliError(f"{path}: no such file")
    if path.is_dir():
        raise TfcliError(f"{path}: is a directory, expected a text file")
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    return open(path, "rb")


def decode_line(raw: bytes, path, lineno: int) -> str:
    """Decode one line strictly as UTF-8, dropping a BOM on line 1 and the line ending (LF or CRLF)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            path, lineno, f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); convert the file to UTF-8"
        ) from None
    if lineno == 1 and text.startswith(BOM):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    return text


def iter_lines(path: os.PathLike | str, *, allow_nul: bool = False) -> Iterator[str]:
    """Yield decoded lines of a text file (or `-` for stdin), raising `InputError` with file:line on bad bytes."""
    name = "<stdin>" if str(path) == "-" else str(path)
    f = open_text(path)
    try:
        for lineno, raw in enumerate(f, 1):
            if not allow_nul and b"\x00" in raw:
                raise InputError(name, lineno, "contains a NUL byte; is this a binary file?")
            yield decode_line(raw, name, lineno)
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TfcliError(f"{name}: cannot read: {e}") from e
    finally:
        if str(path) != "-":
            f.close()


def read_lines(path: os.PathLike | str, **kw) -> list[str]:
    return list(iter_lines(path, **kw))


__all__ = [
    "atomic_open",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_dir",
    "open_text",
    "decode_line",
    "iter_lines",
    "read_lines",
]
