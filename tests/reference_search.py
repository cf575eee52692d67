"""A deliberately slow reference decoder, the oracle that tests check `tfcli/generate/search.py` against.

One sentence at a time, no KV cache, the full forward pass over the whole target prefix at every step, and the beam
kept as plain Python lists. It follows the same rules as `search.py` (length limits, banned tokens, which
candidates end, when a sentence is done), so the fast batched search must give the same hypotheses.
"""

from __future__ import annotations

import pytest
import torch

from tfcli.device import never_chosen
from tfcli.generate.source import Hypothesis, length_penalty, max_lengths
from tfcli.specials import BOS_ID, EOS_ID


def _log_probs(model, src: torch.Tensor, prefix: list[int], step: int, min_len: int) -> torch.Tensor:
    """log p(. | prefix, src) for the next position, recomputed from scratch."""
    tgt = torch.tensor([[BOS_ID] + prefix], device=src.device)
    lprobs = model(src, tgt)[0, -1].float().log_softmax(-1)
    lprobs[never_chosen(src.device, step <= min_len)] = float("-inf")
    return lprobs


@torch.inference_mode()
def reference_greedy(
    model, src_ids: list[int], max_len_a: float = 1.2, max_len_b: int = 10, min_len: int = 0, len_penalty: float = 0.0
) -> Hypothesis:
    """Greedy decoding of one source sentence (ids ending in </s>)."""
    src = torch.tensor([src_ids])
    max_len = int(max_lengths(model, src, max_len_a, max_len_b)[0])
    tokens: list[int] = []
    scores: list[float] = []
    for step in range(1, max_len + 1):
        lprobs = _log_probs(model, src, tokens, step, min_len)
        tok = int(lprobs.argmax())
        scores.append(float(lprobs[tok]))
        if tok == EOS_ID:
            break
        tokens.append(tok)
    return Hypothesis(tokens, sum(scores) / length_penalty(len(scores), len_penalty), scores)


@torch.inference_mode()
def reference_beam_search(
    model,
    src_ids: list[int],
    beam_size: int = 5,
    len_penalty: float = 0.6,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    nbest: int = 1,
    min_len: int = 0,
) -> list[Hypothesis]:
    """Beam search for one source sentence: every step scores all (beam, token) pairs and sorts them."""
    K = beam_size
    src = torch.tensor([src_ids])
    max_len = int(max_lengths(model, src, max_len_a, max_len_b)[0])
    beams = [([], torch.zeros(()), [])]  # (tokens, summed log-prob as float32, token log-probs)
    finished: list[Hypothesis] = []
    for step in range(1, max_len + 1):
        candidates = []  # (summed log-prob, beam index, token, token log-prob)
        for b, (tokens, score, _) in enumerate(beams):
            lprobs = _log_probs(model, src, tokens, step, min_len)
            totals = (score + lprobs).tolist()  # summed in float32, like the batched search
            lp = lprobs.tolist()
            candidates += [(totals[t], b, t, lp[t]) for t in range(len(lp))]
        candidates.sort(key=lambda c: -c[0])
        top = candidates[: 2 * K]
        lp_step = length_penalty(step, len_penalty)
        for total, b, t, lp in top[:K]:
            if t == EOS_ID:
                tokens, _, lps = beams[b]
                finished.append(Hypothesis(list(tokens), total / lp_step, lps + [lp]))
        beams = [
            (beams[b][0] + [t], torch.tensor(total), beams[b][2] + [lp]) for total, b, t, lp in top if t != EOS_ID
        ][:K]
        if step == max_len:
            finished += [Hypothesis(tokens, float(score) / lp_step, lps) for tokens, score, lps in beams]
            break
        if len(finished) >= K:  # done unless the best live beam, ending at the next step, would beat the nbest-th
            nth = sorted((h.score for h in finished), reverse=True)[nbest - 1]
            if nth >= float(beams[0][1]) / length_penalty(step + 1, len_penalty):
                break
    return sorted(finished, key=lambda h: -h.score)[:nbest]


def assert_same_nbest(hyps, ref, tol: float = 1e-4) -> None:
    """A search's n-best is the reference's: the same token sequences in the same order, scores and per-token
    scores within `tol` (float sums in another order)."""
    assert [h.tokens for h in hyps] == [h.tokens for h in ref]
    for h, r in zip(hyps, ref):
        assert h.score == pytest.approx(r.score, abs=tol)
        assert h.token_scores == pytest.approx(r.token_scores, abs=tol)


def _state(forms: list[tuple[int, list[int]]], prog: list[int]) -> tuple[set[int], int, int]:
    """(the constraints met, the bank, the tokens missing) of progress `prog` in `forms` [(constraint, phrase)]."""
    met = {g for (g, ph), p in zip(forms, prog) if p >= len(ph)}
    groups = {g for g, _ in forms}
    whole = sum(max(len(ph) for (h, ph), p in zip(forms, prog) if h == g and p >= len(ph)) for g in met)
    partial = max([p for (g, _), p in zip(forms, prog) if g not in met], default=0)
    missing = sum(min(len(ph) for h, ph in forms if h == g) for g in groups - met)
    return met, whole + partial, missing


def _advance(phrase: list[int], p: int, tok: int) -> int:
    """A phrase's progress after `tok` (search.advanced, for one phrase)."""
    if p >= len(phrase):
        return p
    if phrase[p] == tok:
        return p + 1
    return 1 if phrase[0] == tok else 0


@torch.inference_mode()
def reference_constrained_beam_search(
    model, src_ids: list[int], constraints: list, beam_size: int = 4, len_penalty: float = 0.6,
    max_len_a: float = 1.2, max_len_b: int = 10, nbest: int = 1, min_len: int = 0,
) -> list[Hypothesis]:
    """Beam search with constraints (each a phrase, or a list of alternative phrases, every hypothesis must
    output), by dynamic beam allocation, for one source: each beam proposes its 2K best tokens and the next token
    of each form of each constraint it has not met (</s> only once all are met); the candidates that end are those
    of the first K (by summed log-prob) that end in </s>; the K that continue are taken from the others bank by
    bank (a bank: the tokens of the constraints a candidate has met, and its longest partial match of another),
    each bank's best in turn, the fullest bank first; at the length limit a hypothesis scores UNMET_PENALTY less
    per token of the constraints it lacks (each by its shortest form)."""
    from tfcli.generate.constraints import UNMET_PENALTY, constraint_tensor

    K = beam_size
    src = torch.tensor([src_ids])
    forms = [(g, list(ph)) for g, con in enumerate(constraints)
             for ph in (con if con and not isinstance(con[0], int) else [con])]
    # a constraint given again waits for the one before it: it moves on only once that one is met
    waits = {g: max((h for h in range(g) if constraints[h] == constraints[g]), default=None)
             for g in range(len(constraints))}
    max_len = int(max_lengths(model, src, max_len_a, max_len_b, None, constraint_tensor([constraints], "cpu"))[0])
    beams = [([], torch.zeros(()), [], [0] * len(forms))]  # (tokens, summed log-prob, token log-probs, progress)
    finished: list[Hypothesis] = []
    for step in range(1, max_len + 1):
        candidates = []  # (summed log-prob, beam, token, token log-prob, progress after it)
        for b, (tokens, score, _, prog) in enumerate(beams):
            lprobs = _log_probs(model, src, tokens, step, min_len)
            met = _state(forms, prog)[0]
            if len(met) < len(constraints):
                lprobs[EOS_ID] = float("-inf")
            top = lprobs.topk(2 * K).indices.tolist()
            proposed = list(top)
            ready = {g: waits[g] is None or waits[g] in met for g in waits}
            for (g, ph), p in zip(forms, prog):
                if g not in met and ready[g] and ph[p] not in proposed:
                    proposed.append(ph[p])
            totals = (score + lprobs).tolist()
            candidates += [(totals[t], b, t, float(lprobs[t]),
                            [_advance(ph, p, t) if ready[g] else 0 for (g, ph), p in zip(forms, prog)])
                           for t in proposed if totals[t] > float("-inf")]
        candidates.sort(key=lambda c: -c[0])
        lp_step = length_penalty(step, len_penalty)
        for total_lp, b, t, lp, _ in candidates[:K]:
            if t == EOS_ID:
                tokens, _, lps, _ = beams[b]
                finished.append(Hypothesis(list(tokens), total_lp / lp_step, lps + [lp]))
        going = [c for c in candidates if c[2] != EOS_ID]
        rank, keys = {}, []
        for i, c in enumerate(going):
            bank = _state(forms, c[4])[1]
            keys.append(((rank.get(bank, 0), -bank), i))
            rank[bank] = rank.get(bank, 0) + 1
        chosen = sorted(i for _, i in sorted(keys)[:K])
        beams = [(beams[b][0] + [t], torch.tensor(s), beams[b][2] + [lp], prog)
                 for s, b, t, lp, prog in (going[i] for i in chosen)]
        if step == max_len:
            finished += [Hypothesis(tokens, float(score) / lp_step - UNMET_PENALTY * _state(forms, prog)[2], lps)
                         for tokens, score, lps, prog in beams]
            break
        if len(finished) >= K:
            nth = sorted((h.score for h in finished), reverse=True)[nbest - 1]
            if nth >= float(beams[0][1]) / length_penalty(step + 1, len_penalty):
                break
    return sorted(finished, key=lambda h: -h.score)[:nbest]
