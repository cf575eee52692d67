"""The training objective: label-smoothed cross-entropy over the real (non-padding) target tokens, and with R-Drop
the symmetric KL between two passes' output distributions."""

from __future__ import annotations

import torch
from torch import nn

from tfcli.specials import PAD_ID
from tfcli.torch_compat import autocast_dtype, is_compiling


# rows of logits per block on the CPU: each pass over a block (64 x V floats: 2 MB at V = 8000) stays in the cache
BLOCK_ROWS = 64
# logits per block of the fused projection + loss (linear_label_smoothed_loss): 64 MB of fp32 at most
FUSED_BLOCK_LOGITS = 1 << 24


def label_smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, smoothing: float, pad_id: int = PAD_ID, reuse_logits: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed over non-pad targets: (label-smoothed loss, plain negative log-likelihood).

    With q = (1 - eps) * onehot(y) + eps / V (Szegedy et al. 2016; the 2017 paper uses eps = 0.1):
        loss = -sum_v q_v log p_v = (1 - eps) * nll + eps * mean_v(-log p_v)
    Sums, not means, so that gradient accumulation and several processes can divide by the global token count.
    `reuse_logits`: the backward writes the gradient over the logits (which nothing else may read after the loss),
    instead of into a new (N, V) tensor, whose first touch costs page faults each step on a CPU.
    """
    z = logits.flatten(0, -2)
    return _SmoothedCrossEntropy.apply(z, target.flatten(), float(smoothing), pad_id, reuse_logits)


def _row_blocks(n: int, device: torch.device) -> list[slice]:
    step = BLOCK_ROWS if device.type == "cpu" else max(n, 1)  # a GPU: one block (each is more kernel launches)
    return [slice(i, i + step) for i in range(0, n, step)]


class _SmoothedCrossEntropy(torch.autograd.Function):
    """The loss above with its gradient in closed form: with p = softmax(z) over the logits z of a row,
        d loss / d z = p - q   (real rows; 0 at padding),
    computed in fp32 whatever the logits' dtype, and nothing of size (N, V) kept between forward and backward
    besides the logits themselves. Through autograd (log_softmax, gather, sum, their backward: a (N, V) zero fill,
    scatter and addition) the loss read and wrote the (N, V) logits about ten times and kept fp32 log-probs: in a
    profile of a Multi30k training step on a 2-core CPU, the largest cost after the matrix products."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, target: torch.Tensor, eps: float, pad_id: int, reuse: bool):
        real = target != pad_id
        lse = torch.empty(z.size(0), device=z.device)  # log sum_v exp(z_v), per row
        nll_rows = torch.empty(z.size(0), device=z.device)
        smooth_rows = torch.empty(z.size(0), device=z.device) if eps else None
        for rows in _row_blocks(z.size(0), z.device):
            zb = z[rows].float()
            lse[rows] = block_lse = torch.logsumexp(zb, dim=-1)
            lprobs = zb - block_lse[:, None]  # log p, from the log-sum-exp the backward needs anyway
            nll_rows[rows] = -lprobs.gather(1, target[rows, None]).squeeze(1)
            if eps:
                smooth_rows[rows] = -lprobs.mean(dim=-1)
        nll = nll_rows.masked_fill_(~real, 0.0).sum()
        loss = (1.0 - eps) * nll + eps * smooth_rows.masked_fill_(~real, 0.0).sum() if eps else nll.clone()
        ctx.save_for_backward(z, target, lse, real)
        ctx.eps, ctx.reuse = eps, reuse
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll):
        z, target, lse, real = ctx.saved_tensors
        eps, V = ctx.eps, z.size(1)
        scale = real.float() * grad_loss  # (N,): the incoming gradient, 0 at padding
        grad = z if ctx.reuse else torch.empty_like(z)  # each block's logits are read before it is written
        in_place = ctx.reuse and z.dtype == torch.float32
        for rows in _row_blocks(z.size(0), z.device):
            if in_place:
                p = z[rows].sub_(lse[rows, None]).exp_()  # softmax(z), over the block's logits
            else:
                p = torch.exp(z[rows].float() - lse[rows, None])
            s = scale[rows, None]
            g = p.mul_(s).sub_(s * (eps / V)) if eps else p.mul_(s)  # s * (p - eps / V)
            g.scatter_add_(1, target[rows, None], -(1.0 - eps) * s)  # - s * (1 - eps) at the target
            if not in_place:
                grad[rows] = g
        return grad, None, None, None, None


def linear_label_smoothed_loss(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor, smoothing: float,
    pad_id: int = PAD_ID, block_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """label_smoothed_loss(h W^T + b, target, smoothing), without ever holding the (N, V) logits: the output
    projection and the loss run together, `block_rows` rows at a time (default: FUSED_BLOCK_LOGITS logits a block).

    The gradient is computed in the forward, block by block, while each block's logits are at hand:
        dL/dz = p - q,   dL/dh = (p - q) W,   dL/dW = (p - q)^T h,   dL/db = sum of (p - q) over the rows
    and kept ((N, d), (V, d) and (V,): no (N, V) tensor survives a block); the backward scales them by the incoming
    gradient. The products run in the autocast dtype where autocast is on (as the projection itself would), the
    softmax in fp32, the weight's gradient is summed in fp32."""
    flat = h.flatten(0, -2)
    rows = block_rows or max(1, FUSED_BLOCK_LOGITS // weight.size(0))
    return _LinearSmoothedCrossEntropy.apply(flat, weight, bias, target.flatten(), float(smoothing), pad_id, rows)


class _LinearSmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, target, eps: float, pad_id: int, block_rows: int):
        dtype = autocast_dtype(h.device.type) or h.dtype  # what the projection's products run in
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)
            bc = bias.to(dtype) if bias is not None else None
            V = wc.size(0)
            real = target != pad_id
            grad_h = torch.empty_like(h)
            train_w = ctx.needs_input_grad[1]  # (a frozen output layer, LoRA's: no (V, d) gradient)
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if train_w else None
            grad_b = torch.zeros(V, dtype=torch.float32, device=h.device) \
                if bias is not None and ctx.needs_input_grad[2] else None
            nll = torch.zeros((), device=h.device)
            smooth = torch.zeros((), device=h.device)
            for start in range(0, hc.size(0), block_rows):
                rows = slice(start, start + block_rows)
                z = torch.nn.functional.linear(hc[rows], wc, bc).float()  # (n, V): this block's logits
                lse = torch.logsumexp(z, dim=-1)
                s = real[rows].float()  # 1 at real targets, 0 at padding
                t = target[rows, None]
                nll = nll + ((lse - z.gather(1, t).squeeze(1)) * s).sum()
                if eps:
                    smooth = smooth + ((lse - z.mean(dim=-1)) * s).sum()  # -mean_v log p_v
                g = z.sub_(lse[:, None]).exp_().mul_(s[:, None])  # s * p, over the block's logits
                if eps:
                    g.sub_(s[:, None] * (eps / V))
                g.scatter_add_(1, t, -(1.0 - eps) * s[:, None])  # s * (p - q)
                gc = g.to(dtype)
                grad_h[rows] = gc @ wc
                if grad_w is not None:
                    grad_w.add_(gc.t() @ hc[rows])
                if grad_b is not None:
                    grad_b.add_(g.sum(dim=0))
        loss = (1.0 - eps) * nll + eps * smooth if eps else nll.clone()
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = weight.dtype, bias.dtype if bias is not None else None
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, _grad_nll):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        w_dtype, b_dtype = ctx.dtypes
        return (
            grad_h * grad_loss.to(grad_h.dtype), (grad_w * grad_loss).to(w_dtype) if grad_w is not None else None,
            (grad_b * grad_loss).to(b_dtype) if grad_b is not None else None, None, None, None, None,
        )


class Objective(nn.Module):
    """A model and its loss as one module, so that DDP and torch.compile wrap both (the loss is part of the compiled
    graph). forward(src, inputs, targets) -> (summed loss, summed nll); src is None for a language model.

    On the CPU the output projection and softmax run only at real target positions (padding rows are dropped from
    the decoder's output first: less work, and no vocabulary-wide copy). Elsewhere shapes stay static: selecting
    rows would need the count on the host, a GPU sync and a break in a compiled graph; there the projection and
    the loss run fused, by blocks of rows, so that no (tokens x vocabulary) logits are ever held
    (linear_label_smoothed_loss), as they do on the CPU too where the output layer is frozen (LoRA: the memory
    of large-vocabulary logits is what such a run saves on).
    """

    def __init__(self, model: nn.Module, smoothing: float, rdrop: float = 0.0):
        super().__init__()
        self.model = model
        self.smoothing = smoothing
        self.rdrop = rdrop

    def forward(self, src: torch.Tensor | None, inputs: torch.Tensor, targets: torch.Tensor,
                prefix: torch.Tensor | None = None):
        """`prefix` (B,): a decoder-only translator's prompt lengths (its loss only after them: targets hold PAD)."""
        m = self.model
        if self.rdrop and m.training:  # (validation: the plain loss)
            return self._rdrop(src, inputs, targets, prefix)
        h = m.features(inputs, prefix) if src is None else m.features(src, inputs)
        fused = m.cfg.final_softcap is None  # (the loss by blocks of the output layer's rows: uncapped logits)
        if h.device.type != "cpu" and fused:
            return linear_label_smoothed_loss(h, m.lm_head.weight, m.lm_head.bias, targets, self.smoothing)
        if (src is not None or prefix is not None) and not is_compiling():
            real = targets != PAD_ID
            h, targets = h[real], targets[real]
        if not m.lm_head.weight.requires_grad and fused:  # (frozen, as under LoRA: the logits by blocks)
            return linear_label_smoothed_loss(h, m.lm_head.weight, m.lm_head.bias, targets, self.smoothing)
        return label_smoothed_loss(m.logits(h), targets, self.smoothing, reuse_logits=True)


    def _rdrop(self, src: torch.Tensor | None, inputs: torch.Tensor, targets: torch.Tensor,
               prefix: torch.Tensor | None = None):
        """R-Drop (Liang et al. 2021), as fairseq's implementation: the batch twice in one forward (each copy its
        own dropout masks), then over the real target tokens
            loss = (CE_1 + CE_2) / 2 + alpha * (KL(P_1 || P_2) + KL(P_2 || P_1)) / 2
        with CE the label-smoothed cross-entropy of each pass (summed, as without R-Drop; the halves keep the loss
        per token on the scale it has without it) and P_i the model's own distributions (unsmoothed). Returns
        (that loss, the mean of the two passes' nll), both sums over the tokens of one copy. The (tokens x
        vocabulary) logits of both passes are held (autograd through the KL)."""
        m = self.model
        doubled = torch.cat([inputs, inputs])
        if src is None:
            h = m.features(doubled, None if prefix is None else torch.cat([prefix, prefix]))
        else:
            h = m.features(torch.cat([src, src]), doubled)
        real = targets != PAD_ID
        h1, h2 = h.chunk(2)
        z1, z2 = m.logits(h1[real]).float(), m.logits(h2[real]).float()
        t = targets[real]
        loss1, nll1 = label_smoothed_loss(z1, t, self.smoothing)
        loss2, nll2 = label_smoothed_loss(z2, t, self.smoothing)
        lp1, lp2 = z1.log_softmax(-1), z2.log_softmax(-1)
        # KL(P1 || P2) + KL(P2 || P1) = sum_v (p1 - p2) (log p1 - log p2), per token
        kl = ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum()
        return (loss1 + loss2) / 2 + self.rdrop * kl / 2, (nll1 + nll2) / 2


def batch_loss(objective: Objective, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed label-smoothed loss, summed nll) of one batch (tfcli.train.data.Batch) under teacher forcing: the one
    forward that training and validation share."""
    return objective(batch.src, batch.inputs, batch.targets, batch.prefix)
