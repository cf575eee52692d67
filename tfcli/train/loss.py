"""Label-smoothed cross-entropy over the real (non-padding) target tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tfcli.model.config import PAD_ID


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int = PAD_ID
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed losses over non-pad targets: (label-smoothed loss, plain negative log-likelihood).

    With q = (1 - eps) * onehot(y) + eps / V (Szegedy et al. 2016; the 2017 paper uses eps = 0.1):
        loss = -sum_v q_v log p_v = (1 - eps) * nll + eps * mean_v(-log p_v)
    Sums, not means, so that gradient accumulation and several processes can divide by the global token count.
    """
    logits = logits.flatten(0, -2)
    target = target.flatten()
    keep = target != pad_id
    lprobs = F.log_softmax(logits[keep].float(), dim=-1)  # only real positions: padding costs no softmax
    target = target[keep]
    nll = -lprobs.gather(1, target.unsqueeze(1)).sum()
    if smoothing == 0.0:
        return nll, nll.detach()
    smooth = -lprobs.mean(dim=-1).sum()
    return (1.0 - smoothing) * nll + smoothing * smooth, nll.detach()
