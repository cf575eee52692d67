"""Files translated with their structure kept: each format's reader gives the file's translatable segments as
Requests (their `extra["markup"]`: how the markup stage reads each: tfcli.formats.markup), and a writer that puts the
translations back; everything else in the file is written as it was.

| format | reader | segments | kept |
| --- | --- | --- | --- |
| html-page | html.parser (the standard library's), offsets | the inline content of each block element; alt, title, placeholder and aria-label values | every byte outside the segments; script, style, code, pre |
| markdown | markdown-it-py (CommonMark + tables) | paragraphs, headings, list items, table cells, quotes | code blocks, inline code, untranslated inline HTML (`<kbd>`...), link targets and images as written (inline or reference), HTML blocks, front matter |
| srt, vtt | a strict cue reader (times checked) | sentences, across cues; their words given back to their cues by alignment | cue numbers, identifiers, times, settings, NOTE/STYLE blocks |
| po | polib | empty msgstr (plural forms per the header's nplurals), each line of a msgid alone | comments, contexts, flags (machine output marked fuzzy), existing translations unless --overwrite |
| xliff | lxml | source of each trans-unit (1.2) or segment (2.x), inline elements put back | the document; a target written after its source, existing ones unless --overwrite |
| json | the standard library's json | every string value, each line alone | keys, structure, key order, indentation |

Torch-free: the translator sees only Requests.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tfcli.console import warn
from tfcli.errors import InputError, TfcliError
from tfcli.formats import markup as markups
from tfcli.request import Request

LINE_FORMATS = ("text", "jsonl", "xml", "html")
FILE_FORMATS = ("html-page", "markdown", "srt", "vtt", "po", "xliff", "json")
EXTENSIONS = {".jsonl": "jsonl", ".html": "html-page", ".htm": "html-page", ".xhtml": "html-page",
              ".md": "markdown", ".markdown": "markdown", ".srt": "srt", ".vtt": "vtt", ".po": "po", ".pot": "po",
              ".xlf": "xliff", ".xliff": "xliff", ".json": "json"}


def choose(fmt: str, path: str) -> str:
    """The format of input `path` under --input-format `fmt`: `auto` by the extension (text for stdin and unknown
    ones; a compressed file by the extension before .gz)."""
    if fmt != "auto":
        return fmt
    if path == "-":
        return "text"
    name = path[:-3] if path.endswith(".gz") else path
    return EXTENSIONS.get(Path(name).suffix.lower(), "text")


@dataclass
class Document:
    """A file read: its segments to translate (in order) and the function that writes the file with their
    translations (one text a segment, in the same order)."""

    segments: list[Request]
    write: Callable[[list[str]], str]


def read(fmt: str, path: str, text: str, overwrite: bool = False, tgt_lang: str | None = None) -> Document:
    """The file `path` (its contents `text`) in format `fmt` as a Document; an InputError naming the line where
    it does not parse. `tgt_lang`: the target language, where known (written where the format names it)."""
    return READERS[fmt](path, text, overwrite, tgt_lang)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _lines(text: str, path: str, lineno: int, kind) -> list[Request]:
    """A string value translated line by line (a newline inside it kept): its lines' Requests."""
    return [Request(line, path, lineno + k, extra={"markup": kind}) for k, line in enumerate(text.split("\n"))]


def _kind(text: str) -> str:
    """A message's markup: tags where it holds one, else text (placeholders only)."""
    return "tags" if re.search(r"</?[A-Za-z][\w-]*(\s[^<>]*)?/?>|</?\d+\s*/?>", text) else "text"


# --- ICU MessageFormat -------------------------------------------------------------------------------------------

_ICU_HEAD = re.compile(r"\{\s*[^\s,{}]+\s*,\s*(plural|select|selectordinal)\s*,")
_ICU_CASE = re.compile(r"\s*(?:offset:\s*\d+\s*)?(=\d+|[^\s{}]+)\s*\{")


def _closing(text: str, start: int) -> int | None:
    """The index of the `}` that closes the `{` at `start` (nested braces counted)."""
    depth = 0
    for k in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return k
    return None


def _icu_expressions(text: str) -> list[tuple[int, int, str, list[tuple[int, int]]]]:
    """The top-level ICU plural/select/selectordinal expressions of a message: (start, end, type, each case
    body's (start, end)), offsets into `text`; [] where there is none or one does not parse."""
    text = re.sub(r"<[^>]*>", lambda t: " " * len(t.group()), text)  # (braces inside a tag are its own)
    out, k = [], 0
    while True:
        m = _ICU_HEAD.search(text, k)
        if not m:
            return out
        end = _closing(text, m.start())
        if end is None:
            return []
        cases, j = [], m.end()
        while j < end:
            c = _ICU_CASE.match(text, j)
            if not c:
                break
            close = _closing(text, c.end() - 1)
            if close is None or close > end:
                return []
            cases.append((c.end(), close))
            j = close + 1
        if not cases or text[j:end].strip():
            return []
        out.append((m.start(), end + 1, m.group(1), cases))
        k = end + 1


def _icu_message(text: str) -> tuple[list[tuple[str, bool]], Callable[[list[str]], str]] | None:
    """An ICU message as the texts to translate, each with whether `#` in it is the plural's number, and how to
    put their translations back: the message with each plural/select expression as a placeholder `{ICU_n}` (where
    it holds words), then each case's body (its own expressions likewise). Argument names, keywords, case keys
    and braces are kept as written. None: no ICU plural/select in it."""
    exprs = _icu_expressions(text)
    if not exprs:
        return None
    outer, pos = [], 0
    for n, (start, end, _, _) in enumerate(exprs):
        outer += [text[pos:start], f"{{ICU_{n}}}"]
        pos = end
    outer_text = "".join(outer + [text[pos:]])
    parts: list[tuple[str, bool]] = []
    has_words = bool(re.search(r"\w", re.sub(r"\{ICU_\d+\}", "", outer_text)))
    if has_words:
        parts.append((outer_text, False))
    bodies = []  # per expression, per case: (the case's parts, its join)
    for start, end, kind, cases in exprs:
        for a, b in cases:
            inner = _icu_message(text[a:b])
            body = inner if inner is not None else ([(text[a:b], kind != "select")], lambda outs: outs[0])
            bodies.append(body)
            parts += body[0]

    def join(outs: list[str]) -> str:
        top = outs[0] if has_words else outer_text
        k, b, rebuilt = int(has_words), 0, []
        for start, end, _, cases in exprs:
            expr, at = [], start
            for a, c in cases:
                n = len(bodies[b][0])
                expr += [text[at:a], bodies[b][1](outs[k:k + n])]
                k, b, at = k + n, b + 1, c
            rebuilt.append("".join(expr + [text[at:end]]))
        for n, r in enumerate(rebuilt):
            top = top.replace(f"{{ICU_{n}}}", r, 1)
        return top

    return parts, join


def _spaced_as(source: str, out: str) -> str:
    """`out` with the spaces `source` has at its ends (an ICU case's " There is # item. " keeps them)."""
    return source[: len(source) - len(source.lstrip())] + out.strip() + source[len(source.rstrip()):]


def _message(value: str, path: str, lineno: int, markup: str | None = None):
    """A message string's Requests and how to join their translations back: its lines (a newline inside it kept;
    an XML message, `markup` xml, whole), or with ICU plural/select its parts (`_icu_message`), `#` held as a placeholder in a plural's cases; a part
    without a word is kept as written. `markup`: the reader's (else tags where it holds one, else text)."""
    icu = _icu_message(value)
    if icu is None and markup is not None:  # (an XML message: one segment, its elements may span lines)
        return [Request(value, path, lineno, extra={"markup": markup})], lambda outs: outs[0]
    if icu is None:
        return _lines(value, path, lineno, _kind(value)), "\n".join
    parts, join = icu
    texts = [re.sub(r"(?<!&)#", "{#}", t) if number else t for t, number in parts]
    send = [bool(re.search(r"\w", re.sub(r"<[^>]*>|\{[^{}]*\}", "", t))) for t in texts]
    reqs = [Request(t, path, lineno, extra={"markup": markup or _kind(t)}) for t, go in zip(texts, send) if go]

    def joined(outs: list[str]) -> str:
        it = iter(outs)
        return join([_spaced_as(t, next(it).replace("{#}", "#")) if go else t for (t, _), go in zip(parts, send)])

    return reqs, joined


# --- html-page ----------------------------------------------------------------------------------------------------

_SEGMENT_BREAKS = markups.BLOCK | {"html", "head", "body", "title", "option", "button", "caption", "label",
                                   "legend", "summary", "details", "select", "textarea"}
_SKIP = {"script", "style", "template", "textarea"}


def _page_cuts(text: str) -> list[tuple[int, int, str]]:
    """The spans of an HTML page that are translated: (start, end, how it is read: "html", a block's content, or
    "attr", a text attribute's value), by offsets into the page, in order."""
    from html.parser import HTMLParser

    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    cuts: list[tuple[int, int, str]] = []  # (start, end, how it is read: "html" or "attr")
    state = {"seg": 0, "skip": 0}

    def offset(parser) -> int:
        line, col = parser.getpos()
        return starts[line - 1] + col

    def boundary(at: int, end: int) -> None:
        if not state["skip"] and state["seg"] < at:
            cuts.append((state["seg"], at, "html"))
        state["seg"] = end

    class Reader(HTMLParser):
        def handle_starttag(self, tag, attrs):
            at = offset(self)
            raw = self.get_starttag_text()
            if not state["skip"]:
                cuts.extend((at + a, at + z, "attr") for a, z in markups.text_attributes(raw))
            if tag in _SEGMENT_BREAKS or tag in _SKIP:
                boundary(at, at + len(raw))
            if tag in _SKIP:
                state["skip"] += 1

        def handle_startendtag(self, tag, attrs):
            self.handle_starttag(tag, attrs)

        def handle_endtag(self, tag):
            at = offset(self)
            end = text.find(">", at) + 1 or len(text)
            if tag in _SKIP:
                state["skip"] = max(state["skip"] - 1, 0)
                state["seg"] = end
            elif tag in _SEGMENT_BREAKS:
                boundary(at, end)

        def handle_decl(self, decl):
            at = offset(self)
            boundary(at, at + len(decl) + 3)

    reader = Reader(convert_charrefs=True)
    reader.feed(text)
    reader.close()
    boundary(len(text), len(text))
    return sorted(cuts)


def _html_page(path: str, text: str, overwrite: bool, tgt_lang: str | None) -> Document:
    cuts = _page_cuts(text)
    # a segment with text translates the attributes of the tags inside it itself (Markup.attributes)
    inside = [(s, e) for s, e, how in cuts if how == "html" and _has_text(text[s:e])]
    segments, places = [], []
    for start, end, how in cuts:
        chunk = text[start:end]
        if how == "attr" and any(s <= start < e for s, e in inside):
            continue
        if how == "html":
            if not _has_text(chunk):
                continue
            lead, body, trail = _strip(chunk)
            segments.append(Request(body, path, _line_of(text, start), extra={"markup": "html"}))
            places.append((start, end, lead, trail, None))
        else:
            import html as html_lib

            segments.append(Request(html_lib.unescape(chunk), path, _line_of(text, start), extra={"markup": "text"}))
            places.append((start, end, "", "", "attr"))

    def write(outs: list[str]) -> str:
        import html as html_lib

        pieces, pos = [], 0
        for (start, end, lead, trail, how), out in zip(places, outs):
            pieces += [text[pos:start], lead, html_lib.escape(out) if how else out, trail]
            pos = end
        return "".join(pieces) + text[pos:]

    return Document(segments, write)


def _has_text(chunk: str) -> bool:
    """Whether an HTML chunk holds text outside its tags and comments."""
    bare = re.sub(r"<!--.*?-->|<[^>]*>", " ", chunk, flags=re.DOTALL)
    return bool(re.sub(r"&nbsp;|&#160;", " ", bare).strip())


def _strip(chunk: str) -> tuple[str, str, str]:
    body = chunk.strip()
    if not body:
        return chunk, "", ""
    lead = chunk[: chunk.index(body[0])]
    return lead, body, chunk[len(lead) + len(body):]


# --- markdown -----------------------------------------------------------------------------------------------------

def _markdown(path: str, text: str, overwrite: bool, tgt_lang: str | None) -> Document:
    from markdown_it import MarkdownIt

    lines = text.split("\n")
    body = text
    front = re.match(r"---\n.*?\n(---|\.\.\.)\n", text, re.DOTALL)
    if front:  # (front matter: blank lines to the parser, kept as written)
        body = "\n" * front.group().count("\n") + text[front.end():]
    env: dict = {}
    tokens = MarkdownIt("commonmark").enable("table").parse(body, env)
    references = set(env.get("references", {}))
    raw_lines = _shortcode_raw_lines(lines)
    segments, edits = [], []  # edits: (line, start, end) of each content line of a segment, first line first
    cursor: dict[int, int] = {}
    block_map = None
    for tok in tokens:
        if tok.map is not None:
            block_map = tok.map
        if tok.type != "inline" or not tok.content.strip() or block_map is None:
            continue
        alert = _ALERT.match(tok.content)
        if alert:  # (a GitHub alert's marker stays alone on its line: the rest is the segment)
            tok = _without_first_line(tok, alert.end())
        where = []
        line = block_map[0]
        for content_line in tok.content.split("\n"):
            while line < block_map[1]:
                at = lines[line].find(content_line.strip(), cursor.get(line, 0))
                if at >= 0:
                    where.append((line, at, at + len(content_line.strip())))
                    cursor[line] = at + len(content_line.strip())
                    break
                line += 1
        if len(where) != len(tok.content.split("\n")) or any(w[0] in raw_lines for w in where):
            continue  # (content the parser rewrote beyond finding, or a raw shortcode's: left as written)
        markup = _markdown_markup(tok, references)
        if not markup.plain:
            continue  # (images, code and links without a word: nothing to translate, left as written)
        segments.append(Request(tok.content, path, where[0][0] + 1, extra={"markup": markup}))
        edits.append(where)

    def write(outs: list[str]) -> str:
        new = list(lines)
        changes: dict[int, list] = {}
        for where, out, req in zip(edits, outs, segments):
            if _same_markdown(out, req.text):
                continue  # (the segment's own text: its lines as they were)
            for k, (line, a, b) in enumerate(where):
                changes.setdefault(line, []).append((a, b, out if k == 0 else ""))
        dropped = set()
        for line, spans in changes.items():
            s = new[line]
            for a, b, rep in sorted(spans, reverse=True):
                s = s[:a] + rep + s[b:]
            if not s.strip(" >") and line not in (w[0][0] for w in edits):
                dropped.add(line)  # (a paragraph's later line, now empty: the paragraph is one line)
            new[line] = s
        return "\n".join(s for i, s in enumerate(new) if i not in dropped)

    return Document(segments, write)


_ALERT = re.compile(r"\[!(?:NOTE|TIP|IMPORTANT|WARNING|CAUTION)\][ \t]*\n", re.IGNORECASE)  # an alert's first line
_SHORTCODE = re.compile(r"(\{\{<.*?>\}\}|\{\{%.*?%\}\})", re.DOTALL)  # Hugo's {{< name ... >}}, {{% ... %}}


def _shortcode_raw_lines(lines: list[str]) -> set[int]:
    """The lines inside a paired `{{< name >}}` ... `{{< /name >}}` shortcode (its content is raw: code, TOML),
    which are never translated; `{{% %}}` content is Markdown and is."""
    raw, opened = set(), []
    for k, line in enumerate(lines):
        for m in re.finditer(r"\{\{<\s*(/?)\s*([\w-]+)[^>]*?(/?)>\}\}", line):
            if m.group(1) and opened and opened[-1][0] == m.group(2):
                raw.update(range(opened.pop()[1] + 1, k))
            elif not m.group(1) and not m.group(3):
                opened.append((m.group(2), k))
    return raw


def _without_first_line(tok, cut: int):
    """An inline token without its first content line (`cut`: where the next begins): content and children."""
    import copy

    out = copy.copy(tok)
    out.content = tok.content[cut:]
    children = tok.children or []
    first_break = next((i for i, c in enumerate(children) if c.type in ("softbreak", "hardbreak")), len(children))
    out.children = children[first_break + 1:]
    return out


def _same_markdown(new: str, old: str) -> bool:
    """Whether a segment's new text is its old one: the same but for spaces, for how a reference link whose
    text is its label is written (`[a][a]`, `[a][]`, `[a]`), and for entities and backslash escapes (`&nbsp;`,
    `\\*`), which the text the model sees has decoded."""
    def norm(text):
        text = html.unescape(re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text))
        return re.sub(r"\[([^\[\]]+)\]\[(?:\1)?\]", r"[\1]", "".join(text.split()))

    return norm(new) == norm(old)


class _Brackets:
    """The links and images of an inline token's source (`content`), in order, as written: what a link's closing
    is (`](target "title")`, `][label]`), and an image's whole text, which the parser's tokens no longer say."""

    def __init__(self, content: str, references: set[str] = frozenset()):
        self.s, self.references = content, references  # (the document's reference labels, normalised)
        self.at = {True: 0, False: 0}  # where the next image's, and the next link's, search starts

    def _skip(self, k: int) -> int:
        """Past a backslash escape or a code span at k (k itself where there is neither)."""
        if self.s[k] == "\\":
            return k + 2
        if self.s[k] == "`":
            run = re.match(r"`+", self.s[k:]).group()
            end = self.s.find(run, k + len(run))
            return end + len(run) if end >= 0 else k + len(run)
        return k

    def _match(self, start: int) -> int | None:
        """The index of the `]` that closes the `[` at `start`."""
        depth, k = 0, start
        while k < len(self.s):
            if self._skip(k) != k:
                k = self._skip(k)
                continue
            depth += {"[": 1, "]": -1}.get(self.s[k], 0)
            if depth == 0:
                return k
            k += 1
        return None

    def _tail(self, k: int) -> int:
        """The end of what follows a link text's `]` at k: `(...)` (parentheses balanced), `[label]`, or nothing."""
        if self.s.startswith("(", k + 1):
            depth, j = 0, k + 1
            while j < len(self.s):
                if self.s[j] == "\\":
                    j += 2
                    continue
                depth += {"(": 1, ")": -1}.get(self.s[j], 0)
                if depth == 0:
                    return j + 1
                j += 1
        m = re.match(r"\[(?:[^\]\\]|\\.)*\]", self.s[k + 1 :])
        return k + 1 + m.end() if m else k + 1

    def _is_link(self, k: int) -> bool:
        """Whether the brackets at k can be a link: followed by `(` or `[`, or a shortcut whose label the document
        defines (`[Ctrl]`, `[!NOTE]`, `[1]` without a definition are text)."""
        from markdown_it.common.utils import normalizeReference

        close = self._match(k)
        if close is None:
            return False
        return self.s[close + 1 : close + 2] in ("(", "[") or normalizeReference(self.s[k + 1 : close]) in self.references

    def next(self, image: bool) -> tuple[str, str] | None:
        """The next link's (text, closing) or image's (text, whole source); None where the source does not show it."""
        k = self.at[image]
        while k < len(self.s):
            if self._skip(k) != k:
                k = self._skip(k)
            elif self.s[k] == "[" and (self.s[k - 1 : k] == "!") == image and self._is_link(k):
                break
            elif self.s[k] == "[" and not image:  # (an image, its label too, is no link)
                close = self._match(k)
                k = self._tail(close) if close is not None else k + 1
            else:
                k += 1
        close = self._match(k) if k < len(self.s) else None
        if close is None:
            return None
        end = self._tail(close)
        self.at[image] = end
        return self.s[k + 1 : close], self.s[k - 1 : end] if image else self.s[close:end]


def _kept_html_end(children: list, i: int) -> int | None:
    """Where inline HTML children[i], the opening tag of an element whose content is never translated
    (markup.KEEP, translate="no", class="notranslate"), is closed: the index of its closing tag (the same name,
    nested ones counted); None where it is no such tag or is not closed in the paragraph."""
    from html.parser import HTMLParser

    opened: list[tuple[str, dict]] = []  # (the tag and its attributes as read_html's parser reads them)
    parser = HTMLParser()
    parser.handle_starttag = lambda tag, attrs: opened.append((tag, dict(attrs)))
    parser.feed(children[i].content.strip())
    parser.close()
    if len(opened) != 1 or not markups.untranslated(*opened[0], markups.KEEP):
        return None
    name = opened[0][0]
    depth = 0
    for j in range(i, len(children)):
        if children[j].type != "html_inline":
            continue
        tag = children[j].content.strip().lower()
        if re.match(rf"<{name}[\s>]", tag):
            depth += 1
        elif re.fullmatch(rf"</{name}\s*>", tag):
            depth -= 1
            if not depth:
                return j
    return None


def _written(tok) -> str:
    """An inline token as its source has it (near enough for text inside a kept element)."""
    if tok.type == "code_inline":
        return tok.markup + tok.content + tok.markup
    if tok.type in ("softbreak", "hardbreak"):
        return "\n"
    return tok.content if tok.type in ("text", "html_inline") else tok.markup


def _markdown_markup(tok, references: set[str] = frozenset()) -> markups.Markup:
    """An inline token's children as a Markup: emphasis, strong, strikethrough and links paired nodes (a link's
    target kept as written: inline, or a reference, whose label a shortcut `[text]` gets, since its text is
    translated), inline code, images, autolinks and inline HTML fixed."""
    b = markups.Builder()
    children = tok.children or []
    raw = _Brackets(tok.content, references)
    closings: list[str] = []
    i = 0
    while i < len(children):
        c = children[i]
        kind = c.type
        if kind == "text":
            for k, piece in enumerate(_SHORTCODE.split(c.content)):  # (Hugo's shortcodes: structure, kept)
                if k % 2:
                    b.fixed(piece, placeholder=True)
                elif piece:
                    b.text(piece)
        elif kind in ("softbreak", "hardbreak"):
            b.text(" ")
        elif kind == "code_inline":
            b.fixed(c.markup + c.content + c.markup, placeholder=True)
        elif kind == "image":
            title = c.attrs.get("title")
            written = raw.next(image=True)
            b.fixed(written[1] if written else f"![{c.content}]({c.attrs.get('src', '')}" + (
                f' "{title}"' if title else "") + ")", placeholder=True)
        elif kind == "html_inline":
            end = _kept_html_end(children, i)
            if end is None:
                b.fixed(c.content)
            else:  # (a <code>, <kbd>, translate="no" ... element: copied whole, placed as a word)
                b.fixed("".join(_written(t) for t in children[i : end + 1]), placeholder=True)
                i = end
        elif kind == "link_open" and c.markup == "autolink":
            j = next((k for k in range(i, len(children)) if children[k].type == "link_close"), len(children) - 1)
            b.fixed(f"<{children[i + 1].content if i + 1 < j else c.attrs.get('href', '')}>", placeholder=True)
            i = j
        elif kind == "link_open":
            title = c.attrs.get("title")
            closing = f"]({c.attrs.get('href', '')}" + (f' "{title}"' if title else "") + ")"
            written = raw.next(image=False)
            if written is not None:
                text, close = written
                # (a shortcut or collapsed reference is labelled by its text: the label kept, not the translation)
                closing = close if close not in ("]", "][]") else f"][{text}]"
            closings.append(closing)
            b.open("[")
        elif kind == "link_close":
            b.close(closings.pop() if closings else "]")
        elif kind.endswith("_open"):
            b.open(c.markup)
        elif kind.endswith("_close"):
            b.close(c.markup)
        else:
            b.text(c.content)
        i += 1
    return b.done()


# --- subtitles ----------------------------------------------------------------------------------------------------

_SRT_TIME = r"\d{1,2}:\d{2}:\d{2}[,.]\d{3}"
_VTT_TIME = r"(?:\d{2,}:)?\d{2}:\d{2}\.\d{3}"
_SENTENCE_END = re.compile(r"[.!?…♪:;\"»”)\]]\s*$")
_CUES_A_SENTENCE = 5  # at most this many cues joined into one segment


def _subtitles(fmt: str) -> Callable:
    timing = re.compile(rf"^({_SRT_TIME}|{_VTT_TIME})\s+-->\s+({_SRT_TIME}|{_VTT_TIME})(\s.*)?$")

    def reader(path: str, text: str, overwrite: bool, tgt_lang: str | None) -> Document:
        lines = text.split("\n")
        cues = []  # [first text line, last text line + 1]
        i = 0
        if fmt == "vtt":
            if not lines or not lines[0].lstrip("\ufeff").startswith("WEBVTT"):
                raise InputError(path, 1, 'a WebVTT file starts with "WEBVTT"')
            while i < len(lines) and lines[i].strip():
                i += 1  # (the header)
        while i < len(lines):
            if not lines[i].strip():
                i += 1
                continue
            start = i
            i = _block_end(lines, start, fmt)
            block = lines[start:i]
            if fmt == "vtt" and re.match(r"(NOTE|STYLE|REGION)(\s|$)", block[0]):
                continue
            k = next((k for k, line in enumerate(block[:2]) if "-->" in line), None)
            if k is None:
                raise InputError(path, start + 1, f"a cue without a time line (\"00:00:01{',' if fmt == 'srt' else '.'}"
                                                  f"000 --> 00:00:02{',' if fmt == 'srt' else '.'}000\")")
            m = timing.match(block[k].strip())
            if not m or not re.fullmatch(_SRT_TIME if fmt == "srt" else _VTT_TIME, m.group(1)) or not re.fullmatch(
                    _SRT_TIME if fmt == "srt" else _VTT_TIME, m.group(2)):
                raise InputError(path, start + k + 1, f"a cue time that does not parse: {block[k].strip()!r}")
            if fmt == "srt" and k == 1 and not block[0].strip().isdigit():
                raise InputError(path, start + 1, f"a cue number that is not a number: {block[0].strip()!r}")
            if start + k + 1 < i:
                cues.append((start + k + 1, i))
        groups = _sentence_groups(lines, cues)
        voices = {cue: _voice(" ".join(lines[cue[0]:cue[1]])) for cue in cues}
        segments = [Request((m := _cue_markup(g, voices)).plain, path, g[0][0] + 1, extra={"markup": m})
                    for g in groups]

        def write(outs: list[str]) -> str:
            new = list(lines)
            for g, out in zip(groups, outs):
                texts = _cue_texts(out, len(g))
                for (a, b), cue_text in zip(g, texts):
                    head, body, tail = voices[(a, b)]
                    if _same_cue(cue_text, body):  # (the cue's own words and tags: its lines as they were)
                        continue
                    new[a:b] = [head + _wrap(cue_text, b - a) + tail] + [None] * (b - a - 1)
            return "\n".join(line for line in new if line is not None)

        return Document(segments, write)

    return reader


_VOICE = re.compile(r"\s*(<v(?:\.[^\s>]*)?(?:\s[^>]*)?>)")  # a voice span's start tag, at a cue's start
_TIMESTAMP = re.compile(r"<((?:\d+:)?\d{2}:\d{2}\.\d{3})>")  # a karaoke-style inline timestamp
_TIMESTAMP_TAG = re.compile(r'<tfcli-t t="([\d:.]+)"/>')


def _voice(text: str) -> tuple[str, str, str]:
    """A cue's text as (its voice's start tag at the cue's start, the rest, its `</v>` at the end), so that the
    speaker stays at the start of the cue it was at, whatever the words' order."""
    m = _VOICE.match(text)
    if not m:
        return "", text, ""
    body = text[m.end():]
    tail = "</v>" if body.rstrip().endswith("</v>") else ""
    return m.group(1), body.rstrip()[:-4] if tail else body, tail


def _same_cue(new: str, old: str) -> bool:
    """Whether a cue's new text is its old one: the same words and the same tags in order, whatever the spaces
    around the tags (a copying model's output then comes back byte for byte)."""
    def parts(text):
        return re.sub(r"<[^>]*>", " ", text).split(), re.findall(r"<[^>]*>", text)

    return parts(new) == parts(old)


def _cue_markup(group: list[tuple[int, int]], voices: dict) -> markups.Markup:
    """The segment of a group of cues: each cue's text (without its voice) in a tfcli-cue element, read as HTML;
    inline timestamps kept as tags where they stand."""
    fragment = " ".join(f'<tfcli-cue n="{n}">' + voices[cue][1] + "</tfcli-cue>" for n, cue in enumerate(group))
    m = markups.read_html(_TIMESTAMP.sub(r'<tfcli-t t="\1"/>', fragment), escape=lambda s: s)
    for node in m.root.walk():
        node.open = _TIMESTAMP_TAG.sub(r"<\1>", node.open)
    return m


def _block_end(lines: list[str], start: int, fmt: str) -> int:
    """Where the cue block beginning at `start` ends: at a blank line, or (WebVTT's parsing rules; SRT as players
    read it) at a later line holding "-->", which begins the next cue, with its number before it in SRT."""
    i = start + 1
    while i < len(lines) and lines[i].strip():
        if "-->" in lines[i] and i > start + 1:
            number = fmt == "srt" and lines[i - 1].strip().isdigit() and i - 1 > start + 1
            return i - 1 if number else i
        i += 1
    return i


def _sentence_groups(lines: list[str], cues: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Consecutive cues translated together: a sentence runs on into the next cue when this one has no final
    punctuation and the next starts in lower case (at most _CUES_A_SENTENCE cues a group)."""
    groups, group = [], []
    for k, cue in enumerate(cues):
        group.append(cue)
        last = re.sub(r"<[^>]*>", "", lines[cue[1] - 1])
        after = re.sub(r"<[^>]*>", "", lines[cues[k + 1][0]]).lstrip() if k + 1 < len(cues) else ""
        if _SENTENCE_END.search(last) or not after[:1].islower() or len(group) >= _CUES_A_SENTENCE:
            groups.append(group)
            group = []
    if group:
        groups.append(group)
    return groups


def _cue_texts(rendered: str, n: int) -> list[str]:
    """A rendered segment's text of each cue (its tfcli-cue element's; words outside any go to the cue before);
    a cue left with no word takes half of the words of the nearest cue that has two or more, so that no cue is
    empty while the translation has a word for each."""
    texts = [""] * n
    current = 0
    for piece in re.split(r'(<tfcli-cue n="\d+">|</tfcli-cue>)', rendered):
        m = re.match(r'<tfcli-cue n="(\d+)">', piece)
        if m:
            current = int(m.group(1))
        elif piece != "</tfcli-cue>":
            texts[current] += piece
    texts = [" ".join(t.split()) for t in texts]
    for k in range(n):
        if _has_words(texts[k]):
            continue
        donor = next((d for d in sorted(range(n), key=lambda d: abs(d - k))
                      if sum(map(_has_words, _cue_chunks(texts[d]))) > 1), None)
        if donor is not None:
            first, last = _split_cue(texts[donor])
            give, keep = (last, first) if donor < k else (first, last)
            texts[k], texts[donor] = " ".join(filter(None, (texts[k], give))), keep
    return texts


_CUE_TAG = r"<[A-Za-z/\d][^<>]*>"  # a WebVTT/SRT tag (not a "<" of the text: "2 < 3")


def _has_words(text: str) -> bool:
    return bool(re.sub(_CUE_TAG, "", text).strip())


def _cue_chunks(text: str) -> list[str]:
    """A cue's text split at its spaces, but never inside a tag (`<font color="#fff">`)."""
    return re.findall(rf"(?:{_CUE_TAG}|[^\s<]+|<)+", text)


def _split_cue(text: str) -> tuple[str, str]:
    """A cue's text in two halves by its words, each a whole cue: an element open where it is cut is closed at
    the end of the first half and opened again at the start of the second (`<i>a b</i>`: `<i>a</i>`, `<i>b</i>`).
    Closing tags after the last word of the first half stay with it."""
    chunks = _cue_chunks(text)
    words = [i for i, c in enumerate(chunks) if _has_words(c)]
    cut = words[len(words) // 2 - 1] + 1
    while cut < len(chunks) and chunks[cut].startswith("</"):
        cut += 1
    first, last = " ".join(chunks[:cut]), " ".join(chunks[cut:])
    opened: list[str] = []
    for tag in re.findall(_CUE_TAG, first):
        if tag.startswith("</"):
            if opened and _tag_name(opened[-1]) == tag[2:-1].strip():
                opened.pop()
        elif not tag.endswith("/>") and not _TIMESTAMP.fullmatch(tag):
            opened.append(tag)
    return (first + "".join(f"</{_tag_name(t)}>" for t in reversed(opened)), "".join(opened) + last)


def _tag_name(tag: str) -> str:
    """A WebVTT start tag's name: <c.yellow> and <c> are both c's."""
    return re.match(r"</?([^\s.>/]*)", tag).group(1)


def _wrap(text: str, n_lines: int) -> str:
    """A cue's text on as many lines as the source cue had (at most 2), broken at the space nearest the middle."""
    if n_lines < 2 or " " not in text:
        return text
    mid = len(text) // 2
    spaces = [m.start() for m in re.finditer(" ", text)]
    cut = min(spaces, key=lambda s: abs(s - mid))
    return text[:cut] + "\n" + text[cut + 1:]


# --- po -----------------------------------------------------------------------------------------------------------

_PO_LINE = re.compile(r'^\s*(?:#.*|(?:msgctxt|msgid|msgid_plural|msgstr(?:\[\d+\])?)\s+"(?:[^"\\]|\\.)*"\s*'
                      r'|"(?:[^"\\]|\\.)*"\s*|)$')


def _po(path: str, text: str, overwrite: bool, tgt_lang: str | None) -> Document:
    import polib

    _check_po(path, text.split("\n"))
    try:
        po = polib.pofile(text, wrapwidth=_po_width(text))
    except (OSError, ValueError) as e:
        m = re.search(r"line (\d+)", str(e))
        raise InputError(path, int(m.group(1)) if m else 1, f"not a PO file ({e})") from None
    rule = _plural_rule(po.metadata.get("Plural-Forms", ""), tgt_lang or po.metadata.get("Language", ""))
    nplurals = int(re.search(r"nplurals=(\d+)", rule).group(1))
    todo, segments = [], []
    for entry in po:
        if entry.obsolete or not entry.msgid:
            continue
        done = any(entry.msgstr_plural.values()) if entry.msgid_plural else bool(entry.msgstr)
        if done and not overwrite:
            continue
        sources = [entry.msgid] + ([entry.msgid_plural] if entry.msgid_plural else [])
        spans = []
        for source in sources:  # (its lines, or an ICU message's case texts: lingui's catalogues)
            reqs, join = _message(source, path, entry.linenum)
            spans.append((len(reqs), join))
            segments += reqs
        todo.append((entry, spans))

    def write(outs: list[str]) -> str:
        pos, filled = 0, []
        for entry, spans in todo:
            texts = []
            for n, join in spans:
                texts.append(join(outs[pos : pos + n]))
                pos += n
            if entry.msgid_plural:  # (form 0 the singular's translation, the others the plural's)
                entry.msgstr_plural = {k: texts[0] if k == 0 else texts[1] for k in range(nplurals)}
            else:
                entry.msgstr = texts[0]
            filled.append(entry)
        header = {}
        if tgt_lang and todo and not po.metadata.get("Language"):
            header["Language"] = tgt_lang
        if any(entry.msgid_plural for entry, _ in todo) and rule != po.metadata.get("Plural-Forms"):
            if rule == _GETTEXT_DEFAULT:
                warn(f"{path}: no Plural-Forms header and no known target language: wrote gettext's default "
                     f"({rule}); set the catalogue's Language header (or --tgt-lang) for the language's own rule")
            header["Plural-Forms"] = rule
        return _po_spliced(text, [e for e in po if not e.obsolete and e.msgid], filled, header, _po_width(text))

    return Document(segments, write)


def _po_entries(lines: list[str]) -> list[dict]:
    """Each entry of a PO file (checked by _check_po) by its lines: `comments` (the first comment line's index),
    `keys` (its first keyword line's), `msgid` (the msgid's first line), `msgstr` ((first, end) of its msgstr
    lines, continuation strings included); obsolete entries (#~) are comments."""
    entries, comments, current, block = [], None, None, None
    for k, line in enumerate(lines):
        stripped = line.strip()
        keyword = stripped.split(None, 1)[0] if stripped and not stripped.startswith(("#", '"')) else None
        if keyword is None and stripped.startswith('"'):
            if block == "msgstr":
                current["msgstr"][1] = k + 1
            continue
        if keyword is None:  # a comment or a blank line: the entry before (if any) has ended
            block = None
            if stripped.startswith("#") and comments is None:
                comments = k
            if not stripped:
                comments = None
            continue
        if keyword in ("msgctxt", "msgid") and block in (None, "msgstr"):
            current = {"comments": comments if comments is not None else k, "keys": k, "msgid": None,
                       "msgstr": None}
            entries.append(current)
            comments = None
        block = "msgstr" if keyword.startswith("msgstr") else keyword
        if keyword == "msgid":
            current["msgid"] = k
        if block == "msgstr" and current["msgstr"] is None:
            current["msgstr"] = [k, k + 1]
        elif block == "msgstr":
            current["msgstr"][1] = k + 1
    return entries


def _po_spliced(text: str, entries, filled, header: dict, width: int) -> str:
    """The PO file `text` with the `filled` entries' msgstr lines written in place and each marked fuzzy, the
    `header` fields set: every other byte as it was (polib's writer re-wraps comments; a URL broke at a hyphen)."""
    import polib

    lines = text.split("\n")
    spans = _po_entries(lines)
    is_header = [lines[s["msgid"]].strip() == 'msgid ""' and s["keys"] == s["msgid"]
                 and not lines[s["msgid"] + 1].lstrip().startswith('"') for s in spans]
    spans = [s for s, h in zip(spans, is_header) if not h] if len(spans) == len(entries) + 1 else spans
    if len(spans) != len(entries):  # (what the line scanner and polib read must agree; else polib writes it)
        raise TfcliError("internal: the PO entries read two ways differ")
    at = {id(e): s for e, s in zip(entries, spans)}
    edits = []  # (first line, end line, new lines), applied from the end
    for entry in filled:
        s = at[id(entry)]
        new = polib.POEntry(msgid=entry.msgid, msgid_plural=entry.msgid_plural, msgstr=entry.msgstr,
                            msgstr_plural=entry.msgstr_plural).__unicode__(width).split("\n")
        edits.append((s["msgstr"][0], s["msgstr"][1], [x for x in _from_msgstr(new)]))
        comments = lines[s["comments"]:s["keys"]]
        flags = next((s["comments"] + i for i, c in enumerate(comments) if c.startswith("#,")), None)
        if flags is not None and "fuzzy" not in re.split(r"[,\s]+", lines[flags]):
            edits.append((flags, flags + 1, [lines[flags].rstrip() + ", fuzzy"]))
        elif flags is None:
            before = next((s["comments"] + i for i, c in enumerate(comments) if c.startswith("#|")), s["keys"])
            edits.append((before, before, ["#, fuzzy"]))
    if header and len(is_header) and is_header[0]:
        edits.append(_header_edit(lines, _po_entries(lines)[0], header))
    for first, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[first:end] = new
    return "\n".join(lines)


def _from_msgstr(lines: list[str]) -> list[str]:
    """The msgstr lines of polib's rendering of an entry (its msgstr keyword line to its last string line)."""
    start = next(i for i, line in enumerate(lines) if line.startswith("msgstr"))
    end = max(i for i, line in enumerate(lines) if line.startswith(("msgstr", '"'))) + 1
    return lines[start:end]


def _header_edit(lines: list[str], span: dict, fields: dict) -> tuple[int, int, list[str]]:
    """The header entry's msgstr lines with `fields` set: a field's line replaced where it is there, else added
    after the last."""
    first, end = span["msgstr"]
    block = list(lines[first:end])
    for name, value in fields.items():
        line = f'"{name}: {value}\\n"'
        k = next((i for i, x in enumerate(block) if x.startswith(f'"{name}:')), None)
        if k is None:
            block.append(line)
        else:
            block[k] = line
    return first, end, block


def _check_po(path: str, lines: list[str]) -> None:
    """Every line a PO line, and every entry's keywords in order (msgctxt, msgid, msgid_plural, msgstr or
    msgstr[n]): a msgid without its msgstr is an InputError naming its line (polib would fold it into the next
    entry, which would vanish from the output)."""
    open_at = None  # the line of a msgid whose msgstr has not come yet
    for k, line in enumerate(lines):
        if not _PO_LINE.match(line):
            raise InputError(path, k + 1, f"not a PO line (a keyword and a quoted string, a string, or a # comment): "
                                          f"{line.strip()[:60]!r}")
        keyword = line.split(None, 1)[0] if line.strip() and not line.lstrip().startswith(("#", '"')) else None
        if keyword in ("msgctxt", "msgid") and open_at is not None:
            raise InputError(path, open_at, "a msgid without its msgstr (each entry: msgid, then msgstr)")
        if keyword == "msgid":
            open_at = k + 1
        elif keyword is not None and keyword.startswith("msgstr"):
            open_at = None
    if open_at is not None:
        raise InputError(path, open_at, "a msgid without its msgstr (each entry: msgid, then msgstr)")


_GETTEXT_DEFAULT = "nplurals=2; plural=(n != 1);"
# gettext's plural rules (its manual's "Plural forms"; Django's and Babel's catalogues use the same), by language
_PLURAL_RULES = {
    "nplurals=1; plural=0;": "ja ko vi zh th id ms lo km my",
    _GETTEXT_DEFAULT: "en de nl sv da no nb nn fo es it pt bg el fi et he eo hu ca gl eu af sq tr az ka kk hi bn ur "
                      "fa sw ta te mr",
    "nplurals=2; plural=(n > 1);": "fr pt_BR br oc",
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);":
        "ru uk be sr hr bs",
    "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;": "cs sk",
    "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);": "pl",
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && (n%100<10 || n%100>=20) ? 1 : 2);": "lt",
    "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n != 0 ? 1 : 2);": "lv",
    "nplurals=3; plural=(n==1 ? 0 : (n==0 || (n%100 > 0 && n%100 < 20)) ? 1 : 2);": "ro",
    "nplurals=3; plural=n==1 ? 0 : n==2 ? 1 : 2;": "ga",
    "nplurals=4; plural=(n%100==1 ? 0 : n%100==2 ? 1 : n%100==3 || n%100==4 ? 2 : 3);": "sl",
    "nplurals=6; plural=(n==0 ? 0 : n==1 ? 1 : n==2 ? 2 : n%100>=3 && n%100<=10 ? 3 : n%100>=11 ? 4 : 5);": "ar",
}
_PLURAL_BY_LANGUAGE = {lang: rule for rule, langs in _PLURAL_RULES.items() for lang in langs.split()}
# (three-letter codes, as tc-big and NLLB models name languages, of the languages above)
_ISO3 = {"eng": "en", "deu": "de", "fra": "fr", "spa": "es", "por": "pt", "ita": "it", "nld": "nl", "rus": "ru",
         "ukr": "uk", "pol": "pl", "ces": "cs", "slk": "sk", "jpn": "ja", "kor": "ko", "zho": "zh", "cmn": "zh",
         "ara": "ar", "arb": "ar", "tur": "tr", "swe": "sv", "dan": "da", "fin": "fi", "hun": "hu", "ron": "ro",
         "bul": "bg", "ell": "el", "heb": "he", "lit": "lt", "lav": "lv", "slv": "sl", "hrv": "hr", "srp": "sr",
         "vie": "vi", "tha": "th", "ind": "id", "cat": "ca", "est": "et", "gle": "ga", "hin": "hi", "pes": "fa"}


def _plural_rule(header: str, language: str) -> str:
    """The catalogue's Plural-Forms: its header's where it has a real one, else the target language's (a code such
    as fr, pt_BR, fra_Latn or por), else gettext's default (two forms, n != 1)."""
    if re.search(r"nplurals\s*=\s*\d+\s*;\s*plural\s*=", header):
        return header.strip()
    code = language.strip().replace("-", "_")
    parts = code.split("_")
    for key in (code, parts[0].lower(), _ISO3.get(parts[0].lower(), "")):
        if key in _PLURAL_BY_LANGUAGE:
            return _PLURAL_BY_LANGUAGE[key]
    return _GETTEXT_DEFAULT


def _po_width(text: str) -> int:
    """The line width the file was wrapped to (gettext's 79 unless a longer string line shows a wider one)."""
    longest = max((len(line) for line in text.split("\n") if line.startswith('"')), default=0)
    return 79 if longest <= 80 else longest + 1


# --- xliff --------------------------------------------------------------------------------------------------------

def _xliff(path: str, text: str, overwrite: bool, tgt_lang: str | None) -> Document:
    from lxml import etree

    try:
        root = etree.fromstring(text.encode(), etree.XMLParser(remove_blank_text=False, resolve_entities=False))
    except etree.XMLSyntaxError as e:
        raise InputError(path, e.lineno or 1, f"not well-formed XML ({e.msg})") from None
    ns = etree.QName(root).namespace or ""
    version = root.get("version", "")
    if etree.QName(root).localname != "xliff" or not version.startswith(("1.", "2.")):
        raise InputError(path, 1, "not an XLIFF file (an <xliff version=\"1.2\" or \"2.x\"> root)")
    q = (lambda name: f"{{{ns}}}{name}") if ns else (lambda name: name)
    holders = root.iter(q("trans-unit")) if version.startswith("1.") else root.iter(q("segment"))
    todo, segments = [], []
    for holder in holders:
        if not _translatable(holder):
            continue
        source = holder.find(q("source"))
        target = holder.find(q("target"))
        if source is None or (target is not None and _inner(target, ns).strip() and not overwrite):
            continue
        inner = _inner(source, ns)
        if not inner.strip():
            continue
        reqs, join = _message(inner, path, source.sourceline or 1, "xml")
        if reqs:
            segments += reqs
            todo.append((holder, source, target, len(reqs), join))

    def write(outs: list[str]) -> str:
        return _xliff_written(path, text, root, q, version, todo, outs, tgt_lang)

    return Document(segments, write)


def _xliff_written(path: str, text: str, root, q, version: str, todo: list, outs: list[str],
                   tgt_lang: str | None) -> str:
    """The XLIFF document `text` with each of `todo`'s (holder, source, target) given its translation in `outs`,
    written into the document's own text: a target replaced, or a new one after its source (indented as the
    source is), the states and target language set; every other byte as it was (lxml's writer rewrote
    &apos;, line breaks in attribute values and CDATA)."""
    from lxml import etree

    tags = _xml_tags(text)
    elements = list(root.iter(tag=etree.Element))
    if len(tags) != len(elements):  # (what the tag scanner and lxml read must agree)
        raise TfcliError("internal: the XLIFF elements read two ways differ")
    at = {id(e): t for e, t in zip(elements, tags)}
    edits = []  # (start, end, new text)
    pos = 0
    for holder, source, target, n, join in todo:
        out, pos = join(outs[pos:pos + n]), pos + n
        state = "needs-review-translation" if version.startswith("1.") else None
        if target is not None:
            t = at[id(target)]
            open_tag = _with_attribute(text[t[0]:t[1]].rstrip("/>").rstrip() + ">", "state", state)
            edits.append((t[0], t[3], f"{open_tag}{out}</{_qname(open_tag)}>"))
        else:  # (after its source, indented as the source is)
            s = at[id(source)]
            indent = re.search(r"\s*$", text[:s[0]]).group()
            name = _qname(text[s[0]:s[1]]).replace("source", "target")
            state_attr = f' state="{state}"' if state else ""
            edits.append((s[3], s[3], f"{indent}<{name}{state_attr}>{out}</{name}>"))
        if not version.startswith("1."):
            h = at[id(holder)]
            edits.append((h[0], h[1], _with_attribute(text[h[0]:h[1]], "state", "translated")))
    if todo and tgt_lang:  # (XLIFF 2 wants trgLang on a document with targets; 1.2 target-language on a file)
        for e, name in ([(root, "trgLang")] if version.startswith("2.") else
                        [(f, "target-language") for f in root.iter(q("file"))]):
            if e.get(name) is None:
                t = at[id(e)]
                edits.append((t[0], t[1], _with_attribute(text[t[0]:t[1]], name, tgt_lang)))
    if todo and version.startswith("2.") and root.get("trgLang") is None and not tgt_lang:
        warn(f"{path}: XLIFF 2 wants trgLang on <xliff> once it holds targets, and the target language is not "
             "known here: set it in the file (or give a multilingual model's --tgt-lang)")
    out = _spliced(text, edits)
    try:  # (the targets are the markup stage's well-formed renderings; checked, never assumed)
        etree.fromstring(out.encode(), etree.XMLParser(resolve_entities=False))
    except etree.XMLSyntaxError as e:
        raise TfcliError(f"{path}: internal: the translated XLIFF is not well-formed ({e.msg})") from None
    return out


_XML_TOKEN = re.compile(r"<!--.*?-->|<!\[CDATA\[.*?\]\]>|<\?.*?\?>|<!DOCTYPE(?:[^\[>]|\[[^\]]*\])*>"
                        r"|</([\w:.-]+)\s*>|<([\w:.-]+)(?:\s+[\w:.-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*\s*(/?)>", re.DOTALL)


def _xml_tags(text: str) -> list[tuple[int, int, int, int]]:
    """Each element of an XML document, in document order (lxml's iter()): (start tag's start, its end, end tag's
    start, its end) as offsets into `text`; a self-closing element's end tag is its start tag."""
    out, open_ = [], []
    for m in _XML_TOKEN.finditer(text):
        if m.group(2):  # a start tag
            out.append([m.start(), m.end(), m.start(), m.end()])
            if not m.group(3):
                open_.append(len(out) - 1)
        elif m.group(1):  # an end tag
            k = open_.pop()
            out[k][2], out[k][3] = m.start(), m.end()
    return [tuple(t) for t in out]


def _qname(tag: str) -> str:
    return re.match(r"</?([\w:.-]+)", tag).group(1)


def _with_attribute(tag: str, name: str, value: str | None) -> str:
    """A start tag with attribute `name` set to `value` (replaced where it has one, else added last); None: as
    it is."""
    if value is None:
        return tag
    attr = re.compile(rf"""(\s{re.escape(name)}\s*=\s*)(?:"[^"]*"|'[^']*')""")
    if attr.search(tag):
        return attr.sub(lambda m: f'{m.group(1)}"{value}"', tag, count=1)
    end = len(tag) - (2 if tag.endswith("/>") else 1)
    return f'{tag[:end].rstrip()} {name}="{value}"{tag[end:]}'


def _spliced(text: str, edits: list[tuple[int, int, str]]) -> str:
    """`text` with each (start, end, new) span replaced, the rest as it was."""
    out, pos = [], 0
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1])):
        out += [text[pos:start], new]
        pos = end
    return "".join(out) + text[pos:]


def _translatable(holder) -> bool:
    """Whether a trans-unit (1.2) or segment (2.x) is to be translated: the `translate` of the nearest element
    around it (itself included) that has one, as both versions inherit it (yes where none has)."""
    for e in (holder, *holder.iterancestors()):
        if e.get("translate") is not None:
            return e.get("translate") != "no"
    return True


def _declarations(element) -> str:
    """The namespace declarations in scope at `element`, as attributes."""
    return "".join(f' xmlns="{uri}"' if prefix is None else f' xmlns:{prefix}="{uri}"'
                   for prefix, uri in element.nsmap.items())


def _inner(element, ns: str) -> str:
    """An element's content as XML text, its children written without the namespace declarations in scope
    around them (those of the document)."""
    from lxml import etree

    out = markups.xml_escape(element.text or "")
    for child in element:
        out += etree.tostring(child, encoding="unicode", with_tail=True)
    for declaration in re.findall(r'\s(?:xmlns(?::[\w.-]+)?="[^"]*")', _declarations(element)):
        out = out.replace(declaration, "")
    return out


# --- json ---------------------------------------------------------------------------------------------------------

_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"(\s*:)?')


def _json(path: str, text: str, overwrite: bool, tgt_lang: str | None) -> Document:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(path, e.lineno, f"not valid JSON ({e.msg} at column {e.colno})") from None
    spans_at = [m.span() for m in _JSON_STRING.finditer(text) if not m.group(1)]  # (string values, in order)
    strings: list[tuple[list, object]] = []

    def walk(node, trail):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, trail + [k])
        elif isinstance(node, list):
            for k, v in enumerate(node):
                walk(v, trail + [k])
        elif isinstance(node, str):
            strings.append((trail, node))

    walk(data, [])
    segments, spans, joins = [], [], []
    for n, (trail, value) in enumerate(strings):
        lineno = _line_of(text, spans_at[n][0]) if n < len(spans_at) else 1
        reqs, join = _message(value, path, lineno) if value.strip() else ([], None)
        spans.append(len(reqs))
        joins.append(join)
        segments += reqs
    def write(outs: list[str]) -> str:
        edits, pos = [], 0
        for n_value, ((trail, value), n, join) in enumerate(zip(strings, spans, joins)):
            if not n:
                continue
            new = join(outs[pos : pos + n])
            pos += n
            if new != value and n_value < len(spans_at):  # (written in place: every other byte as it was)
                start, end = spans_at[n_value]
                edits.append((start, end, json.dumps(new, ensure_ascii=False)))
        return _spliced(text, edits)

    return Document(segments, write)


READERS = {"html-page": _html_page, "markdown": _markdown, "srt": _subtitles("srt"), "vtt": _subtitles("vtt"),
           "po": _po, "xliff": _xliff, "json": _json}
assert set(READERS) == set(FILE_FORMATS)

