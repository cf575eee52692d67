"""nn.Linear, with one CPU-specific arrangement for bf16 autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.torch_compat import cpu_autocast_dtype

# Under bf16 autocast on the CPU, oneDNN builds (and caches) a kernel for each distinct number of rows, and training
# batches bring new ones at every step: time and memory go to kernels used once. Rows padded to a multiple of 64 keep
# the kernels few (benchmarks/cpu_bf16_shapes.py measures both).
CPU_BF16_ROWS = 64


class Linear(nn.Linear):
    """y = x W^T + b, as nn.Linear (the same parameters and state-dict keys). On the CPU under bf16 autocast the
    rows of x (all dimensions but the last, flattened) are padded with zeros to a multiple of CPU_BF16_ROWS, and the
    padding's outputs dropped: the same result for every real row, from a few kernels instead of one per shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or cpu_autocast_dtype() != torch.bfloat16:
            return super().forward(x)
        rows = x.reshape(-1, x.size(-1))
        pad = -rows.size(0) % CPU_BF16_ROWS
        if pad == 0:
            return super().forward(x)
        y = super().forward(F.pad(rows, (0, 0, 0, pad)))[: rows.size(0)]
        return y.view(*x.shape[:-1], y.size(-1))
