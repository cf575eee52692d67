"""A line's sentences, for translating documents sentence by sentence (`tfcli translate --split-sentences`).

The splitter is sentencex (Wikimedia's, maintained; rules and abbreviation lists for some 250 languages, a fallback
chain for the others, generic terminators where a language is not given). On Multi30k paragraphs in German,
English and French it finds the sentences as pysbd and sentence-splitter do (within one paragraph in 200), at 50 to
200 times their speed, and starts quickest (benchmarks/results/sentence_split.md).
"""

from __future__ import annotations

from typing import Callable

from tfcli.data.languages import two_letter_code
from tfcli.errors import ConfigError

GENERIC = "en"  # rules used when the input's language is not given: terminators, English abbreviations


def splitter(lang: str | None) -> Callable[[str], list[str]]:
    """text -> its sentences, stripped, in order (none empty; a text without a boundary is one sentence)."""
    try:
        from sentencex import segment
    except ImportError:
        raise ConfigError("--split-sentences needs the sentencex package: pip install sentencex (or "
                          "--split-sentences never)") from None
    code = two_letter_code(lang or GENERIC)  # fra_Latn, pt-BR -> fr, pt

    def split(text: str) -> list[str]:
        out = [s.strip() for s in segment(code, text)]
        return [s for s in out if s] or [text.strip()]

    return split
