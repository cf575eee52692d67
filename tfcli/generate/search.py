"""Decoding for encoder-decoder models: batched greedy and beam search.

Both run the encoder once per sentence, feed the decoder one new token per beam and step through
`step.IncrementalDecoder` (its key/value memory holds the rest, the cross-attention keys/values of the source are
computed once per sentence, and reordering beams copies no keys/values). Each is a `schedule.Search` under the one
`schedule.Schedule`: what a step decides stays on the device; the host reads it every `check_every` steps, to stop,
and to let finished sentences leave the batch (on the CPU, at once, so no compute is spent on them) or, with a
fixed-shape decoder (`step.StaticDecoder`, a GPU's), to give their places to the next sentences: continuous
batching, so that a batch stays full to the end of a file instead of shrinking to a tail of small steps. A
sentence's output does not depend on which place it takes or when. Neither ever emits <pad> or <s>.

Length rules, shared with the slow reference in `tests/reference_search.py`:
  - a sentence may have at most max_len = a * src_len + b output tokens (src_len counts </s>; capped at the model's
    max_len); a hypothesis that reaches it stops there, without </s>;
  - </s> is forbidden before `min_len` tokens (benchmarks set min_len = max_len to force equal work).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli.data.batching import pad
from tfcli.generate import native
from tfcli.device import never_chosen, to_device
from tfcli.errors import NotANumber
from tfcli.generate.sampling import LineSampling
from tfcli.generate.schedule import Decoder, Schedule, read_every, search_graph
from tfcli.generate.step import step_model
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without </s>
    score: float | None  # sum of token log-probs / lp(|Y|); None from a greedy search told not to score
    token_scores: list[float] | None = None  # log p of each token, then of </s> when it ended with one
    alignment: list[tuple[int, int]] | None = None  # (source word, target word) pairs (translate --alignment)
    parts: list[int] | None = None  # a line translated sentence by sentence: each sentence's number of tokens


def length_penalty(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting </s>. alpha = 0 ranks by raw log-prob."""
    return ((5 + length) / 6) ** alpha


def max_lengths(model, src: torch.Tensor, max_len_a: float, max_len_b: int,
                prefix: torch.Tensor | None = None, constraints: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) longest allowed output per sentence: a * src_len + b, at least 1 (and one more than its target prefix),
    and room for its constraints' tokens on top; at most the model's max_len."""
    src_len = (src != PAD_ID).sum(1)
    longest = (src_len.float() * max_len_a + max_len_b).long().clamp(min=1)
    if prefix is not None:
        longest = torch.maximum(longest, (prefix >= 0).sum(1) + 1)
    if constraints is not None:  # (the words they add are not in the source's length; every form counted)
        longest = longest + constraints[..., 2].sum(1)
    return longest.clamp(max=model.cfg.max_len)


def _start(sm, src: torch.Tensor, beam_size: int, max_steps: int, slots: int | None):
    """Encode the first sentences of the batch and start their decoder: (decoder, rows). `slots`: rows decoded at
    once (None: the whole batch); fewer rows than sentences need a decoder that takes new sentences into finished
    ones' places (`StaticDecoder`)."""
    n = src.size(0) if slots is None else max(1, min(slots, src.size(0)))
    if n < src.size(0) and not sm.static:
        raise ValueError("decoding in fewer slots than sentences needs the fixed-shape decoder "
                         "(StepModel(static=True))")
    return sm.start(n, beam_size, max_steps, *sm.encode(src[:n] if n < src.size(0) else src)), n


def _longest(sm, src: torch.Tensor, limits: list[int], max_len_a: float, max_len_b: int,
             prefix: torch.Tensor | None) -> int:
    """The positions a batch's decoder holds: its longest length limit, or with fixed shapes the limit of a
    sentence as wide as the batch's source tensor (so that every batch of one source width, prefix width and
    length rule has one shape: one graph)."""
    if not sm.static:
        return max(limits)
    P = prefix.size(1) + 1 if prefix is not None else 1
    return max(max(limits), min(sm.cfg.max_len, max(int(src.size(1) * max_len_a + max_len_b), P)))



def banned_tokens(step: int, min_len: int, device) -> torch.Tensor:
    """Ids that may not come at `step` (1-based): <pad> and <s> always, </s> until min_len tokens exist."""
    return never_chosen(torch.device(device), step <= min_len)


@dataclass(slots=True)
class Bans:
    """What each row's next token may not be, as named rules that every way of choosing it applies, so that each
    rule is written once: <pad> and <s> always, and </s> before `min_len` tokens (`at`: the output position being
    chosen, 1-based, an int or each row's (R,) tensor); `avoid` (R, A), the tokens that would complete a phrase to
    avoid (`avoided`); `pieces` ((R,) rows, (V,) tokens), rows that may take none of those tokens (a constraint
    just ended: no piece may continue its word); `no_end` (R,), rows that may not end (constraints unmet). Bans
    leave the model's distribution as it is: log-probs stay normalised over the whole vocabulary."""

    at: int | torch.Tensor
    min_len: int = 0
    avoid: torch.Tensor | None = None
    pieces: tuple[torch.Tensor, torch.Tensor] | None = None
    no_end: torch.Tensor | None = None

    def never(self, device) -> torch.Tensor:
        """The ids no row may take: <pad>, <s>, and </s> where `at` is one position for every row, before min_len."""
        return never_chosen(device, isinstance(self.at, int) and self.at <= self.min_len)

    def no_eos(self) -> torch.Tensor | None:
        """(R,) the rows that may not take </s> besides `never`'s: before min_len by a row's own position, or
        `no_end`; None: none."""
        early = None if isinstance(self.at, int) or not self.min_len else self.at <= self.min_len
        if self.no_end is None:
            return early
        return self.no_end if early is None else early | self.no_end

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Every rule on (R, V) log-probs or logits `x`, in place (the banned tokens at -inf)."""
        x.index_fill_(1, self.never(x.device), float("-inf"))
        eos = self.no_eos()
        if eos is not None:
            x[:, EOS_ID].masked_fill_(eos, float("-inf"))
        return self.apply_rows(x)

    def apply_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rules of each row's own (`avoid`, `pieces`) on `x`, in place."""
        if self.avoid is not None:
            x.scatter_(1, self.avoid, float("-inf"))
        if self.pieces is not None:
            x.masked_fill_(self.pieces[0][:, None] & self.pieces[1][None, :], float("-inf"))
        return x

    def on_columns(self, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Every rule on (R, C) `values` of the tokens `ids` (what rows.c's best_next leaves unwritten: the
        constraints' next tokens): -inf where banned."""
        banned = (ids[..., None] == self.never(ids.device)).any(-1)
        eos = self.no_eos()
        if eos is not None:
            banned |= (ids == EOS_ID) & eos[:, None]
        if self.avoid is not None:
            banned |= (ids[:, :, None] == self.avoid[:, None, :]).any(-1)
        if self.pieces is not None:
            banned |= self.pieces[0][:, None] & self.pieces[1][ids]
        return values.masked_fill(banned, float("-inf"))

    def blocks(self, size: int, n: int) -> list[Bans]:
        """The bans of `n` consecutive blocks of `size` rows."""
        def split(x):
            return x.split(size) if torch.is_tensor(x) else (x,) * n

        pieces = split(self.pieces[0]) if self.pieces is not None else (None,) * n
        return [Bans(at, self.min_len, av, (p, self.pieces[1]) if p is not None else None, ne)
                for at, av, p, ne in zip(split(self.at), split(self.avoid), pieces, split(self.no_end))]


def avoid_tensor(phrases: list[list[list[int]]], device) -> torch.Tensor | None:
    """Each row's phrases to avoid (token id lists) as one (rows, A, L) tensor, each phrase right-aligned with -1
    before its first token (a row with fewer phrases gets ones that ban only <pad>); None where no row has one."""
    A = max((len(p) for p in phrases), default=0)
    if not A:
        return None
    L = max(len(t) for p in phrases for t in p)
    out = torch.full((len(phrases), A, L), -1, dtype=torch.long)
    out[:, :, -1] = PAD_ID
    for r, row in enumerate(phrases):
        for a, t in enumerate(row):
            out[r, a, L - len(t):] = torch.tensor(t)
    return out.to(device)


def avoided(av: torch.Tensor, tokens: torch.Tensor, at, k: int) -> torch.Tensor:
    """(R, A) for each beam the last token of each phrase whose other tokens end its output so far (<pad>, banned
    anyway, where none does): the token that would complete the phrase. av (n, A, L): each live sentence's phrases
    (`avoid_tensor`); tokens (R = n * k, >= at - 1): each beam's output, position p at column p - 1; `at`: the
    output position being chosen (1-based), an int or each beam's ((R,) tensor). Nothing is read on the host."""
    n, A, L = av.shape
    if k > 1:
        av = av[:, None].expand(n, k, A, L).reshape(n * k, A, L)
    head, last = av[:, :, :-1], av[:, :, -1]
    steps = torch.arange(L - 1, device=av.device)
    cols = (at[:, None] if torch.is_tensor(at) else at) - L + steps  # the last L - 1 tokens' columns
    cols = cols.expand(tokens.size(0), L - 1)
    window = tokens.gather(1, cols.clamp(min=0)).masked_fill(cols < 0, -2)  # (-2: before the output's start)
    match = ((head == -1) | (head == window[:, None, :])).all(-1)
    return torch.where(match, last, PAD_ID)


UNMET_PENALTY = 1e4  # subtracted from a finished hypothesis's score per constraint token it lacks


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
    out[:, :, 0] = torch.arange(C) + C  # (the empty phrases' own constraints)
    out[:, :, 2] = 0
    for r, row in enumerate(rows):
        for c, (group, wait, t) in enumerate(row):
            out[r, c, 0], out[r, c, 1], out[r, c, 2] = group, wait, len(t)
            out[r, c, 3 : 3 + len(t)] = torch.tensor(t)
    return out.to(device)


def has_waits(con: torch.Tensor) -> bool:
    """Whether any phrase of `con` (`constraint_tensor`) waits for another (a constraint given twice in a row)."""
    return bool((con[..., 1] >= 0).any())


def ready(con: torch.Tensor, prog: torch.Tensor) -> torch.Tensor:
    """(..., C) whether each phrase of `con` may move on at progress `prog`: it waits for nothing, or the
    constraint it waits for is met (by any of its forms)."""
    met = prog >= con[..., 2]
    wait = con[..., 1]
    return (wait < 0) | ((con[..., 0][..., None, :] == wait[..., :, None]) & met[..., None, :]).any(-1)


def _forms(con: list, c: int) -> list[tuple[int, list[int]]]:
    return [(c, list(t)) for t in con] if con and not isinstance(con[0], int) else [(c, list(con))]


def advanced(con: torch.Tensor, prog: torch.Tensor, tok: torch.Tensor, ready: torch.Tensor | None = None
             ) -> torch.Tensor:
    """Each phrase's progress after `tok`. con (..., C, 3 + L): the phrases (`constraint_tensor`); prog (..., C):
    how many of each phrase's tokens end the output so far (its length, for good, once it has been output whole);
    tok (...): the next token. A phrase goes one token on where `tok` is its next, starts again at 1 where `tok`
    is its first, else back to 0; where `ready` (..., C) (`ready` of `prog`: constraints given twice) is False,
    it stays at 0."""
    phrase, lens = con[..., 3:], con[..., 2]
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
    lens = con[..., 2]
    if not alternatives:
        met = prog >= lens
        return dict(open=~met, missing=(lens * ~met).sum(-1), bank=(lens * met).sum(-1) + (prog * ~met).amax(-1))
    group = con[..., 0]
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
    group = con[..., 0]
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
    banks = C * (con.size(2) - 3) + 1  # (at most C * L constraint tokens)
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


def _forced_at(prefix: torch.Tensor | None, at, beams: int) -> torch.Tensor | None:
    """(rows,) the token each row must take at output position `at` (1-based; an int, or (n,) per sentence), -1
    where it is free; None when no row is forced. `prefix`: (n, P) target prefix ids per live sentence, -1 past each
    prefix's end."""
    if prefix is None:
        return None
    if isinstance(at, int):
        if at > prefix.size(1):
            return None
        forced = prefix[:, at - 1]
    else:
        forced = prefix.gather(1, (at - 1).clamp(max=prefix.size(1) - 1)[:, None]).squeeze(1)
        forced = forced.masked_fill(at > prefix.size(1), -1)
    return _per_beam(forced, beams)


def _per_beam(x: torch.Tensor, beams: int) -> torch.Tensor:
    """(n,) per sentence -> (n * beams,) per beam, sentence-major (x.repeat_interleave(beams), without the read of
    the device that repeat_interleave may make to size its output)."""
    return x[:, None].expand(-1, beams).reshape(-1) if beams > 1 else x


def _write_at(buf: torch.Tensor, at, values: torch.Tensor) -> None:
    """buf[r, ..., at - 1] = values[r, ...]: `at` an int, or each row's position ((R,) tensor)."""
    if isinstance(at, int):
        buf[..., at - 1] = values
    else:
        index = (at - 1).view(-1, *[1] * (buf.dim() - 1)).expand(*buf.shape[:-1], 1)
        buf.scatter_(-1, index, values.unsqueeze(-1))


def _with_forced(v: torch.Tensor, i: torch.Tensor, forced_lp: torch.Tensor, forced: torch.Tensor | None, k: int):
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


def _best_next(decoder: Decoder, tok: torch.Tensor, bans: Bans, k: int, forced: torch.Tensor | None = None,
               normalise: bool = True, extra: torch.Tensor | None = None):
    """The k most likely next tokens of each row by log p(y_t | y_<t, x), `bans` kept: (log-probs, ids), each
    (R, k) (k = 1: the max, each (R,)); a row's forced token (a target prefix's), whatever the model prefers or
    bans. Without `normalise` the values may be the logits instead (the same order; rows.c then skips the
    log-softmax's normaliser). `extra`: (R, C) more ids (>= 0) whose log-probs each row needs (the next tokens of
    its constraints): then a third tensor, (R, C), holds them (-inf where banned).

    On the CPU by rows.c's best_next where it runs and the step is not fixed-shape (`_best_next_rows`: chosen on
    the logits, the log-softmax over the vocabulary never written out), else by blocks of 64 rows, so that the
    log-probs the top-k reads are still in the cache, and with `top_k` in place of torch.topk; on a GPU at once
    (each block is three more kernel launches, and nothing there is gained by it)."""
    logits = decoder.step(tok).float()
    cpu = logits.device.type == "cpu"
    if cpu and not decoder.fixed:  # (a fixed-shape step is one graph: no C call in it)
        best = _best_next_rows(logits, bans, k, forced, normalise, extra)
        if best is not None:
            return best
    values, ids, extras = [], [], []
    blocks = logits.split(64) if cpu else (logits,)
    split = (lambda x: x.split(64) if x is not None else (None,) * len(blocks)) if cpu else (lambda x: (x,))
    for block, fb, bb, eb in zip(blocks, split(forced), bans.blocks(64, len(blocks)) if cpu else (bans,), split(extra)):
        lprobs = block.log_softmax(-1)
        forced_lp = None if fb is None else lprobs.gather(1, fb.clamp(min=0)[:, None])
        bb.apply(lprobs)
        v, i = lprobs.max(-1) if k == 1 else top_k(lprobs, k) if cpu else lprobs.topk(k, dim=1)
        v, i = _with_forced(v, i, forced_lp, fb, k)
        values.append(v)
        ids.append(i)
        if eb is not None:
            extras.append(lprobs.gather(1, eb))
    out = (values[0], ids[0]) if len(values) == 1 else (torch.cat(values), torch.cat(ids))
    return out if extra is None else (*out, extras[0] if len(extras) == 1 else torch.cat(extras))


def _best_next_rows(logits: torch.Tensor, bans: Bans, k: int, forced, normalise: bool, extra):
    """_best_next by rows.c's best_next (None where it does not run): the never-chosen ids, the rows that may not
    end and the pieces that may not follow a constraint go to the C call; the phrases to avoid are written into the
    logits, each row's normaliser taken over the whole vocabulary first, so that the bans leave the model's
    distribution as it is."""
    forced_logit = None if forced is None else logits.gather(1, forced.clamp(min=0)[:, None])
    extra_logit = None if extra is None else logits.gather(1, extra)
    full = logits.logsumexp(1) if bans.avoid is not None else None
    chosen_from = logits if bans.avoid is None else logits.scatter(1, bans.avoid, float("-inf"))
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
        return _with_forced(v, i, forced_lp, forced, k)
    extra_lp = extra_logit - norm[:, None] if norm is not None else extra_logit
    return (*_with_forced(v, i, forced_lp, forced, k), bans.on_columns(extra_lp, extra))


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




class _SourceSearch:
    """What greedy and beam search share as `schedule.Search`es: the source of each item, its length limit and
    target prefix, and the decoder's rows of `beams` beams each. Subclasses keep their per-row tensors in
    `per_row` (one row per item) and `per_beam` (`beams` rows per item): rows that leave take those with them."""

    per_row: tuple[str, ...] = ("limit", "pre", "av", "cn")
    per_beam: tuple[str, ...] = ()

    def __init__(self, sm, decoder, sched: Schedule, src, max_len, prefix, beams: int, avoid=None, constraints=None):
        n = sched.item.numel()
        self.sm, self.decoder, self.sched, self.src, self.max_len, self.prefix = sm, decoder, sched, src, max_len, prefix
        self.beams, self.device, self.avoid, self.constraints = beams, src.device, avoid, constraints
        self.limit = max_len[:n].clone()  # each row's length limit
        self.pre = prefix[:n].clone() if prefix is not None else None  # and its target prefix
        self.av = avoid[:n].clone() if avoid is not None else None  # and the phrases it must not output
        self.cn = constraints[:n].clone() if constraints is not None else None  # and the phrases it must

    def capturable(self) -> bool:
        return True

    def must_read(self) -> bool:
        return False

    def read(self) -> list[bool]:
        return self.ended_rows().tolist()

    def ended_rows(self) -> torch.Tensor:
        """Whether each row's item has ended, on the device."""
        raise NotImplementedError

    def retire(self, rows: list[int]) -> None:
        pass

    def admit(self, rows: torch.Tensor, items: torch.Tensor, placed=None) -> None:
        """Encode the items' sources into the decoder's `rows`; their own state is the subclass's to reset."""
        self.decoder.admit(rows, *self.sm.encode(self.src[items]))
        self.limit[rows] = self.max_len[items]
        if self.pre is not None:
            self.pre[rows] = self.prefix[items]
        if self.av is not None:
            self.av[rows] = self.avoid[items]
        if self.cn is not None:
            self.cn[rows] = self.constraints[items]

    def avoided(self, tokens: torch.Tensor, at, k: int) -> torch.Tensor | None:
        """(rows * k, A) the token each beam may not take next (`avoided`), or None without phrases to avoid."""
        return None if self.av is None else avoided(self.av, tokens, at, k)

    def keep(self, rows: torch.Tensor) -> None:
        beams = self._beams(rows)
        for names, index in ((self.per_row, rows), (self.per_beam, beams)):
            for name in names:
                x = getattr(self, name)
                if x is not None:
                    setattr(self, name, x[index])
        self.decoder.select(rows)

    def _beams(self, rows: torch.Tensor) -> torch.Tensor:
        """The beam rows of decoder rows `rows`."""
        K = self.beams
        return (rows[:, None] * K + torch.arange(K, device=rows.device)).flatten() if K > 1 else rows


def _decode(make, model, src: torch.Tensor, beam_size: int, max_len_a: float, max_len_b: int,
            prefix: torch.Tensor | None, check_every: int, slots: int | None, constraints: torch.Tensor | None = None):
    """Set up the decoder and the schedule for a batch, build the search (`make(sm, decoder, schedule, max_len,
    T)`), run it to the end, and return it."""
    every = read_every(check_every, src.device)
    max_len = max_lengths(model, src, max_len_a, max_len_b, prefix, constraints)
    sm = step_model(model)
    T = _longest(sm, src, max_len.tolist(), max_len_a, max_len_b, prefix)  # (one read)
    decoder, n = _start(sm, src, beam_size, T, slots)
    sched = Schedule(src.size(0), n, decoder.fixed, every, T, src.device)
    search = make(sm, decoder, sched, max_len, T)
    sched.run(search, search_graph(decoder))
    decoder.release()
    return search


class _Greedy(_SourceSearch):
    """Greedy decoding (or sampling): per row its tokens, their log-probs, the step it ended at (0: not yet) and
    whether with </s>; per item the same, copied when its row ends. (Token buffers have one more column, which an
    ended fixed-shape row running on past its limit writes.)"""

    per_row = _SourceSearch.per_row + ("tok", "tokens", "lps", "end", "eos")

    def __init__(self, sm, decoder, sched, src, max_len, T, prefix, min_len, sampling, lines, scored, avoid=None):
        super().__init__(sm, decoder, sched, src, max_len, prefix, 1, avoid)
        B, n, device = src.size(0), sched.item.numel(), src.device
        self.min_len, self.sampling, self.lines, self.scored = min_len, sampling, lines, scored
        self.out_tok = torch.zeros(B, T + 1, dtype=torch.long, device=device)
        self.out_lp = torch.zeros(B, T + 1, device=device)
        self.out_end = torch.zeros(B, dtype=torch.long, device=device)
        self.out_eos = torch.zeros(B, dtype=torch.bool, device=device)
        self.tokens, self.lps = self.out_tok[:n].clone(), self.out_lp[:n].clone()
        self.end, self.eos = self.out_end[:n].clone(), self.out_eos[:n].clone()
        self.tok = torch.full((n,), BOS_ID, dtype=torch.long, device=device)

    def advance(self, at) -> None:
        """Each row's next token and its log-prob, and whether it ends. With fixed shapes everything is read from
        and written to the same tensors, so that the step can be a CUDA graph."""
        forced = _forced_at(self.pre, at, 1)
        bans = Bans(at, self.min_len, self.avoided(self.tokens, at, 1))
        if self.sampling is None:
            lp, nxt = _best_next(self.decoder, self.tok, bans, 1, forced, self.scored)
        else:
            logits = self.decoder.step(self.tok).float()
            lprobs = Bans(at, self.min_len).apply(logits.log_softmax(-1))
            # drawn from the distribution without the banned tokens, scored by the model's own
            allowed = lprobs if bans.avoid is None else Bans(at, self.min_len).apply(
                bans.apply_rows(logits.clone()).log_softmax(-1))
            nxt = self.sampling.choose(allowed, self.lines[self.sched.item], at)
            if forced is not None:
                nxt = torch.where(forced >= 0, forced, nxt)
            lp = lprobs.gather(1, nxt[:, None]).squeeze(1)  # (the model's log-probability, bans or not)
        _write_at(self.tokens, at, nxt)
        _write_at(self.lps, at, lp)
        is_eos = nxt == EOS_ID
        ending = (self.end == 0) & (is_eos | (self.limit <= at))
        if self.sched.fixed:
            self.end.copy_(torch.where(ending, at, self.end))
            self.tok.copy_(nxt)
        else:
            self.end.masked_fill_(ending, at)
            self.tok = nxt
        self.eos.logical_or_(ending & is_eos)

    def ended_rows(self) -> torch.Tensor:
        return self.end > 0

    def retire(self, rows: list[int]) -> None:
        index = to_device(rows, self.device) if len(rows) < self.end.numel() else slice(None)
        items = self.sched.item[index]
        self.out_tok[items], self.out_lp[items] = self.tokens[index], self.lps[index]
        self.out_end[items], self.out_eos[items] = self.end[index], self.eos[index]

    def admit(self, rows: torch.Tensor, items: torch.Tensor, placed=None) -> None:
        super().admit(rows, items)
        self.tokens[rows], self.lps[rows], self.end[rows], self.eos[rows], self.tok[rows] = 0, 0, 0, False, BOS_ID

    def hypotheses(self, len_penalty: float) -> list[Hypothesis]:
        out = []
        for e, ended_eos, toks, scores in zip(*_to_lists(self.out_end, self.out_eos, self.out_tok, self.out_lp)):
            lps = scores[:e]
            _numbers(lps)
            scores = lps if self.scored else None
            out.append(Hypothesis(toks[: e - 1 if ended_eos else e],
                                  sum(scores) / length_penalty(e, len_penalty) if scores is not None else None, scores))
        return out


@torch.inference_mode()
def greedy_decode(
    model, src: torch.Tensor, max_len_a: float = 1.2, max_len_b: int = 10, min_len: int = 0, len_penalty: float = 0.0,
    sampling: LineSampling | None = None, lines: torch.Tensor | None = None, prefix: torch.Tensor | None = None,
    check_every: int = 0, slots: int | None = None, scored: bool = True, avoid: torch.Tensor | None = None,
) -> list[Hypothesis]:
    """Greedy decoding on the incremental decoder; one `Hypothesis` per source row (scored like beam search, beam 1).
    With `sampling`, each next token is drawn instead (`lines`: (B,) each row's index in the input, which with the
    seed keys its random numbers); the score is still the model's log-probability of the tokens chosen. `prefix`:
    (B, P) target ids each output must start with (-1 past a row's prefix), scored as the model scores them.
    `avoid`: (B, A, L) token phrases a row's output never holds (`avoid_tensor`; beam_search says how).
    Without `scored` the hypotheses' scores are None (as CTranslate2's without return_scores): the tokens are chosen
    on the logits, and the log-softmax's normaliser is not computed where that saves work (rows.c's best_next).

    Everything a step decides stays on the device (each row's tokens, log-probs, and the step it ended at); the
    host reads it every `check_every` steps (`schedule.read_every`), to stop, to let the finished rows leave, or
    with a fixed-shape decoder to give their places to the next sentences (`slots` rows at once; None: all). A row
    that ended between two reads runs on until the next one, unread: its output is what it was when it ended.

    src: (B, S) right-padded source ids, each ending in </s>.
    """
    def make(sm, decoder, sched, max_len, T):
        return _Greedy(sm, decoder, sched, src, max_len, T, prefix, min_len, sampling, lines, scored, avoid)

    return _decode(make, model, src, 1, max_len_a, max_len_b, prefix, check_every, slots).hypotheses(len_penalty)


def greedy_search(model, src: torch.Tensor, max_len_a: float = 1.2, max_len_b: int = 10) -> list[list[int]]:
    """Greedy decoding, just the output ids (without </s>) per source row."""
    return [h.tokens for h in greedy_decode(model, src, max_len_a, max_len_b, scored=False)]


class _Beam(_SourceSearch):
    """Beam search's state. Per input item: its K best finished hypotheses (score, the step it ended at: 0 for
    none, ended with </s>, tokens, per-token log-probs), how many ended in all. Per row (a live sentence): its length
    limit, the largest length penalty it can get, the nbest-th best finished score and whether K have ended (copies
    of fin_*, kept where the step reads them), whether it is done, and the summed log-probs of its k beams. Per beam:
    its last token, its tokens so far and their log-probs. Rows are sentence-major: row s * k + j is beam j of live
    sentence s. (Token buffers have one more column, which a done sentence running on past its limit in a
    fixed-shape decoder writes.)"""

    per_row = _SourceSearch.per_row + ("lp_max", "floor", "full", "done", "scores")
    per_beam = ("tok", "tokens", "lps", "prog", "open", "fresh")

    def __init__(self, sm, decoder, sched, src, max_len, T, prefix, K, nbest, len_penalty, min_len, token_scores,
                 avoid=None, constraints=None, continuing=None):
        super().__init__(sm, decoder, sched, src, max_len, prefix, K, avoid, constraints)
        self.continuing = continuing
        # (each read once, at the start)
        self.alternatives = constraints is not None and has_alternatives(constraints)
        self.waits = constraints is not None and has_waits(constraints)
        B, n, device = src.size(0), sched.item.numel(), src.device
        self.K, self.nbest, self.len_penalty, self.min_len = K, nbest, len_penalty, min_len
        self.fin_score = torch.full((B, K), float("-inf"), device=device)
        self.fin_step = torch.zeros(B, K, dtype=torch.long, device=device)
        self.fin_eos = torch.zeros(B, K, dtype=torch.bool, device=device)
        self.fin_tok = torch.zeros(B, K, T + 1, dtype=torch.long, device=device)
        self.fin_lp = torch.zeros(B, K, T + 1, device=device) if token_scores else None
        self.fin_n = torch.zeros(B, dtype=torch.long, device=device)
        self.lp_max_all = length_penalty(max_len.float() + 1, len_penalty)
        self.lp_max = self.lp_max_all[:n].clone()
        self.floor = torch.full((n,), float("-inf"), device=device)
        self.full = torch.zeros(n, dtype=torch.bool, device=device)
        self.done = torch.zeros(n, dtype=torch.bool, device=device)
        self.k = 1  # beams per live sentence: 1 at the first step, K after
        self.scores = torch.zeros(n, 1, device=device)  # (n, k)
        self.tokens = torch.zeros(n, T + 1, dtype=torch.long, device=device)  # (n * k, T + 1)
        self.lps = torch.zeros(n, T + 1, device=device) if token_scores else None
        self.tok = torch.full((n,), BOS_ID, dtype=torch.long, device=device)
        self.first_beam = torch.tensor([0.0] + [float("-inf")] * (K - 1), device=device)  # a sentence that joins later
        # each beam's progress in each of its sentence's constraints (`advanced`)
        self.prog = torch.zeros(n, constraints.size(1), dtype=torch.long, device=device) if constraints is not None \
            else None
        # and which of them are of a constraint it has not met (`constraint_state`'s open; an empty phrase is met)
        self.open = self.cn[..., 2] > 0 if constraints is not None else None
        # and whether its last token ended a constraint (a piece that would continue that word is not taken)
        self.fresh = torch.zeros(n, dtype=torch.bool, device=device) if constraints is not None else None

    def capturable(self) -> bool:
        return self.k == self.K

    def advance(self, at) -> None:
        """One step: every live beam expanded, the K best continuations kept, what ends merged into the finished
        hypotheses, and whether each sentence is done. After the first step with fixed shapes, everything is read
        from and written to the same tensors, so that it can be a CUDA graph."""
        K, k, n, len_penalty = self.K, self.k, self.scores.size(0), self.len_penalty
        device, token_scores = self.device, self.lps is not None
        at_row = at if isinstance(at, int) else _per_beam(at, k)
        col = at if isinstance(at, int) else at[:, None]
        top_lp, cand_scores, cand_idx, cand_beam, cand_tok = self._candidates(at, at_row)
        cand_row = cand_beam + (torch.arange(n, device=device) * k)[:, None]  # the beam's row in `tokens` / cache
        is_eos = cand_tok == EOS_ID
        if self.cn is None:
            # the K best candidates that do not end the hypothesis continue (at most K of the 2K end in </s>)
            next_scores, pick = cand_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)
        else:
            pick, missing, next_prog, next_open, next_fresh = pick_by_banks(
                cand_scores, cand_tok, cand_beam, self.cn, self.prog, self.ready if self.waits else None, self.open,
                self.alternatives, K, k)
            next_scores = cand_scores.gather(1, pick)
        next_beam, next_tok, next_row = cand_beam.gather(1, pick), cand_tok.gather(1, pick), cand_row.gather(1, pick)
        cand_lp = top_lp.gather(1, cand_idx) if token_scores else None
        next_lp = cand_lp.gather(1, pick) if token_scores else None

        # what ends now, in a sentence not done yet: </s> among its first K candidates, and at its max length its K
        # continuing beams
        live = ~self.done
        at_max = self.limit <= at
        ends = torch.cat([is_eos[:, :K], at_max[:, None].expand(n, K)], 1) & live[:, None]  # (n, 2K)
        # (on the CPU, where reading is cheap, skipped when nothing ends)
        if self.sched.fixed or self.sched.every > 1 or bool(ends.any()):
            item = self.sched.item
            at_limit = next_scores / length_penalty(col, len_penalty)
            if self.cn is not None:  # (</s> comes only once every constraint is met; the length limit, before)
                at_limit = at_limit - UNMET_PENALTY * missing
            _keep_finished(
                (self.fin_score, self.fin_step, self.fin_eos, self.fin_tok, self.fin_lp, self.fin_n), item, ends, at,
                torch.cat([cand_scores[:, :K] / length_penalty(col, len_penalty), at_limit], 1),
                torch.cat([cand_row[:, :K], next_row], 1), torch.cat([cand_tok[:, :K], next_tok], 1),
                self.tokens, self.lps, torch.cat([cand_lp[:, :K], next_lp], 1) if token_scores else None,
            )
            new_floor, new_full = self.fin_score[item, self.nbest - 1], self.fin_n[item] >= K
        else:
            new_floor, new_full = self.floor, self.full
        # done: at the max length, or settled (see beam_search)
        settled = new_full & (new_floor >= next_scores[:, 0] / length_penalty(at + 1, len_penalty))
        if len_penalty >= 0:  # (alpha < 0: lp falls as |Y| grows, no bound)
            settled |= new_floor >= next_scores[:, 0] / self.lp_max
        new_done = ~live | at_max | settled

        self.decoder.select(None, next_beam)
        rows = next_row.flatten()
        at_row = at if isinstance(at, int) else _per_beam(at, K)
        new_tokens = self.tokens.index_select(0, rows)
        _write_at(new_tokens, at_row, next_tok.flatten())
        new_lps = None
        if token_scores:
            new_lps = self.lps.index_select(0, rows)
            _write_at(new_lps, at_row, next_lp.flatten())
        new = dict(scores=next_scores, tokens=new_tokens, lps=new_lps, tok=next_tok.flatten(), floor=new_floor,
                   full=new_full, done=new_done, prog=next_prog.flatten(0, 1) if self.cn is not None else None,
                   open=next_open.flatten(0, 1) if self.cn is not None else None,
                   fresh=next_fresh.flatten() if self.cn is not None else None)
        if self.sched.fixed and k == K:  # in place: the same tensors at every step
            for name, value in new.items():
                if value is not None:
                    getattr(self, name).copy_(value)
        else:
            for name, value in new.items():
                setattr(self, name, value)
            self.k = K

    def _candidates(self, at, at_row):
        """(each beam's proposals' log-probs (n, k * W), then the sentence's candidates sorted best first: summed
        log-probs, index into the proposals, beam, token; each (n, 2K), or with constraints all k * W of them).

        A candidate among its sentence's 2K best (beam, token) pairs is among its own beam's 2K best tokens, so
        each beam proposes its 2K best and the sentence picks 2K of those k * 2K: no beam score is added to, and no
        topk runs over, all k * V pairs. With constraints each beam proposes more (`_with_constraints`), and all
        are kept: the continuing beams are chosen by `pick_by_banks`."""
        K, k, n = self.K, self.k, self.scores.size(0)
        forced, ban = _forced_at(self.pre, at, k), self.avoided(self.tokens, at_row, k)
        if self.cn is None:
            top_lp, top_tok = _best_next(self.decoder, self.tok, Bans(at_row, self.min_len, ban), 2 * K, forced)
            W = 2 * K
        else:
            top_lp, top_tok, W = self._with_constraints(at_row, forced, ban)  # (n * k, W)
        top_lp = top_lp.view(n, k * W)
        cand = (self.scores.unsqueeze(2) + top_lp.view(n, k, W)).view(n, k * W)
        if self.cn is None:
            cand_scores, cand_idx = cand.topk(2 * K, dim=1)
        else:
            cand_scores, cand_idx = cand.sort(dim=1, descending=True, stable=True)
        beam = torch.div(cand_idx, W, rounding_mode="floor")
        return top_lp, cand_scores, cand_idx, beam, top_tok.view(n, k * W).gather(1, cand_idx)

    def _with_constraints(self, at_row, forced, ban):
        """Each beam's candidates with constraints: its 2K best tokens and, after them, the next token of each
        constraint it has not met (where another candidate of the beam is not that token already, and no prefix
        forces its token); </s> banned until every constraint is met, and after a constraint's last token the
        pieces that would continue its word (`continuing`). Returns (log-probs, ids, W), each (n * k, W),
        W = 2K + C."""
        K, k = self.K, self.k
        n, C, L1 = self.cn.shape
        con, prog, unmet = self.cn[:, None].expand(n, k, C, L1), self.prog.view(n, k, C), self.open  # (R = n * k)
        nxt = con[..., 3:].gather(-1, prog.clamp(max=L1 - 4).unsqueeze(-1)).view(n * k, C).clamp(min=0)  # (R, C)
        pieces = (self.fresh, self.continuing) if self.continuing is not None else None
        bans = Bans(at_row, self.min_len, ban, pieces, no_end=unmet.any(1))
        top_lp, top_tok, extra_lp = _best_next(self.decoder, self.tok, bans, 2 * K, forced, extra=nxt)
        if self.waits:  # (each beam's, for its candidates too: `pick_by_banks`)
            self.ready = ready(con, prog).view(n * k, C)
        live = unmet & self.ready if self.waits else unmet  # (a phrase that waits proposes nothing yet)
        earlier = torch.ones(C, C, dtype=torch.bool, device=nxt.device).tril(-1)  # c' < c
        repeated = ((nxt[:, :, None] == top_tok[:, None, :]).any(-1)
                    | ((nxt[:, :, None] == nxt[:, None, :]) & earlier & live[:, None, :]).any(-1))
        off = ~live | repeated
        if forced is not None:
            off = off | (forced >= 0)[:, None]
        return torch.cat([top_lp, extra_lp.masked_fill(off, float("-inf"))], 1), torch.cat([top_tok, nxt], 1), \
            2 * K + C

    def ended_rows(self) -> torch.Tensor:
        return self.done

    def admit(self, rows: torch.Tensor, items: torch.Tensor, placed=None) -> None:
        """K fresh beams a new sentence, all but the first at -inf."""
        super().admit(rows, items)
        self.lp_max[rows] = self.lp_max_all[items]
        self.floor[rows], self.full[rows], self.done[rows], self.scores[rows] = float("-inf"), False, False, \
            self.first_beam
        beams = self._beams(rows)
        self.tokens[beams], self.tok[beams] = 0, BOS_ID
        if self.lps is not None:
            self.lps[beams] = 0
        if self.prog is not None:
            self.prog[beams], self.fresh[beams] = 0, False
            self.open[beams] = (self.cn[rows, :, 2] > 0).repeat_interleave(self.K, 0)

    def hypotheses(self) -> list[list[Hypothesis]]:
        out = []
        token_scores = self.fin_lp is not None
        host = _to_lists(self.fin_score, self.fin_step, self.fin_eos, self.fin_tok,
                         *((self.fin_lp,) if token_scores else ()))
        for score, ended, eos, toks, *lp in zip(*host):
            _numbers(score)
            out.append([Hypothesis(toks[j][: ended[j] - eos[j]], score[j], lp[0][j][: ended[j]] if lp else None)
                        for j in range(self.nbest)])
        return out


@torch.inference_mode()
def beam_search(
    model,
    src: torch.Tensor,
    beam_size: int = 5,
    len_penalty: float = 0.6,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    nbest: int = 1,
    min_len: int = 0,
    token_scores: bool = False,
    prefix: torch.Tensor | None = None,
    check_every: int = 0,
    slots: int | None = None,
    avoid: torch.Tensor | None = None,
    constraints: torch.Tensor | None = None,
    continuing: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Batched beam search; per source row, the `nbest` best hypotheses, best first. `prefix`: (B, P) target ids
    every hypothesis must start with (-1 past a row's prefix): while a row is in its prefix each beam has one way
    on, the prefix's next token, scored as the model scores it. `avoid`: (B, A, L) token phrases no hypothesis of
    the row outputs (`avoid_tensor`): the token that would complete one is never chosen (a prefix still is).
    `constraints`: (B, C, 3 + L) token phrases every hypothesis of the row must output, in any order, or for a set
    of alternatives one of them (`constraint_tensor`): dynamic beam allocation (Post & Vilar 2018) in its vectorised form (Hu et al. 2019).
    Each beam also proposes the next token of each constraint it has not met, the continuing beams are chosen by
    `pick_by_banks`, and </s> is banned until every constraint is met; the length limit grows by the constraints'
    tokens, and a hypothesis that still reaches it with some unmet scores UNMET_PENALTY less per missing token (the
    best of those is returned only where no hypothesis met them all). `continuing`: (V,) the tokens that continue
    the word before them (SentencePiece pieces without "▁"), none of which may follow a constraint's last token, so
    that a phrase ends where a word does; None: every token may.

    Each step expands every live beam by the whole vocabulary and keeps the 2K best (beam, token) pairs by summed
    log-prob (each beam's 2K best tokens, then one topk over the K x 2K pairs). Pairs ending in </s> among the first
    K become finished hypotheses, scored sum(log p) / lp(|Y|) (GNMT); the K best others go on. A sentence is done
    when it reaches its max length (its live beams finish too), or once it has K finished hypotheses and its
    `nbest`-th best is at least what the best live beam would score if it ended at the next step,
    best_live_sum / lp(|Y| + 1) (Hugging Face's default rule; with alpha = 0 it is exact, since a live beam's
    summed log-prob only falls; fairseq's "K finished" alone can stop while a live beam is better, so that a larger
    beam returned a worse translation). It is also done as soon as its `nbest` best finished hypotheses cannot be
    beaten at all: lp(|Y|) is at most lp(max_len + 1), so no live beam can finish above
    best_live_sum / lp(max_len + 1). That changes no output and saves the steps after the answer is settled.

    All of it stays on the device: each sentence's K best finished hypotheses so far (best first; equal scores in
    the order they ended), how many ended, and whether it is done. The host reads the device every `check_every`
    steps (`schedule.read_every`), to stop, and to let the done sentences leave the batch or, with a fixed-shape
    decoder, give their places to the next sentences (`slots` sentences at once; None: all): continuous batching.
    A sentence done between two reads runs on unread, and nothing it does is kept. The first step runs one row per
    sentence; a sentence that joins later starts with K beams, all but the first at -inf.
    """
    K, V = beam_size, model.cfg.tgt_vocab_size
    if not 1 <= nbest <= K:
        raise ValueError(f"nbest must be between 1 and the beam size ({K}), got {nbest}")
    if 2 * K > V - 3:
        raise ValueError(f"beam size {K} is too large for a vocabulary of {V}")

    def make(sm, decoder, sched, max_len, T):
        return _Beam(sm, decoder, sched, src, max_len, T, prefix, K, nbest, len_penalty, min_len, token_scores,
                     avoid, constraints, continuing)

    return _decode(make, model, src, K, max_len_a, max_len_b, prefix, check_every, slots, constraints).hypotheses()


@dataclass(frozen=True)
class SearchOptions:
    """How the sources of a batch are searched, set once for a run (`from_config`): greedy (a beam of 1), beam
    search, or with `sampling` one draw a row. `scored`: compute the hypotheses' scores (greedy search without
    them chooses on the logits and skips the normaliser); `token_scores`: keep each token's log-prob (beam search;
    greedy keeps them whenever it scores)."""

    beam_size: int = 5
    len_penalty: float = 0.6
    max_len_a: float = 1.2
    max_len_b: int = 10
    min_len: int = 0
    nbest: int = 1
    scored: bool = True
    token_scores: bool = False
    check_every: int = 0
    sampling: LineSampling | None = None

    @classmethod
    def from_config(cls, cfg) -> SearchOptions:
        """From a TranslateConfig."""
        sampling = LineSampling(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed) if cfg.sampling else None
        return cls(cfg.beam_size, cfg.len_penalty, cfg.max_len_a, cfg.max_len_b, cfg.min_len, cfg.nbest or 1,
                   scored=cfg.tabular or cfg.sampling, token_scores=cfg.scores, check_every=cfg.check_every,
                   sampling=sampling)

    def mode(self, constrained: bool = False) -> str:
        """"sampling", "greedy" or "beam": what `search` runs (constraints need beam search, at any beam size)."""
        if self.sampling is not None:
            return "sampling"
        return "beam" if self.beam_size > 1 or constrained else "greedy"


@dataclass(frozen=True)
class Rows:
    """What each row of a batch brings besides its source, each None where no row has any: `prefix` (B, P) target
    ids its output starts with (-1 past a row's prefix), `avoid` its phrases to avoid (`avoid_tensor`),
    `constraints` its phrases to hold (`constraint_tensor`), `lines` (B,) the keys of its random numbers
    (sampling: its index in the input)."""

    prefix: torch.Tensor | None = None
    avoid: torch.Tensor | None = None
    constraints: torch.Tensor | None = None
    lines: torch.Tensor | None = None

    @classmethod
    def build(cls, device, max_len: int, prefixes: list[list[int]] | None = None,
              avoid: list[list[list[int]]] | None = None, constraints: list[list] | None = None,
              lines: list[int] | None = None) -> Rows:
        """From per-row lists (token ids; [] for none): a prefix is cut to max_len - 1 tokens."""
        prefix = None
        if prefixes is not None and any(prefixes):
            prefix = pad([p[: max_len - 1] for p in prefixes], pad_id=-1).to(device)
        return cls(prefix, avoid_tensor(avoid, device) if avoid is not None else None,
                   constraint_tensor(constraints, device) if constraints is not None else None,
                   torch.tensor(lines, device=device) if lines is not None else None)


def search(model, src: torch.Tensor, options: SearchOptions, rows: Rows = Rows(), slots: int | None = None,
           continuing=None) -> list[list[Hypothesis]]:
    """The one entry for decoding a batch of sources (B, S): per row its hypotheses, best first (one for greedy
    search and sampling, `options.nbest` for beam search). `continuing`: a function giving the (V,) tokens that
    may not follow a constraint's last token (`beam_search`), called only where constraints are given."""
    o = options
    mode = o.mode(rows.constraints is not None)
    if mode == "beam":
        return beam_search(model, src, o.beam_size, o.len_penalty, o.max_len_a, o.max_len_b, o.nbest, o.min_len,
                           o.token_scores, rows.prefix, o.check_every, slots, rows.avoid, rows.constraints,
                           continuing() if rows.constraints is not None and continuing is not None else None)
    lines = rows.lines if mode == "sampling" else None
    return [[h] for h in greedy_decode(model, src, o.max_len_a, o.max_len_b, o.min_len, o.len_penalty, o.sampling,
                                       lines, rows.prefix, o.check_every, slots, o.scored, rows.avoid)]


def _numbers(values: list[float]) -> None:
    """NotANumber where a hypothesis' scores hold NaN: what a model whose weights or activations hold NaN or inf
    gives (rows.c's best_next says so at once; torch's search carries the NaN into the scores)."""
    if any(v != v for v in values):
        raise NotANumber(native.NAN_MESSAGE)


def _keep_finished(fin, alive, ends, at, score, row, last, tokens, lps, last_lp) -> None:
    """Merge the hypotheses that end at output position `at` (an int, or (n,) per sentence) into each live
    sentence's K best finished ones (in place).

    `fin`: per input row (score, step, eos, tokens, log-probs, count), as beam_search keeps them; `ends` (n, 2K):
    which of the step's 2K candidates end (the first K by </s>, the others at the max length), with their
    `score` (already divided by the length penalty), beam `row` in `tokens`/`lps`, `last` token and its log-prob
    `last_lp`. A stable sort keeps equal scores in the order they ended."""
    fin_score, fin_step, fin_eos, fin_tok, fin_lp, fin_n = fin
    n, K2 = ends.shape
    K, T = K2 // 2, tokens.size(1)
    eos = torch.zeros_like(ends)
    eos[:, : K] = True
    new_tok = tokens.index_select(0, row.flatten()).view(n, K2, T)
    _write_at(new_tok, at, last)
    merged = torch.cat([fin_score[alive], score.masked_fill(~ends, float("-inf"))], 1)  # (n, 3K)
    order = merged.sort(dim=1, descending=True, stable=True).indices[:, :K]
    fin_score[alive] = merged.gather(1, order)
    ended = torch.where(ends, at if isinstance(at, int) else at[:, None], 0)
    fin_step[alive] = torch.cat([fin_step[alive], ended], 1).gather(1, order)
    fin_eos[alive] = torch.cat([fin_eos[alive], eos & ends], 1).gather(1, order)
    pick = order[:, :, None].expand(n, K, T)
    fin_tok[alive] = torch.cat([fin_tok[alive], new_tok], 1).gather(1, pick)
    if fin_lp is not None:
        new_lp = lps.index_select(0, row.flatten()).view(n, K2, T)
        _write_at(new_lp, at, last_lp)
        fin_lp[alive] = torch.cat([fin_lp[alive], new_lp], 1).gather(1, pick)
    fin_n[alive] += ends.sum(1)


def _to_lists(*tensors: torch.Tensor, one_copy: bool | None = None) -> list[list]:
    """Each tensor as (nested) Python lists. From a GPU (`one_copy`: by default, off the CPU) in one copy: each
    .tolist() there waits for the device, and a search's outputs are four or five tensors. (Through float64, which
    holds every float32, bool and token id exactly.)"""
    if not (tensors[0].device.type != "cpu" if one_copy is None else one_copy):
        return [t.tolist() for t in tensors]
    flat = torch.cat([t.reshape(-1).double() for t in tensors]).cpu()
    out = []
    for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        out.append(part.view(t.shape).to(t.dtype).tolist())
    return out
