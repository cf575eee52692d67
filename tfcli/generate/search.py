"""Decoding for encoder-decoder models (and decoder-only ones given prompts: their source is the prompt, prefilled by
`source.run`): the one entry (`search`) to greedy decoding, sampling and beam search.

Each runs the encoder once per sentence, feeds the decoder one new token per beam and steps through
`step.IncrementalDecoder` (its key/value memory holds the rest, the cross-attention keys/values of the source are
computed once per sentence, and reordering beams copies no keys/values). Each is a `schedule.Search` under the one
`schedule.Schedule`: what a step decides stays on the device; the host reads it every `check_every` steps, to stop,
and to let finished sentences leave the batch (on the CPU, at once, so no compute is spent on them) or, with a
fixed-shape decoder (`step.StaticDecoder`, a GPU's), to give their places to the next sentences: continuous
batching, so that a batch stays full to the end of a file instead of shrinking to a tail of small steps. A
sentence's output does not depend on which place it takes or when. Neither ever emits <pad> or <s>.

The modules: `source.py` (options, rows, length rules, hypotheses, the shared bookkeeping), `rules.py` (the rule
list every search applies), `constraints.py`, `choose.py` (a step's best tokens), `greedy.py`, `beam.py`.
"""

from __future__ import annotations

import torch

from tfcli.generate.beam import beam_search
from tfcli.generate.greedy import greedy_decode
from tfcli.generate.source import Hypothesis, Rows, SearchOptions


def search(model, src: torch.Tensor, options: SearchOptions, rows: Rows = Rows(), slots: int | None = None,
           continuing=None) -> list[list[Hypothesis]]:
    """The one entry for decoding a batch of sources (B, S): per row its hypotheses, best first (one for greedy
    search and sampling, `options.nbest` for beam search). `continuing`: a function giving the (V,) tokens that
    may not follow a constraint's last token (`beam_search`), called only where constraints are given."""
    if options.mode(rows.constraints is not None) == "beam":
        words = continuing() if rows.constraints is not None and continuing is not None else None
        return beam_search(model, src, options, rows, slots, words)
    return [[h] for h in greedy_decode(model, src, options, rows, slots)]


def greedy_search(model, src: torch.Tensor, options: SearchOptions) -> list[list[int]]:
    """Greedy decoding, just the output ids (without </s>) per source row."""
    return [h.tokens for h in greedy_decode(model, src, options)]
