"""Greedy decoding and sampling for encoder-decoder models: one row per sentence, on the incremental decoder."""

from __future__ import annotations

import torch

from tfcli.device import to_device
from tfcli.generate.choose import best_next, write_at
from tfcli.generate.rules import Bans, Step
from tfcli.generate.source import Hypothesis, Rows, SearchOptions, SourceSearch, length_penalty, numbers, run, \
    to_lists
from tfcli.specials import BOS_ID, EOS_ID


class Greedy(SourceSearch):
    """Greedy decoding (or sampling): per row its tokens, their log-probs, the step it ended at (0: not yet) and
    whether with </s>; per item the same, copied when its row ends. (Token buffers have one more column, which an
    ended fixed-shape row running on past its limit writes.)"""

    per_row = SourceSearch.per_row + ("tok", "tokens", "lps", "end", "eos")

    def __init__(self, sm, decoder, sched, src, max_len, T, rules, options: SearchOptions, lines):
        super().__init__(sm, decoder, sched, src, max_len, rules, 1)
        B, n, device = src.size(0), sched.item.numel(), src.device
        self.sampling, self.lines, self.scored = options.sampling, lines, options.scored
        self.ends = options.end_ids(device) if options.ends else None  # (None: </s> alone ends a text)
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
        step = Step(at, self.tokens)
        forced = self.rules.forced(step)
        if self.sampling is None and not self.rules.penalises:
            lp, nxt = best_next(self.decoder, self.tok, self.rules, step, 1, forced, self.scored)
        else:
            nxt, lp = self._choose(step, forced)
        if self.ends is not None:  # (the model's other ends end a text as </s> does: counted as </s> from here)
            nxt = torch.where(torch.isin(nxt, self.ends), EOS_ID, nxt)
        write_at(self.tokens, at, nxt)
        write_at(self.lps, at, lp)
        is_eos = nxt == EOS_ID
        ending = (self.end == 0) & (is_eos | (self.limit <= at))
        if self.sched.fixed:
            self.end.copy_(torch.where(ending, at, self.end))
            self.tok.copy_(nxt)
        else:
            self.end.masked_fill_(ending, at)
            self.tok = nxt
        self.eos.logical_or_(ending & is_eos)

    def _choose(self, step: Step, forced):
        """The next tokens chosen from the logits as the rules leave them (drawn with sampling, else the most
        likely: a repetition penalty is on the logits, as transformers' greedy search has it), each scored by the
        model's own log-probability."""
        logits = self.decoder.step(self.tok).float()
        bans = self.rules.bans(step)
        kept = Bans(step.at, bans.min_len, no_end=bans.no_end, eos=bans.eos)  # (what the score keeps)
        lprobs = kept.apply(logits.log_softmax(-1))
        if bans.ids is None and bans.pieces is None and not self.rules.penalises:
            allowed = lprobs
        else:  # (drawn from the distribution without the banned tokens)
            allowed = bans.apply_rows(self.rules.penalise(logits.clone(), step))
            allowed = kept.apply(allowed.log_softmax(-1) if self.sampling is not None else allowed)
        if self.sampling is not None:
            nxt = self.sampling.choose(allowed, self.lines[self.sched.item], step.at)
        else:
            nxt = allowed.argmax(-1)
        if forced is not None:
            nxt = torch.where(forced >= 0, forced, nxt)
        return nxt, lprobs.gather(1, nxt[:, None]).squeeze(1)  # (the model's log-probability, bans or not)

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
        for e, ended_eos, toks, scores in zip(*to_lists(self.out_end, self.out_eos, self.out_tok, self.out_lp)):
            lps = scores[:e]
            numbers(lps)
            scores = lps if self.scored else None
            out.append(Hypothesis(toks[: e - 1 if ended_eos else e],
                                  sum(scores) / length_penalty(e, len_penalty) if scores is not None else None, scores,
                                  ended=bool(ended_eos)))
        return out


@torch.inference_mode()
def greedy_decode(model, src: torch.Tensor, options: SearchOptions, rows: Rows = Rows(),
                  slots: int | None = None) -> list[Hypothesis]:
    """Greedy decoding on the incremental decoder; one `Hypothesis` per source row (scored like beam search, beam 1).
    With `options.sampling`, each next token is drawn instead (`rows.lines`: (B,) each row's index in the input,
    which with the seed keys its random numbers); the score is still the model's log-probability of the tokens
    chosen. `rows`: target prefixes (scored as the model scores them) and phrases to avoid (`beam_search` says
    how). Without `options.scored` the hypotheses' scores are None (as CTranslate2's without return_scores): the
    tokens are chosen on the logits, and the log-softmax's normaliser is not computed where that saves work (rows.c's
    best_next).

    Everything a step decides stays on the device (each row's tokens, log-probs, and the step it ended at); the
    host reads it every `options.check_every` steps (`schedule.read_every`), to stop, to let the finished rows
    leave, or with a fixed-shape decoder to give their places to the next sentences (`slots` rows at once; None:
    all). A row that ended between two reads runs on until the next one, unread: its output is what it was when it
    ended.

    src: (B, S) right-padded source ids, each ending in </s>.
    """
    lines = rows.lines if options.sampling is not None else None

    def make(sm, decoder, sched, max_len, T, rules):
        return Greedy(sm, decoder, sched, src, max_len, T, rules, options, lines)

    return run(make, model, src, options, rows, 1, slots).hypotheses(options.len_penalty)
