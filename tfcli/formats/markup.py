"""Inline markup in a segment: the tags taken out, the text translated alone, each tag put back by word alignment.

A segment (`Click <b>Save</b> and <a href="x">continue</a>.`) is read into a `Markup`: its plain text (whitespace
runs one space), and a tree of `Node`s over it. A paired node (`<b>`...`</b>`, a Markdown `**`...`**`) covers the
source words its content is in; a fixed node (a void element such as `<br/>`, a placeholder `%d`, a non-translatable
element such as `<code>ls</code>`) is copied whole and sits between words. The plain text is what is translated, so
the output with its tags removed is the translation of the text without them (the exactness rule tests hold us to).

`render` puts the nodes back around the target words aligned (tfcli.generate.alignment) to their source words, as
Bergamot (Firefox Translations) does for HTML: a paired node spans the first to the last target word aligned to any
of its words, clipped to its parent's span; siblings are laid out in source order without overlapping (an overlap
shared), so the tree stays the source's tree (same elements, same nesting, same order) and the output is
well-formed; a node whose words have no
aligned target word, and every fixed node, is placed next to the target words of its neighbouring source word (the
one it is written against). Torch-free; the readers (xml, html, markdown) feed a `Builder`.
"""

from __future__ import annotations

import bisect
import difflib
import html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Callable

PREV, NEXT, ALONE = "prev", "next", "alone"  # a fixed node's place: stuck to the word before, after, or spaced


@dataclass(eq=False)
class Node:
    """An element over the plain text's characters [start, end). Paired: `open` and `close` written around its
    content; fixed: `open` is the whole item, written as it was (`glue`: where it stands against the words)."""

    open: str = ""
    close: str = ""
    start: int = 0
    end: int = 0
    fixed: bool = False
    glue: str = NEXT
    placeholder: bool = False  # a fixed node that is text (%d, a URL, <code>..</code>), not a tag
    children: list["Node"] = field(default_factory=list)

    def walk(self):
        for c in self.children:
            yield c
            yield from c.walk()


ATTRIBUTES = ("alt", "title", "placeholder", "aria-label")  # HTML attributes whose values are text to translate
_ATTRIBUTE = re.compile(r"""\s(%s)\s*=\s*(?:"([^"]*)"|'([^']*)')""" % "|".join(ATTRIBUTES), re.IGNORECASE)


def text_attributes(tag: str) -> list[tuple[int, int]]:
    """Where the values of a start tag's `ATTRIBUTES` that hold text are, (start, end) in `tag`, last first."""
    out = []
    for m in _ATTRIBUTE.finditer(tag):
        group = 2 if m.group(2) is not None else 3
        if m.group(group).strip():
            out.append(m.span(group))
    return out[::-1]


@dataclass(eq=False)
class Attribute:
    """An attribute value that is text (`ATTRIBUTES`): characters [start, end) of its node's `open`, and the value
    unescaped (what is translated)."""

    node: Node
    start: int
    end: int
    text: str


@dataclass
class Markup:
    """A segment read: `plain` (what is translated), the node tree under `root`, and how a target word is written
    (`escape`: XML and HTML escape &, < and >)."""

    plain: str
    root: Node
    escape: Callable[[str], str] = staticmethod(lambda s: s)
    attributes: list["Attribute"] = field(default_factory=list)  # attribute values translated on their own

    @property
    def nodes(self) -> list[Node]:
        return list(self.root.walk())

    def render(self, target: str, alignment: list[tuple[int, int]] | None, src_words: list[str] | None = None,
               attributes: list[str] | None = None) -> str:
        """`target` (the translation of `plain`) with the nodes put back. `alignment`: (source word, target word)
        pairs, the source words being `src_words` (the words the aligner saw: the decoded source), mapped here onto
        `plain`'s words; None or [] puts every node next to its neighbours by position alone. `attributes`: the
        translations of `self.attributes`' values (None: as they were)."""
        words = target.split()
        if not self.root.children:
            return " ".join(self.escape(w) for w in words)
        opens: dict[Node, str] = {}
        for a, text in zip(self.attributes, attributes or ()):  # (from the last in a tag, so offsets hold)
            tag = opens.get(a.node, a.node.open)
            opens[a.node] = tag[: a.start] + html.escape(text) + tag[a.end :]
        src_map = _word_map(src_words, self.plain.split()) if src_words is not None else None
        to_tgt: dict[int, list[int]] = {}
        for i, j in alignment or ():
            if src_map is not None:
                if i >= len(src_map):
                    continue
                i = src_map[i]
            if 0 <= j < len(words):
                to_tgt.setdefault(i, []).append(j)
        return _Layout(self, words, to_tgt, opens).text()


def _word_map(aligned: list[str], plain: list[str]) -> list[int]:
    """For each word of `aligned` (a tokenizer's decoding of `plain`), the word of `plain` it is in: the words
    that are the same matched as words, the stretches between them character by character without spaces
    (difflib, where the tokenizer changed characters or spaces)."""
    if not plain:
        return [0] * len(aligned)
    out: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, aligned, plain, autojunk=False).get_opcodes():
        if tag == "equal":
            out += range(j1, j2)
        elif j1 == j2:  # (words the tokenizer added: with the plain word before them)
            out += [min(max(j1 - 1, 0), len(plain) - 1)] * (i2 - i1)
        else:
            out += [j1 + k for k in _char_map(aligned[i1:i2], plain[j1:j2])]
    return out


def _char_map(aligned: list[str], plain: list[str]) -> list[int]:
    """`_word_map` of a stretch whose words differ: characters matched, spaces left out."""
    a, p = "".join(aligned), "".join(plain)
    owner_p = [k for k, w in enumerate(plain) for _ in w]
    starts, pos = [], 0
    for w in aligned:
        starts.append(pos)
        pos += len(w)
    if a == p:
        return [owner_p[s] if s < len(owner_p) else len(plain) - 1 for s in starts]
    where = [-1] * len(a)
    for blk in difflib.SequenceMatcher(None, a, p, autojunk=False).get_matching_blocks():
        for k in range(blk.size):
            where[blk.a + k] = owner_p[blk.b + k]
    out = []
    for s, w in zip(starts, aligned):
        hits = [where[s + k] for k in range(len(w)) if where[s + k] >= 0]
        out.append(hits[0] if hits else min(round(s * len(plain) / max(len(a), 1)), len(plain) - 1))
    return out


class _Layout:
    """The nodes placed over the target words, then written out."""

    def __init__(self, markup: Markup, words: list[str], to_tgt: dict[int, list[int]], opens: dict[Node, str]):
        self.m, self.words, self.to_tgt, self.opens = markup, words, to_tgt, opens
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", markup.plain)]
        self.starts, self.ends = [s for s, _ in spans], [e for _, e in spans]
        self.span: dict[Node, tuple[int, int]] = {}
        self._place(markup.root, 0, len(words))

    def _src_words(self, node: Node) -> range:
        """The source words that intersect the node's characters."""
        return range(bisect.bisect_right(self.ends, node.start), bisect.bisect_left(self.starts, node.end))

    def _anchor(self, node: Node, words: range) -> int:
        """The target boundary (0..n) a node without aligned words goes to: after the target words of the source
        word before it, or before those of the word after it (the one a fixed node is stuck to first)."""
        before = bisect.bisect_right(self.ends, node.start) - 1 if not words else words.start - 1
        after = bisect.bisect_left(self.starts, node.end) if not words else words.stop
        if node.fixed and 0 <= before + 1 < len(self.starts) and self.starts[before + 1] < node.start:
            after = before + 1  # (inside a word, `(<code>)`: before its translation, or inside it: _cut)
        sides = [("prev", before), ("next", after)]
        if (node.glue != PREV) if node.fixed else before < 0:
            sides.reverse()
        for side, w in sides:
            tgt = self.to_tgt.get(w)
            if tgt:
                return max(tgt) + 1 if side == "prev" else min(tgt)
        if before < 0:
            return 0
        if after >= len(self.starts):
            return len(self.words)
        return round(len(self.words) * after / max(len(self.starts), 1))

    def _want(self, node: Node) -> tuple[int, int]:
        words = self._src_words(node) if not node.fixed else range(0)
        if words and words.start == 0 and words.stop == len(self.starts):
            return 0, len(self.words)  # (an element around all the words: around all the translation's)
        tgt = [j for w in words for j in self.to_tgt.get(w, ())]
        if tgt:
            return min(tgt), max(tgt) + 1
        if words and self.words:  # (words aligned to nothing: the same share of the translation, a word at least)
            scale = len(self.words) / len(self.starts)
            a = min(int(words.start * scale), len(self.words) - 1)
            return a, max(a + 1, round(words.stop * scale))
        at = self._anchor(node, words)
        return at, at

    def _place(self, node: Node, lo: int, hi: int) -> None:
        self.span[node] = (lo, hi)
        wants = []
        for k, c in enumerate(node.children):
            a, b = self._want(c)
            a = min(max(a, lo), hi)
            wants.append((a, k, min(max(b, a), hi), c))
        cur = lo  # (siblings in source order: the output has the source's elements, in the source's order)
        for k, (a, _, b, c) in enumerate(wants):
            a = max(a, cur)
            b = max(b, a)
            if k + 1 < len(wants) and b > wants[k + 1][0] and b > a:  # (overlapping the next: the overlap shared)
                na, nb = wants[k + 1][0], wants[k + 1][2]
                b = max(a + 1, min((max(na, a) + b) // 2, nb - 1) if nb > max(na, a) else b)
            self._place(c, a, b)
            cur = b

    def _items(self, node: Node, lo: int, hi: int) -> list:
        """The node's content over target words [lo, hi): words (ints) and (text, side, cut) pieces, in order;
        `cut`: a tag that goes that many characters inside the word next to it (before a comma, after a quote)."""
        out, j = [], lo
        for c in node.children:
            a, b = self.span[c]
            out += list(range(j, a))
            tag = self.opens.get(c, c.open)
            if c.fixed:
                out.append((tag, c.glue, self._cut(c.start, a, lead=True) if c.glue == NEXT else 0))
            else:
                inner = self._items(c, a, b)
                out += [(tag, NEXT, self._cut(c.start, a, lead=True) if b > a else 0)] + inner
                out.append((c.close, PREV, self._cut(c.end, b - 1, lead=False) if b > a else 0))
            j = b
        return out + list(range(j, hi))

    def _cut(self, at: int, j: int, lead: bool) -> int:
        """Where an element's edge `at` falls inside a source word, the rest of that word's side being punctuation
        (`continue</a>.`, `"<b>word`), and target word j has the same punctuation there: its length, else 0."""
        w = bisect.bisect_right(self.ends, at) if lead else bisect.bisect_left(self.starts, at) - 1
        if not 0 <= w < len(self.starts) or not self.starts[w] < at < self.ends[w] or not 0 <= j < len(self.words):
            return 0
        rest = self.m.plain[self.starts[w] : at] if lead else self.m.plain[at : self.ends[w]]
        target = self.words[j]
        if not all(ch in _PUNCT for ch in rest) or len(target) <= len(rest):
            return 0
        return len(rest) if (target.startswith(rest) if lead else target.endswith(rest)) else 0

    def text(self) -> str:
        items = self._items(self.m.root, 0, len(self.words))
        out, gap, seen_word, k = [], [], False, 0
        while True:
            it = items[k] if k < len(items) else None
            k += 1
            if isinstance(it, tuple):
                gap.append(it)
                continue
            inside = []  # opening tags that go inside the word after, after its leading punctuation
            while it is not None and gap and gap[-1][1] == NEXT and gap[-1][2]:
                inside.insert(0, gap.pop())
            out.append(_gap([(t, side) for t, side, _ in gap], before=seen_word, after=it is not None))
            gap = []
            if it is None:
                return "".join(out)
            word = self.m.escape(self.words[it])
            if inside:
                n = inside[0][2]
                word = word[:n] + "".join(t for t, _, _ in inside) + word[n:]
            closing = []  # closing tags that go inside this word, before its trailing punctuation
            while k < len(items) and isinstance(items[k], tuple) and items[k][1] == PREV and items[k][2]:
                closing.append(items[k])
                k += 1
            if closing:
                n = closing[0][2]
                word = word[:-n] + "".join(t for t, _, _ in closing) + word[-n:]
            out.append(word)
            seen_word = True


_PUNCT = set(".,;:!?)]}\"'«»“”‘’…(¿¡[{")


def _gap(pieces: list[tuple[str, str]], before: bool, after: bool) -> str:
    """The pieces between two words (`before`/`after`: a word is there) with the spaces between them: the words'
    one space before the first piece not stuck to the word before (else after the last), and a space on each side
    of a spaced (ALONE) piece where something stands, the opening tags just before it and the closing ones just
    after it going with it (`[![badge](b.svg)](url)`: spaced as a whole)."""
    m = len(pieces)
    space = [False] * (m + 1)  # space[b]: a space before piece b (b == m: before the word after)
    if before and after:
        space[next((i for i, (_, side) in enumerate(pieces) if side != PREV), m)] = True
    for i, (_, side) in enumerate(pieces):
        if side == ALONE:
            a, z = i, i
            while a > 0 and pieces[a - 1][1] == NEXT:
                a -= 1
            while z < m - 1 and pieces[z + 1][1] == PREV:
                z += 1
            space[a] = space[a] or a > 0 or before
            space[z + 1] = space[z + 1] or z < m - 1 or after
    out = [(" " if space[b] else "") + text for b, (text, _) in enumerate(pieces)]
    return "".join(out) + (" " if space[m] else "")


class Builder:
    """Collects a segment as it is read: text (unescaped; `protect` finds the placeholders in it, each made a
    fixed node written as `escape` writes it), tags and fixed items; `done()` gives the Markup."""

    def __init__(self, protect: re.Pattern | None = None, escape: Callable[[str], str] | None = None):
        self.protect, self.escape = protect, escape or (lambda s: s)
        self.plain: list[str] = []
        self.size = 0
        self.space = True  # the plain text so far ends in a space (or is empty)
        self.stack = [Node()]
        self.waiting: list[tuple[Node, bool]] = []  # fixed nodes not yet knowing what follows, and what came before

    def text(self, s: str) -> None:
        pos = 0
        for m in self.protect.finditer(s) if self.protect else ():
            if m.end() > m.start():
                self._text(s[pos : m.start()])
                self.fixed(self.escape(m.group()), placeholder=True)
                pos = m.end()
        self._text(s[pos:])

    def _text(self, s: str) -> None:
        for part in re.split(r"(\s+)", s):
            if not part:
                continue
            self._settle(part[0].isspace())
            if not part[0].isspace():
                self.plain.append(part)
                self.size += len(part)
                self.space = False
            elif not self.space:
                self.plain.append(" ")
                self.size += 1
                self.space = True

    def _settle(self, space_after: bool) -> None:
        """The waiting fixed nodes' glue, now that what follows them is known."""
        for node, space_before in self.waiting:
            if space_before and space_after:  # (spaced on both sides in the source: spaced in the output)
                node.glue = ALONE
            else:
                node.glue = PREV if space_after else NEXT
        self.waiting = []

    def open(self, tag: str, breaks: bool = False) -> None:
        """An element opens here; `breaks`: a block element, a space between words before it and after its end."""
        if breaks:
            self._text(" ")
        node = Node(open=tag, start=self.size)
        self.stack[-1].children.append(node)
        self.stack.append(node)

    def close(self, tag: str, breaks: bool = False) -> None:
        if breaks:
            self._text(" ")
        node = self.stack.pop()
        node.close, node.end = tag, self.size

    def fixed(self, item: str, placeholder: bool = False, breaks: bool = False) -> None:
        """A fixed node here; `breaks`: it stands for a space between words (HTML's <br>)."""
        if breaks:
            self._text(" ")
        node = Node(open=item, start=self.size, end=self.size, fixed=True, placeholder=placeholder)
        self.stack[-1].children.append(node)
        self.waiting.append((node, self.space))

    @property
    def depth(self) -> int:
        """Elements open now."""
        return len(self.stack) - 1

    def done(self) -> Markup:
        self._settle(True)
        plain = "".join(self.plain)
        if plain.endswith(" "):
            plain = plain[:-1]
        for node in self.stack[0].walk():
            node.start, node.end = min(node.start, len(plain)), min(node.end, len(plain))
        return Markup(plain, self.stack[0], self.escape)


def xml_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(s: str) -> str:
    return html.unescape(s)


class MarkupError(ValueError):
    """A segment that does not parse (malformed XML): `column` (1-based) says where."""

    def __init__(self, message: str, column: int | None = None):
        super().__init__(message)
        self.column = column


# HTML elements that never have content, and those whose content is never translated
VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())
KEEP = frozenset("code kbd samp var script style pre math svg".split())
BLOCK = frozenset("address article aside blockquote dd div dl dt figcaption figure footer form h1 h2 h3 h4 h5 h6 "
                  "header hr li main nav ol p section table tbody td tfoot th thead tr ul br".split())


def untranslated(name: str, attrs: dict, keep: frozenset) -> bool:
    """Whether an element's content is copied untouched: its name is kept, or it says translate="no" or has the
    class notranslate (Google's and DeepL's convention)."""
    return (name.lower() in keep or str(attrs.get("translate", "")).lower() == "no"
            or "notranslate" in str(attrs.get("class", "")).split())


def read_xml(segment: str, protect: re.Pattern | None = None, keep: frozenset = frozenset()) -> Markup:
    """A segment of XML content (text with inline elements, no root): a MarkupError where it is not well-formed.
    Tags, comments and processing instructions are kept as written; `keep`: elements copied whole."""
    import xml.parsers.expat as expat

    head, tail = "<_tfcli_>", "</_tfcli_>"
    data = (head + segment + tail).encode()
    parser = expat.ParserCreate()
    events: list = []
    parser.StartElementHandler = lambda n, a: events.append(("open", parser.CurrentByteIndex, n, a))
    parser.EndElementHandler = lambda n: events.append(("close", parser.CurrentByteIndex, n, None))
    parser.CharacterDataHandler = lambda d: events.append(("text", parser.CurrentByteIndex, d, None))
    parser.CommentHandler = lambda d: events.append(("fixed", parser.CurrentByteIndex, d, None))
    parser.ProcessingInstructionHandler = lambda t, d: events.append(("fixed", parser.CurrentByteIndex, t, None))
    parser.DefaultHandler = lambda d: events.append(("fixed", parser.CurrentByteIndex, d, None))
    try:
        parser.Parse(data, True)
    except expat.ExpatError as e:
        column = len(data[: e.offset].decode(errors="replace")) - len(head) + 1 if e.lineno == 1 else None
        raise MarkupError(f"not well-formed XML ({expat.errors.messages[e.code]})", column) from None
    events = events[1:-1]  # (the wrapper)
    bounds = [e[1] for e in events] + [len(data) - len(tail)]
    raw = [data[bounds[i] : bounds[i + 1]].decode() for i in range(len(events))]
    b = Builder(protect, xml_escape)
    i = 0
    while i < len(events):
        kind, _, name, attrs = events[i]
        if kind == "text":
            b.text(name)
        elif kind == "fixed":
            b.fixed(raw[i])
        elif kind == "open" and (untranslated(name, attrs, keep) or raw[i].endswith("/>")):
            j = _matching(events, i)
            b.fixed("".join(raw[i : j + 1]), placeholder=not raw[i].endswith("/>"))
            i = j
        elif kind == "open":
            b.open(raw[i])
        else:
            b.close(raw[i])
        i += 1
    return b.done()


def _matching(events: list, i: int) -> int:
    """The index of the close event of the element opened at events[i]."""
    depth = 0
    for j in range(i, len(events)):
        depth += {"open": 1, "close": -1}.get(events[j][0], 0)
        if depth == 0:
            return j
    return len(events) - 1


def read_html(segment: str, protect: re.Pattern | None = None, keep: frozenset = frozenset(),
              escape: Callable[[str], str] = xml_escape) -> Markup:
    """A segment of HTML (as browsers read it: never an error): void elements fixed, `KEEP` elements and `keep`
    copied whole, an element left open closed by nothing (as written), a stray end tag kept where it stands; the
    text values of `ATTRIBUTES` (alt, title, ...) in `Markup.attributes`, to be translated on their own."""
    b = Builder(protect, escape)
    reader = _HtmlReader(segment, b, KEEP | keep)
    reader.feed(segment)
    reader.close()
    if reader.kept:
        b.fixed(segment[reader.kept[0][1]:], placeholder=True)
    while b.depth:
        b.close("")
    out = b.done()
    out.attributes = reader.attributes
    return out


class _HtmlReader(HTMLParser):
    """read_html's parser: what each of html.parser's events does to the Builder."""

    def __init__(self, segment: str, b: Builder, keep: frozenset):
        super().__init__(convert_charrefs=True)
        self.segment, self.b, self.keep = segment, b, keep
        self.starts = [0] + [m.end() for m in re.finditer("\n", segment)]
        self.kept: list = []  # [(name, start offset, depth)] while inside a kept element
        self.attributes: list[Attribute] = []

    def _at(self) -> int:
        line, col = self.getpos()
        return self.starts[line - 1] + col

    def values(self, node: Node) -> None:
        self.attributes.extend(Attribute(node, a, z, html.unescape(node.open[a:z]))
                               for a, z in text_attributes(node.open))

    def handle_starttag(self, tag, attrs):
        raw, at, b, kept = self.get_starttag_text(), self._at(), self.b, self.kept
        if kept:
            if tag == kept[-1][0] and tag not in VOID:
                kept.append((tag, at))
            return
        if tag in VOID:
            b.fixed(raw, breaks=tag in BLOCK)
            self.values(b.stack[-1].children[-1])
        elif untranslated(tag, dict(attrs), self.keep):
            kept.append((tag, at))
        else:
            b.open(raw, breaks=tag in BLOCK)
            self.values(b.stack[-1])

    def handle_startendtag(self, tag, attrs):
        if not self.kept:
            self.b.fixed(self.get_starttag_text(), breaks=tag in BLOCK)
            self.values(self.b.stack[-1].children[-1])

    def handle_endtag(self, tag):
        at, b, kept = self._at(), self.b, self.kept
        end = self.segment.find(">", at) + 1 or len(self.segment)
        if kept:
            if tag == kept[-1][0]:
                first = kept.pop()
                if not kept:
                    b.fixed(self.segment[first[1] : end], placeholder=True)
            return
        open_names = [_name(n.open) for n in b.stack[1:]]
        if tag not in open_names:
            b.fixed(self.segment[at:end])
            return
        while _name(b.stack[-1].open) != tag:  # (an element left open inside: closed by nothing)
            b.close("")
        b.close(self.segment[at:end], breaks=tag in BLOCK)

    def handle_data(self, data):
        if not self.kept:
            self.b.text(data)

    def _raw(self, text):
        if not self.kept:
            self.b.fixed(text)

    def handle_comment(self, data):
        self._raw(f"<!--{data}-->")

    def handle_decl(self, decl):
        self._raw(f"<!{decl}>")

    def handle_pi(self, data):
        self._raw(f"<?{data}>")


def _name(tag: str) -> str:
    m = re.match(r"<\s*([^\s/>]+)", tag)
    return m.group(1).lower() if m else ""


def read_text(segment: str, protect: re.Pattern | None = None, keep: frozenset = frozenset()) -> Markup:
    """Plain text: only its placeholders (`protect`) made fixed nodes."""
    b = Builder(protect)
    b.text(segment)
    return b.done()


_NUMBERED = re.compile(r"<(/?)(\d+)(\s*/?)>")  # react-i18next's <0>...</0> and <1/>: elements named by a number


def read_tags(segment: str, protect: re.Pattern | None = None, keep: frozenset = frozenset()) -> Markup:
    """A message string with HTML tags in it (a PO msgid, a JSON value): read as HTML, its text written back
    unescaped, as such strings are; numbered tags (react-i18next's `<0>text</0>`, `<1/>`) are elements too."""
    if not _NUMBERED.search(segment):
        return read_html(segment, protect, keep, escape=lambda s: s)
    named = _NUMBERED.sub(lambda m: f"<{m.group(1)}tfcli-n{m.group(2)}{m.group(3)}>", segment)
    out = read_html(named, protect, keep, escape=lambda s: s)
    back = re.compile(r"<(/?)tfcli-n(\d+)")
    for node in out.root.walk():  # (each tag written back as it was)
        node.open, node.close = back.sub(r"<\1\2", node.open), back.sub(r"<\1\2", node.close)
    return out


READERS = {"text": read_text, "xml": read_xml, "html": read_html, "tags": read_tags}  # the markup stage's, by name
