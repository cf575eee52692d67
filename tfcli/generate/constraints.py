"""Constraints: phrases every output of a row must hold (terminology), by dynamic beam allocation (Post & Vilar
2018) in its vectorised form (Hu et al. 2019). Each row's phrases are packed in one tensor (`constraint_tensor`, its
columns GROUP, WAIT, LENGTH, TOKENS), which rows.c's constrained_pick reads as it is; each beam's progress in them
is a `Progress`. `Constraints` is the rule that beam search asks: what each beam proposes besides its best tokens,
what it bans, and which candidates go on (`pick_by_banks`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli.generate import native
from tfcli.generate.rules import PerItem
from tfcli.specials import EOS_ID


UNMET_PENALTY = 1e4  # subtracted from a finished hypothesis's score per constraint token it lacks
GROUP, WAIT, LENGTH, TOKENS = 0, 1, 2, 3  # the columns of a phrase in `constraint_tensor`'s packing (rows.c reads it)


def constraint_tensor(constraints: list[list], device) -> torch.Tensor | None:
    """Each row's constraints as one (rows, C, 3 + L) tensor. A constraint is a phrase (a token id list) or a set
    of alternatives (a list of such lists: any one of them does); each alternative is a phrase of the tensor: its
    column 0 the constraint it is a form of, column 1 the constraint it waits for (-1: none), column 2 its length
    (read at every step: kept, not counted), then its tokens left-aligned with -1 after them (a row with fewer gets
    empty phrases, each a constraint of its own, met from the start). A constraint given again in a row (a glossary
    term found twice) waits for the one before it: it moves on only once that one is met, so the output holds the
    phrase as often as it is given. None where no row has one."""
    rows = []
    for row in constraints:
        forms, last = [], {}
        for c, con in enumerate(row):
            key = repr(con)
            forms += [(c, last.get(key, -1), t) for _, t in _forms(con, c)]
            last[key] = c
        rows.append(forms)
    C = max(map(len, rows), default=0)
    if not C:
        return None
    L = max(len(t) for row in rows for _, _, t in row)
    out = torch.full((len(rows), C, 3 + L), -1, dtype=torch.long)
    out[:, :, GROUP] = torch.arange(C) + C  # (the empty phrases' own constraints)
    out[:, :, LENGTH] = 0
    for r, row in enumerate(rows):
        for c, (group, wait, t) in enumerate(row):
            out[r, c, GROUP], out[r, c, WAIT], out[r, c, LENGTH] = group, wait, len(t)
            out[r, c, TOKENS : TOKENS + len(t)] = torch.tensor(t)
    return out.to(device)


def has_waits(con: torch.Tensor) -> bool:
    """Whether any phrase of `con` (`constraint_tensor`) waits for another (a constraint given twice in a row)."""
    return bool((con[..., WAIT] >= 0).any())


def ready(con: torch.Tensor, prog: torch.Tensor) -> torch.Tensor:
    """(..., C) whether each phrase of `con` may move on at progress `prog`: it waits for nothing, or the
    constraint it waits for is met (by any of its forms)."""
    met = prog >= con[..., LENGTH]
    wait = con[..., WAIT]
    return (wait < 0) | ((con[..., GROUP][..., None, :] == wait[..., :, None]) & met[..., None, :]).any(-1)


def _forms(con: list, c: int) -> list[tuple[int, list[int]]]:
    return [(c, list(t)) for t in con] if con and not isinstance(con[0], int) else [(c, list(con))]


def advanced(con: torch.Tensor, prog: torch.Tensor, tok: torch.Tensor, ready: torch.Tensor | None = None
             ) -> torch.Tensor:
    """Each phrase's progress after `tok`. con (..., C, 3 + L): the phrases (`constraint_tensor`); prog (..., C):
    how many of each phrase's tokens end the output so far (its length, for good, once it has been output whole);
    tok (...): the next token. A phrase goes one token on where `tok` is its next, starts again at 1 where `tok`
    is its first, else back to 0; where `ready` (..., C) (`ready` of `prog`: constraints given twice) is False,
    it stays at 0."""
    phrase, lens = con[..., TOKENS:], con[..., LENGTH]
    nxt = phrase.gather(-1, prog.clamp(max=phrase.size(-1) - 1).unsqueeze(-1)).squeeze(-1)
    t = tok.unsqueeze(-1)
    again = (phrase[..., 0] == t).long()
    moved = torch.where(nxt == t, prog + 1, again)
    if ready is not None:
        moved = moved * ready
    return torch.where(prog >= lens, prog, moved)


def constraint_state(con: torch.Tensor, prog: torch.Tensor, alternatives: bool = True) -> dict[str, torch.Tensor]:
    """What progress `prog` (..., C) in the phrases `con` (..., C, 3 + L) comes to: `open` (..., C), whether the
    constraint a phrase is a form of is still unmet; `missing` (...), the tokens of the unmet constraints (each by
    its shortest form); `bank`, the tokens of the met constraints (each by the form met) and the longest partial
    match of an open phrase (one phrase at a time: a token that starts two phrases is one step, not two).
    Without `alternatives` (every phrase a constraint of its own: `has_alternatives` false) the same values
    without the (C, C) pairing of forms."""
    lens = con[..., LENGTH]
    if not alternatives:
        met = prog >= lens
        return dict(open=~met, missing=(lens * ~met).sum(-1), bank=(lens * met).sum(-1) + (prog * ~met).amax(-1))
    group = con[..., GROUP]
    same = group[..., :, None] == group[..., None, :]  # (..., C, C)
    C = group.size(-1)
    first = ~(same & torch.ones(C, C, dtype=torch.bool, device=con.device).tril(-1)).any(-1)  # a constraint's first
    met = prog >= lens
    done = (same & met[..., None, :]).any(-1)
    credit = (same * (lens * met)[..., None, :]).amax(-1)
    shortest = torch.where(same, lens[..., None, :], lens.new_tensor(1 << 30)).amin(-1)
    whole = (credit * first).sum(-1)
    return dict(open=~done, missing=(shortest * first * ~done).sum(-1), bank=whole + (prog * ~done).amax(-1))


def has_alternatives(con: torch.Tensor) -> bool:
    """Whether any row of `con` (`constraint_tensor`) holds a set of alternatives (two phrases of one constraint)."""
    group = con[..., GROUP]
    return bool(((group[..., :, None] == group[..., None, :]).sum((-1, -2)) > group.size(-1)).any())


def pick_by_banks(scores: torch.Tensor, tok: torch.Tensor, beam: torch.Tensor, con: torch.Tensor, prog: torch.Tensor,
                  ready: torch.Tensor | None, open_: torch.Tensor, alternatives: bool, K: int, k: int):
    """A constrained beam search's continuing candidates, by dynamic beam allocation (Post & Vilar 2018). Each
    sentence's candidates `scores`, `tok`, `beam` (n, M; sorted best first; the beam of k each extends) are
    taken on by their progress in the phrases `con` (n, C, 3 + L) after their token (`advanced`, from their beam's
    `prog` (n * k, C), held where its `ready` is False) and grouped by bank (`constraint_state`); each bank's best
    are taken in turn, the fullest bank first (its best, then every other bank's best, then the second best of
    each, ...), so that hypotheses that have met fewer constraints keep places beside those that met more;
    candidates that end (</s>) or score -inf only after all others. Returns (pick (n, K) in candidate order, the
    constraint tokens each picked one misses (n, K), its progress (n, K, C), which of its phrases are of an unmet
    constraint (n, K, C), whether its token met a constraint that its beam (`open_`, (n * k, C)) had not (n, K)).
    On the CPU one call of rows.c (native.constrained_pick: the same integers), else these operators."""
    fast = native.constrained_pick(scores, tok, beam, EOS_ID, con, prog, ready, open_, alternatives, K, k)
    if fast is not None:
        return fast
    n, M = scores.shape
    C = con.size(1)
    row = beam + (torch.arange(n, device=beam.device) * k)[:, None]
    cons = con[:, None].expand(-1, M, -1, -1)
    cand_prog = advanced(cons, prog[row], tok, ready[row] if ready is not None else None)  # (n, M, C)
    state = constraint_state(cons, cand_prog, alternatives)
    banks = C * (con.size(2) - TOKENS) + 1  # (at most C * L constraint tokens)
    bank = state["bank"]
    ok = (tok != EOS_ID) & (scores > float("-inf"))
    # each candidate's rank within its bank, by score (the candidates come sorted): grouped by bank, in order
    pos = torch.arange(M, device=scores.device).expand(n, M)
    order = (torch.where(ok, bank, banks) * M + pos).argsort(dim=1)
    grouped = bank.masked_fill(~ok, banks).gather(1, order)
    starts = torch.ones_like(grouped, dtype=torch.bool)
    starts[:, 1:] = grouped[:, 1:] != grouped[:, :-1]
    rank = torch.empty_like(pos).scatter_(1, order, pos - torch.where(starts, pos, 0).cummax(1).values)
    key = torch.where(ok, rank * banks + (banks - 1 - bank), M * banks + pos)
    pick = key.topk(K, dim=1, largest=False).indices.sort(1).values
    each = pick[..., None].expand(n, K, C)
    still = state["open"].gather(1, each)
    before = open_[row.gather(1, pick)]
    return pick, state["missing"].gather(1, pick), cand_prog.gather(1, each), still, (before & ~still).any(-1)


@dataclass(slots=True)
class Progress:
    """Each beam's state in its sentence's constraints: `prog` (R, C), how many of each phrase's tokens end its
    output (`advanced`); `open` (R, C), which phrases are of a constraint it has not met (an empty phrase is met);
    `fresh` (R,), whether its last token ended a constraint (a piece that would continue that word is not taken)."""

    prog: torch.Tensor
    open: torch.Tensor
    fresh: torch.Tensor

    def select(self, index) -> Progress:
        return Progress(self.prog[index], self.open[index], self.fresh[index])


class Constraints(PerItem):
    """(B, C, 3 + L) phrases every hypothesis of the row must output, in any order, or for a set of alternatives one
    of them (`constraint_tensor`). Each beam also proposes the next token of each constraint it has not met
    (`propose`), the continuing beams are chosen by `pick_by_banks` (`pick`), and </s> is banned until every
    constraint is met. `continuing`: (V,) the tokens that continue the word before them (SentencePiece pieces
    without "▁"), none of which may follow a constraint's last token, so that a phrase ends where a word does;
    None: every token may."""

    def __init__(self, every: torch.Tensor, n: int, continuing: torch.Tensor | None):
        super().__init__(every, n)
        self.continuing = continuing
        self.alternatives, self.waits = has_alternatives(every), has_waits(every)  # (each read once, at the start)
        self.state = Progress(torch.zeros(n, every.size(1), dtype=torch.long, device=every.device),
                              self.live[..., LENGTH] > 0, torch.zeros(n, dtype=torch.bool, device=every.device))
        self.ready: torch.Tensor | None = None

    def ban(self, step, bans):
        bans.no_end = self.state.open.any(1)
        if self.continuing is not None:
            bans.pieces = (self.state.fresh, self.continuing)

    def next_tokens(self, k: int) -> torch.Tensor:
        """(n * k, C) each beam's next token of each of its phrases (a phrase's own clamp where it is done); with
        constraints given twice, which phrases may move on (`ready`) is kept for `pick`."""
        n, C, L1 = self.live.shape
        con, prog = self.live[:, None].expand(n, k, C, L1), self.state.prog.view(n, k, C)
        if self.waits:
            self.ready = ready(con, prog).view(n * k, C)
        return con[..., TOKENS:].gather(-1, prog.clamp(max=L1 - 4).unsqueeze(-1)).view(n * k, C).clamp(min=0)

    def propose(self, top_lp, top_tok, nxt, extra_lp, forced) -> tuple[torch.Tensor, torch.Tensor]:
        """Each beam's candidates: its best tokens (`top_lp`, `top_tok`, (R, W)) and after them the next token of
        each constraint it has not met (`nxt`, log-probs `extra_lp`), where another candidate of the beam is not
        that token already and no prefix forces its token (a phrase that waits proposes nothing yet)."""
        C = nxt.size(1)
        live = self.state.open & self.ready if self.waits else self.state.open
        earlier = torch.ones(C, C, dtype=torch.bool, device=nxt.device).tril(-1)  # c' < c
        repeated = ((nxt[:, :, None] == top_tok[:, None, :]).any(-1)
                    | ((nxt[:, :, None] == nxt[:, None, :]) & earlier & live[:, None, :]).any(-1))
        off = ~live | repeated
        if forced is not None:
            off = off | (forced >= 0)[:, None]
        return torch.cat([top_lp, extra_lp.masked_fill(off, float("-inf"))], 1), torch.cat([top_tok, nxt], 1)

    def pick(self, scores, tok, beam, K: int, k: int):
        """`pick_by_banks` for the live beams: (pick, missing, the picked candidates' `Progress` (n, K, ...))."""
        pick, missing, prog, open_, fresh = pick_by_banks(
            scores, tok, beam, self.live, self.state.prog, self.ready if self.waits else None, self.state.open,
            self.alternatives, K, k)
        return pick, missing, Progress(prog, open_, fresh)

    def keep(self, rows, beams):
        super().keep(rows, beams)
        self.state = self.state.select(beams)

    def admit(self, rows, items, beams):
        super().admit(rows, items, beams)
        K = beams.numel() // max(rows.numel(), 1)
        self.state.prog[beams], self.state.fresh[beams] = 0, False
        self.state.open[beams] = (self.live[rows, :, LENGTH] > 0).repeat_interleave(K, 0)
