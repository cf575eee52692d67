"""Generate the embedded demo corpus: English number words -> French number words.

The corpus is written by this script (with the `num2words` library), so the project may ship it. Translating
"three hundred and forty-two" into "trois cent quarante-deux" needs real sequence-to-sequence work: French counts
in twenties ("quatre-vingt-dix-sept" = 97), joins with "et" and hyphens, and drops "and" and commas.

    python data/make_numbers.py            # rewrites data/numbers/{train,valid,test}.{en,fr}
"""

from __future__ import annotations

import random
from pathlib import Path

from num2words import num2words

SPLITS = {"train": 12000, "valid": 500, "test": 500}
SEED = 20261123


def sample_numbers(n_total: int, rng: random.Random) -> list[int]:
    """Distinct numbers below one million, log-uniform so small and large numbers both appear."""
    seen: set[int] = set()
    out: list[int] = []
    while len(out) < n_total:
        digits = rng.randint(1, 6)
        x = rng.randrange(10 ** (digits - 1) if digits > 1 else 0, 10**digits)
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


def main() -> None:
    rng = random.Random(SEED)
    numbers = sample_numbers(sum(SPLITS.values()), rng)
    out_dir = Path(__file__).parent / "numbers"
    out_dir.mkdir(exist_ok=True)
    start = 0
    for split, n in SPLITS.items():
        chunk = numbers[start : start + n]
        start += n
        for lang in ("en", "fr"):
            lines = [num2words(x, lang=lang) for x in chunk]
            (out_dir / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
