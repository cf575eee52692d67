"""The rules on each row's next token: one list (`RowRules`), built once per batch, that every search applies.

A rule says what it bans on a row's next token (`ban`), how it changes the scores the search ranks by
(`penalise`), what it forces (`forced`), and keeps what it must remember about each item (`PerItem`: rows that
leave take it with them, new items bring theirs). Beam search, greedy decoding, sampling and language-model
generation all ask the same list; what it bans reduces to `Bans` (a few ids, an </s> mask by row, ids by row,
pieces after a constraint), which rows.c's best_next applies in one pass where no rule changes the scores.

The rules: <pad> and <s> never (`Bans.never`); `MinLength`; `Prefix` (forced tokens); `Avoid` (phrases never
output); `NoRepeatNgram`; `RepetitionPenalty`; the constraints' bans come from `constraints.Constraints`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli.device import never_chosen
from tfcli.specials import EOS_ID, PAD_ID


@dataclass(slots=True)
class Step:
    """What the rules read about the choice being made: `at`, the output position chosen (1-based; one for every
    row, or each row's (R,) tensor); `tokens` (R, W), each row's text so far, of which the first `length` columns
    are real (an int, or each row's (R,); None: `at` - 1, the search's own output, position p at column p - 1);
    `k`, rows (beams) per item, item-major."""

    at: int | torch.Tensor
    tokens: torch.Tensor | None = None
    k: int = 1
    length: int | torch.Tensor | None = None

    def seen(self) -> int | torch.Tensor:
        return self.at - 1 if self.length is None else self.length


@dataclass(slots=True)
class Bans:
    """What the rules ban, reduced to what every way of choosing applies: <pad> and <s> always, and </s> before
    `min_len` tokens (`at`: the output position being chosen, an int or each row's (R,) tensor); `ids` (R, X): ids
    each row may not take (<pad> where it bans nothing more); `pieces` ((R,) rows, (V,) tokens): rows that may take
    none of those tokens; `no_end` (R,): rows that may not end; `eos`: no row may end. Bans leave the model's
    distribution as it is: log-probs stay normalised over the whole vocabulary."""

    at: int | torch.Tensor
    min_len: int = 0
    ids: torch.Tensor | None = None
    pieces: tuple[torch.Tensor, torch.Tensor] | None = None
    no_end: torch.Tensor | None = None
    eos: bool = False
    ends: torch.Tensor | None = None  # the model's other end tokens (`OtherEnds`): banned wherever </s> is

    def never(self, device) -> torch.Tensor:
        """The ids no row may take: <pad>, <s>, and </s> (and the model's other `ends`) where `at` is one position
        for every row, before min_len."""
        no_end = self.eos or isinstance(self.at, int) and self.at <= self.min_len
        ids = never_chosen(device, no_end)
        return torch.cat([ids, self.ends]) if no_end and self.ends is not None else ids

    def no_eos(self) -> torch.Tensor | None:
        """(R,) the rows that may not take </s> besides `never`'s: before min_len by a row's own position, or
        `no_end`; None: none."""
        early = None if isinstance(self.at, int) or not self.min_len or self.eos else self.at <= self.min_len
        if self.no_end is None:
            return early
        return self.no_end if early is None else early | self.no_end

    def add_ids(self, ids: torch.Tensor | None) -> None:
        if ids is not None:
            self.ids = ids if self.ids is None else torch.cat([self.ids, ids], 1)

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Every ban on (R, V) log-probs or logits `x`, in place (the banned tokens at -inf)."""
        x.index_fill_(1, self.never(x.device), float("-inf"))
        eos = self.no_eos()
        if eos is not None:
            x[:, EOS_ID].masked_fill_(eos, float("-inf"))
        return self.apply_rows(x)

    def apply_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The bans of each row's own (`ids`, `pieces`) on `x`, in place."""
        if self.ids is not None:
            x.scatter_(1, self.ids, float("-inf"))
        if self.pieces is not None:
            x.masked_fill_(self.pieces[0][:, None] & self.pieces[1][None, :], float("-inf"))
        return x

    def on_columns(self, values: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Every ban on (R, C) `values` of the tokens `ids` (what rows.c's best_next leaves unwritten: the
        constraints' next tokens): -inf where banned."""
        banned = (ids[..., None] == self.never(ids.device)).any(-1)
        eos = self.no_eos()
        if eos is not None:
            banned |= (ids == EOS_ID) & eos[:, None]
        if self.ids is not None:
            banned |= (ids[:, :, None] == self.ids[:, None, :]).any(-1)
        if self.pieces is not None:
            banned |= self.pieces[0][:, None] & self.pieces[1][ids]
        return values.masked_fill(banned, float("-inf"))

    def blocks(self, size: int, n: int) -> list[Bans]:
        """The bans of `n` consecutive blocks of `size` rows."""
        def split(x):
            return x.split(size) if torch.is_tensor(x) else (x,) * n

        pieces = split(self.pieces[0]) if self.pieces is not None else (None,) * n
        return [Bans(at, self.min_len, ids, (p, self.pieces[1]) if p is not None else None, ne, self.eos, self.ends)
                for at, ids, p, ne in zip(split(self.at), split(self.ids), pieces, split(self.no_end))]


class Rule:
    """One rule of the list. Each hook does nothing unless the rule says otherwise."""

    penalises = False  # whether `penalise` changes the scores (then rows.c's one pass does not apply)

    def ban(self, step: Step, bans: Bans) -> None:
        """Add what this rule bans at `step` to `bans`."""

    def penalise(self, x: torch.Tensor, step: Step) -> None:
        """Change (R, V) scores `x` in place."""

    def forced(self, step: Step) -> torch.Tensor | None:
        """(R,) the token each row must take (-1: free), or None where no row is forced."""
        return None

    def keep(self, rows: torch.Tensor, beams: torch.Tensor) -> None:
        """Only the live items `rows` (their beams' rows: `beams`) go on."""

    def admit(self, rows: torch.Tensor, items: torch.Tensor, beams: torch.Tensor) -> None:
        """Items `items` take the places `rows` (their beams: `beams`)."""


class PerItem(Rule):
    """A rule with a tensor per input item (`every`, (B, ...)), of which `live` holds the rows decoded now."""

    def __init__(self, every: torch.Tensor, n: int | None = None):
        self.every = every
        self.live = every if n is None else every[:n].clone()

    def keep(self, rows, beams):
        self.live = self.live[rows]

    def admit(self, rows, items, beams):
        self.live[rows] = self.every[items]


class MinLength(Rule):
    """No </s> before `min_len` output tokens (position `at` <= min_len)."""

    def __init__(self, min_len: int):
        self.min_len = min_len

    def ban(self, step, bans):
        bans.min_len = self.min_len


class NoEnd(Rule):
    """Never </s> (lm-generate --ignore-eos)."""

    def ban(self, step, bans):
        bans.eos = True


class OtherEnds(Rule):
    """A model's end tokens besides </s> (Llama 3's <|eot_id|>, a chat model's end of turn): each ends a text as
    </s> does, so the rules that keep </s> back (`MinLength`, `NoEnd`, the constraints') keep them back too: for
    every row (`Bans.never`), or for the rows that may not end (their ids banned by row). The list's last rule."""

    def __init__(self, ids: list[int], device=None):
        self.ids = torch.tensor(ids, dtype=torch.long, device=device)

    def ban(self, step, bans):
        """(Last in the list: the rules before it say which rows may not end.)"""
        bans.ends = self.ids
        rows = bans.no_eos()
        if rows is not None:
            bans.add_ids(torch.where(rows[:, None], self.ids[None, :], PAD_ID))


class Prefix(PerItem):
    """(B, P) target ids each output starts with (-1 past a row's prefix): while a row is in its prefix it has one
    way on, the prefix's next token, scored as the model scores it."""

    def forced(self, step):
        prefix, at = self.live, step.at
        if isinstance(at, int):
            if at > prefix.size(1):
                return None
            forced = prefix[:, at - 1]
        else:
            at = at[:: step.k] if step.k > 1 else at
            forced = prefix.gather(1, (at - 1).clamp(max=prefix.size(1) - 1)[:, None]).squeeze(1)
            forced = forced.masked_fill(at > prefix.size(1), -1)
        return per_beam(forced, step.k)


class Avoid(PerItem):
    """(B, A, L) token phrases no output of the row holds (`avoid_tensor`): the token that would complete one is
    never chosen (a prefix still is)."""

    def ban(self, step, bans):
        bans.add_ids(avoided(self.live, step.tokens, step.at, step.k))


class NoRepeatNgram(Rule):
    """No n-gram twice in a row's text (fairseq's and transformers' no_repeat_ngram_size): the token that would
    complete an n-gram the text holds already is banned."""

    def __init__(self, n: int):
        self.n = n

    def ban(self, step, bans):
        bans.add_ids(repeated_ngrams(step.tokens, step.seen(), self.n))


class RepetitionPenalty(Rule):
    """CTRL's penalty (Keskar et al. 2019) on every token of the row's text: a positive score divided by
    `penalty`, a negative one multiplied. transformers' convention: on the logits where the search chooses by them
    (greedy, sampling), on the log-probs where it sums them (beam search, whose scores are then the penalised ones)."""

    penalises = True

    def __init__(self, penalty: float):
        self.penalty = penalty

    def penalise(self, x, step):
        seen = step.seen()
        if isinstance(seen, int):
            previous = step.tokens[:, :seen]
        else:  # (the columns past a row's text read as <pad>, banned anyway)
            cols = torch.arange(step.tokens.size(1), device=x.device)
            previous = step.tokens.masked_fill(cols >= seen[:, None], PAD_ID)
        if previous.size(1):
            scores = x.gather(1, previous)
            x.scatter_(1, previous, torch.where(scores > 0, scores / self.penalty, scores * self.penalty))


class RowRules:
    """The rules of a batch, in the order they apply: scores changed first (`penalise`), then the bans."""

    def __init__(self, rules: list[Rule]):
        self.rules = rules
        self.penalises = any(r.penalises for r in rules)

    def find(self, kind: type) -> Rule | None:
        return next((r for r in self.rules if isinstance(r, kind)), None)

    def bans(self, step: Step) -> Bans:
        bans = Bans(step.at)
        for rule in self.rules:
            rule.ban(step, bans)
        return bans

    def penalise(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        for rule in self.rules:
            rule.penalise(x, step)
        return x

    def apply(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """Every rule on (R, V) scores `x`, in place."""
        return self.bans(step).apply(self.penalise(x, step))

    def forced(self, step: Step) -> torch.Tensor | None:
        out = None
        for rule in self.rules:
            forced = rule.forced(step)
            if forced is not None:
                out = forced if out is None else torch.where(out >= 0, out, forced)
        return out

    def keep(self, rows: torch.Tensor, beams: torch.Tensor) -> None:
        for rule in self.rules:
            rule.keep(rows, beams)

    def admit(self, rows: torch.Tensor, items: torch.Tensor, beams: torch.Tensor) -> None:
        for rule in self.rules:
            rule.admit(rows, items, beams)


def per_beam(x: torch.Tensor, beams: int) -> torch.Tensor:
    """(n,) per sentence -> (n * beams,) per beam, sentence-major (x.repeat_interleave(beams), without the read of
    the device that repeat_interleave may make to size its output)."""
    return x[:, None].expand(-1, beams).reshape(-1) if beams > 1 else x


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


def repeated_ngrams(tokens: torch.Tensor, seen: int | torch.Tensor, n: int) -> torch.Tensor | None:
    """(R, M) for each row the tokens that would repeat an n-gram of its text (<pad> where none): the token after
    each earlier occurrence of the text's last n - 1 tokens. tokens (R, >= seen): each row's text in its first
    `seen` columns (an int, or each row's (R,)). None where no row's text holds an n-gram yet."""
    if isinstance(seen, int):
        if seen < n:
            return None
        text = tokens[:, :seen]
        windows = text.unfold(1, n, 1)  # (R, seen - n + 1, n)
        match = (windows[:, :, :-1] == text[:, seen - n + 1:][:, None, :]).all(-1)
        return torch.where(match, windows[:, :, -1], PAD_ID)
    W = tokens.size(1)
    if W < n:
        return None
    windows = tokens.unfold(1, n, 1)  # (R, W - n + 1, n)
    cols = (seen[:, None] - n + 1 + torch.arange(n - 1, device=tokens.device)).clamp(min=0)
    last = tokens.gather(1, cols)  # (R, n - 1)
    starts = torch.arange(windows.size(1), device=tokens.device)
    match = (windows[:, :, :-1] == last[:, None, :]).all(-1) & (starts[None, :] + n <= seen[:, None])
    return torch.where(match, windows[:, :, -1], PAD_ID)
