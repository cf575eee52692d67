"""Turning next-token logits into a choice: pure functions on (B, V) logits, composed by `next_token`.

Order (as in most toolkits): the rules (`rules.RowRules`: bans, a repetition penalty), then greedy argmax, or
temperature -> top-k -> top-p -> sample. A seeded `torch.Generator` makes sampling repeatable: same seed, same inputs, same text.

Translation and language-model generation sample each line (prompt) from random numbers of its own
(`line_uniforms`: a counter-based generator keyed by the seed, the line's index in the input and the step), so that
a line's sample is the same whatever batch, buffer, neighbours or number of processes it is decoded with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcli.errors import NotANumber
from tfcli.generate import native
from tfcli.generate.rules import RowRules, Step
from tfcli.torch_compat import is_compiling

NEG_INF = float("-inf")


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(z / T): T < 1 sharpens the distribution, T > 1 flattens it."""
    if temperature <= 0:
        raise ValueError("temperature must be positive (use greedy decoding for T -> 0)")
    return logits if temperature == 1.0 else logits / temperature  # (x / 1 is x, bit for bit)


def _on_rows_c(logits: torch.Tensor) -> bool:
    """Whether rows.c may be asked about these (R, V) logits (it says itself where its kernels do not run)."""
    return logits.device.type == "cpu" and logits.dim() == 2 and not is_compiling()


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits per row (and any tied with the k-th), set the rest to -inf. k <= 0: no filter.
    On the CPU the k-th value comes from rows.c's best_next where it runs (one pass over a row; the same value as
    torch's topk), except where a row holds NaN or +inf, which best_next refuses to choose from: torch's topk filters
    those as it filters any row, and what draws from them finds them (their softmax is NaN)."""
    if k <= 0 or k >= logits.size(-1):
        return logits
    best = None
    if _on_rows_c(logits):
        try:
            best = native.best_next(logits, native.NO_IDS, None, 0, k, normalise=False)
        except NotANumber:
            best = None
    kth = (best[0] if best is not None else logits.topk(k, dim=-1).values)[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter (Holtzman et al. 2020): keep the smallest set of most likely tokens whose probabilities sum
    to at least p; the most likely token always stays. p >= 1: no filter."""
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above each token
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def next_token(
    logits: torch.Tensor,
    rules: RowRules,
    step: Step,
    greedy: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """(B,) next ids from (B, V) logits, the `rules` applied first (<pad> and <s> are never chosen). Sampling draws
    from `uniforms` ((B,), one number a row: `line_uniforms`) where given, else from `generator`."""
    logits = rules.apply(logits.float().clone(), step)
    if greedy:
        return logits.argmax(-1)
    logits = apply_temperature(logits, temperature)
    if uniforms is not None:
        return draw(logits, top_k, top_p, uniforms)
    logits = top_p_filter(top_k_filter(logits, top_k), top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def draw(logits: torch.Tensor, top_k: int, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """(R,) ids drawn by the uniforms u ((R,) float64) from softmax(logits) after the top-k and top-p filters:
    `sample_by_uniforms`. On the CPU with 1 <= top_k <= 64 and no top-p filter, rows.c's draw_rows computes it in one
    pass a row: its float64 arithmetic is torch's, term by term in order, but for its own e^x and its sum taken in
    order (torch's in its vector lanes, by instruction set), so the two choose alike except where a uniform falls
    within about 1e-16 of the boundary between two tokens. A call where a row holds NaN or +inf or nothing finite (a
    model's numbers gone, which lm-generate and translate report) is drawn by torch's form, every row of it."""
    if top_p >= 1.0 and top_k >= 1 and _on_rows_c(logits):  # (k past best_next's 64: None, torch's form)
        ids = native.draw(logits.contiguous(), top_k, u)
        if ids is not None:
            return ids
    return sample_by_uniforms(top_p_filter(top_k_filter(logits, top_k), top_p), u)


_MASK64 = (1 << 64) - 1
# line_uniforms' key: seed, step and line index each times an odd constant, then SplitMix64's two multipliers
_SEED, _STEP, _LINE, _MIX1, _MIX2 = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03, 0xA0761D6478BD642F, 0xBF58476D1CE4E5B9,
                                     0x94D049BB133111EB)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finaliser (Steele et al. 2014) on int64 tensors, wrapping as uint64 would: a good 64-bit hash."""
    def shr(v: torch.Tensor, n: int) -> torch.Tensor:  # a logical shift: torch's >> on int64 keeps the sign
        return (v >> n) & ((1 << (64 - n)) - 1)

    x = x ^ shr(x, 30)
    x = x * _signed(_MIX1)
    x = x ^ shr(x, 27)
    x = x * _signed(_MIX2)
    return x ^ shr(x, 31)


def _signed(c: int) -> int:
    return c - (1 << 64) if c >= 1 << 63 else c


_HOST_ROWS = 16  # rows on the CPU up to which line_uniforms works in Python ints (a few ops instead of ~15 kernels)


def line_uniforms(seed: int, lines: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
    """(R,) float64 uniforms in [0, 1), one per row: a function of (seed, the row's line index, step) only. `step`:
    an int, or each row's ((R,) tensor; int64 arithmetic wraps as the int's does modulo 2^64, so both agree). A few
    rows on the CPU are computed in Python ints: the same numbers."""
    if lines.device.type == "cpu" and lines.numel() <= _HOST_ROWS and not is_compiling():
        steps = step.tolist() if isinstance(step, torch.Tensor) else [step] * lines.numel()
        return torch.tensor([_uniform(seed, line, s) for line, s in zip(lines.tolist(), steps)], dtype=torch.float64)
    if isinstance(step, int):
        key = _signed((seed * _SEED + step * _STEP) & _MASK64)
    else:
        key = step.to(torch.int64) * _signed(_STEP) + _signed(seed * _SEED & _MASK64)
    x = _splitmix64(lines.to(torch.int64) * _signed(_LINE) + key)
    return ((x >> 11) & ((1 << 53) - 1)).double() / float(1 << 53)


def _uniform(seed: int, line: int, step: int) -> float:
    """line_uniforms' number for one row, in Python ints reduced modulo 2^64."""
    x = (seed * _SEED + step * _STEP + line * _LINE) & _MASK64
    x ^= x >> 30
    x = x * _MIX1 & _MASK64
    x ^= x >> 27
    x = x * _MIX2 & _MASK64
    x ^= x >> 31
    return (x >> 11) / (1 << 53)


def sample_by_uniforms(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """(R,) ids drawn from softmax(logits) by inverse transform: the first token whose cumulative probability
    exceeds u times the total (row-wise, in float64, so that a row's draw depends on its own numbers only; u < 1, so
    some token does)."""
    probs = logits.double().softmax(-1)
    cdf = probs.cumsum(-1)
    ids = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    return ids.clamp_(max=logits.size(-1) - 1)


@dataclass(frozen=True)
class LineSampling:
    """How `tfcli translate --sampling` draws each next token: temperature, then top-k (0: all), then top-p (1: all),
    from line_uniforms(seed, line index, step)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 1

    def choose(self, logits: torch.Tensor, lines: torch.Tensor, step: int | torch.Tensor) -> torch.Tensor:
        """(R,) ids from (R, V) logits whose banned tokens are -inf already; `lines`: each row's line index, `step`:
        the output position (each row's, or one for all)."""
        return draw(apply_temperature(logits, self.temperature), self.top_k, self.top_p,
                    line_uniforms(self.seed, lines, step))
