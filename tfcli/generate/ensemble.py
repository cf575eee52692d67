"""Several translation models decoding as one (`tfcli translate -m A -m B`, `tfcli.load([a, b])`).

Each step, the next-token distribution is the average of the models' probabilities (fairseq's ensemble; Marian
averages log-probabilities instead):
    log p(y | y_<t, x) = log (1/N) sum_i p_i(y | y_<t, x)
so beam search, greedy search, sampling, n-best scores and prefixes all work on the ensemble as on one model. The
models must share their tokenizers (the same ids mean the same words); each keeps its own encoder output and
key/value memory. Alignments come from the first model's attention.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from tfcli.generate.step import StepModel


class EnsembleStepModel:
    """The StepModel interface (`cfg`, `encode`, `start`, `free_memory`, `model`, `static`) over several StepModels."""

    def __init__(self, members: list[StepModel]):
        self.members = members
        self.model = members[0].model
        self.half = members[0].half
        self.static = all(m.static for m in members)  # fixed-shape decoders (tfcli.generate.step.StaticDecoder)
        # the shortest context any member allows
        self.cfg = dataclasses.replace(members[0].cfg, max_len=min(m.cfg.max_len for m in members))

    def encode(self, src: torch.Tensor) -> tuple[list, None]:
        return [m.encode(src) for m in self.members], None

    def start(self, n: int, beam_size: int, max_steps: int, memory=None, mem_mask=None) -> "EnsembleDecoder":
        return EnsembleDecoder([m.start(n, beam_size, max_steps, mem, mask)
                                for m, (mem, mask) in zip(self.members, memory)])

    def free_memory(self) -> None:
        for m in self.members:
            m.free_memory()


class EnsembleDecoder:
    """The `schedule.Decoder` interface (`step`, `select`, `release`, and `admit` over fixed-shape decoders) over
    one decoder per model."""

    def __init__(self, decoders: list):
        self.decoders = decoders
        self.log_n = math.log(len(decoders))
        self.fixed = all(d.fixed for d in decoders)  # fixed shapes: new sentences can take finished ones' places

    def step(self, tok: torch.Tensor) -> torch.Tensor:
        """The log of the averaged probabilities, (rows, V): already normalised, so a log_softmax leaves it as is."""
        out = None
        for d in self.decoders:  # log(p_1 + p_2 + ...), summed pairwise in place: no (N, rows, V) stack
            lp = d.step(tok).float().log_softmax(-1)
            out = lp if out is None else torch.logaddexp(out, lp, out=out)
        return out.sub_(self.log_n)

    def select(self, keep: torch.Tensor | None, parent: torch.Tensor | None = None) -> None:
        for d in self.decoders:
            d.select(keep, parent)

    def admit(self, places: torch.Tensor, memory: list, mem_mask=None) -> None:
        """`memory`: each model's (encoder output, source mask), as `EnsembleStepModel.encode` gives them."""
        for d, (mem, mask) in zip(self.decoders, memory):
            d.admit(places, mem, mask)

    def release(self) -> None:
        for d in self.decoders:
            d.release()
