"""File helpers: atomic writes and strict line reading with file:line errors.

Every output tfcli writes goes to a temporary file (or directory) next to its destination and is renamed into place
only when complete, so an interrupted or failed run never leaves a half-written file where a good one was. Temp
names are dot-files carrying the writer's pid (`.NAME.tmp-PID...`); what a killed process (kill -9, power loss) left
behind is removed by the next write of the same NAME.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import gzip
import io

import json
import os
import select
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Iterable, Iterator, NamedTuple

from tfcli.errors import ConfigError, InputError, TfcliError, raise_if_interrupted

BOM = "\ufeff"


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_stale(path: Path) -> None:
    """Remove `.NAME.tmp-PID...` / `.NAME.old-PID` entries beside `path` whose process no longer runs."""
    prefixes = (f".{path.name}.tmp-", f".{path.name}.old-")
    with contextlib.suppress(OSError):
        for entry in os.scandir(path.parent):
            prefix = next((p for p in prefixes if entry.name.startswith(p)), None)
            pid = entry.name[len(prefix):].split("-")[0] if prefix else ""
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no room for the output, whichever file an error names
_write_points = 0


def fault_point(what: str) -> None:
    """Fault injection for tests: with TFCLI_FAIL_AT=N in the environment, the process's Nth write point fails as
    a full disk does (OSError ENOSPC), so that every output's atomicity is checked deterministically, not by timing.
    Write points: each file an output is made of, and each rename that puts one in place."""
    global _write_points
    n = os.environ.get("TFCLI_FAIL_AT")
    if not n:
        return
    _write_points += 1
    if _write_points == int(n):
        raise OSError(errno.ENOSPC, f"No space left on device (injected at write point {n}: {what})")


def _ours(e: BaseException, tmp: Path) -> bool:
    """An OSError from writing the output (a full disk, no file name, or one inside `tmp`), not e.g. from opening an
    input file."""
    if not isinstance(e, OSError):
        return False
    return e.errno in FULL or e.filename is None or str(e.filename).startswith(str(tmp))


@contextlib.contextmanager
def atomic_open(path: os.PathLike | str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temp file beside `path`; on success fsync and rename it over `path`, on failure remove it.

    A symlink is followed (the file it points to is replaced, the link kept). A device, FIFO or socket
    (/dev/null, /dev/stdout, a named pipe) is written directly: it cannot hold a half-written file, and must never be
    replaced by one.
    """
    shown = path
    if "b" in mode:
        encoding = None
    try:
        kind = os.stat(path).st_mode  # through symlinks
    except OSError:
        kind = None  # a new file (or an unusable path: the checks below say why)
    if kind is not None and stat.S_ISDIR(kind):
        raise TfcliError(f"{shown}: is a directory")
    if kind is not None and not stat.S_ISREG(kind):
        try:
            with open(path, mode, encoding=encoding) as f:
                yield f
        except OSError as e:
            if e.filename not in (None, str(path)):
                raise
            raise TfcliError(f"{shown}: cannot write: {e.strerror or e}") from e
        return
    path = Path(os.path.realpath(path))
    make_parent(path)
    _remove_stale(path)
    tmp = _tmp_name(path)
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        raise_if_interrupted()
        fault_point(f"rename into {path.name}")
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if _ours(e, tmp):
            raise TfcliError(f"{shown}: cannot write: {e.strerror or e}") from e
        raise


def atomic_write_text(path: os.PathLike | str, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_json(path: os.PathLike | str, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


@contextlib.contextmanager
def atomic_dir(path: os.PathLike | str, overwrite: bool = False, needs: int | None = None) -> Iterator[Path]:
    """Build a directory in a temp dir beside `path`, then rename it into place.

    With `overwrite`, an existing `path` is swapped with the new one in one step where the OS can (Linux), else
    moved aside first; the old one is deleted only after the new one is in place. `needs`: about how many bytes the
    directory takes, said when the disk is full.
    """
    path = Path(path)
    make_parent(path)
    _remove_stale(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    try:
        yield tmp
        raise_if_interrupted()
        fault_point(f"rename into {path.name}")
        if not path.exists():
            os.replace(tmp, path)
        elif not overwrite:
            raise TfcliError(f"{path}: already exists")
        elif _exchange(tmp, path):  # now `tmp` holds the old directory
            shutil.rmtree(tmp, ignore_errors=True)
        else:  # a kill between these two renames leaves no `path`, only `.NAME.old-PID`
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if _ours(e, tmp):
            raise TfcliError(f"{path}: cannot write: {e.strerror or e}{space_needed(needs)}") from e
        raise


def space_needed(nbytes: int | None) -> str:
    """"; about N MiB needed" for an error message (nothing when unknown)."""
    return f"; about {nbytes / 2**20:.1f} MiB needed" if nbytes else ""


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 with RENAME_EXCHANGE); False where the OS or filesystem cannot."""
    if sys.platform != "linux":
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it (old glibc, musl)
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # e.g. a filesystem without RENAME_EXCHANGE
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def make_parent(path: Path) -> None:
    """Every output's rule: missing parent directories are created (`-o new/dir/out.txt` works, as `--output-dir`
    does); a file in the way or a read-only directory is one line naming it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file where a directory should be
        raise TfcliError(f"{path.parent}: cannot be created: {_file_in_the_way(path)} is a file") from None
    except NotADirectoryError:
        raise TfcliError(f"{path.parent}: cannot be created: {_file_in_the_way(path)} is a file") from None
    except PermissionError:
        raise TfcliError(f"{_first_missing(path.parent)}: cannot be created: permission denied") from None
    except OSError as e:
        raise TfcliError(f"{path.parent}: cannot be created: {e.strerror or e}") from None
    _check_writable_dir(path.parent)


def _first_missing(d: Path) -> Path:
    for p in reversed([d, *d.parents]):
        if not p.exists():
            return p
    return d


def _check_writable_dir(d: Path) -> None:
    if not d.exists():
        raise TfcliError(f"{d}: directory does not exist")
    if not d.is_dir():
        raise TfcliError(f"{d}: is not a directory")
    if not os.access(d, os.W_OK):
        raise TfcliError(f"{d}: directory is not writable")


def refuse_overwriting_inputs(outputs, inputs, hint: str = "choose another output") -> None:
    """Raise a TfcliError when writing any of `outputs` would replace or delete one of `inputs`: the same file or
    directory however it is spelled (relative, absolute, through a symlink, a hard link), or an output directory that
    holds an input (a directory output is replaced whole). `-` as an output is stdout: refused when the shell
    redirected it into an input file. Paths that do not exist yet are never inputs."""
    ins = []
    for p in inputs:
        if p is None or str(p) == "-":
            continue
        st = _stat(p)
        if st is not None:
            ins.append((p, st, os.path.realpath(p)))
    for out in outputs:
        if out is None:
            continue
        if str(out) == "-":
            st = _stat_fd(1)
            if st is None or not stat.S_ISREG(st.st_mode):
                continue
            shown, real = "stdout", None
        else:
            # also the lexical form: "new-dir/../x" names x once new-dir is created
            shown, lexical = str(out), os.path.normpath(os.path.abspath(out))
            st = _stat(out) or _stat(lexical)
            real = os.path.realpath(out if _stat(out) else lexical)
            if st is None:
                continue
        for p, pst, preal in ins:
            if (st.st_dev, st.st_ino) == (pst.st_dev, pst.st_ino):
                same = "" if os.path.abspath(shown) == os.path.abspath(p) else f" (the same file as {p})"
                raise TfcliError(f"{shown}: is an input of this command{same}; writing it would destroy that input; "
                                 f"{hint}")
            if real and stat.S_ISDIR(st.st_mode) and preal.startswith(real.rstrip(os.sep) + os.sep):
                raise TfcliError(f"{shown}: holds the input {p}; writing this directory would destroy it; {hint}")


def _stat(path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _stat_fd(fd: int) -> os.stat_result | None:
    try:
        return os.fstat(fd)
    except (OSError, ValueError):
        return None


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


ENCODING_ERRORS = ("strict", "replace")
# How text input that is not UTF-8 is read, for the command (or library call) that sets it with `encoding_errors`:
# strict (one error naming file, line and column) or replace (each bad byte becomes U+FFFD, the line is kept). None:
# strict, in a command that offers no choice (its error does not name the option).
_encoding_errors: contextvars.ContextVar[str | None] = contextvars.ContextVar("tfcli_encoding_errors", default=None)


@contextlib.contextmanager
def encoding_errors(policy: str) -> Iterator[None]:
    """Read text input with `policy` (strict or replace) inside this block; the outer setting is back after."""
    if policy not in ENCODING_ERRORS:
        raise ConfigError(f"--encoding-errors {policy}: choose from {', '.join(ENCODING_ERRORS)}")
    token = _encoding_errors.set(policy)
    try:
        yield
    finally:
        _encoding_errors.reset(token)


def decode_line(raw: bytes, path, lineno: int, errors: str | None = None) -> str:
    """Decode one line as UTF-8, dropping a BOM on line 1 and the line ending (LF or CRLF). `errors`: strict or
    None (an InputError naming file, line and column; strict also names --encoding-errors) or replace (U+FFFD for
    each invalid byte)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if errors == "replace":
            text = raw.decode("utf-8", errors="replace")
        else:
            hint = " (or read it with --encoding-errors replace)" if errors == "strict" else ""
            raise InputError(path, lineno, f"invalid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                           f"convert the file to UTF-8{hint}") from None
    if lineno == 1 and text.startswith(BOM):
        text = text[1:]
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    return text


class InputLine(NamedTuple):
    """A line of an input: its file's name (<stdin> for `-`), its 1-based number, its text (without the newline)."""

    name: str
    lineno: int
    text: str


def read_inputs(inputs: list[str], pauses: bool = False) -> Iterator[InputLine | None]:
    """An `InputLine` for every line of every input, `-` being stdin; with `pauses`, also None
    whenever a piped stdin has no further line ready (so `tail -f x | tfcli translate` and co-processes get each
    line's translation without waiting for --buffer-size lines; a fast producer still fills whole buffers)."""
    for path in inputs:
        name = "<stdin>" if path == "-" else path
        lineno = 0
        for text in iter_lines(path, pauses=pauses):
            if text is None:
                yield None
                continue
            lineno += 1
            yield InputLine(name, lineno, text)


def iter_lines(path: os.PathLike | str, *, allow_nul: bool = False, pauses: bool = False) -> Iterator[str | None]:
    """Yield decoded lines of a text file (or `-` for stdin), raising `InputError` with file:line on bad bytes.

    `pauses`: when stdin is a pipe or a terminal, also yield None each time no further complete line is ready yet
    (input has paused), so that the reader can act on what it has instead of waiting for more or for the end.
    """
    name = "<stdin>" if str(path) == "-" else str(path)
    f = open_text(path)
    raws: Iterable[bytes | None] = _lines_with_pauses(f.fileno()) if pauses and _is_stream(path) else f
    replaced: list[int] = []  # lines whose invalid bytes became U+FFFD
    try:
        lineno = 0
        for raw in raws:
            if raw is None:
                yield None
                continue
            lineno += 1
            if not allow_nul and b"\x00" in raw:
                raise InputError(name, lineno, "contains a NUL byte; is this a binary file?")
            policy = _encoding_errors.get()
            text = decode_line(raw, name, lineno, policy)
            if policy == "replace" and "\ufffd" in text and "\ufffd" not in raw.decode("utf-8", "ignore"):
                replaced.append(lineno)
            yield text
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TfcliError(f"{name}: cannot read: {e}") from e
    finally:
        if str(path) != "-":
            f.close()
        if replaced:
            print(f"warning: {name}: {len(replaced)} line(s) with invalid UTF-8, read with U+FFFD in place of each bad "
                  f"byte (first: line {replaced[0]})", file=sys.stderr, flush=True)


def _is_stream(path) -> bool:
    """stdin, and a pipe or a terminal (not a file), on a system where select() works on it."""
    if str(path) != "-" or os.name != "posix":
        return False
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # no real stdin (e.g. replaced in tests)
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def _lines_with_pauses(fd: int) -> Iterator[bytes | None]:
    """Lines (with their newline) read straight from file descriptor `fd`, and None whenever no complete line is
    ready: a fast producer (cat of a big file) always has more ready, so pauses come only when input really waits."""
    buf = b""
    while True:
        nl = buf.find(b"\n")
        if nl >= 0:
            line, buf = buf[: nl + 1], buf[nl + 1 :]
            yield line
            continue
        if not select.select([fd], [], [], 0)[0]:
            yield None
            select.select([fd], [], [])  # wait for more
        data = os.read(fd, 1 << 16)
        if not data:  # end of input
            if buf:
                yield buf
            return
        buf += data


def read_lines(path: os.PathLike | str, *, rstrip: bool = False, allow_nul: bool = False) -> list[str]:
    """All lines of a text file (`-`: stdin); `rstrip`: without trailing whitespace, as sacrebleu reads its files."""
    lines = iter_lines(path, allow_nul=allow_nul)
    return [line.rstrip() for line in lines] if rstrip else list(lines)


def read_text(path: os.PathLike | str) -> str:
    """A whole text file (`-`: stdin), CRLF read as LF, a leading BOM left out; bad bytes an InputError naming the
    line, as iter_lines raises."""
    return read_document(path)[0]


def read_document(path: os.PathLike | str) -> tuple[str, str]:
    """`read_text`'s text, and the file's line end: "\r\n" where every line ends so (a file written on Windows),
    else "\n", so that a file format's output can be written with the line ends of its input."""
    name = "<stdin>" if str(path) == "-" else str(path)
    f = open_text(path)
    try:
        raw = f.read()
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise TfcliError(f"{name}: cannot read: {e}") from e
    finally:
        if str(path) != "-":
            f.close()
    newline = "\r\n" if 0 < raw.count(b"\r\n") == raw.count(b"\n") else "\n"
    text = "\n".join(decode_line(line, name, k + 1, _encoding_errors.get()) for k, line in enumerate(raw.split(b"\n")))
    return text, newline


__all__ = [
    "atomic_open",
    "atomic_write_text",
    "atomic_write_json",
    "atomic_dir",
    "open_text",
    "decode_line",
    "encoding_errors",
    "iter_lines",
    "read_lines",
    "read_text",
    "refuse_overwriting_inputs",
    "run_lock",
]


@contextlib.contextmanager
def run_lock(path: os.PathLike | str, what: str) -> Iterator[None]:
    """Hold `.NAME.lock` beside `path` while a command writes `path`, so that a second `tfcli train -o RUN` (or
    `prepare -o DIR`) on it refuses instead of writing beside the first. The lock names its process and host; one
    left by a process that is gone (killed) is taken over, so a kill -9 never leaves a directory locked."""
    import socket

    path = Path(path)
    lock = path.parent / f".{path.name}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):  # a file where a parent directory should be
        raise TfcliError(f"{path}: cannot be created: Not a directory ({_file_in_the_way(path)} is a file)") from None
    me = {"pid": os.getpid(), "host": socket.gethostname(), "command": what, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except PermissionError:
            raise TfcliError(f"{lock.parent}: directory is not writable (needed for {path.name})") from None
        except FileExistsError:
            holder = _lock_holder(lock)
            if holder is None or _gone(holder, me["host"]):
                lock.unlink(missing_ok=True)  # stale: its process is gone
                continue
            raise TfcliError(
                f"{path}: in use by another tfcli {holder.get('command', '')} (pid {holder.get('pid')} on "
                f"{holder.get('host')}, since {holder.get('since')}); wait for it to finish, or remove {lock} if that "
                "process is gone"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    else:
        raise TfcliError(f"{lock}: cannot take the lock")
    try:
        yield
    finally:
        if (_lock_holder(lock) or {}).get("pid") == me["pid"]:
            lock.unlink(missing_ok=True)


def _file_in_the_way(path: Path) -> Path:
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return path.parent


def _lock_holder(lock: Path) -> dict | None:
    try:
        holder = json.loads(lock.read_text())
        return holder if isinstance(holder, dict) else None
    except (OSError, ValueError):
        return None  # half-written by a killed process: stale


def _gone(holder: dict, host: str) -> bool:
    """The lock's process no longer runs (checkable on this host only; another host's lock is respected)."""
    if holder.get("host") != host:
        return False
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, KeyError, ValueError, TypeError):
        return False
    return False


@contextlib.contextmanager
def open_output(path: str | None) -> Iterator[IO[str]]:
    """A UTF-8 text stream: stdout, or a file written atomically (it appears only when complete)."""
    if path is None or path == "-":
        out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
        try:
            yield out
            out.flush()
        finally:
            out.detach()  # leave sys.stdout open
    else:
        with atomic_open(path, "w") as f:
            yield f
