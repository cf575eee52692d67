"""Learning-rate schedules as pure functions of the update number, so a resumed run needs no scheduler state."""

from __future__ import annotations

import math


def learning_rate(
    step: int, schedule: str, peak: float, warmup: int, total_steps: int = 0, min_lr: float = 0.0,
    anchor: tuple[int, float] | None = None,
) -> float:
    """The learning rate for update number `step` (1-based).

    inverse_sqrt (Vaswani et al. 2017, eq. 3): lr = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), written with
      the peak reached at step = warmup: lr = peak * min(step / warmup, sqrt(warmup / step)).
    cosine: linear warmup to the peak, then lr = min + (peak - min) * (1 + cos(pi * progress)) / 2 until total_steps.
    constant: linear warmup to the peak, then flat.
    anchor (a, lr_a), cosine only: a run whose end moved (resumed with another length, or a time budget planned
      again) goes on along the same cosine from the point p_a where it gives lr_a, stretched or squeezed to reach
      min at total_steps: progress = p_a + (1 - p_a) * (step - a) / (total_steps - a). Its learning rate never
      jumps, and its decay keeps the cosine's shape (a half cosine restarted at a would stall there, flat).
    """
    step = max(step, 1)
    if warmup > 0 and step < warmup:
        return peak * step / warmup
    if schedule == "constant":
        return peak
    if schedule == "inverse_sqrt":
        return peak * math.sqrt(max(warmup, 1) / step) if warmup > 0 else peak / math.sqrt(step)
    if schedule == "cosine":
        if anchor is not None and step >= anchor[0]:
            start, start_lr = anchor
            if step == start or total_steps <= start or peak <= min_lr:
                return start_lr
            # lr = min + (peak - min) * (1 + cos(pi * p)) / 2, solved for p at the anchor
            p_a = math.acos(max(-1.0, min(1.0, 2 * (start_lr - min_lr) / (peak - min_lr) - 1))) / math.pi
            progress = min(1.0, p_a + (1 - p_a) * (step - start) / (total_steps - start))
            return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
        if total_steps <= warmup:
            return peak
        progress = min(1.0, (step - warmup) / (total_steps - warmup))
        return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown schedule {schedule!r}")
