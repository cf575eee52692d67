"""Teacher-forced loss and perplexity of a checkpoint on a prepared split.

    loss = (1/N) sum_t -log p(y_t | context)        nats per token, over the N scored tokens
    ppl  = exp(loss)                                 per (subword) token
    word ppl = exp(sum_t -log p(y_t | context) / W)  the same total, divided by W word-level tokens

Translation models: the target side given the source, every target token scored including </s> (as fairseq
does): target in = <s> y_1 .. y_m, target out = y_1 .. y_m </s>; padding is not counted.

Language models: the split is one stream, </s> s_1 </s> s_2 </s> ... s_n </s>, scored in consecutive windows of
the model's context (`window`, default max_len). Every token after the leading </s> is predicted, so the total
is the log-likelihood of the whole text, line ends included. With `stride` < window the windows overlap (a sliding
window) and each token is scored once, in the first window where it is among the last `stride` tokens: every
token then sees at least window - stride tokens of context (lower, fairer perplexity; window/stride times the
compute).

Word-level perplexity divides the total by W = whitespace words of {split}.tgt.txt + one per line for its </s>,
which for WikiText-2 is exactly the standard count (words + one <eos> per line: 245,569 for test). `words`
overrides W when the text file is missing or another convention is wanted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from tfcli import checkpoint

from tfcli import checkpoint_meta
from tfcli.data.batching import collate_seq2seq, lm_stream, token_batches
from tfcli.data.prepared import PreparedData, Sequences
from tfcli.errors import CheckpointError, ConfigError, TfcliError
from tfcli.evaluate.config import PerplexityConfig
from tfcli.console import Progress
from tfcli.device import resolve_device
from tfcli.io import iter_lines
from tfcli.specials import PAD_ID

IGNORE = -100  # target id that cross_entropy skips (padding, and context-only positions of sliding windows)
HEAD_FLOATS = 1 << 26  # logits computed at once while scoring a language model (256 MB of fp32)
TEXT_WINDOW = 4096  # --text's default window where the model's context is longer (Llama 3's is 131,072)


@dataclass
class PerplexityResult:
    checkpoint: str
    data: str
    split: str
    kind: str  # seq2seq | lm
    sequences: int
    tokens: int  # tokens scored
    nll: float  # total negative log-likelihood in nats
    words: int | None = None  # word-level tokens (whitespace words + one </s> per line)
    words_from: str = ""  # where the word count came from
    window: int | None = None  # LM only
    stride: int | None = None  # LM only
    truncated: int = 0  # pairs cut to the model's max_len (their tail is not scored)

    @property
    def loss(self) -> float:
        return self.nll / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.loss)

    @property
    def word_ppl(self) -> float | None:
        return math.exp(self.nll / self.words) if self.words else None

    def to_json(self) -> dict:
        return {
            "checkpoint": self.checkpoint,
            "data": self.data,
            "split": self.split,
            "kind": self.kind,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "nll": self.nll,  # total
            "nll_per_token": self.loss,
            "loss": self.loss,  # = nll_per_token (kept for scripts that read it)
            "ppl": self.ppl,
            "bits_per_token": self.loss / math.log(2),
            "words": self.words,
            "word_ppl": self.word_ppl,
            "words_from": self.words_from or None,
            "window": self.window,
            "stride": self.stride,
            "truncated": self.truncated,
        }

    def format(self) -> str:
        lines = [
            f"checkpoint: {self.checkpoint} ({self.kind})",
            f"data:       {self.data} split {self.split}: {self.sequences} sequences, {self.tokens} tokens scored"
            + (f" (windows of {self.window}, stride {self.stride})" if self.window is not None else ""),
            f"nll  = {self.loss:.4f} nats/token ({self.loss / math.log(2):.4f} bits; plain cross-entropy, not the "
            "label-smoothed training loss)",
            f"ppl  = {self.ppl:.2f} per token",
        ]
        if self.words:
            lines.append(f"ppl  = {self.word_ppl:.2f} per word (exp(total NLL / {self.words} words; {self.words_from}))")
        else:
            lines.append(f"word ppl: not computed ({self.words_from})")
        if self.truncated:
            lines.append(
                f"warning: {self.truncated} pairs were longer than the model's max_len and were cut; their tails are "
                "not scored"
            )
        return "\n".join(lines)


def check_tokenizers(meta: dict, data: PreparedData, sides: list[str]) -> None:
    """The data must have been tokenized with the checkpoint's tokenizer: same file, or at least the same vocabulary."""
    from tokenizers import Tokenizer

    for side in sides:
        checkpoint.tokenizer(meta, side)  # exists, and fits the model
        ckpt_file = checkpoint_meta.tokenizer_path(meta, side)
        if side not in data.meta.get("tokenizers", {}):
            raise TfcliError(f"{data.path}: has no {side} tokenizer; was it prepared for another kind of model?")
        data_file = data.tokenizer_file(side)
        if ckpt_file.read_bytes() == data_file.read_bytes():
            continue
        ckpt_vocab = Tokenizer.from_file(str(ckpt_file)).get_vocab()
        data_vocab = Tokenizer.from_file(str(data_file)).get_vocab()
        if ckpt_vocab != data_vocab:
            differ = len(set(ckpt_vocab.items()) ^ set(data_vocab.items())) // 2
            raise CheckpointError(
                f"tokenizer mismatch: {data_file} ({len(data_vocab)} tokens) is not the tokenizer of the checkpoint "
                f"{ckpt_file} ({len(ckpt_vocab)} tokens; about {differ} entries differ); prepare the evaluation data "
                "with the checkpoint's tokenizer"
            )


@torch.inference_mode()
def seq2seq_nll(
    model, src: Sequences, tgt: Sequences, max_tokens: int, device: torch.device
) -> tuple[float, int, int]:
    """Total target NLL (nats), tokens scored (</s> included, padding not) and pairs cut to max_len."""
    max_len = model.cfg.max_len
    lengths = np.maximum(src.lengths, tgt.lengths) + 1  # + </s> (or <s>): the padded width of the pair
    truncated = int((lengths > max_len).sum())
    nll, count = 0.0, 0
    batches = token_batches(np.minimum(lengths, max_len), max_tokens)
    with Progress("scoring", len(src), "sent") as bar:
        for idx in batches:
            s, t_in, t_out = collate_seq2seq([src[i] for i in idx], [tgt[i] for i in idx], max_len)
            s, t_in, t_out = s.to(device), t_in.to(device), t_out.to(device)
            logits = model(s, t_in)
            nll += F.cross_entropy(
                logits.float().flatten(0, 1), t_out.flatten(), ignore_index=PAD_ID, reduction="sum"
            ).item()
            count += int((t_out != PAD_ID).sum())
            bar.advance(len(idx))
    return nll, count, truncated


def lm_windows(n_targets: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, n_new) per window: inputs stream[begin:end] predict stream[begin+1:end+1]; the last n_new of
    those targets are scored (each target exactly once)."""
    windows, scored_to = [], 0
    begin = 0
    while scored_to < n_targets:
        end = min(begin + window, n_targets)
        windows.append((begin, end, end - scored_to))
        scored_to = end
        begin += stride
    return windows


def text_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """`lm_windows`' (begin, end, n_new) for the windows of transformers' perplexity guide: window k reads tokens
    [k * stride, k * stride + window) and scores those it reaches that no window before it did and that have a
    token before them in it: a window of W tokens scores at most W - 1, the text's first token never, and with
    stride = window no window's first token (the guide's arithmetic, kept so that the figures are its)."""
    windows, scored_to = [], 1
    for begin in range(0, n_tokens, stride):
        end = min(begin + window, n_tokens)
        windows.append((begin, end - 1, min(end - scored_to, end - 1 - begin)))
        scored_to = end
        if end == n_tokens:
            break
    return windows


@torch.inference_mode()
def lm_nll(model, stream: np.ndarray, window: int, stride: int, max_tokens: int, device,
           windows: list[tuple[int, int, int]] | None = None) -> tuple[float, int]:
    """Total NLL (nats) and count of every token of `stream` after the first, scored window by window
    (`lm_windows`, or the `windows` given)."""
    windows = windows if windows is not None else lm_windows(len(stream) - 1, window, stride)
    per_batch = max(1, max_tokens // window)
    nll, count = 0.0, 0
    data = torch.from_numpy(stream)
    with Progress("scoring", len(windows), "windows") as bar:
        for b in range(0, len(windows), per_batch):
            chunk = windows[b : b + per_batch]
            T = max(end - begin for begin, end, _ in chunk)
            ids = torch.full((len(chunk), T), PAD_ID, dtype=torch.long)
            targets = torch.full((len(chunk), T), IGNORE, dtype=torch.long)
            for row, (begin, end, n_new) in enumerate(chunk):
                n = end - begin
                ids[row, :n] = data[begin:end]
                # right padding is harmless: causal attention never lets a real position see the pads after it
                targets[row, n - n_new : n] = data[end - n_new + 1 : end + 1]
            targets = targets.to(device).flatten()
            scored = targets != IGNORE
            features = model.features(ids.to(device)).flatten(0, 1)[scored]
            targets = targets[scored]
            # the output layer on the scored positions only, a block of rows at a time: a 256k vocabulary's
            # logits for a whole window would take gigabytes
            rows = max(1, HEAD_FLOATS // model.cfg.tgt_vocab_size)
            for i in range(0, len(targets), rows):
                logits = model.logits(features[i : i + rows]).float()
                nll += F.cross_entropy(logits, targets[i : i + rows], reduction="sum").item()
            count += len(targets)
            bar.advance(len(chunk))
    return nll, count


def evaluate_text(ckpt, path: str, cfg: PerplexityConfig) -> PerplexityResult:
    """Loss and perplexity of language model `ckpt` on a plain text file. An imported model reads the file as
    one text, as its tokenizer does (its BOS first where it adds one), in the windows of transformers' perplexity
    guide (`text_windows`), so that its figure is the guide's; a tfcli-trained one line by line, </s> before each
    line, in `lm_windows`, as a prepared split. Windows of `cfg.window` tokens (default: the model's max_len, at
    most TEXT_WINDOW) every `cfg.stride`."""
    from pathlib import Path

    cfg.validate()
    device = resolve_device(cfg.device)
    meta = checkpoint_meta.read_meta(ckpt)
    if checkpoint_meta.model_config(meta).kind != "lm":
        raise TfcliError(f"{meta['dir']}: a translation model; --text scores a language model (a translation model "
                         "scores a prepared --data split)")
    tok = checkpoint.tokenizer(meta, "tgt")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TfcliError(f"{path}: not UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise TfcliError(f"{path}: cannot read ({e.strerror or e})") from None
    if "text" in meta:
        from tfcli.generate.lm import text_conventions

        ids = text_conventions(meta)[0] + tok.encode(text, add_special_tokens=False).ids
        stream, sequences = np.asarray(ids, dtype=np.int64), 1
    else:
        from tfcli.data.tokenizer import encode_batch

        lines = text.splitlines()
        encoded = encode_batch(tok, lines)
        flat = np.asarray([i for ids in encoded for i in ids], dtype=np.int64)
        stream, sequences = lm_stream(flat, np.cumsum([0] + [len(e) for e in encoded])), len(lines)
    if len(stream) < 2:
        raise TfcliError(f"{path}: no text to score")
    model, meta = checkpoint.load(meta["dir"], device, mapped=True)
    window = cfg.window or min(model.cfg.max_len, TEXT_WINDOW)
    if window > model.cfg.max_len:
        raise ConfigError(f"--window {window} is longer than the model's context (max_len {model.cfg.max_len})")
    stride = cfg.stride or window
    if stride > window:
        raise ConfigError(f"--stride {stride} is longer than the window ({window}): tokens would be skipped")
    result = PerplexityResult(meta["dir"], str(path), "text", "lm", sequences, 0, 0.0, window=window, stride=stride)
    guide = text_windows(len(stream), window, stride) if "text" in meta else None
    result.nll, result.tokens = lm_nll(model, stream, window, stride, cfg.max_tokens, device, guide)
    if cfg.words is not None:
        result.words, result.words_from = cfg.words, "given by --words"
    else:
        result.words, result.words_from = len(text.split()), f"{len(text.split())} whitespace words of {path}"
    return result


def word_count(data: PreparedData, split: str, n_sequences: int) -> tuple[int | None, str]:
    """Whitespace words + one </s> per line of {split}.tgt.txt, and a note saying so (or why not)."""
    text = data.text_file(split, "tgt")
    if text is None:
        return None, f"no {split}.tgt.txt in the prepared directory; pass --words N"
    words = lines = 0
    for line in iter_lines(text):
        words += len(line.split())
        lines += 1
    if lines != n_sequences:
        return None, f"{text} has {lines} lines but the split has {n_sequences} sequences; pass --words N"
    return words + lines, f"{words} whitespace words + {lines} </s> of {text.name}"


@torch.inference_mode()
def pair_nll(model, data: PreparedData, split: str, max_tokens: int, device: torch.device) -> tuple[float, int, int]:
    """A decoder-only translator's `seq2seq_nll`: each pair as it trained on it (tfcli.train.data.PairData), the
    target's tokens and its </s> scored."""
    from tfcli.train.data import PairData

    pairs = PairData(data, split, model.cfg.max_len, max_tokens, 0, seed=0)
    nll, count = 0.0, 0
    with Progress("scoring", len(pairs), "sent") as bar:
        for idx in pairs.batches(0, shuffle=False):
            batch = pairs.collate(idx).to(device)
            logits = model(batch.inputs, prefix=batch.prefix)
            nll += F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten(), ignore_index=PAD_ID,
                                   reduction="sum").item()
            count += batch.tgt_tokens
            bar.advance(len(idx))
    return nll, count, pairs.truncated


def evaluate_checkpoint(ckpt, data_dir, cfg: PerplexityConfig) -> PerplexityResult:
    """Loss and perplexity of checkpoint `ckpt` on split `cfg.split` of prepared directory `data_dir`."""
    cfg.validate()
    device = resolve_device(cfg.device)
    data = PreparedData(data_dir)
    meta = checkpoint_meta.read_meta(ckpt)
    kind = checkpoint_meta.model_config(meta).kind
    if kind == "seq2seq" and data.kind != "parallel":
        raise TfcliError(f"{data.path}: monolingual data, but {meta['dir']} is a translation model; it needs parallel data")
    sides = ["src", "tgt"] if kind == "seq2seq" else ["tgt"]
    check_tokenizers(meta, data, sides)
    model, meta = checkpoint.load(meta["dir"], device, mapped=True)

    tgt = data.sequences(cfg.split, "tgt")
    result = PerplexityResult(meta["dir"], str(data.path), cfg.split, kind, len(tgt), 0, 0.0)
    if data.kind == "parallel":  # (an encoder-decoder, or a decoder-only translator: the target given the source)
        if cfg.window is not None or cfg.stride is not None:
            raise ConfigError("--window/--stride are for language models; a translation model scores whole pairs")
        if kind == "seq2seq":
            src = data.sequences(cfg.split, "src")
            result.nll, result.tokens, result.truncated = seq2seq_nll(model, src, tgt, cfg.max_tokens, device)
        else:
            result.nll, result.tokens, result.truncated = pair_nll(model, data, cfg.split, cfg.max_tokens, device)
    else:
        window = cfg.window or model.cfg.max_len
        if window > model.cfg.max_len:
            raise ConfigError(f"--window {window} is longer than the model's context (max_len {model.cfg.max_len})")
        stride = cfg.stride or window
        if stride > window:
            raise ConfigError(f"--stride {stride} is longer than the window ({window}): tokens would be skipped")
        result.window, result.stride = window, stride
        stream = lm_stream(np.asarray(tgt.flat, dtype=np.int64), tgt.offsets)
        result.nll, result.tokens = lm_nll(model, stream, window, stride, cfg.max_tokens, device)
    if result.tokens == 0:
        raise TfcliError(f"{data.path}: split '{cfg.split}' is empty")
    if cfg.words is not None:
        result.words, result.words_from = cfg.words, "given by --words"
    else:
        result.words, result.words_from = word_count(data, cfg.split, len(tgt))
    return result
