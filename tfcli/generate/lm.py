"""`tfcli lm-generate`: continue prompts with a decoder-only language model.

The prompt runs through the model once (prefill), filling the key/value memory of `step.IncrementalDecoder`; each
later step feeds only the new token. Many prompts are generated together: left-padded to one length (a mask hides
the padding, and each row numbers its positions from its first real token), and rows leave the batch as they
finish (on a GPU's fixed-shape decoder, the next prompt is prefilled into a finished row's place instead). A row
finishes at </s>, at a --stop string, or after --max-new-tokens. With a single prompt and sample, text streams to
stdout as it is made.

Language models are trained on one stream "</s> s_1 </s> s_2 </s> ...", so a prompt starts after a </s>: the model
sees "</s> prompt" and an empty prompt generates from the start of a text.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from typing import IO, Callable, Iterator

import torch

from tfcli.console import Progress, info, warn
from tfcli.data.tokenizer import decode_batch, encode_batch
from tfcli.generate.config import GenerateConfig
from tfcli.device import precision, resolve_device, to_device
from tfcli.errors import NotANumber, TfcliError
from tfcli.generate.loader import Loaded, load
from tfcli.generate.native import NAN_MESSAGE
from tfcli.generate.rules import MinLength, NoEnd, NoRepeatNgram, OtherEnds, RepetitionPenalty, RowRules, Step
from tfcli.generate.sampling import line_uniforms, next_token
from tfcli.generate.schedule import Schedule, read_every
from tfcli.generate.step import StepModel, step_model
from tfcli.io import encoding_errors, iter_lines, open_output, refuse_overwriting_inputs
from tfcli.specials import EOS_ID, PAD_ID, UNK_ID

START_ID = EOS_ID  # what precedes every text in LM training streams
REFILLS = 16  # on a fixed-shape decoder, prompts a batch holds per place


@torch.inference_mode()
def generate_ids(
    model,
    prompts: list[list[int]],
    cfg: GenerateConfig,
    on_token: Callable[[int, list[int]], bool] | None = None,
    rows: list[int] | None = None,
    slots: int | None = None,
    check_every: int = 0,
    ends: tuple[int, ...] = (),
) -> list[list[int]]:
    """New ids (without </s>) for each prompt; prompts are id lists, a tfcli-trained model's starting with
    START_ID. `ends`: the model's end tokens besides </s> (an imported model's: `text_conventions`); a text
    ends at any of them, which is not part of its new ids.

    Sampling draws each prompt's tokens from random numbers keyed by `cfg.seed` (None: a seed drawn from torch's
    global generator), the prompt's index in the input (`rows`; default: its place in `prompts`) and the token's
    number, so that its text does not depend on the batch it is in or on its neighbours.

    The first `slots` prompts (None: all) are prefilled together, left-padded. What a step decides stays on the
    device (each row's new tokens, how many, whether it has ended); the host reads it every `check_every` steps
    (`schedule.read_every`; with `on_token`, every step), to stop, and to let finished rows leave or, with a
    fixed-shape decoder (a GPU's), to give their places to the next prompts, each prefilled into its place
    (continuous batching). A row that ended between two reads runs on unread.

    A row gets at most `cfg.max_new_tokens` new ids. When the context reaches the positions the decoder holds
    (the model's max_len at most), generation goes on from the last max_len / 2 tokens, as nanoGPT's sample.py
    crops the context to its block size: the key/value memory is rebuilt from them (one prefill every max_len / 2
    new tokens, not a full forward pass per token). Prompts prefilled together, left-padded, slide together, when
    the longest fills the context: for each to slide as it would alone, give prompts of one length (plan_batches).

    `on_token(row, new_ids)` is called after each new token of a row; it returns True to stop that row (a stop
    string was reached).
    """
    cfg = cfg.resolved()[0]  # (nulls: tfcli's defaults; `continuations` fills a model's first)
    sm = step_model(model)
    device = sm.embed.tok.weight.device
    B = len(prompts)
    n = B if slots is None else max(1, min(slots, B))
    if n < B and not sm.static:
        raise ValueError("generating in fewer slots than prompts needs the fixed-shape decoder (StepModel(static=True))")
    every = 1 if on_token is not None else read_every(check_every, device)
    # (no horizon: a row ends at --max-new-tokens, </s> or a stop string, all read on the host)
    sched = Schedule(B, n, sm.static, every, 2**62, device)
    search = _Continue(sm, sched, prompts, cfg, on_token, rows if rows is not None else list(range(B)), every, ends)
    sched.run(search)
    search.decoder.release()
    return search.out


_NAN = -2  # (in _Continue.fresh: the row's logits held NaN)


class _Continue:
    """Language-model generation as a `schedule.Search`. Per decoder row, on the device: its prompt's index in the
    input (`line`), how many new ids it has, whether it has ended, the ids of the steps since the last read (-1:
    none: </s>, or it had ended), and with a repetition penalty its text so far; on the host, the positions it
    holds. A step is the decoder's (on the last token chosen), then the next token's choice."""

    def __init__(self, sm, sched: Schedule, prompts, cfg: GenerateConfig, on_token, lines: list[int], every: int,
                 ends: tuple[int, ...] = ()):
        self.sm, self.sched, self.prompts, self.cfg, self.on_token, self.lines = sm, sched, prompts, cfg, on_token, lines
        n, device = len(sched.held), sched.item.device
        self.device, self.window = device, max(1, sm.cfg.max_len // 2)
        ids, valid = _left_pad(prompts[:n], device)
        T = max(len(p) for p in prompts)
        self.decoder, self.logits = _prefill(sm, ids, valid, min(sm.cfg.max_len, T + cfg.max_new_tokens))
        self.fixed, self.room = self.decoder.fixed, self.decoder.max_steps
        self.rules = lm_rules(cfg, ends, device)
        self.ends = torch.tensor([EOS_ID, *ends], device=device)
        self.track = cfg.repetition_penalty != 1.0 or cfg.no_repeat_ngram_size > 0  # (rules that read the text)
        self.history = ids if self.track else ids[:, :0]
        self.seed = cfg.seed if cfg.seed is not None or cfg.greedy else int(torch.randint(0, 2**62, ()))
        self.line = to_device(lines[:n], device)
        self.count = torch.zeros(n, dtype=torch.long, device=device)
        self.ended = torch.zeros(n, dtype=torch.bool, device=device)
        self.fresh = torch.full((n, every), -1, dtype=torch.long, device=device)
        self.span = [ids.size(1)] * n
        self.out: list[list[int]] = [[] for _ in prompts]
        self.since = 0  # steps since the last read
        self.nxt: torch.Tensor | None = None  # the tokens chosen last, which the next step feeds
        self.pending: dict[int, int] = {}  # fixed shapes: row -> the prompt that takes it after the next step

    def capturable(self) -> bool:
        return False  # (the decoder replays its own step: sampling here reads the host's counters)

    def advance(self, at) -> None:
        if self.nxt is not None:
            if self.track:
                self.history = torch.cat([self.history, self.nxt[:, None]], 1)
            if not self.fixed and self.decoder.t == self.room:
                self._slide_all()
            else:
                self.logits = self.decoder.step(self.nxt)  # one new token per row; the decoder holds the rest
                if self.fixed:
                    self._after_fixed_step()
        cfg, step = self.cfg, Step(self.count + 1, self.history, length=self.history.size(1))
        uniforms = None if cfg.greedy else line_uniforms(self.seed, self.line, self.count + 1)
        nxt = next_token(self.logits, self.rules, step, cfg.greedy, cfg.temperature, cfg.top_k, cfg.top_p,
                         uniforms=uniforms)
        new = ~self.ended & ~torch.isin(nxt, self.ends)
        # (a row whose logits hold NaN or +inf chose nothing, its softmax NaN: read() says so; amax keeps NaN, in one
        # pass without a mask)
        self.fresh[:, self.since] = torch.where(self.logits.amax(-1).isfinite(), torch.where(new, nxt, -1), _NAN)
        self.count += new
        self.ended |= ~new | (self.count >= cfg.max_new_tokens)
        self.since += 1
        self.nxt = nxt

    def must_read(self) -> bool:
        """The context is full: every row (shrinking decoder) or one that still generates (fixed shapes)."""
        if not self.fixed:
            return self.decoder.t == self.room
        return any(p >= 0 and s == self.room for p, s in zip(self.sched.held, self.span))

    def read(self) -> list[bool]:
        """Each row's new ids since the last read (a -1 among them: it has ended, at </s> or before), appended to
        its prompt's output; whether it has stopped."""
        got = self.fresh[:, : self.since].tolist()
        self.since = 0
        stopped = [True] * len(got)
        for r, p in enumerate(self.sched.held):
            if p < 0:
                continue
            for t in got[r]:
                if t == _NAN:
                    raise NotANumber(f"{NAN_MESSAGE} (generating for prompt {self.lines[p] + 1})")
                if t < 0:
                    break
                self.out[p].append(t)
                if self.on_token is not None and self.on_token(p, self.out[p]):
                    self.ended[r] = True
                    break
            else:
                stopped[r] = len(self.out[p]) >= self.cfg.max_new_tokens
        return stopped

    def retire(self, rows: list[int]) -> None:
        pass

    def keep(self, rows: torch.Tensor) -> None:
        self.decoder.select(rows)
        self.line, self.count, self.ended, self.fresh = (x[rows] for x in (self.line, self.count, self.ended, self.fresh))
        self.nxt, self.history = self.nxt[rows], self.history[rows]

    def admit(self, rows: torch.Tensor, items: torch.Tensor, placed: list[tuple[int, int]]) -> None:
        """Fixed shapes: the prompts take their rows after the next step (which runs on the old rows' last tokens,
        unread), each prefilled into its place."""
        self.pending.update(placed)

    def _slide_all(self) -> None:
        """A shrinking decoder whose context is full goes on from each text's second half (positions count from 0
        again): a new decoder, prefilled with those halves."""
        self.decoder.release()
        held = self.sched.held
        texts = [self.prompts[p] + self.out[p] for p in held]
        left = self.cfg.max_new_tokens - min(len(self.out[p]) for p in held)
        ids, valid = _left_pad([t[-self.window :] for t in texts], self.device)
        self.decoder, self.logits = _prefill(self.sm, ids, valid, min(self.sm.cfg.max_len, ids.size(1) + left))
        self.room = self.decoder.max_steps

    def _after_fixed_step(self) -> None:
        """After the step (whatever it computed for them): rows whose context is full go on from its second half,
        and rows taken by new prompts start them; each is prefilled into its place."""
        self.span = [s + 1 for s in self.span]
        held, logits = self.sched.held, self.logits
        for r, p in enumerate(held):
            if r in self.pending:
                p = self.pending.pop(r)
                logits[r] = _admit(self.decoder, r, self.prompts[p], self.device)
                self.span[r] = len(self.prompts[p])
                self.line[r], self.count[r], self.ended[r] = self.lines[p], 0, False
                if self.track:
                    self._track_prompt(r, self.prompts[p])
            elif p >= 0 and self.span[r] > self.room:
                text = self.prompts[p] + self.out[p]
                logits[r] = _admit(self.decoder, r, text[-self.window :], self.device)
                self.span[r] = min(self.window, len(text))

    def _track_prompt(self, r: int, prompt: list[int]) -> None:
        """Row r's text so far: the prompt, right-aligned (<pad>, never chosen, before it)."""
        history = self.history
        if history.size(1) < len(prompt):
            history = torch.cat([history.new_full((history.size(0), len(prompt) - history.size(1)), PAD_ID),
                                 history], 1)
        history[r] = PAD_ID
        history[r, history.size(1) - len(prompt):] = to_device(prompt, self.device)
        self.history = history


def lm_rules(cfg: GenerateConfig, ends: tuple[int, ...] = (), device=None) -> RowRules:
    """The rules of every row's next token: </s> (and the model's other `ends`) never (--ignore-eos) or not before
    --min-new-tokens, the repetition penalty, no repeated n-gram (the text read with its prompt, as transformers
    reads it)."""
    rules: list = [NoEnd()] if cfg.ignore_eos else [MinLength(cfg.min_new_tokens)]
    if cfg.repetition_penalty != 1.0:
        rules.append(RepetitionPenalty(cfg.repetition_penalty))
    if cfg.no_repeat_ngram_size:
        rules.append(NoRepeatNgram(cfg.no_repeat_ngram_size))
    if ends:
        rules.append(OtherEnds(list(ends), device))
    return RowRules(rules)


def _left_pad(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ids, valid): the prompts left-padded into one (B, T) tensor, and where they are real (None: everywhere)."""
    T = max(len(p) for p in prompts)
    ids = to_device([[PAD_ID] * (T - len(p)) + list(p) for p in prompts], device)
    if all(len(p) == T for p in prompts):
        return ids, None
    lengths = to_device([len(p) for p in prompts], device)
    return ids, torch.arange(T, device=device)[None, :] >= (T - lengths)[:, None]


def _admit(decoder, row: int, ids: list[int], device) -> torch.Tensor:
    """Prefill one text into a fixed-shape decoder's row; returns the logits after its last token."""
    return decoder.admit_prompts(to_device([row], device), to_device([ids], device))[0]


def _prefill(sm: StepModel, ids: torch.Tensor, valid: torch.Tensor, room: int):
    """Start a decoder with room for `room` positions and run the left-padded prompts `ids` through it once;
    returns it and the logits after each prompt, (B, V)."""
    decoder = sm.start(ids.size(0), 1, room)
    return decoder, decoder.prefill(ids, valid)


class Continuation:
    """The text a row has generated so far: detokenised after its prompt, cut at the first stop string."""

    def __init__(self, tok, prompt_ids: list[int], stop: list[str]):
        self.tok, self.prompt_ids, self.stop = tok, prompt_ids, stop
        self.head = decode_batch(tok, [prompt_ids])[0]
        self.text = ""
        self.stopped = False

    def update(self, new_ids: list[int]) -> bool:
        """Recompute the text after a new token; True when a stop string has appeared (the text ends before it)."""
        full = decode_batch(self.tok, [self.prompt_ids + new_ids])[0]
        # decode prompt and continuation together so spacing between them is right
        self.text = full[len(self.head) :] if full.startswith(self.head) else decode_batch(self.tok, [new_ids])[0]
        cuts = [i for i in (self.text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.text = self.text[: min(cuts)]
            self.stopped = True
        return self.stopped

    def safe_prefix(self) -> str:
        """What can be shown already: not a possible start of a stop string, nor a half-decoded character."""
        n = len(self.text)
        if not self.stopped:
            n -= max((len(s) for s in self.stop), default=1) - 1
            while n > 0 and self.text[n - 1] == "\ufffd":
                n -= 1
        return self.text[: max(n, 0)]


def read_prompts(prompts: list[str], input_file: str | None) -> list[str]:
    """Prompts from the arguments, else one per line of `input_file` (`-`: stdin), else stdin when it is piped,
    else one empty prompt (generate from scratch)."""
    if prompts:
        return list(prompts)
    if input_file is None and not sys.stdin.isatty():
        input_file = "-"
    if input_file is not None:
        return list(iter_lines(input_file))
    return [""]


def lm_generate(
    checkpoint: str, prompts: list[str], input_file: str | None, output: str | None, cfg: GenerateConfig,
    progress: bool | None = None,
) -> int:
    """Generate `cfg.nbest` continuations of every prompt; write "prompt + continuation" per sample, in order
    (with `cfg.jsonl`, one JSON object per sample: its prompt's 0-based index, the sample's, prompt, continuation).

    Returns the number of samples written.
    """
    from tfcli.checkpoint_meta import input_paths

    refuse_overwriting_inputs([output or "-"], [input_file, *input_paths(checkpoint)], "choose another -o")
    device = resolve_device(cfg.device)
    precision(device, cfg.dtype)  # fail on an impossible precision before loading anything
    loaded = load(checkpoint, device, "lm", cfg.dtype)
    with encoding_errors(cfg.encoding_errors):
        texts = read_prompts(prompts, input_file)
    shown = texts
    if cfg.chat:  # (a line may be a whole conversation: {"messages": [...]})
        from tfcli.generate.chat import read_messages

        source = "prompt" if prompts else input_file if input_file not in (None, "-") else "stdin"
        texts = [read_messages(t, f"{source}:{i}" if not prompts else f"prompt {i}") for i, t in enumerate(texts, 1)]
    if not texts:
        where = input_file if input_file not in (None, "-") else "stdin"
        warn(f"no prompts: {where} was empty, so nothing was generated (give a PROMPT, or run in a terminal to "
             "generate from scratch)")
    samples = [text for text in texts for _ in range(cfg.nbest)]  # the prompt of each sample
    shown = [text for text in shown for _ in range(cfg.nbest)]
    stream = len(samples) == 1 and output in (None, "-") and not cfg.jsonl
    written = 0
    bar = Progress("generating", len(samples), "samples", False if stream else progress)
    with open_output(output) as out, bar:
        # enumerate, not zip: the generator must run to its end (its summary warning comes after the last sample)
        for i, continuation in enumerate(_named(continuations(loaded, samples, cfg, device, out if stream else None),
                                                loaded.meta["dir"])):
            text = shown[i]
            if cfg.jsonl:
                index, sample = divmod(i, cfg.nbest)
                record = {"index": index, "sample": sample, "prompt": text, "continuation": continuation}
                bar.emit(out, json.dumps(record, ensure_ascii=False))
            elif not stream:
                bar.emit(out, continuation if cfg.chat else text + continuation)
            bar.advance(1)
            written += 1
    return written


def _named(items: Iterator[str], checkpoint: str) -> Iterator[str]:
    """`items`, NotANumber naming the checkpoint whose outputs were NaN."""
    try:
        yield from items
    except NotANumber as e:
        raise NotANumber(f"{checkpoint}: {e}") from None


def continuations(loaded: Loaded, texts: list[str], cfg: GenerateConfig, device: torch.device,
                  stream: IO[str] | None = None) -> Iterator[str]:
    """The continuation of each prompt text, in order (`cfg.nbest` is the caller's business: repeat a text
    for more samples). With `stream`, the one text and its continuation are written there as they grow."""
    tok = loaded.tgt_tok
    start, ends = text_conventions(loaded.meta)
    cfg, taken = cfg.resolved((loaded.meta.get("text") or {}).get("generation"))
    if taken:  # (an imported model's publisher chose them: say so, as transformers applies them silently)
        info(f"{loaded.meta['dir']}: generation_config.json's " + ", ".join(
            f"{k} {v}" for k, v in taken.items()) + " (set them to choose otherwise)")
    if cfg.chat:  # (the template writes the model's BOS where it wants one)
        texts, start = chat_prompts(loaded.meta, texts, cfg.system), []
    encoded = encode_batch(tok, texts)
    _warn_unknown(encoded)
    prompt_ids = _fit_prompts(loaded.steps, [start + ids for ids in encoded])
    autocast = precision(device, cfg.dtype, loaded.steps.half)
    if cfg.seed is None:  # one seed for the whole input, so that each prompt's numbers are its own
        cfg = dataclasses.replace(cfg, seed=int(torch.randint(0, 2**62, ())))
    return _generate(loaded.steps, tok, texts, prompt_ids, cfg, autocast, stream, ends)


def chat_prompts(meta: dict, prompts: list, system: str | None) -> list[str]:
    """Each prompt (a user's message, or a conversation: a list of messages) as the model's chat template writes
    it, the assistant's turn opened."""
    from tfcli.generate.chat import messages_of, render

    text = meta.get("text") or {}
    template = text.get("chat_template")
    if not template:
        raise TfcliError(f"{meta['dir']}: the model has no chat template (a base model, or one tfcli trained): "
                         "leave out --chat, and write the prompt as the model expects it")
    where = f"{meta['dir']}: chat template"
    return [render(template, messages_of(p, system), text.get("template_tokens", {}), where) for p in prompts]


def text_conventions(meta: dict) -> tuple[list[int], tuple[int, ...]]:
    """(the ids before every prompt, the end tokens besides </s>) of a checkpoint's language model: an imported
    model's own (meta "text": its tokenizer's BOS or none, its eos_token_id list), else tfcli's (START_ID, none)."""
    text = meta.get("text")
    if text is None:
        return [START_ID], ()
    return list(text.get("start", [])), tuple(text.get("ends", []))


def _warn_unknown(prompt_ids: list[list[int]]) -> None:
    """Prompt text the vocabulary cannot represent (a character tokenizer's unseen characters, a word level one's
    words) becomes <unk>, which the model continues from as from any token: say so, once."""
    unknown = [i for i, ids in enumerate(prompt_ids) if UNK_ID in ids]
    if unknown:
        n = sum(ids.count(UNK_ID) for ids in prompt_ids)
        warn(f"{n} prompt token(s) are unknown (<unk>) to the model's vocabulary (first in prompt {unknown[0] + 1}); "
             "the model continues from <unk> there: characters or words it never saw in training?")


def _fit_prompts(model, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Cut prompts longer than the model's max_len - 1 at their start (with a warning), leaving room to generate."""
    room = model.cfg.max_len - 1
    fitted = []
    for i, ids in enumerate(prompt_ids):
        if len(ids) > room:
            warn(f"prompt {i + 1}: {len(ids)} tokens, more than the model's max_len ({model.cfg.max_len}) allows; "
                 f"keeping the last {room}")
            ids = ids[-room:]
        fitted.append(ids)
    return fitted


def plan_batches(prompt_ids: list[list[int]], size: int, max_len: int, max_new_tokens: int) -> list[list[int]]:
    """Prompt indices in batches of at most `size`, of similar prompt lengths, in the order of their earliest
    prompt. A prompt that can fill the context (its length + max_new_tokens past max_len) is batched only with
    prompts of its own length: a left-padded batch slides its context for every row at once, when the longest
    fills it, so a shorter prompt there would slide earlier than it does alone."""
    def group(i: int) -> int:
        n = len(prompt_ids[i])
        return n if n + max_new_tokens > max_len else -1  # -1: never slides

    order = sorted(range(len(prompt_ids)), key=lambda i: (group(i), len(prompt_ids[i])))
    batches = []
    for _, members in itertools.groupby(order, key=group):
        members = list(members)
        batches += [members[i : i + size] for i in range(0, len(members), size)]
    return sorted(batches, key=min)


def _generate(model, tok, texts, prompt_ids, cfg, autocast, stream: IO[str] | None,
              ends: tuple[int, ...] = ()) -> Iterator[str]:
    """Yield the continuation of each sample, in order; batches hold similar prompt lengths, and run in the order
    of their earliest sample so output can start early. With `stream`, the one sample is written as it grows. On a
    fixed-shape decoder (a GPU's) a batch is REFILLS times --batch-size prompts, generated in --batch-size places
    that the next prompt takes as soon as one finishes."""
    fixed = model.static
    batches = plan_batches(prompt_ids, cfg.batch_size * (REFILLS if fixed else 1), model.cfg.max_len,
                           cfg.max_new_tokens)
    needs_text = stream is not None or bool(cfg.stop)  # decode after every token, not just at the end
    results: dict[int, str] = {}
    early_ends: list[int] = []  # new-token counts of the samples that ended at </s>
    done = 0
    for batch in batches:
        conts = [Continuation(tok, prompt_ids[i], cfg.stop) for i in batch]
        shown = 0
        if stream is not None and not cfg.chat:  # (a chat's reply alone)
            stream.write(texts[batch[0]])
            stream.flush()

        def on_token(j: int, new_ids: list[int]) -> bool:
            nonlocal shown
            stop = conts[j].update(new_ids)
            if stream is not None:
                visible = conts[j].safe_prefix()
                stream.write(visible[shown:])
                stream.flush()
                shown = len(visible)
            return stop

        with autocast:
            new = generate_ids(model, [prompt_ids[i] for i in batch], cfg, on_token if needs_text else None, batch,
                               cfg.batch_size if fixed else None, cfg.check_every, ends)
        for j, (i, ids) in enumerate(zip(batch, new)):
            if not needs_text:
                conts[j].update(ids)
            results[i] = conts[j].text
            if len(ids) < cfg.max_new_tokens and not conts[j].stopped:
                early_ends.append(len(ids))
        if stream is not None:
            stream.write(conts[0].text[shown:] + "\n")
            stream.flush()
        while done in results:
            yield results.pop(done)
            done += 1
    if early_ends and not cfg.chat:  # (a chat's reply ends at its end-of-turn)
        span = f"{min(early_ends)}" if min(early_ends) == max(early_ends) else f"{min(early_ends)}-{max(early_ends)}"
        warn(f"{len(early_ends)} of {len(texts)} sample(s) ended at </s> after {span} of --max-new-tokens "
             f"{cfg.max_new_tokens} tokens; --min-new-tokens N or --ignore-eos go on past it")
