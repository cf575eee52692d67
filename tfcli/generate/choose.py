"""Each row's next tokens by the model's log-probs, every rule of the row kept: what every search step asks.

On the CPU by rows.c's best_next where it runs, the step is not fixed-shape and no rule changes the scores (chosen
on the logits, the log-softmax over the vocabulary never written out); else by blocks of 64 rows, so that the
log-probs the top-k reads are still in the cache; on a GPU at once."""

from __future__ import annotations

import torch

from tfcli.generate import native
from tfcli.generate.rules import Bans, RowRules, Step
from tfcli.generate.schedule import Decoder
from tfcli.specials import EOS_ID


def best_next(decoder: Decoder, tok: torch.Tensor, rules: RowRules, step: Step, k: int,
              forced: torch.Tensor | None = None, normalise: bool = True, extra: torch.Tensor | None = None):
    """The k most likely next tokens of each row by log p(y_t | y_<t, x), the `rules` kept: (log-probs, ids), each
    (R, k) (k = 1: the max, each (R,)); a row's forced token (`forced` >= 0: a target prefix's), whatever the model
    prefers or bans. A rule that changes the scores (a repetition penalty) changes the log-probs returned. Without
    `normalise` the values may be the logits instead (the same order; rows.c then skips the log-softmax's
    normaliser). `extra`: (R, C) more ids (>= 0) whose log-probs each row needs (the next tokens of its
    constraints): then a third tensor, (R, C), holds them (-inf where banned)."""
    logits = decoder.step(tok).float()
    bans = rules.bans(step)
    cpu = logits.device.type == "cpu"
    if cpu and not decoder.fixed and not rules.penalises:  # (a fixed-shape step is one graph: no C call in it)
        best = _best_next_rows(logits, bans, k, forced, normalise, extra)
        if best is not None:
            return best
    if rules.penalises:
        return _best_next_blocks(logits, bans, k, forced, extra, cpu, 1, lambda x: rules.penalise(x, step))
    return _best_next_blocks(logits, bans, k, forced, extra, cpu, -(-logits.size(0) // 64) if cpu else 1)


def _best_next_blocks(logits, bans: Bans, k: int, forced, extra, cpu: bool, n_blocks: int, penalise=None):
    """best_next on torch's operators, in `n_blocks` blocks of 64 rows."""
    blocks = logits.split(64) if n_blocks > 1 else (logits,)
    split = (lambda x: x.split(64) if x is not None else (None,) * n_blocks) if n_blocks > 1 else (lambda x: (x,))
    values, ids, extras = [], [], []
    for block, fb, bb, eb in zip(blocks, split(forced), bans.blocks(64, n_blocks) if n_blocks > 1 else (bans,),
                                 split(extra)):
        lprobs = block.log_softmax(-1)
        forced_lp = None if fb is None else lprobs.gather(1, fb.clamp(min=0)[:, None])
        if penalise is not None:
            penalise(lprobs)
        bb.apply(lprobs)
        v, i = lprobs.max(-1) if k == 1 else top_k(lprobs, k) if cpu else lprobs.topk(k, dim=1)
        v, i = with_forced(v, i, forced_lp, fb, k)
        values.append(v)
        ids.append(i)
        if eb is not None:
            extras.append(lprobs.gather(1, eb))
    out = (values[0], ids[0]) if len(values) == 1 else (torch.cat(values), torch.cat(ids))
    return out if extra is None else (*out, extras[0] if len(extras) == 1 else torch.cat(extras))


def _best_next_rows(logits: torch.Tensor, bans: Bans, k: int, forced, normalise: bool, extra):
    """best_next by rows.c's best_next (None where it does not run): the never-chosen ids, the rows that may not
    end and the pieces that may not follow a constraint go to the C call; the ids banned by row are written into
    the logits, each row's normaliser taken over the whole vocabulary first, so that the bans leave the model's
    distribution as it is."""
    forced_logit = None if forced is None else logits.gather(1, forced.clamp(min=0)[:, None])
    extra_logit = None if extra is None else logits.gather(1, extra)
    full = logits.logsumexp(1) if bans.ids is not None else None
    chosen_from = logits if bans.ids is None else logits.scatter(1, bans.ids, float("-inf"))
    best = native.best_next(chosen_from, bans.never(logits.device), bans.no_eos(), EOS_ID, k, normalise,
                            bans.pieces)
    if best is None:
        return None
    v, i, norm = best
    if norm is not None and full is not None:
        v, norm = v + (norm - full)[:, None], full
    if k == 1:
        v, i = v[:, 0], i[:, 0]
    forced_lp = forced_logit if forced_logit is None or norm is None else forced_logit - norm[:, None]
    if extra is None:
        return with_forced(v, i, forced_lp, forced, k)
    extra_lp = extra_logit - norm[:, None] if norm is not None else extra_logit
    return (*with_forced(v, i, forced_lp, forced, k), bans.on_columns(extra_lp, extra))


def with_forced(v: torch.Tensor, i: torch.Tensor, forced_lp: torch.Tensor, forced: torch.Tensor | None, k: int):
    """The k best (log-probs, ids) `v`, `i` of each row ((R,) each for k = 1, else (R, k)), with the rows whose token
    is forced (`forced` >= 0; its log-prob `forced_lp`, (R, 1)) taking it instead, the other k - 1 candidates
    impossible (-inf), so that a forced beam has one way on."""
    if forced is None:
        return v, i
    tok = forced.clamp(min=0)[:, None]
    if k == 1:
        on = forced >= 0
        return torch.where(on, forced_lp[:, 0], v), torch.where(on, tok[:, 0], i)
    on = (forced >= 0)[:, None]
    fv = torch.cat([forced_lp, forced_lp.new_full((forced_lp.size(0), k - 1), float("-inf"))], 1)
    return torch.where(on, fv, v), torch.where(on, tok.expand(-1, k), i)


def top_k(x: torch.Tensor, k: int, width: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k, dim=1) for a (R, V) tensor with V much larger than k: the same values, best first, and
    their indices (which of several equal values comes first may differ).

    torch.topk on the CPU copies every element into (value, index) pairs to sort: about 8 times the cost of a max
    over the same elements. Here the row is cut into blocks of `width`: the k largest values all lie in the k
    blocks with the largest maxima (a value in any other block has k larger block maxima above it), so topk runs
    over the R x V/width maxima and then the k * width values of those blocks only."""
    R, V = x.shape
    n_blocks = -(-V // width)
    if n_blocks <= 2 * k:
        return x.topk(k, dim=1)
    if V % width:
        x = torch.nn.functional.pad(x, (0, n_blocks * width - V), value=float("-inf"))
    blocks = x.reshape(R * n_blocks, width)
    _, best = x.view(R, n_blocks, width).amax(-1).topk(k, dim=1)  # (R, k) block numbers
    flat = (best + torch.arange(R, device=x.device)[:, None] * n_blocks).flatten()
    values, j = blocks.index_select(0, flat).view(R, k * width).topk(k, dim=1)
    return values, best.gather(1, torch.div(j, width, rounding_mode="floor")) * width + j % width


def write_at(buf: torch.Tensor, at, values: torch.Tensor) -> None:
    """buf[r, ..., at - 1] = values[r, ...]: `at` an int, or each row's position ((R,) tensor)."""
    if isinstance(at, int):
        buf[..., at - 1] = values
    else:
        index = (at - 1).view(-1, *[1] * (buf.dim() - 1)).expand(*buf.shape[:-1], 1)
        buf.scatter_(-1, index, values.unsqueeze(-1))
