"""Choose the length penalty on valid with as few beam-search passes as the full grid's choice needs.

    python3 recipes/len_penalty.py next SCORES.tsv   # the penalty to score next, or nothing: the search is done
    python3 recipes/len_penalty.py best SCORES.tsv   # the best penalty scored (ties: the lowest)

SCORES.tsv: one "penalty<TAB>valid sacreBLEU" line per pass, as recipes/multi30k.sh writes it. Start from 1.0, 1.4
and 1.8; while the best scored is the lowest or the highest scored, the next one out on its side (steps of 0.4,
within 0.2-3.0) is scored. Valid BLEU rises to one peak over the penalty and falls away from it (every 0.6-2.6 grid
in benchmarks/results/recipes.json: the walk picks the grid's choice each time), so the walk stops after 4-5 passes
where the grid took 6, and it is not limited to the grid's ends.
"""

from __future__ import annotations

import sys
from pathlib import Path

START = (1.0, 1.4, 1.8)
STEP = 0.4
LOWEST, HIGHEST = 0.2, 3.0


def read_scores(path: Path) -> dict[float, float]:
    return {float(a): float(b) for a, b in (line.split("\t") for line in path.read_text().splitlines() if line)}


def best(scores: dict[float, float]) -> float:
    return max(sorted(scores), key=scores.__getitem__)  # max keeps the first of equals: the lowest penalty


def next_penalty(scores: dict[float, float]) -> float | None:
    """The penalty to score next, or None when the best scored has a lower score (or the range's end) on each side."""
    todo = [a for a in START if a not in scores]
    if todo:
        return todo[0]
    b, lo, hi = best(scores), min(scores), max(scores)
    if b == lo and round(lo - STEP, 1) >= LOWEST:
        return round(lo - STEP, 1)
    if b == hi and round(hi + STEP, 1) <= HIGHEST:
        return round(hi + STEP, 1)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("next", "best"):
        print("usage: len_penalty.py next|best SCORES.tsv", file=sys.stderr)
        return 2
    path = Path(argv[1])
    scores = read_scores(path) if path.exists() else {}
    if argv[0] == "best":
        if not scores:
            print(f"error: {path} holds no scores", file=sys.stderr)
            return 1
        print(f"{best(scores):g}")
    else:
        nxt = next_penalty(scores)
        if nxt is not None:
            print(f"{nxt:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
