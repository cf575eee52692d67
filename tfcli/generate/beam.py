"""Beam search for encoder-decoder models, batched: K beams a sentence on the incremental decoder, the batch's
rules (`rules.RowRules`) applied at every step, constraints by dynamic beam allocation where a row has them."""

from __future__ import annotations

import torch

from tfcli.generate.choose import best_next, write_at
from tfcli.generate.constraints import UNMET_PENALTY, Constraints, Progress
from tfcli.generate.rules import Step, per_beam
from tfcli.generate.source import Hypothesis, Rows, SearchOptions, SourceSearch, length_penalty, numbers, run, \
    to_lists
from tfcli.specials import BOS_ID, EOS_ID


class Beam(SourceSearch):
    """Beam search's state. Per input item: its K best finished hypotheses (score, the step it ended at: 0 for
    none, ended with </s>, tokens, per-token log-probs), how many ended in all. Per row (a live sentence): its length
    limit, the largest length penalty it can get, the nbest-th best finished score and whether K have ended (copies
    of fin_*, kept where the step reads them), whether it is done, and the summed log-probs of its k beams. Per beam:
    its last token, its tokens so far and their log-probs. Rows are sentence-major: row s * k + j is beam j of live
    sentence s. (Token buffers have one more column, which a done sentence running on past its limit in a
    fixed-shape decoder writes.)"""

    per_row = SourceSearch.per_row + ("lp_max", "floor", "full", "done", "scores")
    per_beam = ("tok", "tokens", "lps")

    def __init__(self, sm, decoder, sched, src, max_len, T, rules, options: SearchOptions):
        K, token_scores = options.beam_size, options.token_scores
        super().__init__(sm, decoder, sched, src, max_len, rules, K)
        self.con = rules.find(Constraints)
        B, n, device = src.size(0), sched.item.numel(), src.device
        self.K, self.nbest, self.len_penalty = K, options.nbest, options.len_penalty
        self.ends = options.end_ids(device) if options.ends else None  # (None: </s> alone ends a text)
        self.fin_score = torch.full((B, K), float("-inf"), device=device)
        self.fin_step = torch.zeros(B, K, dtype=torch.long, device=device)
        self.fin_eos = torch.zeros(B, K, dtype=torch.bool, device=device)
        self.fin_tok = torch.zeros(B, K, T + 1, dtype=torch.long, device=device)
        self.fin_lp = torch.zeros(B, K, T + 1, device=device) if token_scores else None
        self.fin_n = torch.zeros(B, dtype=torch.long, device=device)
        self.lp_max_all = length_penalty(max_len.float() + 1, self.len_penalty)
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

    def capturable(self) -> bool:
        return self.k == self.K

    def advance(self, at) -> None:
        """One step: every live beam expanded, the K best continuations kept, what ends merged into the finished
        hypotheses, and whether each sentence is done. After the first step with fixed shapes, everything is read
        from and written to the same tensors, so that it can be a CUDA graph."""
        K, k, n, len_penalty = self.K, self.k, self.scores.size(0), self.len_penalty
        device, token_scores = self.device, self.lps is not None
        at_row = at if isinstance(at, int) else per_beam(at, k)
        col = at if isinstance(at, int) else at[:, None]
        top_lp, cand_scores, cand_idx, cand_beam, cand_tok = self._candidates(at, at_row)
        if self.ends is not None:  # (the model's other ends end a text as </s> does: </s> from here, constraints too)
            cand_tok = torch.where(torch.isin(cand_tok, self.ends), EOS_ID, cand_tok)
        cand_row = cand_beam + (torch.arange(n, device=device) * k)[:, None]  # the beam's row in `tokens` / cache
        is_eos = cand_tok == EOS_ID
        if self.con is None:
            # the K best candidates that do not end the hypothesis continue (at most K of the 2K end in </s>)
            next_scores, pick = cand_scores.masked_fill(is_eos, float("-inf")).topk(K, dim=1)
        else:
            pick, missing, progress = self.con.pick(cand_scores, cand_tok, cand_beam, K, k)
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
            at_limit = next_scores / length_penalty(col, len_penalty)
            if self.con is not None:  # (</s> comes only once every constraint is met; the length limit, before)
                at_limit = at_limit - UNMET_PENALTY * missing
            new_floor, new_full = self._finish(
                at, ends, torch.cat([cand_scores[:, :K] / length_penalty(col, len_penalty), at_limit], 1),
                torch.cat([cand_row[:, :K], next_row], 1), torch.cat([cand_tok[:, :K], next_tok], 1),
                torch.cat([cand_lp[:, :K], next_lp], 1) if token_scores else None)
        else:
            new_floor, new_full = self.floor, self.full
        # done: at the max length, or settled (see beam_search)
        settled = new_full & (new_floor >= next_scores[:, 0] / length_penalty(at + 1, len_penalty))
        if len_penalty >= 0:  # (alpha < 0: lp falls as |Y| grows, no bound)
            settled |= new_floor >= next_scores[:, 0] / self.lp_max
        new_done = ~live | at_max | settled

        self.decoder.select(None, next_beam)
        self._move(at, next_row.flatten(), next_tok.flatten(), next_lp, dict(
            scores=next_scores, floor=new_floor, full=new_full, done=new_done))
        if self.con is not None:
            self._progress(progress, self.sched.fixed and k == K)
        self.k = K

    def _finish(self, at, ends, score, row, last, last_lp):
        """The step's hypotheses that end (`ends`, with their scores, rows, last tokens and log-probs) merged into
        the finished ones (`keep_finished`); each live sentence's nbest-th best finished score and whether K
        have ended."""
        item = self.sched.item
        keep_finished((self.fin_score, self.fin_step, self.fin_eos, self.fin_tok, self.fin_lp, self.fin_n), item,
                      ends, at, score, row, last, self.tokens, self.lps, last_lp)
        return self.fin_score[item, self.nbest - 1], self.fin_n[item] >= self.K

    def _move(self, at, rows, tok, lp, new: dict) -> None:
        """The continuing beams (`rows`: their parents' rows) take their tokens; the per-row values `new` are
        kept. After the first step with fixed shapes, in place: the same tensors at every step."""
        at_row = at if isinstance(at, int) else per_beam(at, self.K)
        tokens = self.tokens.index_select(0, rows)
        write_at(tokens, at_row, tok)
        lps = None
        if self.lps is not None:
            lps = self.lps.index_select(0, rows)
            write_at(lps, at_row, lp.flatten())
        new.update(tokens=tokens, lps=lps, tok=tok)
        in_place = self.sched.fixed and self.k == self.K
        for name, value in new.items():
            if in_place and value is not None:
                getattr(self, name).copy_(value)
            elif not in_place:
                setattr(self, name, value)

    def _progress(self, progress: Progress, in_place: bool) -> None:
        """The continuing beams' progress in their constraints (the picked candidates', (n, K, ...))."""
        new = Progress(progress.prog.flatten(0, 1), progress.open.flatten(0, 1), progress.fresh.flatten())
        if in_place:
            for old, value in zip((self.con.state.prog, self.con.state.open, self.con.state.fresh),
                                  (new.prog, new.open, new.fresh)):
                old.copy_(value)
        else:
            self.con.state = new

    def _candidates(self, at, at_row):
        """(each beam's proposals' log-probs (n, k * W), then the sentence's candidates sorted best first: summed
        log-probs, index into the proposals, beam, token; each (n, 2K), or with constraints all k * W of them).

        A candidate among its sentence's 2K best (beam, token) pairs is among its own beam's 2K best tokens, so
        each beam proposes its 2K best and the sentence picks 2K of those k * 2K: no beam score is added to, and no
        topk runs over, all k * V pairs. With constraints each beam proposes more (`Constraints.propose`), and all
        are kept: the continuing beams are chosen by `pick_by_banks`."""
        K, k, n = self.K, self.k, self.scores.size(0)
        step = Step(at_row, self.tokens, k)
        forced = self.rules.forced(step)
        if self.con is None:
            top_lp, top_tok = best_next(self.decoder, self.tok, self.rules, step, 2 * K, forced)
            W = 2 * K
        else:
            nxt = self.con.next_tokens(k)
            top_lp, top_tok, extra_lp = best_next(self.decoder, self.tok, self.rules, step, 2 * K, forced, extra=nxt)
            top_lp, top_tok = self.con.propose(top_lp, top_tok, nxt, extra_lp, forced)  # (n * k, W)
            W = 2 * K + nxt.size(1)
        top_lp = top_lp.view(n, k * W)
        cand = (self.scores.unsqueeze(2) + top_lp.view(n, k, W)).view(n, k * W)
        if self.con is None:
            cand_scores, cand_idx = cand.topk(2 * K, dim=1)
        else:
            cand_scores, cand_idx = cand.sort(dim=1, descending=True, stable=True)
        beam = torch.div(cand_idx, W, rounding_mode="floor")
        return top_lp, cand_scores, cand_idx, beam, top_tok.view(n, k * W).gather(1, cand_idx)

    def ended_rows(self) -> torch.Tensor:
        return self.done

    def admit(self, rows: torch.Tensor, items: torch.Tensor, placed=None) -> None:
        """K fresh beams a new sentence, all but the first at -inf."""
        super().admit(rows, items)
        self.lp_max[rows] = self.lp_max_all[items]
        self.floor[rows], self.full[rows], self.done[rows], self.scores[rows] = float("-inf"), False, False, \
            self.first_beam
        beams = self.beam_rows(rows)
        self.tokens[beams], self.tok[beams] = 0, BOS_ID
        if self.lps is not None:
            self.lps[beams] = 0

    def hypotheses(self) -> list[list[Hypothesis]]:
        out = []
        token_scores = self.fin_lp is not None
        host = to_lists(self.fin_score, self.fin_step, self.fin_eos, self.fin_tok,
                         *((self.fin_lp,) if token_scores else ()))
        for score, ended, eos, toks, *lp in zip(*host):
            numbers(score)
            out.append([Hypothesis(toks[j][: ended[j] - eos[j]], score[j], lp[0][j][: ended[j]] if lp else None,
                                   ended=bool(eos[j])) for j in range(self.nbest)])
        return out


@torch.inference_mode()
def beam_search(model, src: torch.Tensor, options: SearchOptions, rows: Rows = Rows(), slots: int | None = None,
                continuing: torch.Tensor | None = None) -> list[list[Hypothesis]]:
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
    K, V, nbest = options.beam_size, model.cfg.tgt_vocab_size, options.nbest
    if not 1 <= nbest <= K:
        raise ValueError(f"nbest must be between 1 and the beam size ({K}), got {nbest}")
    if 2 * K > V - 3:
        raise ValueError(f"beam size {K} is too large for a vocabulary of {V}")

    def make(sm, decoder, sched, max_len, T, rules):
        return Beam(sm, decoder, sched, src, max_len, T, rules, options)

    return run(make, model, src, options, rows, K, slots, continuing).hypotheses()


def keep_finished(fin, alive, ends, at, score, row, last, tokens, lps, last_lp) -> None:
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
    write_at(new_tok, at, last)
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
        write_at(new_lp, at, last_lp)
        fin_lp[alive] = torch.cat([fin_lp[alive], new_lp], 1).gather(1, pick)
    fin_n[alive] += ends.sum(1)
