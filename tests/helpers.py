"""Small prepared directories and tiny trained checkpoints for tests, built without `tfcli prepare`.

A synthetic vocabulary of words (w0 .. wN) and a word-level tokenizer trained in the test with the four special
tokens first, saved as the prepared format expects. Tasks:
  parallel "copy":    target = source
  parallel "reverse": target = source reversed (needs attention across positions)
  mono "count":       lines of consecutive words "w3 w4 w5 ..." (an LM learns the successor rule)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tfcli.data.prepared import new_meta, write_sequences
from tfcli.model import SPECIAL_TOKENS


def word_tokenizer(words: list[str]):
    """A `tokenizers` WordLevel tokenizer over `words`, specials first (ids 0-3); decode joins with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIAL_TOKENS, min_frequency=1, vocab_size=len(words) + 10)
    tok.train_from_iterator([" ".join(words)], trainer)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    return tok


def _write_split(d: Path, split: str, sides: dict[str, list[str]], tok, vocab: int, text: bool) -> dict:
    info = {}
    for side, lines in sides.items():
        ids = [enc.ids for enc in tok.encode_batch(lines)]
        info[side] = write_sequences(d, split, side, ids, vocab)
        if text:
            (d / f"{split}.{side}.txt").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return info


def make_parallel_prepared(
    d: Path | str,
    n_train: int = 200,
    n_valid: int = 20,
    n_test: int = 20,
    task: str = "reverse",
    n_words: int = 20,
    min_len: int = 3,
    max_len: int = 8,
    seed: int = 0,
) -> Path:
    """A prepared parallel directory (joint vocabulary) for a copy/reverse task; returns its path."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(n_words)]
    tok = word_tokenizer(words)
    vocab = tok.get_vocab_size()
    rng = random.Random(seed)

    def pairs(n):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(min_len, max_len))) for _ in range(n)]
        tgt = [s if task == "copy" else " ".join(reversed(s.split())) for s in src]
        return {"src": src, "tgt": tgt}

    splits = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        if n:
            splits[split] = _write_split(d, split, pairs(n), tok, vocab, text=split != "train")
    for side in ("src", "tgt"):
        tok.save(str(d / f"tokenizer.{side}.json"))
    meta = new_meta(
        "parallel", splits=splits, vocab={"src": vocab, "tgt": vocab}, joint_vocab=True,
        tokenizers={"src": "tokenizer.src.json", "tgt": "tokenizer.tgt.json"}, langs={"src": "xx", "tgt": "yy"},
        settings={"task": task, "synthetic": True},
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return d


def make_mono_prepared(
    d: Path | str, n_train: int = 300, n_valid: int = 30, n_test: int = 30, n_words: int = 30, seed: int = 0
) -> Path:
    """A prepared monolingual directory: lines of consecutive words (w5 w6 w7 ...); returns its path."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    words = [f"w{i}" for i in range(n_words)]
    tok = word_tokenizer(words)
    vocab = tok.get_vocab_size()
    rng = random.Random(seed)

    def lines(n):
        out = []
        for _ in range(n):
            start, length = rng.randrange(n_words), rng.randint(3, 10)
            out.append(" ".join(words[(start + i) % n_words] for i in range(length)))
        return {"tgt": out}

    splits = {}
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        if n:
            splits[split] = _write_split(d, split, lines(n), tok, vocab, text=split != "train")
    tok.save(str(d / "tokenizer.tgt.json"))
    meta = new_meta(
        "mono", splits=splits, vocab={"tgt": vocab}, joint_vocab=False, tokenizers={"tgt": "tokenizer.tgt.json"},
        settings={"task": "count", "synthetic": True},
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return d


def tiny_train_config(data: Path | str, out: Path | str, **overrides):
    """A TrainConfig for a few seconds of CPU training of a tiny model (no dropout unless asked)."""
    from tfcli.train.config import TrainConfig

    fields = dict(
        data=str(data), out=str(out), arch="tiny", max_tokens=512, lr=3e-3, warmup=20, max_steps=150, max_epochs=0,
        log_every=25, valid_every=75, label_smoothing=0.0, clip_norm=1.0, device="cpu", tensorboard=False,
        bleu_max_sentences=20, threads=1,  # one thread: the test machine's cores are shared
    )
    fields.update(overrides)
    return TrainConfig(**fields)


def train_tiny_checkpoint(
    tmp: Path | str, kind: str = "parallel", task: str = "copy", steps: int = 300, model: dict | None = None, **train
) -> Path:
    """Prepare a synthetic task under `tmp` and train a tiny model on it; returns the run directory
    (`tfcli.checkpoint.resolve(run)` gives its best checkpoint). A few seconds on a CPU.

    kind "parallel": the `tiny` encoder-decoder (d_model 64) on a copy (default) or reverse task; after the default
    300 steps it copies the valid sentences exactly (greedy BLEU 100). kind "mono": `lm-tiny` on the counting task.
    """
    from tfcli.train.trainer import train as run_train

    tmp = Path(tmp)
    train = {"schedule": "constant", "warmup": 10, **train}
    if kind == "parallel":
        data = make_parallel_prepared(tmp / "prep", task=task, n_train=2000)
        cfg = tiny_train_config(data, tmp / "run", max_steps=steps, valid_every=steps, **train)
        overrides = {"d_model": 64, "d_ff": 128, **(model or {})}
    else:
        data = make_mono_prepared(tmp / "prep-lm")
        train = {"max_len": 32, **train}
        cfg = tiny_train_config(data, tmp / "run-lm", arch="lm-tiny", max_steps=steps, valid_every=steps, **train)
        overrides = dict(model or {})
    run_train(cfg, overrides)
    return Path(cfg.out)
