"""`tfcli translate`: lines in, translations out, one for one and in order, so it composes in shell pipelines.

Lines are read in chunks (`buffer_size` lines; one at a time from a terminal), tokenised with the checkpoint's
source tokenizer, sorted by length into batches (`max_tokens` / `batch_size`) so little compute goes to padding, and
decoded with batched beam or greedy search. Batches run in the order of their earliest line, and each output line
is written (and flushed) as soon as every line before it is done, so output streams while input is still being
translated. Empty lines give empty lines (score 0) without running the model.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator

import torch

from tfcli import distributed
from tfcli.data.batching import pad, source_ids, token_batches, width_groups
from tfcli.data.languages import language_id, tag_id
from tfcli.data.tokenizer import (
    clause_end_ids, continuing_ids, decode_batch, encode_batch, unk_rate, word_start_ids,
)
from tfcli.generate.config import TranslateConfig
from tfcli.console import Progress, warn
from tfcli.device import precision, resolve_device
from tfcli.generate.loader import Loaded, load_ensemble
from tfcli.generate.alignment import default_layer, pharaoh, token_alignments, word_alignment
from tfcli.generate.sampling import LineSampling
from tfcli.generate.search import Hypothesis, avoid_tensor, beam_search, constraint_tensor, greedy_decode
from tfcli.generate.shards import translate_in_parts
from tfcli.errors import InputError, TfcliError
from tfcli.specials import EOS_ID, UNK_ID
from tfcli.io import (
    encoding_errors, jsonl_items, open_output, read_inputs, read_lines, refuse_overwriting_inputs, with_avoid,
    with_constraints, with_prefixes,
)

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


def _unspaced(c: str) -> bool:
    """Whether `c` belongs to writing that puts no space between sentences: Chinese and Japanese characters and
    their full-width punctuation (U+3000-U+30FF, U+3400-U+9FFF, U+F900-U+FAFF, U+FF00-U+FFEF)."""
    o = ord(c)
    return 0x3000 <= o <= 0x30FF or 0x3400 <= o <= 0x9FFF or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF


def join_sentences(texts: list[str]) -> str:
    """A line's sentence translations as one text: a space between two sentences, none where both sides of the
    seam are Chinese or Japanese ("我很好。" + "你呢？" -> "我很好。你呢？"); empty ones left out."""
    out = ""
    for t in (t for t in texts if t):
        out += t if not out or _unspaced(out[-1]) and _unspaced(t[0]) else " " + t
    return out


def _source_language(item: tuple) -> str | None:
    """An input item's own source language (`jsonl_items`' eighth field), or None."""
    return item[7] if len(item) > 7 else None


class Translator:
    """A loaded model with its tokenizers and settings; turns (name, line number, text) items into output lines."""

    def __init__(self, loaded: Loaded, cfg: TranslateConfig, device: torch.device):
        self.steps, self.src_tok, self.tgt_tok = loaded.steps, loaded.src_tok, loaded.tgt_tok
        self.cfg, self.device = cfg, device
        self.max_len = self.steps.cfg.max_len
        n_layers = self.steps.cfg.n_decoder_layers
        if cfg.alignment_layer > n_layers:
            raise TfcliError(f"--alignment-layer {cfg.alignment_layer}: the model's decoder has {n_layers} layers")
        self.alignment_layer = cfg.alignment_layer or default_layer(n_layers)
        self.tags = loaded.tags  # a multilingual model's {language: tag id}
        self.langs = loaded.langs  # an M2M-100-style model's {language: token id}
        if self.langs:
            for role, lang in (("source", cfg.src_lang), ("target", cfg.tgt_lang)):
                if lang is not None:
                    language_id(self.langs, lang, "--src-lang" if role == "source" else "--tgt-lang", role)
        elif cfg.tgt_lang is not None:
            tag_id(self.tags, cfg.tgt_lang, "--tgt-lang")
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

    def run(self, items: Iterable[tuple[str, int, str]]) -> Iterator[str]:
        """Yield the output for each input line, in input order (several lines for --nbest)."""
        for index, hyps in self.hypotheses(items):
            yield self._format(index, hyps)

    def hypotheses(self, items: Iterable[tuple | None]) -> Iterator[tuple[int, list[Hypothesis]]]:
        """Yield (0-based line index, hypotheses best first) for each input line, in input order. An item is
        (file name, line number, text), or with a fourth field the line's target prefix (`with_prefixes`), a
        fifth its target language (`jsonl_items`; None: --tgt-lang's), a sixth and seventh its phrases to avoid and
        to hold, an eighth its source language (None: --src-lang's). A None
        item means that input has paused (read_inputs): what has arrived is translated now, not when the buffer
        fills."""
        tty = sys.stdin.isatty()
        chunk: list[tuple[str, int, str]] = []
        for item in items:
            if item is None:
                if chunk:
                    yield from self._chunk(chunk)
                    chunk = []
                continue
            chunk.append(item)
            # from a terminal, translate each line as it is typed
            if len(chunk) >= self.cfg.buffer_size or (tty and item[0] == "<stdin>"):
                yield from self._chunk(chunk)
                chunk = []
        if chunk:
            yield from self._chunk(chunk)
        self._check_empty()

    def _check_empty(self) -> None:
        """A weak model's search may end every hypothesis at </s> at once: empty lines, and no word said. Say so,
        once, with the flag that forbids it."""
        if self.empty and self.empty >= EMPTY_WARN_RATE * self.decoded and not self.warned_empty:
            warn(f"{self.empty} of {self.decoded} translation(s) are empty (the model's best output ended at </s> "
                 "at once: an undertrained model?); --min-len 1 forbids an empty output")
            self.warned_empty = True

    def _chunk(self, chunk: list[tuple]) -> Iterator[tuple[int, list[Hypothesis]]]:
        first = self.index
        self.index += len(chunk)
        results: dict[int, list[Hypothesis]] = {}
        todo = []  # lines with text (or a prefix to continue); the others are done already
        prefixes = [item[3] if len(item) > 3 else "" for item in chunk]
        avoids = [self._phrases(item, 5, "to avoid") for item in chunk]  # per line, the target phrases it must not
        musts = [self._phrases(item, 6, "to hold") for item in chunk]  # output, and those it must
        for i, (_, _, text, *_) in enumerate(chunk):
            if text.strip() or prefixes[i]:
                todo.append(i)
            else:  # an empty line gives one empty hypothesis, score 0, without running the model
                results[i] = [Hypothesis([], 0.0, [], [] if self.cfg.alignment else None)]
        ids = encode_batch(self.src_tok, [chunk[i][2] for i in todo])
        self._check_unknowns(ids)
        leads, forced = [], []  # per line: the source's first token (a language's), the output's (M2M-100's)
        for i in todo:  # a multilingual model: the line's target-language tag first
            name, lineno, *rest = chunk[i]
            lang = rest[2] if len(rest) > 2 and rest[2] is not None else self.cfg.tgt_lang
            if self.langs:
                src_lang = _source_language(chunk[i]) or self.cfg.src_lang
                leads.append(language_id(self.langs, src_lang, f"{name}:{lineno}", "source"))
                forced.append([language_id(self.langs, lang, f"{name}:{lineno}", "target")])
            else:
                leads.append(tag_id(self.tags, lang, f"{name}:{lineno}"))
                forced.append([])
        # each line as the sources it is translated as (itself, its sentences, or windows), in order
        units, owner, keys = [], [], []  # the sources' ids; the line (index into todo) and sampling key of each
        spans = []  # per line (index into todo): its first source and how many
        for k, i in enumerate(todo):
            pieces = self._units(chunk[i], ids[k], leads[k], whole=bool(musts[i]))
            spans.append((len(units), len(pieces)))
            units += pieces
            owner += [k] * len(pieces)
            keys += [first + i + (p << 40) for p in range(len(pieces))]  # (a line's first source keyed as the line)
        targets = None
        if any(prefixes) or self.langs:  # a line's prefix starts its first source's translation
            encoded = encode_batch(self.tgt_tok, [prefixes[i] for i in todo]) if any(prefixes) else [[]] * len(todo)
            targets = [forced[k] + (encoded[k] if spans[k][0] == u else []) for u, k in enumerate(owner)]
        src = [source_ids(seq, self.max_len) for seq in units]
        avoid = [avoids[todo[k]] for k in owner] if any(avoids) else None
        must = None
        if any(musts):  # a line's constraints go with its first source (the line itself, unless past max_len)
            must = [musts[todo[k]] if spans[k][0] == u else [] for u, k in enumerate(owner)]
            for u, k in enumerate(owner):
                need = sum(len(c) if isinstance(c[0], int) else min(map(len, c)) for c in must[u])
                need += len(targets[u]) if targets is not None else 0
                if need >= self.max_len:
                    name, lineno = chunk[todo[k]][:2]
                    raise InputError(name, lineno, f"its constraints and prefix are {need} target tokens, and the "
                                     f"model's outputs hold at most {self.max_len - 1}")
        unit_hyps: dict[int, list[Hypothesis]] = {}  # the sources decoded so far whose line is not complete
        done = 0
        if src:
            lengths = [len(s) for s in src]
            if self.fixed:  # one fixed-shape decoder per source width, its places refilled as sentences finish
                groups = width_groups(lengths, self.cfg.max_tokens, self.cfg.batch_size)
            else:  # batches that shrink as sentences finish
                groups = [(b, None, None) for b in token_batches(lengths, self.cfg.max_tokens, self.cfg.batch_size)]
            groups.sort(key=lambda g: int(g[0].min()))  # earliest lines first, so output can start early
            for batch, width, slots in groups:
                rows = batch.tolist()
                hyps = self.decode([src[u] for u in rows], [keys[u] for u in rows],
                                   [targets[u] for u in rows] if targets is not None else None, width, slots,
                                   [avoid[u] for u in rows] if avoid is not None else None,
                                   [must[u] for u in rows] if must is not None else None)
                unit_hyps.update(zip(rows, hyps))
                for k in dict.fromkeys(owner[u] for u in rows):  # (each line once, in order)
                    start, n = spans[k]
                    if all(u in unit_hyps for u in range(start, start + n)):
                        results[todo[k]] = self._joined([unit_hyps.pop(u) for u in range(start, start + n)],
                                                        src[start : start + n], leads[k] is not None)
                        self.decoded += 1
                        self.empty += not results[todo[k]][0].tokens and not prefixes[todo[k]]
                while done in results:
                    yield first + done, results.pop(done)
                    done += 1
        while done < len(chunk):
            yield first + done, results.pop(done)
            done += 1

    def _units(self, item: tuple, ids: list[int], lead: int | None, whole: bool = False) -> list[list[int]]:
        """The sources a line is translated as, each without </s>, the language tag first where there is one: the
        line itself; its sentences, where `split_sentences` says (auto: a line longer than 99% of the training
        sources or than the model takes, or any line for a model known to be trained on sentences; never a line
        with constraints, `whole`, that fits max_len); and any source longer than the model's max_len in windows of
        as many tokens as it takes (`_windows`: cut between words), with a warning naming the line (never cut)."""
        name, lineno, text = item[:3]
        room = self.max_len - 1 - (lead is not None)  # tokens a source may have besides </s> and the tag
        mode = self.cfg.split_sentences
        pieces = [ids]
        if whole and len(ids) <= room:
            mode = "never"
        if mode == "always" or mode == "auto" and (len(ids) > room or self.on_sentences or self.trained_len is not None
                                                  and len(ids) + 1 > self.trained_len):
            sentences = self._sentences(text, _source_language(item) or self.src_lang)
            if len(sentences) > 1:
                pieces = encode_batch(self.src_tok, sentences)
        out = []
        for seq in pieces:
            if len(seq) > room:
                warn(f"{name}:{lineno}: a sentence of {len(seq)} tokens, longer than the model's max_len "
                     f"({self.max_len}); translating it in windows of up to {room} tokens, cut between words")
                if self._cuts is None:
                    self._cuts = (word_start_ids(self.src_tok), clause_end_ids(self.src_tok))
                windows = _windows(seq, room, *self._cuts)
            else:
                windows = [seq]
            out += [[lead, *w] if lead is not None else w for w in windows]
        return out

    def _sentences(self, text: str, lang: str | None) -> list[str]:
        """`text`'s sentences (tfcli.data.sentences) by the rules of `lang` (None: generic ones)."""
        if lang not in self.splitters:
            from tfcli.data.sentences import splitter

            self.splitters[lang] = splitter(lang)
        return self.splitters[lang](text)

    def _joined(self, parts: list[list[Hypothesis]], srcs: list[list[int]], tagged: bool) -> list[Hypothesis]:
        """A line's hypotheses from those of the sources it was cut into, in order: the k-th best of each joined
        (tokens and token scores one after the other, the score the sum, alignments offset by the words before)."""
        if len(parts) == 1:
            return parts[0]
        out = []
        for r in range(min(len(p) for p in parts)):
            hs = [p[r] for p in parts]
            score = None if any(h.score is None for h in hs) else sum(h.score for h in hs)
            token_scores = None if any(h.token_scores is None for h in hs) else [x for h in hs for x in h.token_scores]
            alignment = None
            if all(h.alignment is not None for h in hs):
                alignment, src_off, tgt_off, last = [], 0, 0, ""
                for h, seq in zip(hs, srcs):
                    text = "" if self.cfg.raw else self.tgt_tok.decode(h.tokens, skip_special_tokens=False).strip()
                    if last and text and _unspaced(last[-1]) and _unspaced(text[0]):
                        tgt_off -= 1  # (joined without a space: the seam's two words are one, join_sentences)
                    alignment += [(i + src_off, j + tgt_off) for i, j in h.alignment]
                    src_off += self._words(self.src_tok, [t for t in seq[tagged:] if t != EOS_ID])
                    tgt_off += len(h.tokens) if self.cfg.raw else len(text.split())  # (as _words counts them)
                    last = text or last
            out.append(Hypothesis([t for h in hs for t in h.tokens], score, token_scores, alignment,
                                  parts=[len(h.tokens) for h in hs]))
        return out

    def _words(self, tok, ids: list[int]) -> int:
        """Words of `ids` as alignments count them (tfcli.generate.alignment.word_of_token)."""
        return len(ids) if self.cfg.raw else len(tok.decode(ids, skip_special_tokens=False).split())

    def _phrases(self, item: tuple, field: int, what: str) -> list:
        """An item's phrases `field` (a list: the sixth field the texts to avoid, the seventh those to hold, where
        a list of texts is a set of alternatives) as target token lists (a set: a list of them); a phrase with no
        token, or one to hold that the tokenizer reads with <unk>, is an InputError naming the line."""
        phrases = item[field] if len(item) > field and item[field] else []
        forms = [p for c in phrases for p in ([c] if isinstance(c, str) else c)]
        ids = dict(zip(forms, encode_batch(self.tgt_tok, forms))) if forms else {}
        for phrase, toks in ids.items():
            if not toks:
                raise InputError(item[0], item[1], f"the phrase {what} {phrase!r} has no target tokens")
            if UNK_ID in toks and field == 6:  # (a phrase to avoid with <unk> in it just never matches)
                raise InputError(item[0], item[1], f"the phrase {what} {phrase!r} has a piece the target vocabulary "
                                 "lacks (<unk>)")
        if phrases and field == 6 and self.cfg.sampling:
            raise InputError(item[0], item[1], "constraints need beam search, not --sampling")
        return [ids[c] if isinstance(c, str) else [ids[p] for p in c] for c in phrases]

    def decode(self, batch: list[list[int]], lines: list[int], prefixes: list[list[int]] | None = None,
               width: int | None = None, slots: int | None = None,
               avoid: list[list[list[int]]] | None = None,
               must: list[list[list[int]]] | None = None) -> list[list[Hypothesis]]:
        """Hypotheses (best first) for a batch of source id lists (each ending in </s>); `lines`: their 0-based
        indices in the input (what a line's random numbers are keyed by when sampling); `prefixes`: target ids each
        output starts with (an empty list: none). `width`: pad the sources to it; `slots`: sentences decoded at
        once (a fixed-shape decoder, continuous batching), None: all. `avoid`: each source's target phrases (token
        lists) that its output must not hold; `must`: those it must hold (beam search, at any beam size)."""
        cfg = self.cfg
        src = pad(batch, length=min(width, self.max_len) if width else None).to(self.device)
        prefix = None
        if prefixes is not None and any(prefixes):
            prefix = pad([p[: self.max_len - 1] for p in prefixes], pad_id=-1).to(self.device)
        banned = avoid_tensor(avoid, self.device) if avoid is not None else None
        constraints = constraint_tensor(must, self.device) if must is not None else None
        with self.precision:
            if constraints is not None:
                hyps = beam_search(
                    self.steps, src, cfg.beam_size, cfg.len_penalty, cfg.max_len_a, cfg.max_len_b,
                    nbest=cfg.nbest or 1, min_len=cfg.min_len, token_scores=cfg.scores, prefix=prefix,
                    check_every=cfg.check_every, slots=slots, avoid=banned, constraints=constraints,
                    continuing=self.continuing(),
                )
            elif cfg.sampling:
                sampling = LineSampling(cfg.temperature, cfg.topk, cfg.topp, cfg.seed)
                hyps = [[h] for h in greedy_decode(
                    self.steps, src, cfg.max_len_a, cfg.max_len_b, cfg.min_len, cfg.len_penalty, sampling,
                    torch.tensor(lines, device=self.device), prefix, cfg.check_every, slots, avoid=banned,
                )]
            elif cfg.beam_size == 1:
                hyps = [[h] for h in greedy_decode(
                    self.steps, src, cfg.max_len_a, cfg.max_len_b, cfg.min_len, cfg.len_penalty, prefix=prefix,
                    check_every=cfg.check_every, slots=slots, scores=cfg.tabular, avoid=banned,
                )]
            else:
                hyps = beam_search(
                    self.steps, src, cfg.beam_size, cfg.len_penalty, cfg.max_len_a, cfg.max_len_b,
                    nbest=cfg.nbest or 1, min_len=cfg.min_len, token_scores=cfg.scores, prefix=prefix,
                    check_every=cfg.check_every, slots=slots, avoid=banned,
                )
            if cfg.alignment:
                self._align(batch, src, hyps)
        if self.langs:  # the target language's token, forced first: not part of the translation
            for h in (h for hs in hyps for h in hs):
                h.tokens = h.tokens[1:]
                h.token_scores = h.token_scores[1:] if h.token_scores is not None else None
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

    def _align(self, batch: list[list[int]], src: torch.Tensor, hyps: list[list[Hypothesis]]) -> None:
        """Each hypothesis's word alignment (every n-best one), from one teacher-forced pass over the batch."""
        rows = [i for i, hs in enumerate(hyps) for _ in hs]
        flat = [h for hs in hyps for h in hs]
        aligned = token_alignments(self.steps.model, src[rows], [h.tokens for h in flat], self.alignment_layer)
        skip = 1 if self.langs else 0  # (the forced target-language token)
        for row, h, positions in zip(rows, flat, aligned):
            h.alignment = word_alignment(self.src_tok, self.tgt_tok, batch[row], h.tokens[skip:], positions[skip:],
                                         self.cfg.raw, lead=1 if self.tags or self.langs else 0)

    def texts(self, hyps: list[Hypothesis]) -> list[str]:
        """The hypotheses as output text: detokenised (or subword tokens with `raw`), one line each; a line
        translated sentence by sentence, each sentence detokenised alone and joined (`join_sentences`)."""
        if self.cfg.raw:
            texts = [" ".join(self.tgt_tok.id_to_token(t) for t in h.tokens) for h in hyps]
        else:
            pieces, spans = [], []
            for h in hyps:
                cuts = [0, *itertools.accumulate(h.parts or [len(h.tokens)])]
                spans.append((len(pieces), len(cuts) - 1))
                pieces += [h.tokens[a:b] for a, b in zip(cuts, cuts[1:])]
            decoded = decode_batch(self.tgt_tok, pieces)
            texts = [join_sentences(decoded[a : a + n]) for a, n in spans]
        # one line out per line in, whatever the detokeniser makes
        return [t.replace("\r", " ").replace("\n", " ") for t in texts]

    def _format(self, index: int, hyps: list[Hypothesis]) -> str:
        align = (lambda h: "\t" + pharaoh(h.alignment)) if self.cfg.alignment else (lambda h: "")
        if not self.cfg.tabular:
            return self.texts(hyps[:1])[0] + align(hyps[0])
        lines = []
        for h, text in zip(hyps, self.texts(hyps)):
            line = f"{index}\t{h.score:.4f}\t{text}"
            if self.cfg.scores:
                line += "\t" + " ".join(f"{s:.4f}" for s in h.token_scores)
            lines.append(line + align(h))
        return "\n".join(lines)

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


def _side_lines(path: str | None, flag: str, field: str, what: str, inputs: list[str], cfg: TranslateConfig,
                output_dir: str | None) -> list[str] | None:
    """The lines of a file with one line a line of the input (--prefix, --avoid), checked against the input's
    line count where it is known before reading it."""
    if path is None:
        return None
    if cfg.input_format == "jsonl":
        raise TfcliError(f"{flag}: JSONL input gives each line's {field} in its \"{field}\" field; drop {flag}")
    if output_dir is not None:
        raise TfcliError(f"{flag} holds one line per input line of one output: use -o FILE, not --output-dir")
    with encoding_errors(cfg.encoding_errors):
        lines = read_lines(path)
    total = _count_lines(inputs)
    if total is not None and total != len(lines):
        raise TfcliError(f"{path}: {len(lines)} {what} for {total} input lines; give one a line")
    return lines


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
    side_files = [f for f in (prefix_file, avoid_file, constraint_file) if f]
    sources = inputs + [p for c in checkpoints for p in input_paths(c)] + side_files
    refuse_overwriting_inputs([out or "-" for _, out in jobs], sources, hint)
    prefixes = _side_lines(prefix_file, "--prefix", "prefix", "prefixes", inputs, cfg, output_dir)
    avoid = _side_lines(avoid_file, "--avoid", "avoid", "lines", inputs, cfg, output_dir)
    musts = _side_lines(constraint_file, "--constraints", "constraints", "lines", inputs, cfg, output_dir)

    def annotate(items):
        if prefixes is not None:
            items = with_prefixes(items, prefixes, prefix_file)
        if avoid is not None:
            items = with_avoid(items, avoid, avoid_file)
        return with_constraints(items, musts, constraint_file) if musts is not None else items

    processes = distributed.launched().world_size
    if processes > 1 or resume:
        why = f"on {processes} processes" if processes > 1 else "with --resume"
        if output in (None, "-") or output_dir is not None:
            raise TfcliError(f"translating {why} writes one file: give -o FILE (not stdout or --output-dir)")
        def make_translator(device: torch.device) -> Translator:
            precision(device, cfg.dtype)
            return Translator(load_ensemble(checkpoints, device, cfg.dtype), cfg, device)

        with encoding_errors(cfg.encoding_errors):
            return translate_in_parts(checkpoints, inputs, output, cfg, resume, progress, make_translator,
                                      annotate, side_files)
    device = resolve_device(cfg.device)
    precision(device, cfg.dtype)  # fail on an impossible precision before loading anything
    translator = Translator(load_ensemble(checkpoints, device, cfg.dtype), cfg, device)
    total = _count_lines(inputs) if (progress if progress is not None else sys.stderr.isatty()) else None
    n = 0
    with encoding_errors(cfg.encoding_errors), Progress("translating", total, "sent", progress) as bar:
        for files, out_path in jobs:
            translator.index = 0  # --nbest line numbers count within each output
            with open_output(out_path) as out:
                items = read_inputs(files, pauses=True)
                if cfg.input_format == "jsonl":
                    items = jsonl_items(items)
                for text in translator.run(annotate(items)):
                    bar.emit(out, text)
                    bar.advance(1)
                    n += 1
    return n
