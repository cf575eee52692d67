"""What every search of a batch of sources shares: its options (`SearchOptions`, made from the run's config), what
each row brings (`Rows`, which builds the batch's rule list), the length rules, the hypotheses it returns, and the
decoder's rows (`SourceSearch`: a `schedule.Search`'s bookkeeping, run by `run`).

Length rules, shared with the slow reference in `tests/reference_search.py`:
  - a sentence may have at most max_len = a * src_len + b output tokens (src_len counts </s>; a decoder-only
    model's, its source's tokens in the prompt, plus one; capped at the model's max_len); a hypothesis that
    reaches it stops there, without </s>;
  - </s> is forbidden before `min_len` tokens (benchmarks set min_len = max_len to force equal work).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli.data.batching import pad
from tfcli.errors import NotANumber
from tfcli.generate import native
from tfcli.generate.constraints import LENGTH, Constraints, constraint_tensor
from tfcli.generate.rules import (Avoid, MinLength, NoRepeatNgram, OtherEnds, Prefix, RepetitionPenalty, RowRules,
                                  avoid_tensor)
from tfcli.generate.sampling import LineSampling
from tfcli.generate.schedule import Schedule, read_every, search_graph
from tfcli.generate.step import step_model
from tfcli.specials import EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without </s>
    score: float | None  # sum of token log-probs / lp(|Y|); None from a greedy search told not to score
    token_scores: list[float] | None = None  # log p of each token, then of </s> when it ended with one
    alignment: list[tuple[int, int]] | None = None  # (source word, target word) pairs (translate --alignment)
    parts: list[int] | None = None  # a line translated sentence by sentence: each sentence's number of tokens
    ended: bool = True  # False: stopped by the length limit, before the model ended it


@dataclass(frozen=True)
class SearchOptions:
    """How the sources of a batch are searched, set once for a run from its config (`from_config`: the defaults are
    the config's): greedy (a beam of 1), beam search, or with `sampling` one draw a row. `scored`: compute the
    hypotheses' scores (greedy search without them chooses on the logits and skips the normaliser);
    `token_scores`: keep each token's log-prob (beam search; greedy keeps them whenever it scores)."""

    beam_size: int
    len_penalty: float
    max_len_a: float
    max_len_b: int
    min_len: int
    nbest: int
    scored: bool
    token_scores: bool
    check_every: int
    sampling: LineSampling | None
    no_repeat_ngram_size: int
    repetition_penalty: float
    ends: tuple[int, ...]  # the model's end tokens besides </s> (an imported chat model's end of turn)

    @classmethod
    def from_config(cls, cfg, ends: tuple[int, ...] = ()) -> SearchOptions:
        """From a TranslateConfig, and the model's other `ends` (its checkpoint's)."""
        sampling = LineSampling(cfg.temperature, cfg.top_k, cfg.top_p, cfg.seed) if cfg.sampling else None
        return cls(cfg.beam_size, cfg.len_penalty, cfg.max_len_a, cfg.max_len_b, cfg.min_len, cfg.nbest or 1,
                   scored=cfg.tabular or cfg.sampling, token_scores=cfg.scores, check_every=cfg.check_every,
                   sampling=sampling, no_repeat_ngram_size=cfg.no_repeat_ngram_size,
                   repetition_penalty=cfg.repetition_penalty, ends=tuple(ends))

    def end_ids(self, device) -> torch.Tensor:
        """(E,) every id that ends an output: </s>, then the model's other ends."""
        return torch.tensor([EOS_ID, *self.ends], device=device)

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
    (sampling: its index in the input), `sources` (B,) a decoder-only model's source lengths in tokens (its
    source is in a prompt: the length rule counts the source's tokens, not the prompt's)."""

    prefix: torch.Tensor | None = None
    avoid: torch.Tensor | None = None
    constraints: torch.Tensor | None = None
    lines: torch.Tensor | None = None
    sources: torch.Tensor | None = None

    @classmethod
    def build(cls, device, max_len: int, prefixes: list[list[int]] | None = None,
              avoid: list[list[list[int]]] | None = None, constraints: list[list] | None = None,
              lines: list[int] | None = None, sources: list[int] | None = None) -> Rows:
        """From per-row lists (token ids; [] for none): a prefix is cut to max_len - 1 tokens."""
        prefix = None
        if prefixes is not None and any(prefixes):
            prefix = pad([p[: max_len - 1] for p in prefixes], pad_id=-1).to(device)
        return cls(prefix, avoid_tensor(avoid, device) if avoid is not None else None,
                   constraint_tensor(constraints, device) if constraints is not None else None,
                   torch.tensor(lines, device=device) if lines is not None else None,
                   torch.tensor(sources, device=device) if sources is not None else None)

    def rules(self, options: SearchOptions, n: int, continuing: torch.Tensor | None = None, device=None) -> RowRules:
        """The batch's rule list, for its first `n` rows decoded at once: the options' rules, then the rows' own."""
        rules = [RepetitionPenalty(options.repetition_penalty)] if options.repetition_penalty != 1.0 else []
        rules += [MinLength(options.min_len)]
        if self.prefix is not None:
            rules.append(Prefix(self.prefix, n))
        if self.avoid is not None:
            rules.append(Avoid(self.avoid, n))
        if options.no_repeat_ngram_size:
            rules.append(NoRepeatNgram(options.no_repeat_ngram_size))
        if self.constraints is not None:
            rules.append(Constraints(self.constraints, n, continuing))
        if options.ends:  # (last: the rules before it say which rows may not end)
            rules.append(OtherEnds(list(options.ends), device))
        return RowRules(rules)


def length_penalty(length: int, alpha: float) -> float:
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting </s>. alpha = 0 ranks by raw log-prob."""
    return ((5 + length) / 6) ** alpha


def max_lengths(model, src: torch.Tensor, max_len_a: float, max_len_b: int, prefix: torch.Tensor | None = None,
                constraints: torch.Tensor | None = None, sources: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) longest allowed output per sentence: a * src_len + b, at least 1 (and one more than its target prefix),
    and room for its constraints' tokens on top; at most the model's max_len. `sources`: the source lengths where
    `src` holds prompts (src_len: each one's, plus one as for </s>)."""
    src_len = (src != PAD_ID).sum(1) if sources is None else sources + 1
    longest = (src_len.float() * max_len_a + max_len_b).long().clamp(min=1)
    if prefix is not None:
        longest = torch.maximum(longest, (prefix >= 0).sum(1) + 1)
    if constraints is not None:  # (the words they add are not in the source's length; every form counted)
        longest = longest + constraints[..., LENGTH].sum(1)
    return longest.clamp(max=model.cfg.max_len)


class SourceSearch:
    """What greedy and beam search share as `schedule.Search`es: the source of each item, its length limit, the
    batch's rules, and the decoder's rows of `beams` beams each. Subclasses keep their per-row tensors in `per_row`
    (one row per item) and `per_beam` (`beams` rows per item): rows that leave take those with them, as the rules
    take theirs."""

    per_row: tuple[str, ...] = ("limit",)
    per_beam: tuple[str, ...] = ()

    def __init__(self, sm, decoder, sched: Schedule, src, max_len, rules: RowRules, beams: int):
        n = sched.item.numel()
        self.sm, self.decoder, self.sched, self.src, self.max_len = sm, decoder, sched, src, max_len
        self.rules, self.beams, self.device = rules, beams, src.device
        self.limit = max_len[:n].clone()  # each row's length limit

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
        """Encode the items' sources into the decoder's `rows`, and give the rules theirs; their own state is the
        subclass's to reset."""
        self.decoder.admit(rows, *self.sm.encode(self.src[items]))
        self.limit[rows] = self.max_len[items]
        self.rules.admit(rows, items, self.beam_rows(rows))

    def keep(self, rows: torch.Tensor) -> None:
        beams = self.beam_rows(rows)
        for names, index in ((self.per_row, rows), (self.per_beam, beams)):
            for name in names:
                x = getattr(self, name)
                if x is not None:
                    setattr(self, name, x[index])
        self.rules.keep(rows, beams)
        self.decoder.select(rows)

    def beam_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The beam rows of decoder rows `rows`."""
        K = self.beams
        return (rows[:, None] * K + torch.arange(K, device=rows.device)).flatten() if K > 1 else rows


def run(make, model, src: torch.Tensor, options: SearchOptions, rows: Rows, beams: int, slots: int | None,
        continuing: torch.Tensor | None = None):
    """Set up the decoder, the schedule and the rules for a batch, build the search (`make(sm, decoder, schedule,
    max_len, T, rules)`), run it to the end, and return it. `slots`: rows decoded at once (None: the whole batch);
    fewer rows than sentences need a decoder that takes new sentences into finished ones' places
    (`StaticDecoder`)."""
    o = options
    every = read_every(o.check_every, src.device)
    max_len = max_lengths(model, src, o.max_len_a, o.max_len_b, rows.prefix, rows.constraints, rows.sources)
    sm = step_model(model)
    if sm.cfg.kind == "lm":  # a decoder-only model: the source is its prompt, the output what follows it
        return _run_prompted(make, sm, src, max_len, o, rows, beams, continuing, every)
    T = _longest(sm, src, max_len.tolist(), o.max_len_a, o.max_len_b, rows.prefix)  # (one read)
    n = src.size(0) if slots is None else max(1, min(slots, src.size(0)))
    if n < src.size(0) and not sm.static:
        raise ValueError("decoding in fewer slots than sentences needs the fixed-shape decoder "
                         "(StepModel(static=True))")
    decoder = sm.start(n, beams, T, *sm.encode(src[:n] if n < src.size(0) else src))
    sched = Schedule(src.size(0), n, decoder.fixed, every, T, src.device)
    search = make(sm, decoder, sched, max_len, T, rows.rules(o, n, continuing, src.device))
    sched.run(search, search_graph(decoder))
    decoder.release()
    return search


def _run_prompted(make, sm, src: torch.Tensor, max_len: torch.Tensor, o: SearchOptions, rows: Rows, beams: int,
                  continuing, every: int):
    """`run` for a decoder-only model: each row of `src` (right-padded) is a prompt, prefilled left-padded into a
    decoder holding it and the longest output; the search's first step reads the logits after the prompt."""
    if sm.static:
        raise ValueError("a prompted search runs on the shrinking decoder (a StepModel without static shapes)")
    lengths = (src != PAD_ID).sum(1)
    P = int(lengths.max())
    max_len = torch.minimum(max_len, sm.cfg.max_len - lengths).clamp(min=1)  # (prompt and output in the context)
    T = int(max_len.max())
    at = torch.arange(P, device=src.device)
    valid = at[None, :] >= (P - lengths)[:, None]  # (right-padded prompts, moved right: left-padded)
    ids = src.gather(1, (at[None, :] - (P - lengths)[:, None]).clamp(min=0)).masked_fill(~valid, PAD_ID)
    decoder = sm.start(src.size(0), beams, P + T)
    decoder = _Prompted(decoder, decoder.prefill(ids, valid if not bool(valid.all()) else None))
    sched = Schedule(src.size(0), src.size(0), False, every, T, src.device)
    search = make(sm, decoder, sched, max_len, T, rows.rules(o, src.size(0), continuing, src.device))
    sched.run(search, None)
    decoder.release()
    return search


class _Prompted:
    """A decoder whose prompts were prefilled: its first `step` gives the logits after them (the token the search
    feeds there, <s>, is not part of a decoder-only model's text); every other call is the decoder's."""

    def __init__(self, decoder, logits: torch.Tensor):
        self.decoder, self.first = decoder, logits

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        if self.first is not None:
            logits, self.first = self.first, None
            return logits
        return self.decoder.step(tok)

    def __getattr__(self, name):
        return getattr(self.decoder, name)


def _longest(sm, src: torch.Tensor, limits: list[int], max_len_a: float, max_len_b: int,
             prefix: torch.Tensor | None) -> int:
    """The positions a batch's decoder holds: its longest length limit, or with fixed shapes the limit of a
    sentence as wide as the batch's source tensor (so that every batch of one source width, prefix width and
    length rule has one shape: one graph)."""
    if not sm.static:
        return max(limits)
    P = prefix.size(1) + 1 if prefix is not None else 1
    return max(max(limits), min(sm.cfg.max_len, max(int(src.size(1) * max_len_a + max_len_b), P)))


def numbers(values: list[float]) -> None:
    """NotANumber where a hypothesis' scores hold NaN: what a model whose weights or activations hold NaN or inf
    gives (rows.c's best_next says so at once; torch's search carries the NaN into the scores)."""
    if any(v != v for v in values):
        raise NotANumber(native.NAN_MESSAGE)


def to_lists(*tensors: torch.Tensor, one_copy: bool | None = None) -> list[list]:
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
