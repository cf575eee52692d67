"""The C kernels of CPU decoding (rows.c): built once per machine with the system's C compiler into the user's cache
and called through ctypes on tensors' memory (plain C, no torch headers). Each has a torch fallback, used where no
compiler is found.

- int8's row quantisation and dequantisation (tfcli.generate.int8), bit for bit its torch fallback, and its
  linear layers (`int8_kernel()`: rows.c's linear_int8, AVX-512 VNNI or AVX2), bit for bit fbgemm's path.
- `RowLinear`: fp32 linear layers of the decoder's steps and the output layer, y = x W^T + b (+ a residual, then a
  ReLU). Each output is one fused multiply-add chain over the input from the bias, the same whatever the number of
  rows, so a row's result depends on that row alone (a sentence's translation on that sentence alone), as with
  oneDNN's pre-packed weights (the fallback, and what the encoder runs). Two versions, the same results bit for
  bit: tiles of up to 8 rows x 32 outputs held in AVX-512's registers, or of 3 rows x 32 outputs in AVX2's (the
  last few rows in tiles as wide as the registers allow), split over torch's OpenMP threads. On the few rows of a
  small batch's step a call takes a fraction of oneDNN's time, and about as long on many rows (docs/performance.md).
- `attention_kernel()`: attention, every row and head in one call (rows.c's attend_rows: a decoding step's, where
  torch would launch seven small operators a layer, and the encoder's); a row's result depends on that row alone.
- `layers_kernel()`: a decoder's layers for one step in one call (rows.c's decode_layers: the same row kernel and
  attention, in the same order, so the same bits), described by `LayerArgs`; tfcli.generate.step says when it runs.
- `activate_`: the row kernels' GELU and SiLU (after RowLinear, and in decode_layers), the bits of torch's vectorised
  kernels on any CPU.
- `best_next`: a search's k best next tokens a row, chosen on the logits, with their log-probs (the log-softmax
  over the vocabulary never written out).
- `draw`: a top-k sample a row (tfcli.generate.sampling.draw), by inverse transform in float64 over the kept tokens
  only, where its torch form takes ten operators over the whole vocabulary.
- `constrained_pick`: a constrained beam search's choice of its continuing candidates (dynamic beam allocation),
  the same integers as its torch form (tfcli.generate.constraints.pick_by_banks) in one call where that takes some
  thirty small operators a step.
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

from tfcli.checkpoint import paged
from tfcli.errors import NotANumber

NB = 32  # outputs a column block of the weights (rows.c)
_PACK_BLOCKS = 128  # column blocks packed at a time (RowLinear)
PAD = 64  # weights are padded with zeros to a multiple of this many outputs (the widest tile, rows.c)


def pack(w: torch.Tensor) -> torch.Tensor:
    """fp32 W (N x K) as rows.c's row kernel reads it: column blocks of NB outputs, each K x NB (a block's weights
    in the order it reads them), zero past N to a multiple of PAD. Written by rows.c's pack_blocks, without a padded
    copy of W (a 256k-word output layer's is 1 GB), a mapped checkpoint's pages given back block by block."""
    N, K = w.shape
    blocks = -(-N // PAD) * PAD // NB
    wt = torch.empty(blocks, K, NB)
    for i in range(0, blocks, _PACK_BLOCKS):
        j = min(i + _PACK_BLOCKS, blocks)
        with paged(w[i * NB : j * NB]) as rows:
            rows = rows.contiguous()
            library().pack_blocks(rows.data_ptr(), rows.size(0), K, j - i, wt[i].data_ptr())
    return wt


class RowLinear:
    """`module` (nn.Linear, fp32) on the CPU as rows.c's linear_rows: `self(x)` for 2-d fp32 x, or
    `self(x, residual)` = x W^T + b + residual; with `relu`, max(0, .) next. With `norm` (an nn.LayerNorm) the
    layer norms its input rows first (`norm_input`: a pre-norm sublayer's first layer) or its output rows last (a
    post-norm sublayer's last, after the residual), in the same call. `store` (an fp32 StoredWeights,
    tfcli.generate.stored): where the packed weights are read from when it holds them (`tfcli quantize --dtype
    fp32`'s file), and put when they are packed here. Only where `fp32_kernel()` is not None."""

    def __init__(self, module: nn.Linear, relu: bool = False, norm: nn.LayerNorm | None = None,
                 norm_input: bool = False, store=None):
        self.kernel = fp32_kernel()
        if self.kernel is None:
            raise RuntimeError("the fp32 row kernel is not available here (see tfcli.generate.native.fp32_kernel)")
        self.N, self.K = module.weight.shape
        stored = None if store is None else store.get(module)
        if stored is not None:
            self.wt = stored["wt"]
        else:
            self.wt = pack(module.weight.detach().float())
            if store is not None:
                store.put(module, wt=self.wt)
        blocks = len(self.wt)
        self.bias = None
        if module.bias is not None:
            self.bias = torch.zeros(blocks * NB)
            self.bias[: self.N] = module.bias.detach().float()
        self.relu = int(relu)
        self.norm, self.ln, self.eps = 0, None, 0.0  # rows.c: norm 1 on the input, 2 on the output
        self._xn = torch.empty(0)  # the normed input rows (scratch, with norm 1)
        if norm is not None:
            n = self.K if norm_input else self.N
            if tuple(norm.normalized_shape) != (n,):
                raise ValueError(f"a LayerNorm over {tuple(norm.normalized_shape)} cannot norm rows of {n}")
            weight = norm.weight.detach().float() if norm.weight is not None else torch.ones(n)
            bias = norm.bias.detach().float() if norm.bias is not None else torch.zeros(n)
            self.norm, self.ln, self.eps = 1 if norm_input else 2, torch.cat([weight, bias]), norm.eps

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        x = x.contiguous()
        M = x.size(0)
        y = torch.empty(M, self.N)
        if residual is not None and residual.stride(1) != 1:
            residual = residual.contiguous()
        if self.norm == 1 and self._xn.numel() < M * self.K:
            self._xn = torch.empty(M * self.K)
        if M:
            self.kernel(x.data_ptr(), self.wt.data_ptr(), None if self.bias is None else self.bias.data_ptr(),
                        None if residual is None else residual.data_ptr(),
                        0 if residual is None else residual.stride(0), self.relu, y.data_ptr(), M, self.K, self.N,
                        None if self.ln is None else self.ln.data_ptr(), self.norm, self.eps,
                        self._xn.data_ptr() if self.norm == 1 else None)
        return y

    def args(self) -> "LinearArgs":
        """This layer as rows.c's decode_layers reads it (pointers into this object's tensors: keep it alive)."""
        return LinearArgs(self.wt.data_ptr(), None if self.bias is None else self.bias.data_ptr(),
                          None if self.ln is None else self.ln.data_ptr(), self.K, self.N, self.relu, self.norm,
                          self.eps)


_p, _i64 = ctypes.c_void_p, ctypes.c_int64


class LinearArgs(ctypes.Structure):
    """rows.c's linear_t: a RowLinear's weights, bias and folded LayerNorm (`RowLinear.args`)."""

    _fields_ = [("wt", _p), ("b", _p), ("ln", _p), ("K", _i64), ("N", _i64), ("act", ctypes.c_int32),
                ("norm", ctypes.c_int32), ("eps", ctypes.c_float)]


class LayerArgs(ctypes.Structure):
    """rows.c's layer_t: one decoder layer for decode_layers: its RowLinears, QK-norm's RMSNorm gains (or None), and
    the batch's memory (set by the decoder: self-attention keys | values, the source's keys and values)."""

    _fields_ = [("qkv", LinearArgs), ("self_out", LinearArgs), ("cross_q", LinearArgs), ("cross_out", LinearArgs),
                ("w1", LinearArgs), ("w2", LinearArgs), ("q_norm", _p), ("k_norm", _p), ("cross_q_norm", _p),
                ("qk_eps", ctypes.c_float), ("kv", _p), ("mem_kt", _p), ("mem_v", _p)]


def fp32_kernel():
    """rows.c's linear_rows for this CPU (its AVX-512 or its AVX2 version: the same results), or None where neither
    runs: no C library (no compiler), a CPU without AVX2 and FMA, or torch's own CPU kernels held to plain x86-64
    (ATEN_CPU_CAPABILITY=default; held to avx2, the AVX2 version runs, as on a CPU without AVX-512)."""
    lib = library()
    return None if lib is None else _version(lib.linear_rows_supported(), lib.linear_rows, lib.linear_rows_avx2)


def int8_kernel():
    """rows.c's linear_int8 for this CPU (its AVX-512 VNNI or its AVX2 version: the same results), or None where
    neither runs (as `fp32_kernel`: no library, no AVX2, or torch's kernels held to plain x86-64; AVX-512 VNNI only
    where torch's run AVX-512)."""
    lib = library()
    return None if lib is None else _version(lib.linear_int8_supported(), lib.linear_int8, lib.linear_int8_avx2)


def vector_isa() -> int:
    """The vectors of rows.c's exact helpers that run here (quantize_weight's isa): 2 AVX-512, 1 AVX2, 0 none (plain
    C; no library, or torch's kernels held to plain x86-64), as `fp32_kernel` chooses. Every level gives the same
    bytes; tests hold each to the others."""
    lib = library()
    return 0 if lib is None else _version(lib.linear_rows_supported(), 2, 1) or 0


def _version(level: int, avx512, avx2):
    """Of a kernel's two versions, the one this CPU runs (`level`: rows.c's answer, 2 AVX-512, 1 AVX2, 0 neither)
    within what torch's own CPU kernels are held to (ATEN_CPU_CAPABILITY), or None."""
    capability = torch.backends.cpu.get_cpu_capability()
    if level == 2 and capability == "AVX512":
        return avx512
    if level >= 1 and capability in ("AVX2", "AVX512"):
        return avx2
    return None


def attention_kernel():
    """rows.c's attend_rows (tfcli.generate.step's fp32 attention on the CPU, the encoder's and the decoder's), where
    the fp32 row kernel runs (the same conditions: `fp32_kernel`); None elsewhere."""
    return None if fp32_kernel() is None else library().attend_rows


def layers_kernel():
    """rows.c's decode_layers (a decoder's layers for one step, described by `LayerArgs`) in the version of the row
    kernel that runs here (`fp32_kernel`); None where none does."""
    kernel, lib = fp32_kernel(), library()
    if kernel is None:
        return None
    return lib.decode_layers if kernel is lib.linear_rows else lib.decode_layers_avx2


ACTIVATIONS = {"gelu": 3, "silu": 4}  # rows.c's activate (and linear_t.act): the activations it has


def activate_(x: torch.Tensor, act: str) -> torch.Tensor:
    """GELU (erf form) or SiLU (`act`) on fp32 CPU `x` in place by rows.c's activate, as the row kernels' layers
    apply it (decode_layers too): the bits of torch's vectorised kernels (ATen's, AVX2 or AVX-512) on any CPU (F.gelu
    runs oneDNN's GELU, whose bits follow the instruction set oneDNN picks). Only where `fp32_kernel()` is not None;
    returns x (a contiguous copy of a strided x)."""
    x = x.contiguous()
    library().activate(x.data_ptr(), x.data_ptr(), x.numel(), ACTIVATIONS[act])
    return x


NAN_LOGITS = 2  # rows.c's best_next: a row's logits hold NaN
NAN_MESSAGE = ("the model's next-token scores are not numbers (NaN): its weights hold NaN or inf, or an activation "
               "overflowed")


def best_next(x: torch.Tensor, ban: torch.Tensor, ban_eos: torch.Tensor | None, eos: int, k: int,
              normalise: bool = True, pieces: tuple[torch.Tensor, torch.Tensor] | None = None):
    """rows.c's best_next on logits x (R, V), fp32, contiguous, on the CPU: each row's k best tokens by log-prob,
    the tokens `ban` (int64 ids) and, in the rows where `ban_eos` (R,) is True, `eos` excluded: (log-probs (R, k),
    ids (R, k), each row's log-softmax normaliser (R,)); without `normalise`, (logits, ids, None), one pass over x
    instead of two. The banned logits are set to -inf in x. `pieces`: ((R,) rows, (V,) tokens, both bool): in those
    rows none of those tokens is chosen (the normaliser still over every token). None where the kernel does not run
    (as `fp32_kernel`), k is past its 64 or `ban` past its 7 ids. NotANumber where a row's logits hold NaN."""
    if (fp32_kernel() is None or not 1 <= k <= 64 or ban.numel() > 7 or x.dtype != torch.float32
            or not x.is_contiguous() or (pieces is not None and pieces[1].numel() != x.size(1))):
        return None
    R, V = x.shape
    values, ids, norm = torch.empty(R, k), torch.empty(R, k, dtype=torch.long), torch.empty(R) if normalise else None
    if ban_eos is not None:
        ban_eos = ban_eos.to(torch.uint8).contiguous()
    after, cont = (None, None) if pieces is None else (p.contiguous() for p in pieces)  # (bool: one byte, 0 or 1)
    status = library().best_next(x.data_ptr(), R, V, ban.data_ptr(), ban.numel(),
                                 None if ban_eos is None else ban_eos.data_ptr(), eos,
                                 None if after is None else after.data_ptr(), None if cont is None else cont.data_ptr(),
                                 k, values.data_ptr(), ids.data_ptr(), None if norm is None else norm.data_ptr())
    if status == NAN_LOGITS:
        raise NotANumber(NAN_MESSAGE)
    if status:
        raise RuntimeError(f"rows.c's best_next refused k={k} with {ban.numel()} banned ids")
    return values, ids, norm


def draw(x: torch.Tensor, k: int, u: torch.Tensor) -> torch.Tensor | None:
    """rows.c's draw_rows on logits x (R, V), fp32, contiguous, on the CPU: each row's token drawn by its uniform u
    (R,) from the softmax over its k best logits and any tied with the k-th (best_next finds the k-th and the max).
    None where best_next does not run, or a row holds NaN or +inf or no finite logit (whose softmax is NaN: no token
    to draw; torch's form draws what it draws from them)."""
    try:
        best = best_next(x, NO_IDS, None, 0, k, normalise=False)
    except NotANumber:
        return None
    if best is None:
        return None
    lo, mx = best[0][:, -1].contiguous(), best[0][:, 0].contiguous()
    u = u.to(torch.float64).contiguous()
    ids = torch.empty(x.size(0), dtype=torch.long)
    empty = library().draw_rows(x.data_ptr(), x.size(0), x.size(1), lo.data_ptr(), mx.data_ptr(), u.data_ptr(),
                                ids.data_ptr())
    return None if empty else ids


NO_IDS = torch.empty(0, dtype=torch.long)  # (best_next's banned ids: none)


def constrained_pick(scores: torch.Tensor, tok: torch.Tensor, beam: torch.Tensor, eos: int, con: torch.Tensor,
                     prog: torch.Tensor, ready: torch.Tensor | None, open_: torch.Tensor, alternatives: bool, K: int,
                     k: int):
    """rows.c's constrained_pick (constraints.pick_by_banks says what it computes): (pick, missing, progress, open,
    fresh), or None where it does not run (no library, or not fp32 on the CPU)."""
    lib = library()
    if lib is None or scores.dtype != torch.float32 or scores.device.type != "cpu":
        return None
    n, M = scores.shape
    C, L = con.size(1), con.size(2) - 3
    args = [x.contiguous() for x in (scores, tok, beam, con, prog, open_)]
    ready = ready.contiguous() if ready is not None else None
    out = (torch.empty(n, K, dtype=torch.long), torch.empty(n, K, dtype=torch.long),
           torch.empty(n, K, C, dtype=torch.long), torch.empty(n, K, C, dtype=torch.bool),
           torch.empty(n, K, dtype=torch.bool))
    ptr = [x.data_ptr() for x in args]
    if lib.constrained_pick(n, M, K, k, C, L, *ptr[:3], eos, *ptr[3:5], None if ready is None else ready.data_ptr(),
                            ptr[5], int(alternatives), *(x.data_ptr() for x in out)):
        return None
    return out


_SOURCE = Path(__file__).with_name("rows.c")


_SYMBOLS = ("quantize_rows", "dequantize_rows", "pack_blocks", "linear_rows", "linear_rows_avx2",
            "linear_rows_supported", "linear_int8", "linear_int8_avx2", "linear_int8_supported", "quantize_weight",
            "attend_rows", "decode_layers", "decode_layers_avx2", "activate", "best_next", "constrained_pick",
            "struct_layout")


class _Untrusted(OSError):
    """A cache folder or library that another user could have written."""


@functools.cache
def library():
    """rows.c as a loaded library, built on first use into ~/.cache/tfcli (or $XDG_CACHE_HOME/tfcli), keyed by the
    source and the compiler; None, with one warning, where it cannot be built (no C compiler) or the cache is not
    the user's own: int8's torch fallback then runs (the same results) and fp32 linear layers run on oneDNN.

    Loading a library runs its code, so it is loaded only from a folder of the user's that nobody else may write,
    owned by the user, with the SHA-256 recorded when it was built beside it; anything else (a truncated or corrupt
    file, one planted by another user, one that lacks a function) is built again. Processes that start together
    build it once (a lock in the cache), and a build that was killed leaves no file behind for long (the next build
    removes it)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if compiler is None:
        warnings.warn("tfcli: no C compiler found (cc/gcc): decoding on the CPU runs without its C kernels, a "
                      "little slower")
        return None
    flags = ["-O3", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"]
    key = hashlib.sha256(_SOURCE.read_bytes() + compiler.encode() + " ".join(flags).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tfcli"
    path = cache / f"rows-{key}.so"
    try:
        cache.mkdir(parents=True, exist_ok=True, mode=0o700)
        _check_private(cache)
        with _locked(cache / f".rows-{key}.lock"):
            lib = _load_checked(path)
            if lib is None:
                lib = _build(compiler, flags, path)
    except (OSError, subprocess.SubprocessError) as e:
        detail = e.stderr.decode(errors="replace").strip().splitlines()[-1:] if getattr(e, "stderr", None) else [e]
        warnings.warn(f"tfcli: could not build or load {_SOURCE.name} ({detail[0] if detail else e}): decoding "
                      "on the CPU runs without its C kernels, a little slower")
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.quantize_rows.argtypes = [p, i64, i64, i64, ctypes.c_float, p, p, p]
    lib.quantize_rows.restype = None
    lib.dequantize_rows.argtypes = [p, i64, i64, p, p, p, i64, ctypes.c_int]
    lib.dequantize_rows.restype = None
    lib.pack_blocks.argtypes, lib.pack_blocks.restype = [p, i64, i64, i64, p], None
    for linear in (lib.linear_rows, lib.linear_rows_avx2):
        linear.argtypes = [p, p, p, p, i64, ctypes.c_int, p, i64, i64, i64, p, ctypes.c_int, ctypes.c_float, p]
        linear.restype = None
    lib.linear_rows_supported.argtypes, lib.linear_rows_supported.restype = [], ctypes.c_int
    for linear in (lib.linear_int8, lib.linear_int8_avx2):
        linear.argtypes = [p, i64, i64, i64, ctypes.c_float, p, p, p, p, p, i64, ctypes.c_int, p, p, p]
        linear.restype = None
    lib.linear_int8_supported.argtypes, lib.linear_int8_supported.restype = [], ctypes.c_int
    lib.quantize_weight.argtypes = [p, i64, i64, i64, p, p, p, p, ctypes.c_int]
    lib.quantize_weight.restype = None
    lib.attend_rows.argtypes = [p, i64, i64, i64, p, i64, i64, i64, i64, p, i64, i64, i64, p, i64, i64, i64,
                                i64, i64, i64, i64, i64, i64, ctypes.c_float, p]
    lib.attend_rows.restype = None
    for layers in (lib.decode_layers, lib.decode_layers_avx2):
        layers.argtypes = [ctypes.POINTER(LayerArgs), i64, p, p, i64, i64, i64, i64, i64, i64, i64, i64, p, i64,
                           i64, p, i64, ctypes.c_float]
        layers.restype = None
    lib.activate.argtypes, lib.activate.restype = [p, p, i64, ctypes.c_int], None
    lib.best_next.argtypes = [p, i64, i64, p, i64, p, i64, p, p, i64, p, p, p]
    lib.best_next.restype = ctypes.c_int
    lib.draw_rows.argtypes, lib.draw_rows.restype = [p, i64, i64, p, p, p, p], ctypes.c_int
    lib.constrained_pick.argtypes = [i64, i64, i64, i64, i64, i64, p, p, p, i64, p, p, p, p, ctypes.c_int, p, p, p,
                                     p, p]
    lib.constrained_pick.restype = ctypes.c_int
    lib.struct_layout.argtypes, lib.struct_layout.restype = [p], None
    mismatch = layout_mismatch(lib)
    if mismatch:
        warnings.warn(f"tfcli: {_SOURCE.name}'s structs are laid out otherwise than tfcli's ctypes ({mismatch}): "
                      "decoding on the CPU runs without its C kernels, a little slower")
        return None
    return lib


def layout_mismatch(lib) -> str:
    """Where the library's linear_t and layer_t differ from LinearArgs and LayerArgs ("" if nowhere): a struct read
    at the wrong offsets would hand decode_layers wrong pointers."""
    got = (ctypes.c_int64 * 5)()
    lib.struct_layout(got)
    want = (ctypes.sizeof(LinearArgs), ctypes.sizeof(LayerArgs), LinearArgs.eps.offset, LayerArgs.kv.offset,
            LayerArgs.mem_v.offset)
    names = ("sizeof linear_t", "sizeof layer_t", "linear_t.eps", "layer_t.kv", "layer_t.mem_v")
    return ", ".join(f"{n} {g} against {w}" for n, g, w in zip(names, got, want) if g != w)


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
    """Compile rows.c to a temporary file, load and check it, record its SHA-256, and move it to `path`; a
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
