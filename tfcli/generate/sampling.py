"""Turning next-token logits into a choice: pure functions on (B, V) logits, composed by `next_token`.

Order (as in most toolkits): ban <pad>/<s>, repetition penalty, then greedy argmax, or temperature -> top-k -> top-p
-> sample. A seeded `torch.Generator` makes sampling repeatable: same seed, same inputs, same text.
"""

from __future__ import annotations

import torch

from tfcli.specials import BOS_ID, PAD_ID

NEG_INF = float("-inf")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(z / T): T < 1 sharpens the distribution, T > 1 flattens it."""
    if temperature <= 0:
        raise ValueError("temperature must be positive (use greedy decoding for T -> 0)")
    return logits / temperature


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits per row (and any tied with the k-th), set the rest to -inf. k <= 0: no filter."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most likely tokens whose probabilities sum
    to at least p; the most likely token always stays. p >= 1: no filter."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each token
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def apply_repetition_penalty(logits: torch.Tensor, previous: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty (Keskar et al. 2019) on every token already in the row's text (`previous`: (B, T) ids):
    a positive logit is divided by `penalty`, a negative one multiplied, so penalty > 1 makes repeats less likely."""
    if penalty == 1.0 or previous.numel() == 0:
        return logits
    seen = logits.gather(-1, previous)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(-1, previous, seen)


def next_token(
    logits: torch.Tensor,
    previous: torch.Tensor,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    repetition_penalty: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(B,) next ids from (B, V) logits. <pad> and <s> are never chosen."""
    logits = logits.float().index_fill(-1, torch.tensor([PAD_ID, BOS_ID], device=logits.device), NEG_INF)
    logits = apply_repetition_penalty(logits, previous, repetition_penalty)
    if greedy:
        return logits.argmax(-1)
    logits = top_p_filter(top_k_filter(apply_temperature(logits, temperature), top_k), top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)
