"""What `tfcli eval` is configured by, without torch or sacrebleu: scoring text (sacrebleu's options) and perplexity."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tfcli.errors import ConfigError

METRIC_NAMES = ("bleu", "chrf", "ter")


@dataclass
class MetricsConfig:
    """How hypotheses are scored; field names follow sacrebleu's options."""

    metrics: list[str] = field(default_factory=lambda: ["bleu", "chrf", "ter"])
    tokenize: str = "13a"  # BLEU's tokenizer (chrF works on characters, TER uses TERCOM's own)
    lowercase: bool = False  # case-insensitive BLEU and chrF (TER is case-insensitive unless ter_case_sensitive)
    ter_case_sensitive: bool = False
    chrf_word_order: int = 0  # 2 = chrF++ (Popović 2017)
    chrf_char_order: int = 6
    chrf_beta: int = 2
    paired: Literal["none", "bs", "ar"] = "none"  # significance test against the baseline (the first system)
    n_samples: int = 0  # resamples (bs) or trials (ar); 0 = sacrebleu's defaults, 1000 and 10000

    def validate(self) -> None:
        for m in self.metrics:
            if m not in METRIC_NAMES:
                raise ConfigError(f"--metrics: unknown metric '{m}'; choose from {', '.join(METRIC_NAMES)}")
        if not self.metrics:
            raise ConfigError("--metrics: name at least one metric")
        from sacrebleu.metrics import BLEU  # sacrebleu's own list: whatever its version offers

        TOKENIZERS = tuple(BLEU.TOKENIZERS)
        if self.tokenize not in TOKENIZERS:
            raise ConfigError(f"--tokenize: unknown tokenizer '{self.tokenize}'; choose from {', '.join(TOKENIZERS)}")
        if self.chrf_word_order < 0 or self.chrf_char_order < 1 or self.chrf_beta < 0:
            raise ConfigError("chrF: word order must be >= 0, character order >= 1 and beta >= 0")
        if self.n_samples < 0:
            raise ConfigError("--n-samples must be >= 0")


@dataclass
class PerplexityConfig:
    split: str = "test"
    max_tokens: int = 4096  # tokens per batch (bounds memory: the logits are max_tokens x vocab floats)
    window: int | None = None  # LM context per window; default: the model's max_len
    stride: int | None = None  # LM tokens newly scored per window; default: the window (no overlap)
    words: int | None = None  # word-level token count for word perplexity; default: from {split}.tgt.txt
    device: str = "auto"  # auto = cuda if available, else cpu

    def validate(self) -> None:
        if self.max_tokens < 1:
            raise ConfigError("--max-tokens must be positive")
        if self.window is not None and self.window < 1:
            raise ConfigError("--window must be positive")
        if self.stride is not None and self.stride < 1:
            raise ConfigError("--stride must be positive")
        if self.words is not None and self.words < 1:
            raise ConfigError("--words must be positive")
