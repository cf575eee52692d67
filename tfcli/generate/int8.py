"""int8 linear layers for decoding on the CPU (`--dtype int8`), with a result per row that depends on that row alone.

y = x W^T + b with W in int8, one scale per output row (max |w| mapped to 127), and x quantised at each call with one
scale per row (per token), symmetrically to 7 bits: s_r = max_j |x_rj| / 63, q_rj = round(x_rj / s_r). Then
y_rj = s_r * w_j * sum_k q_rk W_jk + b_j. The integer sums are exact, so a sentence's translation is the same in any
batch, next to any other sentences (a scale for the whole call, as torch's dynamic quantisation takes, made it
depend on them). 7 bits, not 8: fbgemm's AVX2/AVX-512 kernels, and rows.c's AVX2 one, add pairs of u8 x s8
products in 16 bits, which 8-bit inputs could saturate.

Three engines run the integer product: rows.c's linear_int8 (tfcli.generate.native.int8_kernel: AVX-512 VNNI or
AVX2; loading reorders the int8 weights, nothing more, and a call quantises its rows itself), fbgemm (torch's;
where rows.c's kernel does not run) and, on a CPU with AMX, oneDNN for calls of many rows (its tiles win there).
Each computes the exact integer sum and returns it as a float times w_j, then * s_r, + b (+ a residual, ReLU) in
that order, so which engine served a call changes nothing (where K * 63 * 127 >= 2^24, i.e. K > 2,097, a sum
may round on its way to a float, perhaps otherwise in oneDNN: there one engine serves every call).

Quantising the rows and applying s_r, b (and a residual or ReLU) around fbgemm and oneDNN are one pass each in the
same C file (rows.c, built once per machine with the system's C compiler: tfcli.generate.native); without a
compiler the same operations run as torch ops, a little slower, with the same results bit for bit.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.nn import functional as F

from tfcli.checkpoint import paged
from tfcli.device import cpu_has_amx, int8_engines
from tfcli.errors import NotANumber
from tfcli.generate import native
from tfcli.generate.stored import StoredWeights

LEVELS = 63  # |q| <= 63: 7 bits
# on a CPU with AMX, calls with at least this many rows go to oneDNN, fewer to rows.c's kernel or fbgemm
ONEDNN_MIN_ROWS = 32
_EXACT_SUM = 2**24  # integers up to this are exact in float32


def quantize_weight(w: torch.Tensor, wq: torch.Tensor | None = None, packed: "_Packed | None" = None,
                    rows: int = 4096) -> torch.Tensor:
    """One scale per output row of w (max |w| / 127, zero past w's rows where `packed` has more) and w in int8 by
    those scales, rounded half to even, into `wq` (N x K) and/or `packed` (rows.c's blocks, which need rows.c).
    rows.c's quantize_weight writes them in one pass with no temporaries (torch's ops made several the size of a
    block, which the heap then keeps: tfcli.runtime.keep_freed_memory), the same bytes as the torch ops that run
    without rows.c; `rows` at a time, so that a mapped checkpoint's pages are given back block by block."""
    lib = native.library()
    N, K = w.shape
    scale = torch.zeros(len(packed.cs) if packed is not None else N)
    for i in range(0, N, rows):
        with paged(w[i : i + rows]) as block:
            n = len(block)
            if lib is not None:
                block = block.contiguous()
                lib.quantize_weight(block.data_ptr(), n, K, K, None if wq is None else wq[i].data_ptr(),
                                    None if packed is None else packed.wp[i // 64].data_ptr(),
                                    None if packed is None else packed.cs[i].data_ptr(), scale[i].data_ptr(),
                                    native.vector_isa())
            elif packed is not None:
                raise RuntimeError("rows.c's int8 blocks need rows.c (tfcli.generate.native.library)")
            else:
                scale[i : i + n] = _row_scale(block.abs().amax(dim=1), 1e-12, 127)
                wq[i : i + n] = torch.round(block / scale[i : i + n, None]).nan_to_num_(0)
    return scale


def default_engines() -> tuple[str, ...]:
    """rows.c's linear_int8 ("rows", tfcli.generate.native.int8_kernel) where it runs, with oneDNN for calls of
    many rows on a CPU with AMX; elsewhere torch's (tfcli.device.int8_engines)."""
    engines = int8_engines()
    if native.int8_kernel() is None:
        return engines
    return ("rows", "onednn") if "onednn" in engines and cpu_has_amx() else ("rows",)


class Int8Linear:
    """`module` (nn.Linear) in int8: `self(x)` for 2-d fp32 x, or `self(x, residual)` = x W^T + b + residual; with
    `relu`, max(0, .) after the bias."""

    def __init__(self, module: nn.Linear, relu: bool = False, engines: tuple[str, ...] | None = None,
                 store: StoredWeights | None = None):
        """`engines`: which of "rows", "fbgemm" and "onednn" to use (default: `default_engines()`); with two, calls
        of fewer than ONEDNN_MIN_ROWS rows go to the first. `store` (tfcli.generate.stored, int8): where the
        module's int8 weights are read from when it holds them (`tfcli quantize`'s file), and put when they are
        quantised here."""
        w = module.weight.detach()
        self.N, self.K = N, K = w.shape
        self.relu = relu
        if engines is None:
            engines = default_engines()
        if not engines:
            raise RuntimeError("int8: neither rows.c nor this torch build has int8 linear layers")
        if K * LEVELS * 127 >= _EXACT_SUM:  # engines could round the sum differently: one serves all
            engines = engines[-1:]
        stored = None if store is None else store.get(module)
        if stored is not None:
            wp, cs, self.w_scale = stored["wp"], stored["cs"], stored["scale"]
            self.rows = _Packed(N, K, wp, cs) if "rows" in engines else None
            wq = unpack(wp, N, K) if set(engines) - {"rows"} else None
        else:
            wq = torch.empty(N, K, dtype=torch.int8) if set(engines) - {"rows"} else None
            self.rows = _Packed(N, K) if "rows" in engines else None
            self.w_scale = quantize_weight(w.float(), wq, self.rows)
            if store is not None:
                wp, cs = (self.rows.wp, self.rows.cs) if self.rows is not None else pack(wq)
                store.put(module, wp=wp, cs=cs, scale=F.pad(self.w_scale, (0, len(cs) - len(self.w_scale))))
        if not self.w_scale.isfinite().all():  # (NaN: a row of the weights holds NaN or inf, quantize_weight)
            raise NotANumber(f"a linear layer's weights ({N} x {K}) hold NaN or inf", module)
        self.bias = None
        if module.bias is not None:
            self.bias = torch.zeros(len(self.w_scale))
            self.bias[:N] = module.bias.detach().float()
        self.fbgemm = self.onednn = None
        if "fbgemm" in engines:
            previous = torch.backends.quantized.engine
            with warnings.catch_warnings():  # torch marks its quantised tensor types as deprecated
                warnings.simplefilter("ignore")
                q = torch._make_per_channel_quantized_tensor(
                    wq, self.w_scale[:N].double(), torch.zeros(N, dtype=torch.long), 0)
                engine = "x86" if "x86" in torch.backends.quantized.supported_engines else "fbgemm"
                try:  # a process-wide setting, restored at once; the packed weights keep their engine
                    torch.backends.quantized.engine = engine
                    self.fbgemm = torch.ops.quantized.linear_prepack(q, None)
                finally:
                    torch.backends.quantized.engine = previous
        if "onednn" in engines:
            self.onednn = torch.ops.onednn.qlinear_prepack(wq, None)
            self._zeros = torch.zeros(N, dtype=torch.long)
        self.min_rows = ONEDNN_MIN_ROWS if len(engines) > 1 else 0

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        x = x.contiguous()
        if self.onednn is not None and x.size(0) >= self.min_rows:
            q, s = quantize_rows(x, as_int8=True)
            y = torch.ops.onednn.qlinear_pointwise(q, 1.0, 0, self.onednn, self.w_scale[: self.N], self._zeros, None,
                                                   1.0, 0, torch.float32, "none", [], "")
        elif self.rows is not None:
            return self.rows(x, self.w_scale, self.bias, residual, self.relu)
        else:
            q, s = quantize_rows(x, as_int8=False)  # fbgemm takes integer-valued floats, quantised again exactly
            y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(q, 1.0, LEVELS + 1, self.fbgemm)
        return dequantize_rows(y, s, None if self.bias is None else self.bias[: self.N], residual, self.relu)


class _Packed:
    """int8 weights as rows.c's linear_int8 reads them (blocks of 64 outputs, groups of four inputs; see rows.c),
    with each output's sum of weights, and its call."""

    def __init__(self, N: int, K: int, wp: torch.Tensor | None = None, cs: torch.Tensor | None = None):
        """Empty blocks for quantize_weight to fill, or `wp` and `cs` as `pack` returns them."""
        self.N, self.K, self.K4 = N, K, -(-K // 4)
        self.wp = torch.zeros(-(-N // 64), self.K4, 64, 4, dtype=torch.int8) if wp is None else wp
        self.cs = torch.zeros(len(self.wp) * 64, dtype=torch.int32) if cs is None else cs
        self.kernel = native.int8_kernel()
        if self.kernel is None:
            raise RuntimeError("rows.c's int8 kernel does not run here (see tfcli.generate.native.int8_kernel)")

    def __call__(self, x: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, relu: bool) -> torch.Tensor:
        M = x.size(0)
        y = torch.empty(M, self.N)
        if residual is not None and residual.stride(1) != 1:
            residual = residual.contiguous()
        if M:
            xq, s = torch.empty(M, self.K4 * 4, dtype=torch.uint8), torch.empty(M)
            self.kernel(x.data_ptr(), M, self.K, self.N, float(LEVELS), self.wp.data_ptr(), self.cs.data_ptr(),
                        w_scale.data_ptr(), None if bias is None else bias.data_ptr(),
                        None if residual is None else residual.data_ptr(),
                        0 if residual is None else residual.stride(0), int(relu), y.data_ptr(), xq.data_ptr(),
                        s.data_ptr())
        return y


def pack(wq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(wp, cs) of int8 `wq` (N x K) in torch: rows.c's blocks (`_Packed`: zeros past N and K) and each output's sum
    of weights, the bytes quantize_weight writes there."""
    N, K = wq.shape
    padded = torch.zeros(-(-N // 64) * 64, -(-K // 4) * 4, dtype=torch.int8)
    padded[:N, :K] = wq
    return padded.view(-1, 64, padded.size(1) // 4, 4).transpose(1, 2).contiguous(), padded.sum(1, dtype=torch.int32)


def unpack(wp: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """The int8 weights (N x K) in rows.c's blocks `wp`, as plain rows (for fbgemm and oneDNN)."""
    return wp.transpose(1, 2).reshape(-1, wp.size(1) * 4)[:N, :K].contiguous()


def quantize_rows(x: torch.Tensor, as_int8: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, s) for contiguous 2-d fp32 x: s (rows, 1) = max(max |x_r|, 1e-30) / LEVELS, q = round(x / s), int8 or
    integer-valued fp32; s NaN and q 0 in a row holding NaN or inf (_row_scale)."""
    lib = native.library()
    if lib is None:
        s = _row_scale(x.abs().amax(dim=1, keepdim=True), 1e-30, LEVELS)
        q = (x / s).round_().nan_to_num_(0)
        return (q.to(torch.int8) if as_int8 else q), s
    rows, cols = x.shape
    q = torch.empty(rows, cols, dtype=torch.int8 if as_int8 else torch.float32)
    s = torch.empty(rows, 1)
    q8, qf = (q.data_ptr(), None) if as_int8 else (None, q.data_ptr())
    lib.quantize_rows(x.data_ptr(), rows, cols, cols, float(LEVELS), q8, qf, s.data_ptr())
    return q, s


def _row_scale(m: torch.Tensor, floor: float, levels: float) -> torch.Tensor:
    """max(m, floor) / levels, NaN where m is NaN or inf (rows.c's row_scale: what is made from such a row is NaN,
    never a number)."""
    return m.clamp(min=floor).div_(levels).masked_fill_(~m.isfinite(), float("nan"))


def dequantize_rows(y: torch.Tensor, s: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                    relu: bool) -> torch.Tensor:
    """In place on contiguous y: y * s, then + bias, then + residual, then ReLU where asked."""
    lib = native.library()
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
