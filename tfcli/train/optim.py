"""The optimisers `train.optimizer` names: AdamW, or Muon for the stacks' weight matrices with AdamW for the rest.

Muon (Keller Jordan 2024, as in modded-nanogpt): for each weight matrix W (out x in) of the encoder's and decoder's
layers, momentum with Nesterov's look-ahead, then the update orthogonalised by five Newton-Schulz iterations
(U S V^T -> about U V^T), scaled by sqrt(max(1, out / in)):
    m = mu m + g;   u = g + mu m;   W -= lr_muon * sqrt(max(1, out/in)) * NS5(u)
A fused projection ([q; k; v] of self-attention, [k; v] of cross-attention) is orthogonalised one projection at
a time, as the unfused matrices would be (modded-nanogpt does the same for its stacked q, k, v).
Embeddings, the output projection, biases and norms keep AdamW. Both updates are plain fp32 torch ops in a fixed
order, so a resumed run (its moments and momenta saved in the checkpoint) continues bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tfcli.model.attention import MultiHeadAttention

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic's (a, b, c), chosen for fast convergence on [0, 1]


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """About U V^T for g = U S V^T: X <- a X + (b A + c A^2) X with A = X X^T, from X = g / ||g||_F (so that every
    singular value starts in [0, 1]); on the wide orientation, so that A is the smaller Gram matrix."""
    a, b, c = NS_COEFFICIENTS
    tall = g.size(0) > g.size(1)
    x = g.T if tall else g
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def muon_parameters(model: nn.Module) -> dict[int, tuple[int, ...]]:
    """The parameters Muon updates, by id, each with its blocks of rows: the 2-d weights inside the layers of the
    encoder and the decoder (not the embeddings, the output projection, biases or norms); a fused projection's
    weight is one block per projection it holds, any other weight one block."""
    blocks = {id(p): (p.size(0),) for name, p in model.named_parameters() if p.dim() == 2 and ".layers." in f".{name}"}
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            weight = (module.kv_proj if module.cross else module.qkv_proj).weight
            if id(weight) in blocks:
                blocks[id(weight)] = module.fused_rows
    return blocks


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the parameter groups with `muon=True`, AdamW (decoupled weight decay) for the others. Each group's
    `lr` is what the schedule sets; a Muon group's step is `lr * lr_scale` (the ratio of Muon's peak rate to
    AdamW's)."""

    def __init__(self, groups: list[dict], lr: float, betas=(0.9, 0.98), eps: float = 1e-8, momentum: float = 0.95,
                 blocks: dict[int, tuple[int, ...]] | None = None):
        """`blocks`: the row blocks a Muon parameter is orthogonalised in, by id (muon_parameters); one if absent."""
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=0.0, muon=False, momentum=momentum,
                        lr_scale=1.0)
        super().__init__(groups, defaults)
        self.blocks = blocks or {}

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if group["muon"]:
                    self._muon(p, group)
                else:
                    self._adamw(p, group)

    def _muon(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf, mu = state["momentum_buffer"], group["momentum"]
        buf.mul_(mu).add_(p.grad)
        u = p.grad.add(buf, alpha=mu)
        sizes = self.blocks.get(id(p), (p.size(0),))
        for rows, w, u_block in zip(sizes, p.split(sizes), u.split(sizes)):  # (views: updated in place)
            lr = group["lr"] * group["lr_scale"] * math.sqrt(max(1.0, rows / p.size(1)))
            if group["weight_decay"]:
                w.mul_(1 - lr * group["weight_decay"])
            w.add_(newton_schulz(u_block).to(p.dtype), alpha=-lr)

    def _adamw(self, p: torch.Tensor, group: dict) -> None:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros(())
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t = float(state["step"])
        lr = group["lr"] * group["lr_scale"]
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(p.grad, 1 - beta1)
        v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        # p -= lr * m_hat / (sqrt(v_hat) + eps), with m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t)
        denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(group["eps"])
        p.addcdiv_(m, denom, value=-lr / (1 - beta1**t))


def step_if_finite(optimizer: torch.optim.Optimizer, finite: torch.Tensor) -> None:
    """`optimizer.step()` where `finite` (a 0-d bool tensor: the gradients' norm is finite) holds, else no update at
    all: weights, moments and step counts stay as they were (an inf or NaN gradient would make every later weight
    NaN). torch's fused AdamW skips on the device (its `found_inf`, as under a GradScaler), so a GPU step never waits
    for the answer; another optimizer reads it on the host."""
    if getattr(optimizer, "_step_supports_amp_scaling", False):
        optimizer.found_inf = (~finite).float()
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif bool(finite):
        optimizer.step()
