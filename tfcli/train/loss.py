"""The training objective: label-smoothed cross-entropy over the real (non-padding) target tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tfcli.model.config import PAD_ID
from tfcli.torch_compat import is_compiling


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed over non-pad targets: (label-smoothed loss, plain negative log-likelihood).

    With q = (1 - eps) * onehot(y) + eps / V (Szegedy et al. 2016; the 2017 paper uses eps = 0.1):
        loss = -sum_v q_v log p_v = (1 - eps) * nll + eps * mean_v(-log p_v)
    Sums, not means, so that gradient accumulation and several processes can divide by the global token count.
    """
    lprobs = F.log_softmax(logits.flatten(0, -2).float(), dim=-1)
    target = target.flatten()
    real = target != pad_id
    nll = -lprobs.gather(1, target.unsqueeze(1)).squeeze(1).masked_fill(~real, 0.0).sum()
    if smoothing == 0.0:
        return nll, nll.detach()
    smooth = -lprobs.sum(dim=-1).masked_fill(~real, 0.0).sum() / lprobs.size(-1)  # mean over v, one division
    return (1.0 - smoothing) * nll + smoothing * smooth, nll.detach()


class Objective(nn.Module):
    """A model and its loss as one module, so that DDP and torch.compile wrap both (the loss is part of the compiled
    graph). forward(src, inputs, targets) -> (summed loss, summed nll); src is None for a language model.

    On the CPU the output projection and softmax run only at real target positions (padding rows are dropped from
    the decoder's output first: less work, and no vocabulary-wide copy). Elsewhere shapes stay static: selecting
    rows would need the count on the host, a GPU sync and a break in a compiled graph.
    """

    def __init__(self, model: nn.Module, smoothing: float):
        super().__init__()
        self.model = model
        self.smoothing = smoothing

    def forward(self, src: torch.Tensor | None, inputs: torch.Tensor, targets: torch.Tensor):
        m = self.model
        if src is None:
            h = m.decoder(inputs)
        else:
            memory, memory_mask = m.encode(src)
            h = m.decoder(inputs, memory, memory_mask)
        if src is not None and h.device.type == "cpu" and not is_compiling():
            real = targets != PAD_ID
            h, targets = h[real], targets[real]
        return label_smoothed_loss(m.lm_head(h), targets, self.smoothing)
