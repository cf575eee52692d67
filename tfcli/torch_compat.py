"""What differs between the PyTorch versions tfcli supports (2.2 and later: pyproject.toml)."""

from __future__ import annotations

import torch

if hasattr(torch.compiler, "is_compiling"):  # torch 2.3+
    is_compiling = torch.compiler.is_compiling
else:  # torch 2.2
    from torch._dynamo import is_compiling  # noqa: F401 (re-exported)
