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

Quantising the rows and applying s_r, b (and a residual or ReLU) are one pass each in a small C file (rows.c, built
once per machine with the system's C compiler: tfcli.generate.native); without a compiler the same operations run as
torch ops, a little slower, with the same results bit for bit.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from tfcli.checkpoint import paged
from tfcli.device import int8_engines
from tfcli.generate import native

LEVELS = 63  # |q| <= 63: 7 bits
# on a CPU with AMX, calls with at least this many rows go to oneDNN, fewer to fbgemm
ONEDNN_MIN_ROWS = 32
_EXACT_SUM = 2**24  # integers up to this are exact in float32


def quantize_weight(w: torch.Tensor, rows: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """(one scale per output row, max |w| / 127; w in int8 by those scales, rounded half to even), a block of `rows`
    rows at a time, so that no full-size float temporary is made (a 256k-word output layer's is 1 GB, which the
    heap then keeps: tfcli.runtime.keep_freed_memory)."""
    scale = torch.empty(w.size(0))
    wq = torch.empty(w.shape, dtype=torch.int8)
    for i in range(0, w.size(0), rows):
        with paged(w[i : i + rows]) as block:  # (a mapped checkpoint's pages given back block by block)
            scale[i : i + rows] = block.abs().amax(dim=1).clamp(min=1e-12) / 127
            wq[i : i + rows] = torch.round(block / scale[i : i + rows, None])
    return scale, wq


class Int8Linear:
    """`module` (nn.Linear) in int8: `self(x)` for 2-d fp32 x, or `self(x, residual)` = x W^T + b + residual; with
    `relu`, max(0, .) after the bias."""

    def __init__(self, module: nn.Linear, relu: bool = False, engines: tuple[str, ...] | None = None):
        """`engines`: which of "fbgemm" and "onednn" to use (default: those available; oneDNN only on a CPU with AMX
        unless fbgemm is missing); with both, calls of fewer than ONEDNN_MIN_ROWS rows go to fbgemm."""
        w = module.weight.detach().float().contiguous()
        self.w_scale, wq = quantize_weight(w)
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
    lib = native.library()
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
