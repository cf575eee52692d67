"""Placeholders and other text no translation may change: printf (`%s`, `%1$d`, `%@`), Python's `%(name)s`, braces
(`{name}`, `{0}`, `{{var}}`, ICU arguments with their nested messages), BBCode tags, URLs and e-mail addresses, and
the user's own patterns (--protect). Each is taken out of the text before translation and put back, whole, next to
the target words aligned to its neighbours (tfcli.formats.markup): the output holds each exactly as often as the
source, by construction, and the model never sees one to mangle.
"""

from __future__ import annotations

import re

from tfcli.errors import ConfigError

# in the order tried at a position: the longer and more specific first
PATTERNS = {
    "url": r"\b(?:https?|ftp)://[^\s<>\"']*[^\s<>\"'.,;:!?)\]]|\bwww\.[^\s<>\"']*[^\s<>\"'.,;:!?)\]]",
    "email": r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b",
    "double-braces": r"\{\{[^{}]*\}\}",
    "braces": r"\{(?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*\}",
    "python-format": r"%\([^()\s]+\)[-+0# ]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]",
    # (a letter may follow at once, "%dm %ds", "%.3fs", "file%s"; a number may not come before: "50%off" is text)
    "printf": r"(?<!\d)%(?:\d+\$)?[-+0#]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGcrspaA@]|%%",
    "bbcode": r"(?i:\[/?(?:b|i|u|s|url|img|quote|code|color|size|font|list|center|\*)(?:=[^\]\n]*)?\])",
}


def pattern(builtin: bool, protect: list[str] | tuple[str, ...] = ()) -> re.Pattern | None:
    """One pattern finding the user's `protect` patterns (first) and, with `builtin`, PATTERNS; None: neither."""
    parts = []
    for p in protect:
        try:
            re.compile(p)
        except re.error as e:
            raise ConfigError(f"translate: --protect {p!r} is not a regular expression ({e})") from None
        parts.append(f"(?:{p})")
    if builtin:
        parts += [f"(?:{p})" for p in PATTERNS.values()]
    return re.compile("|".join(parts)) if parts else None

