"""int8 linear layers for decoding on the CPU (`--dtype int8`), with a result per row that depends on that row alone.

y = x W^T + b with W in int8, one scale per output row (max |w| mapped to 127), and x quantised at each call with one
scale per row (per token), symmetrically to 7 bits: s_r = max_j |x_rj| / 63, q_rj = round(x_rj / s_r). Then
y_rj = s_r * w_j * sum_k q_rk W_jk + b_j. The integer sums are exact, so a sentence's translation is the same in any
batch, next to any other sentences (a scale for the whole call, as torch's dynamic quantisation takes, made it
depend on them). 7 bits, not 8: fbgemm's AVX2/AVX-512 kernels add pairs of u8 x s8 products in 16 bits, which 8-bit
inputs could saturate.

Two engines run the integer product: fbgemm (cheap to set up: few rows) and, on a CPU with AMX, oneDNN (its tiles
win on many rows). Both return the exact sum as a float times w_j (exact while K * 63 * 127 < 2^24, i.e. K <= 2,097;
beyond that one engine serves every call), so which engine served a call changes nothing.

Quantising the rows and applying s_r, b (and a residual or ReLU) are one pass each in a small C file
(int8_rows.c), built once per machine with the system's C compiler into the user's cache; without a compiler the
same operations run as torch ops, a little slower, with the same results bit for bit.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import warnings
from pathlib import Path

import torch
from torch import nn

from tfcli.device import int8_engines

LEVELS = 63  # |q| <= 63: 7 bits
# on a CPU with AMX, calls with at least this many rows go to oneDNN, fewer to fbgemm
ONEDNN_MIN_ROWS = 32
_EXACT_SUM = 2**24  # integers up to this are exact in float32


class Int8Linear:
    """`module` (nn.Linear) in int8: `self(x)` for 2-d fp32 x, or `self(x, residual)` = x W^T + b + residual; with
    `relu`, max(0, .) after the bias."""

    def __init__(self, module: nn.Linear, relu: bool = False, engines: tuple[str, ...] | None = None):
        """`engines`: which of "fbgemm" and "onednn" to use (default: those available; oneDNN only on a CPU with AMX
        unless fbgemm is missing); with both, calls of fewer than ONEDNN_MIN_ROWS rows go to fbgemm."""
        w = module.weight.detach().float().contiguous()
        self.w_scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        wq = torch.round(w / self.w_scale[:, None]).to(torch.int8)
        self.bias = module.bias.detach().float().contiguous() if module.bias is not None else None
        self.relu = relu
        if engines is None:
            engines = int8_engines()
        if not engines:
            raise RuntimeError("int8: this torch build has neither fbgemm's nor oneDNN's int8 linear layers")
        if w.size(1) * LEVELS * 127 >= _EXACT_SUM:  # engines could round the sum differently: one serves all
            engines = engines[-1:]
        self.fbgemm = self.onednn = None
        if "fbgemm" in engines:
            previous = torch.backends.quantized.engine
            with warnings.catch_warnings():  # torch marks its quantised tensor types as deprecated
                warnings.simplefilter("ignore")
                q = torch._make_per_channel_quantized_tensor(
                    wq, self.w_scale.double(), torch.zeros(len(w), dtype=torch.long), 0)
                engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
                try:  # a process-wide setting, restored at once; the packed weights keep their engine
                    torch.backends.quantized.engine = engine
                    self.fbgemm = torch.ops.quantized.linear_prepack(q, None)
                finally:
                    torch.backends.quantized.engine = previous
        if "onednn" in engines:
            self.onednn = torch.ops.onednn.qlinear_prepack(wq, None)
            self._zeros = torch.zeros(len(w), dtype=torch.long)
        self.min_rows = ONEDNN_MIN_ROWS if self.fbgemm is not None else 0

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        x = x.contiguous()
        if self.onednn is not None and x.size(0) >= self.min_rows:
            q, s = quantize_rows(x, as_int8=True)
            y = torch.ops.onednn.qlinear_pointwise(q, 1.0, 0, self.onednn, self.w_scale, self._zeros, None, 1.0, 0,
                                                   torch.float32, "none", [], "")
        else:
            q, s = quantize_rows(x, as_int8=False)  # fbgemm takes integer-valued floats, quantised again exactly
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(q, 1.0, LEVELS + 1, self.fbgemm)
        return dequantize_rows(y, s, self.bias, residual, self.relu)


def quantize_rows(x: torch.Tensor, as_int8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) for contiguous 2-d fp32 x: s (rows, 1) = max(max |x_r|, 1e-30) / LEVELS, q = round(x / s), int8 or
    integer-valued fp32."""
    lib = _kernels()
    if lib is None:
        s = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30).div_(LEVELS)
        q = (x / s).round_()
        return (q.to(torch.int8) if as_int8 else q), s
    rows, cols = x.shape
    q = torch.empty(rows, cols, dtype=torch.int8 if as_int8 else torch.float32)
    s = torch.empty(rows, 1)
    q8, qf = (q.data_ptr(), None) if as_int8 else (None, q.data_ptr())
    lib.quantize_rows(x.data_ptr(), rows, cols, cols, float(LEVELS), q8, qf, s.data_ptr())
    return q, s


def dequantize_rows(y: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                    relu: bool) -> torch.Tensor:
    """In place on contiguous y: y * s, then + bias, then + residual, then ReLU where asked."""
    lib = _kernels()
    if lib is None:
        y.mul_(s)
        if bias is not None:
            y.add_(bias)
        if residual is not None:
            y.add_(residual)
        return y.relu_() if relu else y
    if residual is not None and residual.stride(1) != 1:
        residual = residual.contiguous()
    rows, cols = y.shape
    lib.dequantize_rows(y.data_ptr(), rows, cols, s.data_ptr(), None if bias is None else bias.data_ptr(),
                        None if residual is None else residual.data_ptr(),
                        0 if residual is None else residual.stride(0), int(relu))
    return y


_SOURCE = Path(__file__).with_name("int8_rows.c")


_SYMBOLS = ("quantize_rows", "dequantize_rows")


class _Untrusted(OSError):
    """A cache folder or library that another user could have written."""


@functools.cache
def _kernels():
    """int8_rows.c as a loaded library, built on first use into ~/.cache/tfcli (or $XDG_CACHE_HOME/tfcli), keyed
    by the source and the compiler; None, with one warning, where it cannot be built (no C compiler) or the cache is
    not the user's own: the torch fallback then runs, with the same results.

    Loading a library runs its code, so it is loaded only from a folder of the user's that nobody else may write,
    owned by the user, with the SHA-256 recorded when it was built beside it; anything else (a truncated or corrupt
    file, one planted by another user, one that lacks a function) is built again. Processes that start together
    build it once (a lock in the cache), and a build that was killed leaves no file behind for long (the next build
    removes it)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        warnings.warn("int8: no C compiler found (cc/gcc): rows are quantised with torch ops, a little slower")
        return None
    flags = ["-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"]
    key = hashlib.sha256(_SOURCE.read_bytes() + compiler.encode() + " ".join(flags).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfcli"
    path = cache / f"int8_rows-{key}.so"
    try:
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_private(cache)
        with _locked(cache / f".int8_rows-{key}.lock"):
            lib = _load_checked(path)
            if lib is None:
                lib = _build(compiler, flags, path)
    except (OSError, subprocess.SubprocessError) as e:
        detail = e.stderr.decode(errors="replace").strip().splitlines()[-1:] if getattr(e, "stderr", None) else [e]
        warnings.warn(f"int8: could not build or load {_SOURCE.name} ({detail[0] if detail else e}): rows are "
                      "quantised with torch ops, a little slower")
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.quantize_rows.argtypes = [p, i64, i64, i64, ctypes.c_float, p, p, p]
    lib.quantize_rows.restype = None
    lib.dequantize_rows.argtypes = [p, i64, i64, p, p, p, i64, ctypes.c_int]
    lib.dequantize_rows.restype = None
    return lib


def _check_private(path: Path) -> None:
    """`path` is the user's own and nobody else may write it (else _Untrusted)."""
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise _Untrusted(f"{path} is not private to this user (owner {st.st_uid}, mode {st.st_mode & 0o777:o})")


@contextlib.contextmanager
def _locked(lock: Path):
    """An exclusive lock on `lock` (created), held while the block runs: one process builds, the others wait."""
    import fcntl

    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (closing releases the lock)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_checked(path: Path):
    """The library at `path` if it is the one this user built (owner, mode, the recorded SHA-256) and has the
    functions; None otherwise."""
    record = path.with_name(path.name + ".sha256")
    try:
        for f in (path, record):
            _check_private(f)
        if record.read_text().strip() != _digest(path):
            return None
        lib = ctypes.CDLL(str(path))
    except OSError:  # (missing, another's, or not a loadable library)
        return None
    return lib if all(hasattr(lib, name) for name in _SYMBOLS) else None


def _build(compiler: str, flags: list[str], path: Path):
    """Compile int8_rows.c to a temporary file, load and check it, record its SHA-256, and move it to `path`; a
    killed build's temporary files (the lock is held: no other build runs) are removed first."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        stale.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        subprocess.run([compiler, *flags, str(_SOURCE), "-o", str(tmp), "-lm"], check=True, capture_output=True,
                       timeout=120)
        os.chmod(tmp, 0o700)
        lib = ctypes.CDLL(str(tmp))  # (loaded under its own name: a bad library loaded before at `path` stays apart)
        missing = [name for name in _SYMBOLS if not hasattr(lib, name)]
        if missing:
            raise OSError(f"the built library lacks {', '.join(missing)}")
        record = path.with_name(path.name + ".sha256")
        record_tmp = record.with_name(f".{record.name}.tmp-{os.getpid()}")
        record_tmp.write_text(_digest(tmp) + "\n")
        os.chmod(record_tmp, 0o600)
        os.replace(record_tmp, record)
        os.replace(tmp, path)
        return lib
    finally:
        tmp.unlink(missing_ok=True)
