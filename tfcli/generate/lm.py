"""`tfcli lm-generate`: continue prompts with a decoder-only language model.

The prompt runs through the model once (prefill), filling the key/value memory of `step.IncrementalDecoder`; each
later step feeds only the new token. Many prompts are generated together: left-padded to one length (a mask hides
the padding, and each row numbers its positions from its first real token), and rows leave the batch as they
finish. A row finishes at
</s>, at a --stop string, or after --max-new-tokens. With a single prompt and sample, text streams to stdout as it
is made.

Language models are trained on one stream "</s> s_1 </s> s_2 </s> ...", so a prompt starts after a </s>: the model
sees "</s> prompt" and an empty prompt generates from the start of a text.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import IO, Callable, Iterator

import torch

from tfcli.console import Progress, warn
from tfcli.data.tokenizer import decode_batch, encode_batch
from tfcli.generate.config import GenerateConfig
from tfcli.device import precision, resolve_device
from tfcli.generate.loader import Loaded, load
from tfcli.generate.sampling import line_uniforms, next_token
from tfcli.generate.step import StepModel, step_model
from tfcli.generate.translate import open_output
from tfcli.io import iter_lines, refuse_overwriting_inputs
from tfcli.specials import EOS_ID, PAD_ID, UNK_ID

START_ID = EOS_ID  # what precedes every text in LM training streams


@torch.inference_mode()
def generate_ids(
    model,
    prompts: list[list[int]],
    cfg: GenerateConfig,
    on_token: Callable[[int, list[int]], bool] | None = None,
    rows: list[int] | None = None,
) -> list[list[int]]:
    """New ids (without </s>) for each prompt of one batch; prompts are id lists starting with START_ID.

    Sampling draws each prompt's tokens from random numbers keyed by `cfg.seed` (None: a seed drawn from torch's
    global generator), the prompt's index in the input (`rows`; default: its place in `prompts`) and the step, so
    that its text does not depend on the batch it is in or on its neighbours.

    A row gets at most `cfg.max_new_tokens` new ids. When the context reaches the model's max_len, generation goes on
    from the last max_len / 2 tokens, as nanoGPT's sample.py crops the context to its block size: the key/value
    memory is rebuilt from them (one prefill every max_len / 2 new tokens, not a full forward pass per token).

    `on_token(row, new_ids)` is called after each new token of a row; it returns True to stop that row (a stop
    string was reached).
    """
    sm = step_model(model)
    device = sm.embed.tok.weight.device
    B = len(prompts)
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    T = int(lengths.max())
    ids = torch.full((B, T), PAD_ID, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, T - len(p) :] = torch.tensor(p, device=device)
    max_len = sm.cfg.max_len
    valid = torch.arange(T, device=device)[None, :] >= (T - lengths)[:, None]
    decoder, logits = _prefill(sm, ids, valid, min(max_len, T + cfg.max_new_tokens))
    history = ids  # for the repetition penalty (padding is <pad>, which is never chosen anyway)
    alive = list(range(B))
    out: list[list[int]] = [[] for _ in range(B)]
    seed = cfg.seed if cfg.seed is not None else int(torch.randint(0, 2**62, ()))
    lines = torch.tensor(rows if rows is not None else alive, device=device)  # each live row's index in the input
    step = 0
    while True:
        if cfg.ignore_eos or cfg.min_new_tokens:  # </s> is not allowed yet (or ever)
            early = torch.tensor([cfg.ignore_eos or len(out[row]) < cfg.min_new_tokens for row in alive], device=device)
            logits = logits.clone()
            logits[early, EOS_ID] = float("-inf")
        step += 1
        nxt = next_token(logits, history, cfg.greedy, cfg.temperature, cfg.top_k, cfg.top_p, cfg.repetition_penalty,
                         uniforms=None if cfg.greedy else line_uniforms(seed, lines, step))
        keep = []
        for j, (row, t) in enumerate(zip(alive, nxt.tolist())):
            if t == EOS_ID:
                continue
            out[row].append(t)
            if (on_token is not None and on_token(row, out[row])) or len(out[row]) >= cfg.max_new_tokens:
                continue
            keep.append(j)
        if not keep:
            break
        if len(keep) < len(alive):
            idx = torch.tensor(keep, device=device)
            decoder.select(idx)
            history, nxt, lines = history[idx], nxt[idx], lines[idx]
            alive = [alive[j] for j in keep]
        history = torch.cat([history, nxt[:, None]], 1)
        if decoder.t < decoder.max_steps:
            logits = decoder.step(nxt)  # one new token per row; the decoder holds the rest
        else:  # the context is full: go on from its second half (positions count from 0 again)
            decoder.release()
            window = history[:, -max(1, max_len // 2) :]
            left = cfg.max_new_tokens - min(len(out[row]) for row in alive)
            # short prompts may leave padding in the window
            decoder, logits = _prefill(sm, window, window != PAD_ID, min(max_len, window.size(1) + left))
    decoder.release()
    return out


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
    """Generate `cfg.num_samples` continuations of every prompt; write "prompt + continuation" per sample, in order
    (with `cfg.jsonl`, one JSON object per sample: its prompt's 0-based index, the sample's, prompt, continuation).

    Returns the number of samples written.
    """
    from tfcli.checkpoint import input_paths

    refuse_overwriting_inputs([output or "-"], [input_file, *input_paths(checkpoint)], "choose another -o")
    device = resolve_device(cfg.device)
    precision(device, cfg.dtype)  # fail on an impossible precision before loading anything
    loaded = load(checkpoint, device, "lm", cfg.dtype)
    texts = read_prompts(prompts, input_file)
    if not texts:
        where = input_file if input_file not in (None, "-") else "stdin"
        warn(f"no prompts: {where} was empty, so nothing was generated (give a PROMPT, or run in a terminal to "
             "generate from scratch)")
    samples = [text for text in texts for _ in range(cfg.num_samples)]  # the prompt of each sample
    stream = len(samples) == 1 and output in (None, "-") and not cfg.jsonl
    written = 0
    bar = Progress("generating", len(samples), "samples", False if stream else progress)
    with open_output(output) as out, bar:
        # enumerate, not zip: the generator must run to its end (its summary warning comes after the last sample)
        for i, continuation in enumerate(continuations(loaded, samples, cfg, device, out if stream else None)):
            text = samples[i]
            if cfg.jsonl:
                index, sample = divmod(i, cfg.num_samples)
                record = {"index": index, "sample": sample, "prompt": text, "continuation": continuation}
                bar.emit(out, json.dumps(record, ensure_ascii=False))
            elif not stream:
                bar.emit(out, text + continuation)
            bar.advance(1)
            written += 1
    return written


def continuations(loaded: Loaded, texts: list[str], cfg: GenerateConfig, device: torch.device,
                  stream: IO[str] | None = None) -> Iterator[str]:
    """The continuation of each prompt text, in order (`cfg.num_samples` is the caller's business: repeat a text
    for more samples). With `stream`, the one text and its continuation are written there as they grow."""
    tok = loaded.tgt_tok
    encoded = encode_batch(tok, texts)
    _warn_unknown(encoded)
    prompt_ids = _fit_prompts(loaded.steps, [[START_ID] + ids for ids in encoded])
    autocast = precision(device, cfg.dtype, loaded.steps.half)
    if cfg.seed is None:  # one seed for the whole input, so that each prompt's numbers are its own
        cfg = dataclasses.replace(cfg, seed=int(torch.randint(0, 2**62, ())))
    return _generate(loaded.steps, tok, texts, prompt_ids, cfg, autocast, stream)


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


def _generate(model, tok, texts, prompt_ids, cfg, autocast, stream: IO[str] | None) -> Iterator[str]:
    """Yield the continuation of each sample, in order; batches hold similar prompt lengths, and run in the order
    of their earliest sample so output can start early. With `stream`, the one sample is written as it grows."""
    order = sorted(range(len(texts)), key=lambda i: len(prompt_ids[i]))
    batches = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    batches.sort(key=min)
    needs_text = stream is not None or bool(cfg.stop)  # decode after every token, not just at the end
    results: dict[int, str] = {}
    early_ends: list[int] = []  # new-token counts of the samples that ended at </s>
    done = 0
    for batch in batches:
        conts = [Continuation(tok, prompt_ids[i], cfg.stop) for i in batch]
        shown = 0
        if stream is not None:
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
            new = generate_ids(model, [prompt_ids[i] for i in batch], cfg, on_token if needs_text else None, batch)
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
    if early_ends:
        span = f"{min(early_ends)}" if min(early_ends) == max(early_ends) else f"{min(early_ends)}-{max(early_ends)}"
        warn(f"{len(early_ends)} of {len(texts)} sample(s) ended at </s> after {span} of --max-new-tokens "
             f"{cfg.max_new_tokens} tokens; --min-new-tokens N or --ignore-eos go on past it")
