"""What a line asks of `tfcli translate`, and what comes back for it: one `Request` a line, one `Translation` a
hypothesis. Torch-free.

Every way in makes the same record: the text reader (`requests`), the JSONL reader (`jsonl_requests`), the side
files (`with_side_file`: --prefix, --avoid, --constraints) and the Python API. Each field's shape is checked once,
when the record is made (`Request.__post_init__`); what needs the model (a phrase's target tokens, a language the
model knows) is checked by the translator's encode stage. A new per-line option is a field here, its reader, and
the stage that uses it (docs/architecture.md: "Translating a line").
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from tfcli.errors import InputError, TfcliError

ALTERNATIVES = " ||| "  # between the forms of one constraint, any of which will do (--constraints FILE)


class FieldError(ValueError):
    """A request field of the wrong shape: `field` names it, `index` the phrase (None: the field itself), and
    `wrong_type` says whether it is a type's fault (the API raises TypeError then, ConfigError otherwise)."""

    def __init__(self, field: str, index: int | None, message: str, wrong_type: bool = True):
        super().__init__(message)
        self.field, self.index, self.wrong_type = field, index, wrong_type


@dataclass(frozen=True)
class Request:
    """One input line: where it comes from (`name`, 1-based `lineno`), its text, its languages (None: the
    command's --src-lang/--tgt-lang), a target prefix its translation starts with, target phrases it must not hold
    (`avoid`) and phrases it must hold (`constraints`: a phrase, or a tuple of alternative phrases of which one
    will do), and `extra`: what a file format or a glossary adds (keyed by the stage that reads it)."""

    text: str
    name: str = "<text>"
    lineno: int = 1
    src_lang: str | None = None
    tgt_lang: str | None = None
    prefix: str = ""
    avoid: tuple[str, ...] = ()
    constraints: tuple[str | tuple[str, ...], ...] = ()
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for name in ("text", "prefix"):
            if not isinstance(getattr(self, name), str):
                raise FieldError(name, None, f"is {type(getattr(self, name)).__name__}, expected a string")
        for name in ("src_lang", "tgt_lang"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise FieldError(name, None, f"is {type(value).__name__}, expected a string")
        object.__setattr__(self, "avoid", _phrases(self.avoid, "avoid", alternatives=False))
        object.__setattr__(self, "constraints", _phrases(self.constraints, "constraints", alternatives=True))

    @property
    def where(self) -> str:
        return f"{self.name}:{self.lineno}"

    @property
    def empty(self) -> bool:
        """Nothing to translate: no text and no prefix to continue (an empty output, score 0, without the model)."""
        return not self.text.strip() and not self.prefix


def _phrases(value, name: str, alternatives: bool) -> tuple:
    """`value` as a tuple of phrases (with `alternatives`, an item may be a non-empty list of phrases: a tuple)."""
    if value is None:
        return ()
    what = "a list of phrases (strings, or lists of alternative strings)" if alternatives else \
        "a list of strings (phrases)"
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise FieldError(name, None, f"must be {what}, got {type(value).__name__}")
    out = []
    for i, phrase in enumerate(value):
        if isinstance(phrase, str):
            out.append(phrase)
        elif alternatives and isinstance(phrase, (list, tuple)):
            if not phrase:
                raise FieldError(name, i, "a set of alternatives needs at least one phrase", wrong_type=False)
            if not all(isinstance(p, str) for p in phrase):
                raise FieldError(name, i, f"must be {what}")
            out.append(tuple(phrase))
        else:
            raise FieldError(name, i, f"must be {what}, got {type(phrase).__name__}")
    return tuple(out)


def _located(name: str, lineno: int, make) -> Request:
    """`make()`, its FieldError as an InputError naming the line (and the JSONL field)."""
    try:
        return make()
    except FieldError as e:
        raise InputError(name, lineno, f'field "{e.field}" {e}') from None


def requests(items: Iterable) -> Iterator[Request | None]:
    """tfcli.io.read_inputs' `InputLine`s as Requests; None (the input has paused) passed on."""
    for item in items:
        yield None if item is None else Request(item.text, item.name, item.lineno)


JSONL_FIELDS = ("text", "tgt_lang", "src_lang", "prefix", "avoid", "constraints")


def jsonl_requests(items: Iterable) -> Iterator[Request | None]:
    """read_inputs items whose lines are JSON objects {"text": ..., "tgt_lang": ..., "src_lang": ..., "prefix": ...,
    "avoid": [...], "constraints": [...]} (all but the text optional) as Requests; a blank line is an empty text. A
    line that is not such an object is an InputError naming it."""
    for item in items:
        if item is None or not item.text.strip():
            yield None if item is None else Request("", item.name, item.lineno)
            continue
        name, lineno, line = item
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(name, lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise InputError(name, lineno, 'expected an object with a "text" string, e.g. {"text": "Ein Hund.", '
                                           '"tgt_lang": "fr"}')
        for key in row:
            if key not in JSONL_FIELDS:
                raise InputError(name, lineno, f'unknown field "{key}" (the fields: {", ".join(JSONL_FIELDS)})')
        yield _located(name, lineno, lambda: Request(row["text"], name, lineno, row.get("src_lang"),
                                                     row.get("tgt_lang"), _or_empty(row.get("prefix")), row.get("avoid"),
                                                     row.get("constraints")))


def _or_empty(value):
    return "" if value is None else value


def _tab_phrases(line: str) -> tuple[str, ...]:
    return tuple(p for p in line.split("\t") if p.strip())


def forms(text: str) -> tuple[str, ...]:
    """The forms of a phrase written as forms joined by ALTERNATIVES (any one will do), or the phrase alone."""
    if ALTERNATIVES not in text:
        return (text,)
    return tuple(f.strip() for f in text.split(ALTERNATIVES.strip()) if f.strip())


def _tab_constraints(line: str) -> tuple:
    """A --constraints FILE line: tab-separated phrases, each maybe forms joined by ALTERNATIVES."""
    return tuple(forms(p) if ALTERNATIVES in p else p for p in _tab_phrases(line))


# per side file: the Request field it fills, how a line of it reads, and what its lines are called in errors
SIDE_FILES = {
    "prefix": (lambda line: line, "prefixes"),
    "avoid": (_tab_phrases, "lines"),
    "constraints": (_tab_constraints, "lines"),
}


def with_side_file(items: Iterable, field_name: str, lines: list[str], path: str) -> Iterator:
    """Each Request with `field_name` read from its line of `lines` (the file `path`: one line a line of the input;
    SIDE_FILES says how a line reads); None passed on; a one-line error naming `path` when the counts differ."""
    parse, what = SIDE_FILES[field_name]
    i = 0
    for req in items:
        if req is None:
            yield None
            continue
        if i >= len(lines):
            raise TfcliError(f"{path}: {len(lines)} {what}, but the input has more lines; give one a line")
        yield dataclasses.replace(req, **{field_name: parse(lines[i])})
        i += 1
    if i != len(lines):
        raise TfcliError(f"{path}: {len(lines)} {what} for {i} input lines; give one a line")


@dataclass
class Translation:
    """One translation of a line: its text, its score (sum of token log-probs / ((5 + |Y|) / 6)^len_penalty, as
    `tfcli translate --nbest` prints it; a line translated sentence by sentence: the sentences' sum), with
    `scores` each token's log p (and </s>'s), with `alignment` its (source word, target word) pairs; where the
    line has constraints (its own, a glossary's), `constraints`: each one (by its first form) and whether this
    translation holds it."""

    text: str
    score: float | None
    token_scores: list[float] | None = None
    alignment: list[tuple[int, int]] | None = None
    constraints: list[tuple[str, bool]] | None = None
