"""`tfcli translate`: lines in, translations out, one for one and in order, so it composes in shell pipelines.

Each line is a `Request` (tfcli/request.py), read in chunks (`buffer_size` lines; one at a time from a
terminal), and goes through the stages docs/architecture.md lists: encode (the checkpoint's tokenizers and language
tokens), split (sentences, windows), search (units sorted by length into batches, `max_tokens` / `batch_size`, so
little compute goes to padding; batched beam or greedy search), join (a line's units on text), format. Batches run
in the order of their earliest line, and each output line is written (and flushed) as soon as every line before it
is done, so output streams while input is still being translated. Empty lines give empty lines (score 0) without
running the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import torch

from tfcli import distributed
from tfcli.data.batching import pad, source_ids, token_batches, width_groups
from tfcli.data.tokenizer import (
    clause_end_ids, continuing_ids, decode_batch, encode_batch, unk_rate, word_start_ids,
)
from tfcli.generate.config import TranslateConfig
from tfcli.console import Progress, info, verbose_enabled, warn
from tfcli.device import precision, resolve_device
from tfcli.generate.loader import Loaded, load_ensemble
from tfcli.generate.glossary import Glossary
from tfcli.generate.lm import text_conventions
from tfcli.checkpoint_meta import tokenizer_path
from tfcli.data.languages import language_tags
from tfcli.generate.prompting import Prompter, read_template, reply_line
from tfcli.formats import files, markup as markups
from tfcli.formats.placeholders import pattern as placeholder_pattern
from tfcli.generate.alignment import (
    Remembered, default_layer, pharaoh, prompt_alignments, token_alignments, word_alignment, word_pairs,
)
from tfcli.request import SIDE_FILES, Request, Translation, jsonl_requests, requests, with_side_file
from tfcli.generate.search import Hypothesis, Rows, SearchOptions, search
from tfcli.generate.shards import translate_in_parts
from tfcli.errors import InputError, NotANumber, TfcliError
from tfcli.specials import EOS_ID, UNK_ID
from tfcli.io import encoding_errors, open_output, read_inputs, read_lines, refuse_overwriting_inputs

UNK_WARN_RATE = 0.1  # warn when more than this share of the input's tokens are <unk>
EMPTY_WARN_RATE = 0.05  # warn when at least this share of the decoded lines (and one at least) come out empty


def _windows(seq: list[int], room: int, starts: set[int] | None, clause_ends: set[int]) -> list[list[int]]:
    """`seq` in consecutive windows of at most `room` tokens, together all of it: each cut after the window's last
    comma, semicolon or colon in its second half, else before its last word start there (`starts`: the tokens that
    start a word, None: all), else at `room`."""
    out, start = [], 0
    while len(seq) - start > room:
        half = [c for c in range(start + room, start + room // 2, -1) if starts is None or seq[c] in starts]
        cut = next((c for c in half if seq[c - 1] in clause_ends), half[0] if half else start + room)
        out.append(seq[start:cut])
        start = cut
    out.append(seq[start:])
    return out


def _starts(text: str, sentences: list[str]) -> list[int]:
    """Where each of `text`'s sentences (in order, as the splitter gave them) starts in it."""
    out, pos = [], 0
    for s in sentences:
        at = text.find(s, pos)
        out.append(at if at >= 0 else pos)
        pos = out[-1] + len(s) if at >= 0 else pos
    return out


def _holds(tokens: list[int], phrase: list[int]) -> bool:
    """Whether `phrase` appears in `tokens`, its tokens in a row."""
    n = len(phrase)
    return any(tokens[i : i + n] == phrase for i in range(len(tokens) - n + 1))


def _times(tokens: list[int], constraint: list) -> int:
    """How often a constraint (a phrase, or alternative phrases) appears in `tokens`, each time after the last
    (as the search counts a constraint given more than once: search.constraint_tensor)."""
    forms = [constraint] if isinstance(constraint[0], int) else constraint
    n, i = 0, 0
    while True:
        ends = [e for f in forms for e in [_end(tokens, f, i)] if e is not None]
        if not ends:
            return n
        n, i = n + 1, min(ends)


def _end(tokens: list[int], phrase: list[int], start: int) -> int | None:
    """Where the first whole `phrase` at or after `start` in `tokens` ends, or None."""
    n = len(phrase)
    return next((i + n for i in range(start, len(tokens) - n + 1) if tokens[i : i + n] == phrase), None)


def _unspaced(c: str) -> bool:
    """Whether `c` belongs to writing that puts no space between sentences: Chinese and Japanese characters and
    their full-width punctuation (U+3000-U+30FF, U+3400-U+9FFF, U+F900-U+FAFF, U+FF00-U+FFEF)."""
    o = ord(c)
    return 0x3000 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF


def _seamless(before: str, after: str) -> bool:
    """Whether two sentences' texts join without a space: both sides of the seam Chinese or Japanese."""
    return _unspaced(before[-1]) and _unspaced(after[0])


def join_sentences(texts: list[str]) -> str:
    """A line's sentence translations as one text: a space between two sentences, none where both sides of the
    seam are Chinese or Japanese ("我很好。" + "你呢？" -> "我很好。你呢？"); empty ones left out."""
    out = ""
    for t in (t for t in texts if t):
        out += t if not out or _seamless(out, t) else " " + t
    return out


@dataclass(eq=False)
class _Line:
    """A request in the works: its 0-based index in the input, its source ids, the ids of its language token (first
    in each source), forced target tokens and prefix, its phrases as target ids, and its units' span."""

    request: Request
    index: int
    ids: list[int]
    lead: int | None
    forced: list[int]
    prefix: list[int]
    avoid: list
    must: list  # its own constraints (the request's), with their texts in `must_text`
    must_text: list[str] = field(default_factory=list)
    terms: list = field(default_factory=list)  # the glossary's matches: (match, constraint ids)
    first: int = 0  # its first unit's index in the chunk's units
    n: int = 0  # and how many
    attributes: list[int] = field(default_factory=list)  # of those, the last ones: each attribute value's (markup)


@dataclass
class _Unit:
    """A source the search translates: a line, one of its sentences, or a window of one (`part`: its place in the
    line); language token first, ending in </s>."""

    line: _Line
    part: int
    src: list[int]
    must: list = field(default_factory=list)  # its constraints as target ids, and their texts (each's first form)
    must_text: list[str] = field(default_factory=list)
    span: tuple[int, int] | None = None  # a decoder-only model's: where in `src` (its prompt) the source's ids are

    @property
    def target(self) -> list[int]:
        """The ids its output starts with: the forced language token, then (the line's first unit) its prefix."""
        return self.line.forced + (self.line.prefix if self.part == 0 else [])


_WHOLE_PAGE = re.compile(r"\s*(<!--.*?-->\s*)*<(!doctype\s+html|html[\s>])", re.IGNORECASE)  # a page's first line

class Pipeline:
    """A loaded model with its tokenizers and settings; turns Requests into translations, one line at a time, in
    the stages docs/architecture.md lists: encode -> split -> search -> join -> format."""

    def __init__(self, loaded: Loaded, cfg: TranslateConfig, device: torch.device, glossary: Glossary | None = None):
        self.steps, self.src_tok, self.tgt_tok = loaded.steps, loaded.src_tok or loaded.tgt_tok, loaded.tgt_tok
        self.glossary = glossary if glossary is not None else Glossary.load(cfg.glossary) if cfg.glossary else None
        self.cfg, self.device = cfg, device
        self.checkpoint = loaded.meta["dir"]
        self.prompter = _prompter(loaded, cfg)  # a decoder-only model's prompts (None: an encoder-decoder)
        self.options = SearchOptions.from_config(cfg, text_conventions(loaded.meta)[1] if self.prompter else ())
        if cfg.input_format in files.FILE_FORMATS and cfg.min_len < 1:  # (an entry with text never gets an empty
            self.options = dataclasses.replace(self.options, min_len=1)  # translation: no output ends at once)
        self.max_len = self.steps.cfg.max_len
        n_layers = self.steps.cfg.n_decoder_layers
        if cfg.alignment_layer > n_layers:
            raise TfcliError(f"--alignment-layer {cfg.alignment_layer}: the model's decoder has {n_layers} layers")
        self.alignment_layer = cfg.alignment_layer or default_layer(n_layers)
        self.languages = loaded.languages
        if self.prompter is None:  # (a prompt names the languages)
            self.languages.check(cfg.src_lang, cfg.tgt_lang)
        self.precision = precision(device, cfg.dtype, loaded.steps.half)
        self.warned_unk = self.warned_empty = False
        # --split-sentences auto: the training sources' 99th percentile in tokens (None: a checkpoint without it);
        # the splitter's language: --src-lang, or the one the training data named (tfcli.data.languages)
        data = loaded.meta.get("data") or {}
        self.trained_len = (data.get("src_len") or {}).get("p99")
        self.on_sentences = data.get("trained_on") == "sentences"  # (an imported model: auto splits every line)
        self.src_lang = cfg.src_lang or data.get("src_lang")
        self.splitters = {}  # language -> the splitter, each made on first use
        self.fixed = loaded.steps.static  # fixed-shape decoding (a GPU's): continuous batching
        self._continuing = None  # (V,) the target pieces that continue a word (made when constraints first come)
        self._cuts = None  # the source pieces that start a word, and those that end a clause (made when needed)
        self.index = 0  # 0-based index of the next input line, across chunks and files
        self.decoded = self.empty = 0  # lines decoded, and of those the ones whose best output is empty
        self.unended = 0  # a decoder-only model's lines whose best reply the length limit cut
        self.constrained = self.unmet = 0  # lines with constraints, and of those the ones whose best output misses one
        self.term_ids: dict = {}  # each glossary term met: its target forms' ids (None: the vocabulary cannot spell it)
        # the markup stage: a line's inline markup (--input-format xml/html, or what a file format's reader says) and
        # its placeholders taken out before encode, put back after join (tfcli/formats/markup.py)
        self.line_markup = cfg.input_format if cfg.input_format in ("xml", "html") else None
        builtin = cfg.placeholders == "always" or (cfg.placeholders == "auto" and cfg.input_format not in (
            "auto", "text", "jsonl"))
        self.protect = placeholder_pattern(builtin, cfg.protect)
        self.keep_tags = frozenset(t.lower() for t in cfg.keep_tags)

    def describe(self) -> str:
        """The decoding plan, one line (what --verbose prints): search, precision and the step's backends."""
        o = self.options
        search = {"greedy": "greedy search", "beam": f"beam search (beam {o.beam_size})",
                  "sampling": "sampling"}[o.mode()]
        members = getattr(self.steps, "members", [self.steps])  # (an ensemble: each model's plan)
        plans = "; ".join(dict.fromkeys(m.plan.describe() for m in members))
        ensemble = f", an ensemble of {len(members)}" if len(members) > 1 else ""
        dtype = self.cfg.dtype
        if all(m.stored for m in members):
            dtype += " (weights stored by tfcli quantize)"
        elif any(m.plan.linear == "int8" for m in members):
            dtype += " (weights quantised at load; tfcli quantize stores them)"
        return f"decoding: {search}{ensemble}, {dtype} on {self.device}; step: {plans}"

    def run(self, requests: Iterable[Request | None]) -> Iterator[str]:
        """Yield the output for each request, in input order (several lines for --nbest)."""
        for index, translations in self.translations(requests):
            yield self._format(index, translations)

    def translations(self, requests: Iterable[Request | None]) -> Iterator[tuple[int, list[Translation]]]:
        """Yield (0-based line index, translations best first) for each request, in input order. A None means
        that input has paused (read_inputs): what has arrived is translated now, not when the buffer fills."""
        tty = sys.stdin.isatty()
        chunk: list[Request] = []
        for req in requests:
            if req is None:
                if chunk:
                    yield from self._chunk(chunk)
                    chunk = []
                continue
            chunk.append(req)
            # from a terminal, translate each line as it is typed
            if len(chunk) >= self.cfg.buffer_size or (tty and req.name == "<stdin>"):
                yield from self._chunk(chunk)
                chunk = []
        if chunk:
            yield from self._chunk(chunk)
        self._check_empty()
        if self.unended:  # (a decoder-only model's reply may run on: say where its length limit cut it)
            warn(f"{self.unended} of {self.decoded} replies reached the length limit before the model ended them "
                 "(cut there): raise --max-len-a / --max-len-b, or check the prompt")
        self.unended = 0
        if self.unmet:
            warn(f"{self.unmet} of {self.constrained} line(s) with constraints miss at least one (named above)")
        self.unmet = self.constrained = 0  # (counted again for the next file or part)

    def _check_empty(self) -> None:
        """A weak model's search may end every hypothesis at </s> at once: empty lines, and no word said. Say so,
        once, with the flag that forbids it."""
        if self.empty and self.empty >= EMPTY_WARN_RATE * self.decoded and not self.warned_empty:
            warn(f"{self.empty} of {self.decoded} translation(s) are empty (the model's best output ended at </s> "
                 "at once: an undertrained model?); --min-len 1 forbids an empty output")
            self.warned_empty = True

    def _chunk(self, chunk: list[Request]) -> Iterator[tuple[int, list[Translation]]]:
        """The stages for one chunk of requests; each line's translations yielded, in order, as soon as it and
        every line before it are done."""
        first = self.index
        self.index += len(chunk)
        chunk = [self._unmark(req) for req in chunk]
        lines = self._encode(chunk, first)
        results: dict[int, list[Translation]] = {}
        for i, line in enumerate(lines):
            if line is None:  # an empty line gives one empty translation, score 0, without running the model
                empty = Translation("", 0.0, [] if self.cfg.scores else None, [] if self.cfg.alignment else None)
                results[i] = self._restore(chunk[i], [empty], [])
        units: list[_Unit] = []
        for line in filter(None, lines):
            line.first = len(units)
            attributes = self._attribute_units(line)
            units += [_Unit(line, p, *unit) for p, unit in enumerate(self._split(line) + sum(attributes, []))]
            line.n, line.attributes = len(units) - line.first, [len(a) for a in attributes]
        done = 0
        for finished in self._search_units(units):
            for line in finished:
                results[line.index - first] = self._join(line, [finished[line][u] for u in range(line.n)],
                                                         units[line.first : line.first + line.n])
            while done in results:
                yield first + done, results.pop(done)
                done += 1
        while done < len(chunk):
            yield first + done, results.pop(done)
            done += 1

    # --- markup: tags and placeholders out of the text, and back into the translation -------------------------

    def _unmark(self, req: Request) -> Request:
        """The markup stage: a request whose text has markup (its `extra["markup"]`: a reader's name, or a Markup a
        file format's reader made; --input-format xml/html; placeholders to protect) with its text the plain text
        and the Markup in `extra`; malformed XML is an InputError naming the line (and column)."""
        kind = req.extra.get("markup", self.line_markup or ("text" if self.protect else None))
        if kind is None or isinstance(kind, markups.Markup):
            return req if kind is None else dataclasses.replace(req, text=kind.plain)
        if kind == "html" and _WHOLE_PAGE.match(req.text):
            raise InputError(req.name, req.lineno, "a whole HTML page, read line by line (its <style> and <head> "
                             "as text): translate the file with --input-format html-page")
        try:
            m = markups.READERS[kind](req.text, self.protect, self.keep_tags)
        except markups.MarkupError as e:
            where = f" at column {e.column}" if e.column else ""
            raise InputError(req.name, req.lineno, f"{e}{where}") from None
        return dataclasses.replace(req, text=m.plain, extra={**req.extra, "markup": m})

    def _restore(self, req: Request, translations: list[Translation], units: list[_Unit],
                 attributes: list[str] | None = None) -> list[Translation]:
        """Each translation with the request's markup put back (Markup.render, by the word alignment over the
        source words the aligner saw; `attributes`: its attribute values' translations); the alignment kept only
        where --alignment asked for it."""
        m = req.extra.get("markup")
        if not isinstance(m, markups.Markup):
            return translations
        if not m.root.children:  # (nothing to put back: the words, escaped as the format writes them)
            return [dataclasses.replace(t, text=m.render(t.text, None)) for t in translations]
        lead = self.languages.leads
        sources = [u.src[u.span[0] : u.span[1]] if u.span else [t for t in u.src[lead:] if t != EOS_ID]
                   for u in units]
        src_words = [w for ids in sources for w in self.src_tok.decode(ids, skip_special_tokens=False).split()]
        return [dataclasses.replace(t, text=m.render(t.text, t.alignment, src_words, attributes),
                                    alignment=t.alignment if self.cfg.alignment else None) for t in translations]

    def _attribute_units(self, line: _Line) -> list[list[tuple[list[int], list, list[str]]]]:
        """The units of each of the line's attribute values that are text (alt, title, ...: Markup.attributes),
        translated as sentences of their own after the line's text: windows where one is longer than the model
        takes, no constraints."""
        m = line.request.extra.get("markup")
        if not isinstance(m, markups.Markup) or not m.attributes:
            return []
        room = self.max_len - 1 - (line.lead is not None)
        if self._cuts is None:
            self._cuts = (word_start_ids(self.src_tok), clause_end_ids(self.src_tok))
        if self.prompter is not None:  # (a prompt takes a value whole)
            return [[self._unit(line, [], False, [], a.text)] for a in m.attributes]
        return [[self._unit(line, w, False, []) for w in _windows(ids, room, *self._cuts)]
                for ids in encode_batch(self.src_tok, [a.text for a in m.attributes])]

    # --- encode: a request's text, languages and phrases as ids ----------------------------------------------

    def _encode(self, chunk: list[Request], first: int) -> list[_Line | None]:
        """Each request as a _Line (None for an empty one), every field that needs the model checked here; the
        glossary's terms found in its text (`_terms`) as constraints of their own."""
        avoids = [self._phrases(req, req.avoid, "to avoid") for req in chunk]
        musts = [self._phrases(req, req.constraints, "to hold") for req in chunk]
        todo = [i for i, req in enumerate(chunk) if not req.empty]
        ids = encode_batch(self.src_tok, [chunk[i].text for i in todo])
        self._check_unknowns(ids)
        prefixes = encode_batch(self.tgt_tok, [chunk[i].prefix for i in todo]) if any(
            chunk[i].prefix for i in todo) else [[] for _ in todo]
        lines: list[_Line | None] = [None] * len(chunk)
        for k, i in enumerate(todo):
            req = chunk[i]
            tgt_lang = req.tgt_lang if req.tgt_lang is not None else self.cfg.tgt_lang
            if self.prompter is None:
                lead = self.languages.lead(req.src_lang or self.cfg.src_lang, tgt_lang, req.where)
                forced = self.languages.forced(tgt_lang, req.where)
            else:
                lead, forced = None, []
            texts = [c if isinstance(c, str) else c[0] for c in req.constraints]
            line = lines[i] = _Line(req, first + i, ids[k], lead, forced, prefixes[k], avoids[i], musts[i], texts)
            line.terms = self._terms(req)
            self._check_conflicts(line)
        return lines

    def _terms(self, req: Request) -> list:
        """The glossary stage: the glossary's terms in the request's text (tfcli.generate.glossary), each with its
        target forms as a constraint's token ids."""
        if self.glossary is None or not req.text.strip():
            return []
        matches = self.glossary.find(req.text, req.src_lang or self.src_lang)
        if matches and self.cfg.sampling:
            raise InputError(req.name, req.lineno, "glossary terms need beam search, not --sampling")
        out = []
        for m in matches:
            if m.term not in self.term_ids:  # (each term encoded once; one the vocabulary cannot spell said once)
                forms = encode_batch(self.tgt_tok, list(m.term.targets))
                ok = all(f and UNK_ID not in f for f in forms)
                self.term_ids[m.term] = (forms[0] if len(forms) == 1 else forms) if ok else None
                if not ok:  # (one term of a large glossary does not stop a file)
                    warn(f"{req.where}: the glossary's term {m.term.targets[0]!r} ({m.term.where}) has a piece the "
                         "target vocabulary lacks (<unk>): lines holding its source term are translated without it")
            if self.term_ids[m.term] is not None:
                out.append((m, self.term_ids[m.term]))
        return out

    def _check_conflicts(self, line: _Line) -> None:
        """A phrase to hold (the request's, or a glossary term's) that is, or holds, one of the line's phrases to
        avoid can never be output: a one-line error naming the line and both phrases."""
        if not line.avoid:
            return
        req = line.request
        held = [(text, c) for text, c in zip(line.must_text, line.must)]
        held += [(m.term.targets[0], c) for m, c in line.terms]
        avoided = list(zip(req.avoid, line.avoid))
        for text, c in held:
            forms = [c] if isinstance(c[0], int) else c
            for a_text, a in avoided:
                if any(_holds(f, a) for f in forms):
                    raise InputError(req.name, req.lineno, f"the phrase to hold {text!r} holds the phrase to avoid "
                                     f"{a_text!r}: no translation can have both; drop one of them")

    def _phrases(self, req: Request, phrases: tuple, what: str) -> list:
        """A request's phrases (to avoid, to hold, or of the glossary; a tuple of texts is a set of alternatives) as
        target token lists (a set: a list of them); a phrase with no token, or one to hold that the tokenizer reads
        with <unk>, is an InputError naming the line."""
        forms = [p for c in phrases for p in ([c] if isinstance(c, str) else c)]
        ids = dict(zip(forms, encode_batch(self.tgt_tok, forms))) if forms else {}
        hold = what == "to hold"
        for phrase, toks in ids.items():
            if not toks:
                raise InputError(req.name, req.lineno, f"the phrase {what} {phrase!r} has no target tokens")
            if UNK_ID in toks and hold:  # (a phrase to avoid with <unk> in it just never matches)
                raise InputError(req.name, req.lineno, f"the phrase {what} {phrase!r} has a piece the target "
                                 "vocabulary lacks (<unk>)")
        if phrases and hold and self.cfg.sampling:
            raise InputError(req.name, req.lineno, "constraints need beam search, not --sampling")
        return [ids[c] if isinstance(c, str) else [ids[p] for p in c] for c in phrases]

    # --- split: a line as the sources it is translated as -----------------------------------------------------

    def _split(self, line: _Line) -> list[tuple[list[int], list, list[str]]]:
        """The units a line is translated as, each (source ids ending in </s>, the language token first where there
        is one; its constraints as ids; their texts): the line itself; its sentences, where `split_sentences` says
        (auto: a line longer than 99% of the training sources or than the model takes, or any line for a model known
        to be trained on sentences; never a line with constraints of its own that fits max_len); and any source
        longer than the model's max_len in windows of as many tokens as it takes (`_windows`: cut between words),
        with a warning naming the line (never cut). A glossary term goes with the unit its source words are in; the
        request's own constraints with the first."""
        req, ids, lead = line.request, line.ids, line.lead
        room = self.max_len - 1 - (lead is not None)  # tokens a source may have besides </s> and the tag
        mode = self.cfg.split_sentences
        pieces = [(ids, 0, req.text)]  # (ids, where in the line it starts, its text)
        if line.must and len(ids) <= room:
            mode = "never"
        if mode == "always" or mode == "auto" and (len(ids) > room or self.on_sentences or self.trained_len is not None
                                                  and len(ids) + 1 > self.trained_len):
            sentences = self._sentences(req.text, req.src_lang or self.src_lang)
            if len(sentences) > 1:
                pieces = list(zip(encode_batch(self.src_tok, sentences), _starts(req.text, sentences), sentences))
        windows, starts = [], []  # every unit's ids, and where in the line it starts
        for seq, start, text in pieces:
            if self.prompter is not None:  # (its prompt: `_unit`)
                windows.append(seq)
                starts.append(start)
            elif len(seq) > room:
                warn(f"{req.where}: a sentence of {len(seq)} tokens, longer than the model's max_len "
                     f"({self.max_len}); translating it in windows of up to {room} tokens, cut between words")
                if self._cuts is None:
                    self._cuts = (word_start_ids(self.src_tok), clause_end_ids(self.src_tok))
                cut = _windows(seq, room, *self._cuts)
                windows += cut
                starts += self._char_cuts(text, seq, cut, start) if line.terms else [start] * len(cut)
            else:
                windows.append(seq)
                starts.append(start)
        terms = [[] for _ in windows]
        for m, c in line.terms:  # (each with the last unit that starts at or before it)
            terms[max(j for j, at in enumerate(starts) if at <= m.start or j == 0)].append((m, c))
        texts = [text for _, _, text in pieces] if self.prompter is not None else [None] * len(windows)
        return [self._unit(line, w, j == 0, terms[j], texts[j]) for j, w in enumerate(windows)]

    def _char_cuts(self, text: str, seq: list[int], windows: list[list[int]], start: int) -> list[int]:
        """Where in the line each window of `seq` (`text`'s ids, `text` starting at `start`) starts, by the
        tokenizer's offsets (the first window's start where they do not line up with the ids)."""
        enc = self.src_tok.encode(text, add_special_tokens=False)
        if enc.ids != seq:
            return [start] * len(windows)
        firsts = [sum(len(w) for w in windows[:j]) for j in range(len(windows))]
        return [start + enc.offsets[t][0] if t < len(enc.offsets) else start + len(text) for t in firsts]

    def _unit(self, line: _Line, window: list[int], first: bool, terms: list,
              text: str | None = None) -> tuple[list[int], list, list[str], tuple[int, int] | None]:
        """A unit's source ids (a decoder-only model's: the prompt of its `text`), constraints and their texts (the
        request's own with the first unit, then its glossary terms, a term found k times given k times), checked
        to fit the model's outputs; and a prompt's source span (`_Unit.span`)."""
        must, texts = (list(line.must), list(line.must_text)) if first else ([], [])
        found = [c for _, c in terms]
        for m, c in terms:  # (a term found k times is held k times; the request's own phrases count towards it)
            if must.count(c) < found.count(c):
                must.append(c)
                texts.append(m.term.targets[0])
        if must:
            need = sum(len(c) if isinstance(c[0], int) else min(map(len, c)) for c in must)
            need += len(line.forced) + (len(line.prefix) if first else 0)
            if need >= self.max_len:
                req = line.request
                raise InputError(req.name, req.lineno, f"its constraints and prefix are {need} target tokens, "
                                 f"and the model's outputs hold at most {self.max_len - 1}")
        if self.prompter is not None:
            ids, span = self._prompt(line.request, text)
            return ids, must, texts, span
        src = source_ids([line.lead, *window] if line.lead is not None else window, self.max_len)
        return src, must, texts, None

    def _prompt(self, req: Request, text: str) -> tuple[list[int], tuple[int, int]]:
        """The prompt ids of a source text, for a decoder-only model, and where the text's own tokens are in them
        (by the tokenizer's offsets: the tokens that overlap the text's last occurrence in the prompt); one that
        leaves no room in the model's context for a reply is an error naming the line."""
        prompt, start, end = self.prompter.prompt(text, req.src_lang or self.cfg.src_lang,
                                                  req.tgt_lang if req.tgt_lang is not None else self.cfg.tgt_lang)
        enc = self.tgt_tok.encode(prompt, add_special_tokens=False)
        ids = [*start, *enc.ids, *end]
        if len(ids) >= self.max_len:
            raise InputError(req.name, req.lineno, f"its prompt is {len(ids)} tokens, and the model's context holds "
                             f"{self.max_len}: no room for a translation")
        at = prompt.rfind(text) if text else -1
        if at < 0:
            return ids, (len(start), len(start))
        a = next((t for t, (_, e) in enumerate(enc.offsets) if e > at), len(enc.ids))
        b = next((t for t, (o, _) in enumerate(enc.offsets) if o >= at + len(text)), len(enc.ids))
        return ids, (len(start) + a, len(start) + max(a, b))

    def _sentences(self, text: str, lang: str | None) -> list[str]:
        """`text`'s sentences (tfcli.data.sentences) by the rules of `lang` (None: generic ones)."""
        if lang not in self.splitters:
            from tfcli.data.sentences import splitter

            self.splitters[lang] = splitter(lang)
        return self.splitters[lang](text)

    # --- search: the units in batches; each line handed on once all its units are done -------------------------

    def _search_units(self, units: list[_Unit]) -> Iterator[dict[_Line, dict[int, list[Hypothesis]]]]:
        """Batches of units, the earliest lines first, so that output can start early; after each, the lines it
        completed with their units' hypotheses ({line: {part: hypotheses}})."""
        if not units:
            return
        lengths = [len(u.src) for u in units]
        if self.fixed:  # one fixed-shape decoder per source width, its places refilled as sentences finish
            groups = width_groups(lengths, self.cfg.max_tokens, self.cfg.batch_size)
        else:  # batches that shrink as sentences finish
            groups = [(b, None, None) for b in token_batches(lengths, self.cfg.max_tokens, self.cfg.batch_size)]
        groups.sort(key=lambda g: int(g[0].min()))
        pending: dict[_Line, dict[int, list[Hypothesis]]] = {}
        for batch, width, slots in groups:
            batch_units = [units[u] for u in batch.tolist()]
            for unit, hyps in zip(batch_units, self.search(batch_units, width, slots)):
                pending.setdefault(unit.line, {})[unit.part] = hyps
            lines = dict.fromkeys(u.line for u in batch_units)  # (each line once, in order)
            yield {line: pending.pop(line) for line in lines if len(pending.get(line, ())) == line.n}

    def search(self, units: list[_Unit], width: int | None = None, slots: int | None = None) -> list[list[Hypothesis]]:
        """Hypotheses (best first, without the forced language token) for a batch of units. `width`: pad the
        sources to it; `slots`: sentences decoded at once (a fixed-shape decoder, continuous batching), None: all."""
        batch = [u.src for u in units]
        src = pad(batch, length=min(width, self.max_len) if width else None).to(self.device)
        rows = Rows.build(self.device, self.max_len, [u.target for u in units], [u.line.avoid for u in units],
                          [u.must for u in units],
                          [u.line.index + (u.part << 40) for u in units] if self.options.sampling else None,
                          [u.span[1] - u.span[0] for u in units] if self.prompter is not None else None)
        # (a line's attribute values, its last units, are put back whole: no alignment)
        aligned = [self.cfg.alignment or _tagged(u.line.request) and u.part < u.line.n - sum(u.line.attributes)
                   for u in units]
        # (the alignment reads the encoder outputs the search computed; an ensemble aligns with its first model)
        steps = Remembered(self.steps) if any(aligned) and not hasattr(self.steps, "members") else self.steps
        with self.precision:
            try:
                hyps = search(steps, src, self.options, rows, slots, self.continuing)
            except NotANumber as e:
                lines = sorted({u.line.index + 1 for u in units})
                where = f"line {lines[0]}" if len(lines) == 1 else f"lines {lines[0]}-{lines[-1]}"
                raise NotANumber(f"{self.checkpoint}: {e} (translating input {where})") from None
            if any(aligned):
                self._align(units, src, hyps, aligned, steps)
        if self.languages.forces:  # the target language's token, forced first: not part of the translation
            skip = self.languages.forces
            for h in (h for hs in hyps for h in hs):
                h.tokens = h.tokens[skip:]
                h.token_scores = h.token_scores[skip:] if h.token_scores is not None else None
        return hyps

    def continuing(self) -> torch.Tensor | None:
        """(V,) the target tokens that continue the word before them (tfcli.data.tokenizer.continuing_ids), or None.
        A constraint's last token is never followed by one, so that the phrase ends where a word does (punctuation
        may follow)."""
        if self._continuing is None:
            out = torch.zeros(self.steps.cfg.tgt_vocab_size, dtype=torch.bool)
            out[[i for i in continuing_ids(self.tgt_tok) if i < len(out)]] = True
            self._continuing = out.to(self.device)
        return self._continuing if bool(self._continuing.any()) else None

    def _align(self, units: list[_Unit], src: torch.Tensor, hyps: list[list[Hypothesis]], which: list[bool],
               steps) -> None:
        """The word alignment of each hypothesis (every n-best one) of the units `which` says, from one
        teacher-forced pass of the decoder up to the aligning layer. `steps`: the StepModel that searched."""
        rows = [i for i, hs in enumerate(hyps) if which[i] for _ in hs]
        flat = [h for i, hs in enumerate(hyps) if which[i] for h in hs]
        if self.prompter is not None:  # (the self-attention onto the source in the prompt)
            aligned = prompt_alignments(steps.model, [units[r].src for r in rows], [units[r].span for r in rows],
                                        [h.tokens for h in flat], self.alignment_layer)
            for row, h, positions in zip(rows, flat, aligned):
                a, b = units[row].span
                h.alignment = word_alignment(self.src_tok, self.tgt_tok, units[row].src[a:b], h.tokens, positions,
                                             self.cfg.raw, plain=True)
            return
        batch = [u.src for u in units]
        encode = steps.recall if isinstance(steps, Remembered) else steps.members[0].encode
        aligned = token_alignments(steps.model, src[rows], [h.tokens for h in flat], self.alignment_layer, encode)
        skip = self.languages.forces
        for row, h, positions in zip(rows, flat, aligned):
            h.alignment = word_alignment(self.src_tok, self.tgt_tok, batch[row], h.tokens[skip:], positions[skip:],
                                         self.cfg.raw, lead=1 if self.languages.leads else 0)

    # --- join: a line's units' hypotheses as its translations, on text ----------------------------------------

    def _join(self, line: _Line, parts: list[list[Hypothesis]], units: list[_Unit]) -> list[Translation]:
        """A line's translations from the hypotheses of its units, the k-th best of each joined: each unit's
        text decoded alone and joined (`join_sentences`), token scores one after the other, the score the sum,
        alignments offset by the words before."""
        attributes = None
        if line.attributes:  # (the attribute values' units, last: each one's best translation, into the markup)
            k = sum(line.attributes)
            best = iter(self._texts([p[0] for p in parts[-k:]]))
            attributes = [join_sentences([next(best) for _ in range(n)]) for n in line.attributes]
            parts, units = parts[:-k], units[:-k]
        n = min(len(p) for p in parts)
        ranks = [[p[r] for p in parts] for r in range(n)]
        texts = self._texts([h for hs in ranks for h in hs])
        out = []
        for r, hs in enumerate(ranks):
            pieces = texts[r * len(parts) : (r + 1) * len(parts)]
            text = " ".join(t for t in pieces if t) if self.cfg.raw else join_sentences(pieces)
            score = hs[0].score if len(hs) == 1 else None if any(h.score is None for h in hs) else sum(
                h.score for h in hs)
            token_scores = None
            if self.cfg.scores and all(h.token_scores is not None for h in hs):
                token_scores = [x for h in hs for x in h.token_scores]
            alignment = None
            if all(h.alignment is not None for h in hs):
                alignment = self._joined_alignment(hs, pieces, units) if len(hs) > 1 else hs[0].alignment
            # one line out per line in, whatever the detokeniser makes
            out.append(Translation(text.replace("\r", " ").replace("\n", " "), score, token_scores, alignment,
                                   self._held(hs, units)))
        self.decoded += 1
        self.empty += not any(h.tokens for h in ranks[0]) and not line.request.prefix
        self.unended += self.prompter is not None and not all(h.ended for h in ranks[0])
        if out[0].constraints is not None:
            self._check_held(line, out[0].constraints)
        return self._restore(line.request, out, units, attributes)

    @staticmethod
    def _held(hs: list[Hypothesis], units: list[_Unit]) -> list[tuple[str, bool]] | None:
        """Each constraint of the units (by its text) and whether their hypotheses `hs` hold it; None: none."""
        held = []
        for h, u in zip(hs, units):
            seen: dict[str, int] = {}  # (a constraint given k times is held by its k-th time)
            for text, c in zip(u.must_text, u.must):
                seen[repr(c)] = seen.get(repr(c), 0) + 1
                held.append((text, _times(h.tokens, c) >= seen[repr(c)]))
        return held or None

    def _check_held(self, line: _Line, held: list[tuple[str, bool]]) -> None:
        """Never silent: a best translation that misses a constraint (the search reached its length limit first)
        is a warning naming the line and the phrase; the run ends with their count."""
        self.constrained += 1
        missed = [text for text, ok in held if not ok]
        if missed:
            self.unmet += 1
            warn(f"{line.request.where}: the translation misses the constraint(s) {', '.join(map(repr, missed))} "
                 "(the length limit came first; a larger --max-len-a/--max-len-b gives room)")

    def _texts(self, hyps: list[Hypothesis]) -> list[str]:
        """Each hypothesis as text: detokenised (or subword tokens with `raw`); a decoder-only model's reply as
        one line (prompting.reply_line)."""
        if self.cfg.raw:
            return [" ".join(self.tgt_tok.id_to_token(t) for t in h.tokens) for h in hyps]
        texts = decode_batch(self.tgt_tok, [h.tokens for h in hyps])
        return texts if self.prompter is None else [reply_line(t) for t in texts]

    def _joined_alignment(self, hs: list[Hypothesis], texts: list[str], units: list[_Unit]) -> list[tuple[int, int]]:
        """The units' word alignments as one line's: each offset by the source and target words before it."""
        alignment, src_off, tgt_off, last = [], 0, 0, ""
        tagged = self.languages.leads
        for h, text, unit in zip(hs, texts, units):
            text = "" if self.cfg.raw else text.strip()
            if last and text and _seamless(last, text):
                tgt_off -= 1  # (joined without a space: the seam's two words are one, join_sentences)
            alignment += [(i + src_off, j + tgt_off) for i, j in h.alignment]
            src_off += self._words(self.src_tok, [t for t in unit.src[tagged:] if t != EOS_ID])
            tgt_off += len(h.tokens) if self.cfg.raw else len(text.split())  # (as _words counts them)
            last = text or last
        return alignment

    def _words(self, tok, ids: list[int]) -> int:
        """Words of `ids` as alignments count them (tfcli.generate.alignment.word_of_token)."""
        return len(ids) if self.cfg.raw else len(tok.decode(ids, skip_special_tokens=False).split())

    # --- format: a line's translations as output text ---------------------------------------------------------

    def _format(self, index: int, translations: list[Translation]) -> str:
        if self.cfg.jsonl:
            return "\n".join(json.dumps(self._record(index, rank, t), ensure_ascii=False)
                             for rank, t in enumerate(translations if self.cfg.nbest is not None else translations[:1]))
        align = (lambda t: "\t" + pharaoh(t.alignment)) if self.cfg.alignment else (lambda t: "")
        if not self.cfg.tabular:
            return translations[0].text + align(translations[0])
        lines = []
        for t in translations:
            line = f"{index}\t{t.score:.4f}\t{t.text}"
            if self.cfg.scores:
                line += "\t" + " ".join(f"{s:.4f}" for s in t.token_scores)
            lines.append(line + align(t))
        return "\n".join(lines)

    def _record(self, index: int, rank: int, t: Translation) -> dict:
        """A translation as --jsonl writes it (TranslateConfig.jsonl)."""
        out = {"index": index, **({"rank": rank} if self.cfg.nbest is not None else {}), "text": t.text,
               "score": None if t.score is None else round(t.score, 4)}
        if self.cfg.scores:
            out["token_scores"] = [round(x, 4) for x in t.token_scores or ()]
        if self.cfg.alignment:
            out["alignment"] = [list(p) for p in word_pairs(t.alignment or ())]
        if t.constraints is not None:
            out["constraints"] = [{"phrase": text, "held": held} for text, held in t.constraints]
        return out

    def _check_unknowns(self, ids: list[list[int]]) -> None:
        if self.warned_unk or not ids:
            return
        rate = unk_rate(ids)
        if rate > UNK_WARN_RATE:
            self.warned_unk = True
            warn(
                f"{rate:.0%} of the input's tokens are unknown (<unk>) to the model's source vocabulary: wrong "
                "language or model, or raw text where subwords were expected (or the other way round)?"
            )


def _prompter(loaded: Loaded, cfg: TranslateConfig) -> Prompter | None:
    """A decoder-only model's Prompter (None for an encoder-decoder); a language given that its template does not
    use is warned of."""
    if loaded.cfg.kind != "lm":
        if cfg.prompt_template is not None:
            raise TfcliError("--prompt-template is for a decoder-only model; this one is an encoder-decoder")
        return None
    template = read_template(cfg.prompt_template)
    for flag, lang, field_ in (("--src-lang", cfg.src_lang, "{src_lang}"), ("--tgt-lang", cfg.tgt_lang, "{tgt_lang}")):
        if template is not None and lang and field_ not in template:
            warn(f"{flag} {lang}: the prompt template has no {field_}, so the model is not told it")
    start, _ = text_conventions(loaded.meta)
    trained_here = (loaded.meta.get("data") or {}).get("kind") == "parallel"  # (a translator: its language tags)
    tags = language_tags(loaded.tgt_tok, tokenizer_path(loaded.meta, "tgt")) if trained_here else None
    return Prompter.of(loaded.meta, template, start, tags)


def _tagged(req: Request) -> bool:
    """Whether a request's markup has nodes to put back (its translation needs the word alignment)."""
    m = req.extra.get("markup")
    return isinstance(m, markups.Markup) and bool(m.root.children)


def _count_lines(inputs: list[str]) -> int | None:
    """Lines in plain input files (for the progress bar's total); None when reading stdin or compressed files."""
    if any(p == "-" or p.endswith(".gz") or not os.path.isfile(p) for p in inputs):
        return None
    total = 0
    for p in inputs:
        with open(p, "rb") as f:
            last = b"\n"
            for block in iter(lambda: f.read(1 << 20), b""):
                total += block.count(b"\n")
                last = block[-1:]
            total += last != b"\n"  # a last line without a newline
    return total


def output_paths(inputs: list[str], output_dir: str, suffix: str) -> list[Path]:
    """--output-dir: one output per input file, DIR/NAME+SUFFIX; checked before anything is translated."""
    if any(p == "-" for p in inputs):
        raise TfcliError("--output-dir writes one file per input file; stdin ('-') has no name: use -o FILE")
    paths = [Path(output_dir) / (Path(p).name + suffix) for p in inputs]
    if len(set(paths)) < len(paths):
        raise TfcliError("--output-dir: two inputs have the same file name; add a --suffix or use -o FILE per run")
    try:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TfcliError(f"{output_dir}: cannot create the output directory ({e.strerror or e})") from None
    return paths


def _side_lines(field: str, path: str, inputs: list[str], cfg: TranslateConfig, output_dir: str | None) -> list[str]:
    """The lines of a side file (request.SIDE_FILES: --prefix, --avoid, --constraints) with one line a line of the
    input, checked against the input's line count where it is known before reading it."""
    flag, what = f"--{field}", SIDE_FILES[field][1]
    if files.choose(cfg.input_format, inputs[0]) == "jsonl":
        raise TfcliError(f"{flag}: JSONL input gives each line's {field} in its \"{field}\" field; drop {flag}")
    if output_dir is not None:
        raise TfcliError(f"{flag} holds one line per input line of one output: use -o FILE, not --output-dir")
    with encoding_errors(cfg.encoding_errors):
        lines = read_lines(path)
    total = _count_lines(inputs)
    if total is not None and total != len(lines):
        raise TfcliError(f"{path}: {len(lines)} {what} for {total} input lines; give one a line")
    return lines


def translate_file(translator: Pipeline, cfg: TranslateConfig, path: str, out_path: str | None,
                    progress: bool | None) -> int:
    """One file in a file format (tfcli.formats.files): read whole, its segments translated, written whole and
    atomically (nothing where it does not parse); returns the segment count."""
    from tfcli.io import read_document

    with encoding_errors(cfg.encoding_errors):
        text, newline = read_document(path)
    doc = files.read(cfg.input_format, "<stdin>" if path == "-" else path, text, cfg.overwrite, cfg.tgt_lang)
    translator.index = 0
    outs = []
    with Progress("translating", len(doc.segments), "seg", progress) as bar:
        for _, translations in translator.translations(iter(doc.segments)):
            outs.append(translations[0].text)
            bar.advance(1)
    result = doc.write(outs)
    if newline != "\n":  # (the input's line ends kept: CRLF where every line of it ended so)
        result = result.replace("\n", newline)
    with open_output(out_path) as out:
        out.write(result)
    return len(outs)


def _translate_files(make_translator, cfg: TranslateConfig, jobs, progress: bool | None, why: str | None) -> int:
    """Whole files in a file format (tfcli.formats.files), each to its own output; `why`: an option given that is
    for line formats."""
    if why:
        raise TfcliError(f"--input-format {cfg.input_format} translates whole files, one output file each: "
                         f"{why} is for line formats")
    translator = make_translator(resolve_device(cfg.device))
    return sum(translate_file(translator, cfg, path, out, progress) for (paths, out) in jobs for path in paths)


def translate(
    checkpoint: str | list[str], inputs: list[str], output: str | None, cfg: TranslateConfig, progress: bool | None = None,
    output_dir: str | None = None, suffix: str = "", resume: bool = False, prefix_file: str | None = None,
    avoid_file: str | None = None, constraint_file: str | None = None,
) -> int:
    """Translate every line of `inputs` (files, `-` for stdin) to `output` (None: stdout), or each input file to
    its own file in `output_dir`; returns the line count. Launched by torchrun on several processes, or with
    `resume`, the file is translated in parts (tfcli/generate/shards.py): the count is then this process's.
    `prefix_file`: one target prefix a line of the input (an empty line: none); each output starts with it.
    `avoid_file`: one line a line of the input, target phrases separated by tabs, which its output never holds;
    `constraint_file`: the same, phrases its output must hold.
    Several checkpoints decode as an ensemble (tfcli/generate/ensemble.py)."""
    from tfcli.checkpoint_meta import input_paths

    hint = "choose another --output-dir or a --suffix" if output_dir is not None else "choose another -o"
    jobs = [(inputs, output)] if output_dir is None else [
        ([p], str(out)) for p, out in zip(inputs, output_paths(inputs, output_dir, suffix))
    ]
    checkpoints = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
    kinds = sorted({files.choose(cfg.input_format, p) for p in inputs})
    if len(kinds) > 1:
        raise TfcliError(f"the inputs are in different formats ({', '.join(kinds)}): translate them in separate "
                         "runs, or give one --input-format")
    cfg = dataclasses.replace(cfg, input_format=kinds[0])
    cfg.validate()
    side_files = [f for f in (prefix_file, avoid_file, constraint_file) if f] + list(cfg.glossary)
    sources = inputs + [p for c in checkpoints for p in input_paths(c)] + side_files
    refuse_overwriting_inputs([out or "-" for _, out in jobs], sources, hint)
    side = [(field, path, _side_lines(field, path, inputs, cfg, output_dir)) for field, path in (
        ("prefix", prefix_file), ("avoid", avoid_file), ("constraints", constraint_file)) if path is not None]

    def read(items):
        """The requests of read_inputs' items: each line's text or JSON object, then its side files' fields."""
        reqs = jsonl_requests(items) if cfg.input_format == "jsonl" else requests(items)
        for field, path, lines in side:
            reqs = with_side_file(reqs, field, lines, path)
        return reqs

    def make_translator(device: torch.device) -> Pipeline:
        precision(device, cfg.dtype)  # fail on an impossible precision before loading anything
        translator = Pipeline(load_ensemble(checkpoints, device, cfg.dtype), cfg, device)
        if verbose_enabled():
            info(translator.describe())
        return translator

    processes = distributed.launched().world_size
    if cfg.input_format in files.FILE_FORMATS:
        why = ("--resume" if resume else "several processes" if processes > 1 else "--prefix/--avoid/--constraints"
               if side else "--nbest/--scores/--alignment/--jsonl" if cfg.tabular or cfg.alignment or cfg.jsonl
               else None)
        return _translate_files(make_translator, cfg, jobs, progress, why)
    if processes > 1 or resume:
        why = f"on {processes} processes" if processes > 1 else "with --resume"
        if output in (None, "-") or output_dir is not None:
            raise TfcliError(f"translating {why} writes one file: give -o FILE (not stdout or --output-dir)")
        with encoding_errors(cfg.encoding_errors):
            return translate_in_parts(checkpoints, inputs, output, cfg, resume, progress, make_translator,
                                      read, side_files)
    translator = make_translator(resolve_device(cfg.device))
    total = _count_lines(inputs) if (progress if progress is not None else sys.stderr.isatty()) else None
    n = 0
    with encoding_errors(cfg.encoding_errors), Progress("translating", total, "sent", progress) as bar:
        for paths, out_path in jobs:
            translator.index = 0  # --nbest line numbers count within each output
            with open_output(out_path) as out:
                for text in translator.run(read(read_inputs(paths, pauses=True))):
                    bar.emit(out, text)
                    bar.advance(1)
                    n += 1
    return n
