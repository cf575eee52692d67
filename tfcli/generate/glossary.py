"""A glossary applied to every line (`tfcli translate --glossary FILE`): each source term found in a line becomes
one of its constraints, its target term (or one of its alternatives) required in the translation. Torch-free.

A glossary file is TSV (`.tsv`, `.txt`, anything but `.csv`) or CSV (`.csv`): source term, target term, one pair a
line; alternatives on the target side as `a ||| b` (any one of them will do); blank lines and lines starting with
`#` are skipped. Matching, in `Glossary.find`:

- whole words: a line's words are its runs of letters and digits, each other character a word of its own, and each
  Chinese or Japanese character a word of its own (those scripts put no spaces between words, so a term there
  matches wherever its characters stand);
- case-insensitive, unless the term has a capital inside a word (`iPhone`, `NASA`, `GmbH`): then as written;
- inflected forms by their lemmas (simplemma, where it knows the line's language: `Hunde` matches the term `Hund`);
- the longest match wins: overlapping matches are resolved once, longest first, then leftmost; a term found twice
  is one constraint (the search holds a phrase, not a count of it).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from tfcli.errors import InputError, TfcliError
from tfcli.request import forms

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+|[^\w\s]")


def words(text: str) -> list[tuple[str, int, int]]:
    """`text`'s words with their character spans (start, end), as the glossary matches them."""
    return [(m.group(), m.start(), m.end()) for m in _WORD.finditer(text)]


def _cased(term: str) -> bool:
    """A term with a capital after a word's first letter is matched as written."""
    return any(any(c.isupper() for c in w[1:]) for w, _, _ in words(term))


@dataclass(frozen=True)
class Term:
    """A glossary entry: its source term, its target forms (one of which the translation must hold), and where
    it was given (file:line)."""

    source: str
    targets: tuple[str, ...]
    where: str

    @property
    def constraint(self) -> str | tuple[str, ...]:
        """As a Request's constraint: a phrase, or a set of alternatives."""
        return self.targets[0] if len(self.targets) == 1 else self.targets


@dataclass(frozen=True)
class Match:
    """A term found in a line: the term, and the character span of the line it covers."""

    term: Term
    start: int
    end: int


class Glossary:
    """Terms to apply to every line. `terms`: in the order given; a later entry for the same source term replaces
    an earlier one."""

    def __init__(self, terms: list[Term]):
        self.terms = list({(t.source if _cased(t.source) else t.source.casefold()): t for t in terms}.values())
        self._keys: dict[tuple, Term] = {}  # the words of each term, normalised as a line's are
        for t in self.terms:
            self._keys[self._key([w for w, _, _ in words(t.source)], _cased(t.source))] = t
        self._longest = max((len(k) - 1 for k in self._keys), default=0)
        self._lemma_keys: dict[str | None, dict[tuple, Term]] = {}  # per language: the terms' lemmas
        self._lemmatisers: dict[str | None, object] = {}

    @classmethod
    def load(cls, paths: list[str]) -> Glossary:
        """The terms of every file in `paths`, in order (a one-line error naming the file and line of a bad one)."""
        return cls([t for p in paths for t in _read(Path(p))])

    def __len__(self) -> int:
        return len(self.terms)

    @staticmethod
    def _key(tokens: list[str], cased: bool) -> tuple:
        return (cased, *(tokens if cased else [w.casefold() for w in tokens]))

    def find(self, text: str, lang: str | None = None) -> list[Match]:
        """The terms in `text` (the line's language `lang` picks the lemmatiser; None: surface forms only), in the
        order of the line, without overlaps (the longest first, then the leftmost)."""
        if not self._keys:
            return []
        found = words(text)
        tokens = [w for w, _, _ in found]
        lemma = self._lemmatiser(lang)
        lemmas = [lemma(w) for w in tokens] if lemma is not None else None
        lemma_keys = self._lemma_index(lang, lemma) if lemma is not None else {}
        candidates = []
        for i in range(len(tokens)):
            for n in range(min(self._longest, len(tokens) - i), 0, -1):
                term = self._term(tokens[i : i + n], lemmas[i : i + n] if lemmas else None, lemma_keys)
                if term is not None:
                    candidates.append((-(found[i + n - 1][2] - found[i][1]), i, n, term))
        taken, out = [False] * len(tokens), []
        for _, i, n, term in sorted(candidates, key=lambda c: c[:2]):
            if not any(taken[i : i + n]):
                taken[i : i + n] = [True] * n
                out.append(Match(term, found[i][1], found[i + n - 1][2]))
        return sorted(out, key=lambda m: m.start)

    def _term(self, tokens: list[str], lemmas: list[str] | None, lemma_keys: dict) -> Term | None:
        for cased in (True, False):
            term = self._keys.get(self._key(tokens, cased))
            if term is None and lemmas is not None:
                term = lemma_keys.get(self._key(lemmas, cased))
            if term is not None:
                return term
        return None

    def _lemmatiser(self, lang: str | None):
        """simplemma's lemma of a word in `lang` (None where it has no dictionary for it, or is not installed)."""
        if lang not in self._lemmatisers:
            self._lemmatisers[lang] = None
            from tfcli.data.languages import two_letter_code

            code = two_letter_code(lang) if lang else None
            try:
                import simplemma
                from simplemma.strategies.dictionaries.dictionary_factory import SUPPORTED_LANGUAGES
            except ImportError:
                return None
            if code in SUPPORTED_LANGUAGES:
                self._lemmatisers[lang] = lambda w, code=code: simplemma.lemmatize(w, lang=code)
        return self._lemmatisers[lang]

    def _lemma_index(self, lang: str | None, lemma) -> dict[tuple, Term]:
        if lang not in self._lemma_keys:
            index = {}
            for t in self.terms:
                index.setdefault(self._key([lemma(w) for w, _, _ in words(t.source)], _cased(t.source)), t)
            self._lemma_keys[lang] = index
        return self._lemma_keys[lang]


def _read(path: Path) -> list[Term]:
    """A glossary file's terms (module docstring: the format)."""
    from tfcli.io import read_lines

    if not path.is_file():
        raise TfcliError(f"{path}: no such glossary file")
    out = []
    for lineno, line in enumerate(read_lines(path), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = next(csv.reader([line])) if path.suffix.lower() == ".csv" else line.split("\t")
        fields = [f.strip() for f in fields]
        if len(fields) != 2 or not all(fields):
            sep = "a comma" if path.suffix.lower() == ".csv" else "a tab"
            raise InputError(path, lineno, f"expected a source term and a target term separated by {sep}, got "
                             f"{len(fields)} field(s)" + ("" if len(fields) != 2 else " with one empty"))
        source, target = fields
        if not words(source):
            raise InputError(path, lineno, f"the source term {source!r} has no word")
        if not forms(target):
            raise InputError(path, lineno, f"the target term {target!r} has no form between its ' ||| '")
        out.append(Term(source, forms(target), f"{path}:{lineno}"))
    return out
