"""Small prepared directories and tiny trained checkpoints for tests, built without `tfcli prepare`.

A synthetic vocabulary of words (w0 .. wN) and a word-level tokenizer trained in the test with the four special
tokens first, saved as the prepared format expects. Tasks:
  parallel "copy":    target = source
  parallel "reverse": target = source reversed (needs attention across positions)
  mono "count":       lines of consecutive words "w3 w4 w5 ..." (an LM learns the successor rule)
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from tfcli.data.prepared import SequenceWriter, new_meta
from tfcli.specials import SPECIAL_TOKENS

# the words of the hand-built models' vocabulary (save_copier, save_counter; the fixtures in conftest.py)
WORDS = "apple bird cat dog egg fish goat hat ice jam kite lamp moon nest owl pig queen rat sun tree".split()


def stored_layout_decoded(dtype: str) -> bool:
    """Whether decoding in `dtype` ("int8" or "fp32") runs here on the layout `tfcli quantize --dtype` stores for it
    (fp32: the row kernel, which needs rows.c and oneDNN's packing)."""
    from tfcli import device
    from tfcli.generate import native

    if dtype == "int8":
        return device.int8_available()
    return native.fp32_kernel() is not None and device.onednn_available()


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
    stop: bool = False,
    words: list[str] | None = None,
) -> Path:
    """A prepared parallel directory (joint vocabulary) for a copy/reverse task; returns its path. `stop`: each
    sentence ends with a " ." token (sentences a splitter finds); `words`: the vocabulary (w0, w1, ... by
    default, n_words of them)."""
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    words = words or [f"w{i}" for i in range(n_words)]
    tok = word_tokenizer(words + ["."] * stop)
    vocab = tok.get_vocab_size()
    rng = random.Random(seed)

    def pairs(n):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(min_len, max_len))) + " ." * stop
               for _ in range(n)]
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
        data=str(data), out=str(out), arch="toy", max_tokens=512, lr=3e-3, warmup=20, max_steps=150, max_epochs=0,
        log_every=25, valid_every=75, label_smoothing=0.0, clip_norm=1.0, device="cpu", tensorboard=False,
        bleu_max_sentences=20, threads=1,  # one thread: the test machine's cores are shared
    )
    fields.update(overrides)
    return TrainConfig(**fields)


def poisoned(monkeypatch, bad) -> dict:
    """The training loss is NaN (so are its gradients) at the steps `bad(step)` holds for (1-based); returns, by
    step, whether the step changed the weights or the optimizer's state."""
    import torch

    import tfcli.train.trainer as trainer_module

    real_step, real_loss = trainer_module.Trainer._step, trainer_module.batch_loss
    now, changed = {}, {}

    def state(t):
        opt = [v.clone() for st in t.optimizer.state.values() for v in st.values() if torch.is_tensor(v)]
        return [p.detach().clone() for p in t.raw.parameters()] + opt

    def step(trainer, *a):
        now["step"] = trainer.step + 1
        before = state(trainer)
        real_step(trainer, *a)
        after = state(trainer)
        changed[now["step"]] = len(before) != len(after) or not all(map(torch.equal, before, after))

    def loss(model, batch):
        value, nll = real_loss(model, batch)
        return (value * math.nan if bad(now["step"]) else value), nll

    monkeypatch.setattr(trainer_module.Trainer, "_step", step)
    monkeypatch.setattr(trainer_module, "batch_loss", loss)
    return changed


def train_tiny_checkpoint(
    tmp: Path | str, kind: str = "parallel", task: str = "copy", steps: int = 300, model: dict | None = None,
    prepared: dict | None = None, **train
) -> Path:
    """Prepare a synthetic task under `tmp` and train a tiny model on it; returns the run directory
    (`tfcli.checkpoint.resolve(run)` gives its best checkpoint). A few seconds on a CPU.

    kind "parallel": the `toy` encoder-decoder (d_model 64) on a copy (default) or reverse task; kind "mono":
    `lm-toy` on the counting task; `prepared`: make_parallel_prepared's options. How far it learns differs between
    CPUs (other float kernels), so tests use it for what the trainer writes, or for properties that hold whatever it
    learned, never for what the model outputs (for that: copy_model, successor_lm below).
    """
    from tfcli.train.trainer import train as run_train

    tmp = Path(tmp)
    train = {"schedule": "constant", "warmup": 10, **train}
    if kind == "parallel":
        data = make_parallel_prepared(tmp / "prep", task=task, n_train=2000, **(prepared or {}))
        cfg = tiny_train_config(data, tmp / "run", **{"max_steps": steps, "valid_every": steps, **train})
        overrides = {"d_model": 64, "d_ff": 128, **(model or {})}
    else:
        data = make_mono_prepared(tmp / "prep-lm")
        train = {"max_len": 32, **train}
        cfg = tiny_train_config(data, tmp / "run-lm", arch="lm-toy", max_steps=steps, valid_every=steps, **train)
        overrides = dict(model or {})
    run_train(cfg, overrides)
    return Path(cfg.out)


# --- hand-built models: behaviour known by construction, the same on every CPU --------------------------------------
#
# Trained toy models converge differently under other float kernels (another CPU, ATEN_CPU_CAPABILITY, threads), so
# tests that need a model which "does the task" use these: their weights are set by hand, every decision they make
# wins by a margin of tens of logits, and near-ties among the other tokens are broken by a fixed bias.


def _ln_identity(norm, d_model: int, ones: int) -> None:
    """Set a LayerNorm so that LN(x) = x for every x made of `ones` one-hot entries (mean and variance then fixed)."""
    mu = ones / d_model
    sigma = (ones / d_model - mu * mu + norm.eps) ** 0.5
    norm.weight.data.fill_(sigma)
    norm.bias.data.fill_(mu)


def _blank(model) -> None:
    """Every weight and bias 0, every LayerNorm gain 1: the starting point the hand-built models write into."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for m in model.modules():
            if isinstance(m, torch.nn.LayerNorm):
                m.weight.fill_(1.0)


def copy_model(n_words: int = 20, max_len: int = 32, n_layers: int = 2, logit_scale: float = 6.0):
    """A pre-norm encoder-decoder (learned positions) that copies its source: y_t = x_t, then </s>.

    Layout of the residual stream (d_model = 2V + max_len): token one-hot [0, V), position one-hot [V, V + P), and
    the copied source token [V + P, 2V + P). The encoder passes its embeddings through (every sublayer outputs 0).
    In the decoder's first layer, cross-attention head 0 matches target position t to source position t
    (q = c * onehot(t), k = onehot(s): a score of 60 against 0; the source's </s> scores 30 for every query, so past
    the source's end the model copies </s>) and writes that source token's one-hot into the third block, which alone
    feeds the output layer (with a fixed pseudo-random term per position and token, so that no two hypotheses tie).
    The right token wins by 20 logits or more.
    """
    import torch

    from tfcli.model.config import preset

    from tfcli.specials import EOS_ID

    from tfcli.model.transformer import build_model

    V, P = 4 + n_words, max_len
    D = 2 * V + P
    D += D % 2
    d_head = D // 2
    assert d_head >= P and d_head >= V
    cfg = preset(
        "toy", src_vocab_size=V, tgt_vocab_size=V, d_model=D, n_head=2, d_ff=16, n_encoder_layers=n_layers,
        n_decoder_layers=n_layers, positions="learned", max_len=P, scale_embedding=False, share_embeddings=True,
        tie_output=False, norm="pre", dropout=0.0,
    )
    model = build_model(cfg).eval()
    _blank(model)
    with torch.no_grad():
        model.encoder.embed.tok.weight[:, :V] = torch.eye(V)
        for embed in (model.encoder.embed, model.decoder.embed):
            embed.pos.emb.weight[:, V:V + P] = torch.eye(P)
        _ln_identity(model.encoder.norm, D, 2)
        layer = model.decoder.layers[0]
        _ln_identity(layer.res_cross.norm, D, 2)
        c = 60.0 * d_head**0.5
        layer.cross_attn.q_proj.weight[:P, V:V + P] = c * torch.eye(P)  # head 0 queries: the target position
        layer.cross_attn.kv_proj.weight[:P, V:V + P] = torch.eye(P)  # head 0 keys: the source position
        layer.cross_attn.q_proj.bias[P] = 30.0 * d_head**0.5  # and every query likes </s> a little
        layer.cross_attn.kv_proj.weight[P, EOS_ID] = 1.0
        layer.cross_attn.kv_proj.weight[D:D + V, :V] = torch.eye(V)  # head 0 values: the source token
        layer.cross_attn.out_proj.weight[V + P:2 * V + P, :V] = torch.eye(V)
        bias = -0.05 * torch.arange(V) / V  # tie-breaker: lower ids first, and </s> never unless copied, so that
        bias[EOS_ID] = -0.5  # a beam's runner-up expansions are wrong words, not early ends
        layer.ffn.w2.bias[V + P:2 * V + P] = bias
        model.lm_head.weight[:, V + P:2 * V + P] = logit_scale * torch.eye(V)
        g = torch.Generator().manual_seed(0)
        model.lm_head.weight[:, V:V + P] = 0.5 * torch.rand(V, P, generator=g)  # position x token: no ties
    return model


def successor_lm(vocab: list[str], successor: dict[int, int], max_len: int = 48, logit_scale: float = 1.75):
    """A decoder-only LM (learned positions, all zero) whose next token depends on the current one only:
    p(successor[v] | ..., v) is the largest by about 10 logits (moderate, so temperature sampling varies).
    Tokens missing from `successor` continue with nothing in particular (their row of the output layer is 0)."""
    import torch

    from tfcli.model.config import preset

    from tfcli.model.transformer import build_model

    V = len(vocab)
    D = V + V % 2 + 2
    D += (-D) % 4
    cfg = preset("lm-toy", tgt_vocab_size=V, d_model=D, n_head=4, d_ff=16, max_len=max_len, tie_output=False)
    model = build_model(cfg).eval()
    _blank(model)
    with torch.no_grad():
        model.decoder.embed.tok.weight[:, :V] = torch.eye(V)
        model.decoder.layers[0].ffn.w2.bias[:V] = -0.02 * torch.arange(V) / V  # tie-breaker
        for v, nxt in successor.items():
            model.lm_head.weight[nxt, v] = logit_scale
    return model


def marian_like_dir(d: Path, words: list[str]) -> tuple[Path, object, list[str]]:
    """A Marian model as Opus-MT ships them, saved in `d` with a tokenizer.json over `words`: </s>=0, <unk>=1,
    `words`, <pad> last and the decoder start, an output bias. Returns (d, the transformers model, its vocabulary)."""
    import pytest
    import torch

    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["</s>", "<unk>"] + list(words) + ["<pad>"]
    V = len(vocab)
    cfg = transformers.MarianConfig(
        vocab_size=V, decoder_vocab_size=V, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1, scale_embedding=True,
    )
    torch.manual_seed(3)
    hf = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():
        hf.final_logits_bias.normal_()
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    hf.save_pretrained(d)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["</s>", "<unk>", "<pad>"])
    tok.save(str(d / "tokenizer.json"))
    return d, hf, vocab


def save_word_tokenizer(path, words: list[str]) -> Path:
    """A word-level tokenizer file whose ids are SPECIAL_TOKENS (0-3) then `words` in order; decoding joins words
    with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIAL_TOKENS + words)}, unk_token="<unk>"))
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return Path(path)


def save_model(path, model, tokenizer_file) -> "Path":
    """Save a hand-built model as a checkpoint that translate/lm-generate/eval load (one tokenizer for both sides)."""
    import dataclasses

    from tfcli import checkpoint

    sides = {"src": tokenizer_file, "tgt": tokenizer_file} if model.cfg.kind == "seq2seq" else {"tgt": tokenizer_file}
    return checkpoint.save(path, model, {"model": dataclasses.asdict(model.cfg)}, sides)


def random_translator(seed: int):
    """A random tiny encoder-decoder over WORDS (outputs arbitrary but fixed by `seed`): for checks that a
    sentence's output does not depend on its batch, its neighbours or the process it runs in."""
    import torch

    from tfcli.model.config import preset
    from tfcli.model.transformer import build_model

    torch.manual_seed(seed)
    v = len(SPECIAL_TOKENS) + len(WORDS)
    return build_model(preset("toy", src_vocab_size=v, tgt_vocab_size=v, d_model=64, d_ff=128, max_len=32)).eval()


def save_random_translator(d: Path, seed: int) -> Path:
    """random_translator(seed) saved as a checkpoint in d/ckpt (its word tokenizer in d/tok)."""
    return save_model(d / "ckpt", random_translator(seed), save_word_tokenizer(d / "tok", WORDS))


def random_decoder_translator(d: Path, seed: int, prefix_attention: bool = False):
    """(model, checkpoint path): a random decoder-only model over WORDS saved as a translator trained here (meta data
    kind: parallel: the source, <s>, the target in one sequence) in d/ckpt; outputs arbitrary but fixed by `seed`."""
    import dataclasses

    import torch

    from tfcli import checkpoint
    from tfcli.model.config import preset
    from tfcli.model.transformer import build_model

    torch.manual_seed(seed)
    v = len(SPECIAL_TOKENS) + len(WORDS)
    model = build_model(preset("lm-toy", tgt_vocab_size=v, prefix_attention=prefix_attention, max_len=40)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    tok = save_word_tokenizer(d / "tok", WORDS)
    meta = {"model": dataclasses.asdict(model.cfg), "data": {"kind": "parallel", "joint": True}}
    return model, checkpoint.save(d / "ckpt", model, meta, {"src": tok, "tgt": tok})


def save_copier(d: Path, words: list[str]) -> Path:
    """copy_model over `words`, saved as a checkpoint in d/copier (its word tokenizer in d/tok)."""
    return save_model(d / "copier", copy_model(n_words=len(words), max_len=32), save_word_tokenizer(d / "tok", words))


def save_counter(d: Path, words: list[str]) -> Path:
    """successor_lm that counts up `words` (words[0] -> words[1] -> ...) and ends after the last with "." and </s>;
    a special token is followed by words[0]. Saved as a checkpoint in d/lm."""
    from tfcli.specials import EOS_ID

    vocab = SPECIAL_TOKENS + words + ["."]
    ids = {w: i for i, w in enumerate(vocab)}
    successor = {ids[a]: ids[b] for a, b in zip(words, words[1:])}
    successor.update({ids[words[-1]]: ids["."], ids["."]: EOS_ID})
    successor.update({i: ids[words[0]] for i in range(len(SPECIAL_TOKENS))})
    return save_model(d / "lm", successor_lm(vocab, successor), save_word_tokenizer(d / "tok", words + ["."]))


def write_sequences(directory: Path, split: str, side: str, seqs, vocab_size: int) -> dict:
    """Write a list of id sequences at once, as prepare writes them (SequenceWriter)."""
    with SequenceWriter(directory, split, side, vocab_size) as w:
        w.append(seqs)
        return w.close()


def holds(text: str, phrase: str) -> bool:
    """Whether `text` holds `phrase` as whole words."""
    return f" {phrase} " in f" {text} "


# --- the searches as the tests call them ----------------------------------------------------------------------
# The library's searches take one SearchOptions (made from a TranslateConfig) and the rows' Rows; these keep the tests'
# keyword calls short, with the slow reference's length rule (a = 1.2, b = 10) unless a test gives its own.

def search_options(**changes):
    """`translate`'s SearchOptions (TranslateConfig's defaults) with `changes` (the options' own names)."""
    import dataclasses

    from tfcli.generate.config import TranslateConfig
    from tfcli.generate.search import SearchOptions

    return dataclasses.replace(SearchOptions.from_config(TranslateConfig()), **changes)


def beam_search(model, src, beam_size=5, len_penalty=0.6, max_len_a=1.2, max_len_b=10, nbest=1, min_len=0,
                token_scores=False, prefix=None, check_every=0, slots=None, avoid=None, constraints=None,
                continuing=None, **rules):
    from tfcli.generate.search import Rows, beam_search as search

    options = search_options(beam_size=beam_size, len_penalty=len_penalty, max_len_a=max_len_a,
                             max_len_b=max_len_b, nbest=nbest, min_len=min_len, token_scores=token_scores,
                             check_every=check_every, **rules)
    return search(model, src, options, Rows(prefix, avoid, constraints), slots, continuing)


def greedy_decode(model, src, max_len_a=1.2, max_len_b=10, min_len=0, len_penalty=0.0, sampling=None, lines=None,
                  prefix=None, check_every=0, slots=None, scored=True, avoid=None, **rules):
    from tfcli.generate.search import Rows, greedy_decode as search

    options = search_options(beam_size=1, len_penalty=len_penalty, max_len_a=max_len_a, max_len_b=max_len_b,
                             min_len=min_len, sampling=sampling, check_every=check_every, scored=scored, **rules)
    return search(model, src, options, Rows(prefix, avoid, None, lines), slots)


def greedy_search(model, src, max_len_a=1.2, max_len_b=10):
    return [h.tokens for h in greedy_decode(model, src, max_len_a, max_len_b, scored=False)]


def spm_bpe(d: Path, data: Path) -> Path:
    """A SentencePiece BPE model over Multi30k's three languages (in `data`), as M2M-100 and NLLB ship theirs."""
    import pytest

    spm = pytest.importorskip("sentencepiece")
    text = d / "text.txt"
    with text.open("w", encoding="utf-8") as out:
        for lang in ("en", "de", "fr"):
            out.writelines((data / f"train.{lang}").read_text(encoding="utf-8").splitlines(True)[:4000])
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(d / "bpe"), vocab_size=2000, model_type="bpe",
                                   character_coverage=1.0, minloglevel=2)
    return d / "bpe.model"


def m2m_tokenizer_files(family: str, d: Path, model: Path):
    """The family's tokenizer files in `d`, and transformers' tokenizer read from them."""
    import shutil

    import sentencepiece as spm
    import transformers

    sp = spm.SentencePieceProcessor(model_file=str(model))
    pieces = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]  # (0-2: <unk>, <s>, </s>)
    shutil.copy(model, d / "sentencepiece.bpe.model")
    if family == "m2m100":  # fairseq's dictionary: its own order (by frequency there; reversed here), not the .spm's
        vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *reversed(pieces)])}
        (d / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        return transformers.M2M100Tokenizer(str(d / "vocab.json"), str(d / "sentencepiece.bpe.model"))
    # NLLB: the .spm's ids + 1 behind fairseq's four specials, the language codes and <mask> after (tokenizer.json)
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    from tfcli.data.spm import m2m_tokenizer

    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *pieces])}
    data = m2m_tokenizer(d / "sentencepiece.bpe.model", vocab, [*FAIRSEQ_LANGUAGE_CODES, "<mask>"])
    (d / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    (d / "sentencepiece.bpe.model").unlink()  # (the hub's NLLB directories have both; tokenizer.json is read)
    return transformers.NllbTokenizer(tokenizer_file=str(d / "tokenizer.json"))
