"""Export to CTranslate2 and Hugging Face, import from Hugging Face, fine-tuning with --init-from.

"Same function" is checked on the models' scores (log-probabilities of given outputs), which does not depend on
which CPU kernels round how; greedy/beam output equality is checked on a hand-built model whose right answer wins
by a wide margin.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import (
    copy_model, make_mono_prepared, make_parallel_prepared, marian_like_dir, save_model, save_word_tokenizer,
    tiny_train_config,
)
from tfcli import checkpoint
from tfcli import checkpoint_meta
from tfcli.errors import ConfigError, TfcliError
from tfcli.interop.exporter import export
from tfcli.interop.hf_import import import_model
from tfcli.model.config import preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID
from tfcli.model.transformer import build_model

WORDS = [f"w{i}" for i in range(30)]


def random_model(kind: str = "seq2seq", **fields):
    """A randomly initialised tiny model (biases and norms randomised too, so that no mapping hides behind 0/1)."""
    V = 4 + len(WORDS)
    base = dict(src_vocab_size=V, tgt_vocab_size=V) if kind == "seq2seq" else dict(tgt_vocab_size=V)
    cfg = preset("toy" if kind == "seq2seq" else "lm-toy", **{**base, **fields})
    model = build_model(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    return model


def save(tmp_path: Path, model, name: str = "ckpt") -> Path:
    tok = save_word_tokenizer(tmp_path / "words.json", WORDS)
    return save_model(tmp_path / name, model, tok)


def ids(words: str) -> list[int]:
    return [4 + WORDS.index(w) for w in words.split()]


SOURCES = ["w1 w2 w3 w4", "w5 w6", "w9 w8 w7 w6 w5 w4"]
TARGETS = ["w3 w2", "w7 w8 w9", "w1"]


def tfcli_scores(model, sources=SOURCES, targets=TARGETS) -> list[list[float]]:
    """log p of each target token and of </s>, one sentence at a time."""
    out = []
    with torch.no_grad():
        for s, t in zip(sources, targets):
            y = ids(t) + [EOS_ID]
            if model.cfg.kind == "seq2seq":
                logits = model(torch.tensor([ids(s) + [EOS_ID]]), torch.tensor([[BOS_ID] + y[:-1]]))
            else:
                logits = model(torch.tensor([[EOS_ID] + y[:-1]]))
            lp = logits.log_softmax(-1)[0]
            out.append([float(lp[i, tok]) for i, tok in enumerate(y)])
    return out


# --- CTranslate2 ----------------------------------------------------------------------------------------------

SEQ2SEQ_VARIANTS = {
    "post-norm, shared": dict(norm="post", share_embeddings=True),
    "pre-norm, separate, untied, no bias": dict(norm="pre", share_embeddings=False, tie_output=False, bias=False),
    "learned positions, gelu, unscaled": dict(positions="learned", activation="gelu", scale_embedding=False),
    "gelu_tanh, output bias": dict(activation="gelu_tanh", output_bias=True, norm="post"),
    "rmsnorm, swiglu": dict(rms_norm=True, activation="swiglu"),
    "rmsnorm post-norm, geglu, no bias": dict(rms_norm=True, norm="post", activation="geglu", bias=False),
    "grouped-query attention": dict(n_kv_head=2),
    "silu (classic OPUS-MT), post-norm, output bias": dict(activation="silu", norm="post", output_bias=True),
    "multi-query attention, rmsnorm, swiglu": dict(n_kv_head=1, rms_norm=True, activation="swiglu"),
}
LM_VARIANTS = {
    "learned (GPT-2 shape)": dict(),
    "sinusoidal, relu, post-norm": dict(positions="sinusoidal", activation="relu", norm="post"),
    "rope, untied": dict(positions="rope", tie_output=False),
    "rope, rmsnorm, swiglu": dict(positions="rope", rms_norm=True, activation="swiglu"),
    "rope, qk-norm": dict(positions="rope", qk_norm=True),
    "rope, grouped-query attention, swiglu": dict(positions="rope", n_kv_head=2, activation="swiglu", rms_norm=True),
}


@pytest.mark.parametrize("variant", list(SEQ2SEQ_VARIANTS) + list(LM_VARIANTS))
def test_ctranslate2_export_scores_like_tfcli(tmp_path, variant):
    ctranslate2 = pytest.importorskip("ctranslate2")
    lm = variant in LM_VARIANTS
    model = random_model("lm" if lm else "seq2seq", **(LM_VARIANTS if lm else SEQ2SEQ_VARIANTS)[variant])
    export(save(tmp_path, model), "ctranslate2", tmp_path / "ct2")
    assert {"model.bin", "config.json", "tfcli_export.json", "tokenizer.tgt.json"} <= {p.name for p in (tmp_path / "ct2").iterdir()}
    toks = [t.split() + ["</s>"] for t in TARGETS]
    if lm:
        res = ctranslate2.Generator(str(tmp_path / "ct2")).score_batch([["</s>"] + t for t in toks])
    else:
        res = ctranslate2.Translator(str(tmp_path / "ct2")).score_batch([s.split() for s in SOURCES], [t[:-1] for t in toks])
    theirs = [r.log_probs for r in res]
    ours = tfcli_scores(model)
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, abs=1e-4)


def test_ctranslate2_greedy_and_beam_outputs_equal_tfcli_on_a_confident_model(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tfcli.api import load

    model = copy_model(n_words=20, max_len=32)
    words = [f"w{i}" for i in range(20)]
    tok = save_word_tokenizer(tmp_path / "words.json", words)
    ckpt = save_model(tmp_path / "copy", model, tok)
    export(ckpt, "ctranslate2", tmp_path / "ct2")
    sentences = ["w3 w1 w4 w1 w5", "w9 w2 w6", "w5 w3 w5 w8 w9 w7 w9 w3"]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"))
    ours = load(ckpt)
    for beam in (1, 5):
        res = translator.translate_batch([s.split() for s in sentences], beam_size=beam, length_penalty=0)
        theirs = [" ".join(r.hypotheses[0]) for r in res]
        assert theirs == sentences  # it copies
        assert ours.translate(sentences, beam_size=beam, len_penalty=0) == theirs


def _cpu_has_vnni() -> bool:
    """Whether the CPU adds u8 x s8 products in 32 bits (VNNI, AMX); Linux's flags, else assumed."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return "vnni" in flags or "amx_int8" in flags


def test_ctranslate2_int8_export_is_close(tmp_path):
    """The int8 weights and scales, computed in fp32 by CTranslate2 (compute_type float32 dequantises them): within
    what rounding the weights to 8 bits moves a log-probability. With CTranslate2's own int8 products: close, where
    the CPU has VNNI or AMX (without, CTranslate2's 16-bit pair sums saturate: 0.71 apart on an AMD EPYC with AVX2
    only, its fp32 products 0.014)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    model = random_model(norm="post", share_embeddings=True)
    export(save(tmp_path, model), "ctranslate2", tmp_path / "int8", quantization="int8")
    info = json.loads((tmp_path / "int8" / "tfcli_export.json").read_text())
    assert info["quantization"] == "int8"
    pairs = [s.split() for s in SOURCES], [t.split() for t in TARGETS]
    res = ctranslate2.Translator(str(tmp_path / "int8"), compute_type="float32").score_batch(*pairs)
    for a, b in zip(tfcli_scores(model), [r.log_probs for r in res]):
        assert a == pytest.approx(b, abs=0.05)  # int8 weights: close, not equal
    if _cpu_has_vnni():
        res = ctranslate2.Translator(str(tmp_path / "int8")).score_batch(*pairs)
        for a, b in zip(tfcli_scores(model), [r.log_probs for r in res]):
            assert a == pytest.approx(b, abs=0.2)


# --- Hugging Face ----------------------------------------------------------------------------------------------

HF_VARIANTS = {
    "marian, shared": ("MarianMTModel", dict(norm="post", share_embeddings=True)),
    "marian, separate, untied, output bias, no bias": (
        "MarianMTModel", dict(norm="post", share_embeddings=False, tie_output=False, output_bias=True, bias=False)),
    "marian, silu (classic OPUS-MT)": ("MarianMTModel", dict(norm="post", share_embeddings=True, activation="silu")),
    "pegasus": ("PegasusForConditionalGeneration", dict(norm="pre", share_embeddings=True, activation="gelu")),
    # fairseq's positions: M2M100, in fairseq's vocabulary layout (tfcli's <pad> and <s> trade places: 1 and 0)
    "m2m_100": ("M2M100ForConditionalGeneration", dict(norm="pre", share_embeddings=True, positions="fairseq")),
    "gpt2": ("GPT2LMHeadModel", dict()),
    "gpt2, tanh gelu, untied": ("GPT2LMHeadModel", dict(activation="gelu_tanh", tie_output=False)),
}


@pytest.mark.parametrize("variant", HF_VARIANTS)
def test_hf_export_computes_the_same_logits_and_imports_back_exactly(tmp_path, variant):
    transformers = pytest.importorskip("transformers")
    cls, fields = HF_VARIANTS[variant]
    lm = cls.startswith("GPT2")
    model = random_model("lm" if lm else "seq2seq", **fields)
    ckpt = save(tmp_path, model)
    export(ckpt, "hf", tmp_path / "hf")
    Auto = transformers.AutoModelForCausalLM if lm else transformers.AutoModelForSeq2SeqLM
    hf = Auto.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == cls
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    src = torch.tensor([ids(SOURCES[0]) + [EOS_ID], ids(SOURCES[2])[:4] + [EOS_ID]])
    tgt = torch.tensor([[BOS_ID] + ids(TARGETS[1]), [BOS_ID] + ids(TARGETS[0]) + [EOS_ID]])
    with torch.no_grad():
        if lm:
            assert tok(SOURCES[0]).input_ids == ids(SOURCES[0])
            ours, theirs = model(src), hf(input_ids=src).logits
        else:
            assert tok(SOURCES[0]).input_ids == ids(SOURCES[0]) + [EOS_ID]  # the source, as tfcli feeds it
            ours = model(src, tgt)
            if cls.startswith("M2M100"):  # (fairseq's layout: <s> is 0, <pad> 1)
                swap = torch.tensor([1, 0, *range(2, model.cfg.tgt_vocab_size)])
                theirs = hf(input_ids=src, decoder_input_ids=swap[tgt]).logits[..., swap]
            else:
                theirs = hf(input_ids=src, decoder_input_ids=tgt).logits
    assert float((ours - theirs).abs().max()) < 1e-4
    # and back: the same weights, bit for bit, and the same config
    import_model(tmp_path / "hf", tmp_path / "back")
    back, meta = checkpoint.load(tmp_path / "back")
    assert back.cfg == model.cfg
    a, b = model.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert checkpoint.tokenizer(meta, "tgt").get_vocab() == checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "tgt").get_vocab()


@pytest.mark.parametrize("variant", HF_VARIANTS)
def test_training_loss_and_steps_are_transformers_on_the_export(tmp_path, variant):
    """tfcli's training objective on a batch is the loss transformers computes on the exported model (1e-4
    relative), and two AdamW steps of both on the layers' weights (the embedding tables held) move each tensor the
    same way (the difference's norm under 1% of the move's)."""
    transformers = pytest.importorskip("transformers")
    from tfcli.interop.hf import _pairs, from_hf_state, hf_arch
    from tfcli.train.loss import Objective

    cls, fields = HF_VARIANTS[variant]
    lm = cls.startswith("GPT2")
    model = random_model("lm" if lm else "seq2seq", **fields)
    export(save(tmp_path, model), "hf", tmp_path / "hf")
    Auto = transformers.AutoModelForCausalLM if lm else transformers.AutoModelForSeq2SeqLM
    theirs = Auto.from_pretrained(tmp_path / "hf").eval()
    src = torch.tensor([ids(SOURCES[0]) + [EOS_ID], ids(SOURCES[2])[:4] + [EOS_ID]])
    tgt = torch.tensor([[BOS_ID] + ids(TARGETS[1]) + [EOS_ID], [BOS_ID] + ids(TARGETS[0]) + [EOS_ID, PAD_ID]])
    swap = torch.tensor([1, 0, *range(2, model.cfg.tgt_vocab_size)]) if cls.startswith("M2M100") else None
    hf = (lambda t: swap[t]) if swap is not None else (lambda t: t)  # (fairseq's layout: <s> 0, <pad> 1)
    frozen = ("embed", "shared", "lm_head", "wte", "wpe")
    absent = {h for t, _, h, _ in _pairs(model.cfg, hf_arch(model.cfg)) if t not in model.state_dict()}
    for m in (model, theirs):  # (and the biases the export fills with zeros where tfcli has none: model.bias false)
        for name, p in m.named_parameters():
            p.requires_grad_(not any(f in name for f in frozen) and name not in absent)
    objective = Objective(model, 0.0)
    options = dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
    opts = [torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], **options) for m in (model, theirs)]
    start = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(2):
        if lm:
            loss, _ = objective(None, src[:, :-1], src[:, 1:])
            labels = src
            hf_loss = theirs(input_ids=src, labels=labels).loss
        else:
            loss, _ = objective(src, tgt[:, :-1], tgt[:, 1:])
            labels = hf(tgt[:, 1:]).masked_fill(tgt[:, 1:] == PAD_ID, -100)
            hf_loss = theirs(input_ids=hf(src), decoder_input_ids=hf(tgt[:, :-1]), labels=labels).loss
        mean = loss / int((labels[:, 1:] if lm else labels).ne(-100).sum())
        if step == 0:
            assert float(mean.detach()) == pytest.approx(float(hf_loss.detach()), rel=1e-4)
        for opt, value in zip(opts, (mean, hf_loss)):
            opt.zero_grad()
            value.backward()
            opt.step()
    arch = hf_arch(model.cfg)
    want = from_hf_state({k: v.detach() for k, v in theirs.state_dict().items()}, model.cfg, arch)
    got = model.state_dict()
    trained = {t for t, *_ in _pairs(model.cfg, arch) if t in got and not any(f in t for f in frozen)}
    assert trained
    for name in sorted(trained):
        move, off = got[name] - start[name], got[name] - want[name]
        assert float(move.abs().max()) > 1e-3 and float(off.norm()) < 0.01 * float(move.norm()), name


def _marian_like_dir(tmp_path: Path) -> tuple[Path, object, list[str]]:
    return marian_like_dir(tmp_path / "opus-like", WORDS)


def test_import_reorders_a_foreign_vocabulary_and_keeps_the_distribution(tmp_path):
    d, hf, vocab = _marian_like_dir(tmp_path)
    info = import_model(d, tmp_path / "ckpt")
    assert info["arch"] == "marian" and info["vocab"]["src"] == len(vocab) + 1  # <pad> and <s> share Marian's row
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert model.cfg.output_bias and model.cfg.norm == "post"
    tok = checkpoint.tokenizer(meta, "src")
    src_words, tgt_words = "w1 w2 w3", "w7 w8"
    ours_src = [tok.token_to_id(w) for w in src_words.split()] + [EOS_ID]
    ours_tgt = [BOS_ID] + [tok.token_to_id(w) for w in tgt_words.split()]
    hf_src = [vocab.index(w) for w in src_words.split()] + [0]
    hf_tgt = [len(vocab) - 1] + [vocab.index(w) for w in tgt_words.split()]
    with torch.no_grad():
        ours = model(torch.tensor([ours_src]), torch.tensor([ours_tgt])).log_softmax(-1)[0]
        theirs = hf(input_ids=torch.tensor([hf_src]), decoder_input_ids=torch.tensor([hf_tgt])).logits.log_softmax(-1)[0]
    for word in WORDS + ["</s>"]:  # every token the model has, at its new id
        assert torch.allclose(ours[:, tok.token_to_id(word)], theirs[:, vocab.index(word)], atol=1e-4)
    assert float(ours[:, BOS_ID].max()) < -1e6  # the second copy of Marian's <pad> row is never predicted


def test_import_a_gpt2_with_only_endoftext(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = WORDS + ["<|endoftext|>"]
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_positions=32, n_embd=16, n_layer=2, n_head=4,
                                  bos_token_id=len(vocab) - 1, eos_token_id=len(vocab) - 1)
    torch.manual_seed(4)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    d = tmp_path / "gpt2-like"
    hf.save_pretrained(d)
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.BPEDecoder()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(d / "tokenizer.json"))
    import_model(d, tmp_path / "ckpt")
    model, meta = checkpoint.load(tmp_path / "ckpt")
    assert model.cfg.activation == "gelu_tanh" and model.cfg.kind == "lm"  # GPT-2's gelu_new
    tok = checkpoint.tokenizer(meta, "tgt")
    text = "w3 w4 w5"
    with torch.no_grad():
        ours = model(torch.tensor([[EOS_ID] + [tok.token_to_id(w) for w in text.split()]])).log_softmax(-1)[0]
        theirs = hf(input_ids=torch.tensor([[len(vocab) - 1] + [vocab.index(w) for w in text.split()]])).logits
        theirs = theirs.log_softmax(-1)[0]
    assert torch.allclose(ours[:, EOS_ID], theirs[:, len(vocab) - 1], atol=1e-4)  # <|endoftext|> is tfcli's </s>
    for w in WORDS:
        assert torch.allclose(ours[:, tok.token_to_id(w)], theirs[:, vocab.index(w)], atol=1e-4)
    r = tfcli("lm-generate", "-m", tmp_path / "ckpt", "w3 w4", "--max-new-tokens", "5", "--seed", "1")
    assert r.returncode == 0 and r.stdout.startswith("w3 w4"), r.stderr


# --- refusals: one line, exit 1, nothing written ----------------------------------------------------------------


def tfcli(*args):
    return subprocess.run([sys.executable, "-m", "tfcli", *map(str, args)], capture_output=True, text=True)


def tfcli_here(*args):
    """`tfcli ARGS` in this process (click's runner): (exit status, stderr)."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    return r.exit_code, r.stderr


def test_export_and_import_refusals_are_one_line_and_write_nothing(tmp_path):
    pytest.importorskip("transformers")
    ckpt = save(tmp_path, random_model("lm", positions="rope"))
    seq = save(tmp_path, random_model(positions="learned"), "seq")
    relu2 = save(tmp_path, random_model(activation="relu2"), "relu2")
    rms = save(tmp_path, random_model(rms_norm=True, activation="swiglu"), "rms")
    qk = save(tmp_path, random_model(qk_norm=True, norm="post"), "qk")
    gqa = save(tmp_path, random_model(n_kv_head=2, norm="post"), "gqa")
    cases = [
        (("export", relu2, "--to", "ctranslate2", "-o", tmp_path / "out"), "model.activation relu2 is not supported"),
        (("export", relu2, "--to", "hf", "-o", tmp_path / "out"), "model.activation relu2 is not supported"),
        (("export", rms, "--to", "hf", "-o", tmp_path / "out"), "model.rms_norm true is not supported"),
        (("export", qk, "--to", "ctranslate2", "-o", tmp_path / "out"), "model.qk_norm true is not supported"),
        (("export", qk, "--to", "hf", "-o", tmp_path / "out"), "model.qk_norm true is not supported"),
        (("export", gqa, "--to", "hf", "-o", tmp_path / "out"), "model.n_kv_head 2 is not supported"),
        (("export", ckpt, "--to", "onnx", "-o", tmp_path / "out"), "--to onnx: unknown; choose from ctranslate2, hf"),
        (("export", ckpt, "--to", "hf", "-o", tmp_path / "out"), "model.positions rope with model.rms_norm false is not supported"),
        (("export", seq, "--to", "hf", "-o", tmp_path / "out"), "model.positions learned is not supported"),
        (("export", ckpt, "--to", "hf", "--quantization", "int8", "-o", tmp_path / "out"), "ctranslate2 only"),
        (("export", tmp_path / "words.json", "--to", "hf", "-o", tmp_path / "out"), "not a tfcli checkpoint"),
        (("export", ckpt, "--to", "ctranslate2", "-o", tmp_path), "holds the input"),
        (("export", ckpt, "--to", "ctranslate2", "-o", tmp_path / "pickled"), "already exists"),
        (("import", tmp_path / "nothing", "-o", tmp_path / "out"), "no such directory"),
        (("import", ckpt, "-o", tmp_path / "out"), "is a tfcli checkpoint already"),
        (("import", tmp_path / "ct2", "-o", tmp_path / "out"), "is a CTranslate2 model directory"),
        (("import", tmp_path / "other", "-o", tmp_path / "out"), "is not a transformers model directory"),
    ]
    for name, config in (("ct2", '{"add_source_bos": false}'), ("other", "{}")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(config)
    (tmp_path / "ct2" / "model.bin").write_bytes(b"\0" * 16)
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    cases.append((("import", tmp_path / "bert", "-o", tmp_path / "out"), "model_type 'bert' cannot be imported; supported"))
    (tmp_path / "m2m").mkdir()  # fairseq's positions count from <pad> + 1: another padding id is not theirs
    (tmp_path / "m2m" / "config.json").write_text(json.dumps(dict(
        model_type="m2m_100", d_model=8, encoder_attention_heads=2, decoder_attention_heads=2, encoder_layers=1,
        decoder_layers=1, encoder_ffn_dim=8, decoder_ffn_dim=8, vocab_size=10, pad_token_id=0)))
    cases.append((("import", tmp_path / "m2m", "-o", tmp_path / "out"), "pad_token_id is 0; M2M-100 numbers"))
    (tmp_path / "pickled").mkdir()
    (tmp_path / "pickled" / "config.json").write_text('{"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1, '
                                                      '"n_positions": 8, "vocab_size": 10}')
    (tmp_path / "pickled" / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    cases.append((("import", tmp_path / "pickled", "-o", tmp_path / "out"),
                  "pytorch_model.bin is a pickle, which tfcli never loads; write safetensors beside it with "
                  "transformers: python -c \"import transformers as t; t.AutoModelForCausalLM.from_pretrained("))
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, message in cases:
        code, stderr = tfcli_here(*args)
        assert code == (2 if "unknown; choose" in message else 1), (args, stderr)  # a bad flag: usage
        assert message in stderr and len(stderr.strip().splitlines()) == 1, (args, stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temp directory left behind


def test_export_refuses_a_checkpoint_without_its_tokenizer(tmp_path):
    ckpt = save(tmp_path, random_model())
    (ckpt / "tokenizer.tgt.json").unlink()
    with pytest.raises(TfcliError, match="tokenizer"):
        export(ckpt, "ctranslate2", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- fine-tuning ----------------------------------------------------------------------------------------------


def test_init_from_starts_from_the_checkpoints_weights_with_a_fresh_schedule(tmp_path):
    from tfcli.train.trainer import Trainer, train

    data = make_parallel_prepared(tmp_path / "prep")
    first = tiny_train_config(data, tmp_path / "first", max_steps=6, valid_every=6, valid_bleu=False)
    train(first)
    start, _ = checkpoint.load(tmp_path / "first")
    tuned = tiny_train_config(data, tmp_path / "tuned", max_steps=4, valid_every=4, valid_bleu=False,
                              init_from=str(tmp_path / "first"), arch="small")  # the architecture is the checkpoint's
    trainer = Trainer(tuned, {"dropout": 0.2})
    try:
        assert trainer.step == 0 and not trainer.optimizer.state  # fresh optimizer and schedule
        assert trainer.model_cfg == dataclasses.replace(start.cfg, dropout=0.2)
        a, b = start.state_dict(), trainer.raw.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="model.d_model comes from the checkpoint"):
        Trainer(dataclasses.replace(tuned, out=str(tmp_path / "x")), {"d_model": 64})
    other = make_parallel_prepared(tmp_path / "other", n_words=25)  # another vocabulary
    with pytest.raises(ConfigError, match="--tokenizer-from"):
        Trainer(dataclasses.replace(tuned, data=str(other), out=str(tmp_path / "y")))
    mono = make_mono_prepared(tmp_path / "mono")
    with pytest.raises(ConfigError, match="cannot train on mono data"):
        Trainer(dataclasses.replace(tuned, data=str(mono), out=str(tmp_path / "z")))


def test_import_converts_marian_sentencepiece_vocabularies_as_marian_tokenizes(tmp_path):
    """An Opus-MT-style directory without tokenizer.json: source.spm/target.spm (SentencePiece unigram models) and
    vocab.json. tfcli's converted tokenizer must cut texts into the ids MarianTokenizer gives."""
    spm = pytest.importorskip("sentencepiece")
    transformers = pytest.importorskip("transformers")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"ein Hund läuft über die Wiese Nummer {i} und {i * 7} Katzen schauen zu.\n"
                              f"a dog runs across meadow number {i} while {i * 3} cats watch.\n" for i in range(300)))
    d = tmp_path / "opus-spm"
    d.mkdir()
    for side in ("source", "target"):
        spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / side), vocab_size=120,
                                       model_type="unigram", character_coverage=1.0, minloglevel=2)
        (tmp_path / f"{side}.model").rename(d / f"{side}.spm")
    pieces = ["</s>", "<unk>"]
    for side in ("source", "target"):
        sp = spm.SentencePieceProcessor(model_file=str(d / f"{side}.spm"))
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces + ["<pad>"]))}
    (d / "vocab.json").write_text(json.dumps(vocab))
    V = len(vocab)
    cfg = transformers.MarianConfig(vocab_size=V, decoder_vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16,
                                    decoder_ffn_dim=16, pad_token_id=V - 1, eos_token_id=0, decoder_start_token_id=V - 1)
    transformers.MarianMTModel(cfg).save_pretrained(d)
    import_model(d, tmp_path / "ckpt")
    meta = checkpoint_meta.read_meta(tmp_path / "ckpt")
    theirs = transformers.MarianTokenizer(str(d / "source.spm"), str(d / "target.spm"), str(d / "vocab.json"))
    tok = checkpoint.tokenizer(meta, "src")
    new_id = {h: i for i, h in enumerate([V - 1, V - 1, 0, 1] + [i for i in range(V) if i not in (V - 1, 0, 1)])}
    texts = ["ein Hund läuft über die Wiese", "  a dog   runs  ", "Nummer 123 und 4567 Katzen!", "ﬁne ＡＢＣ qué ™"]
    for text in texts:
        want = [new_id[i] for i in theirs(text).input_ids[:-1]]  # MarianTokenizer appends </s>; tfcli's batching does
        assert tok.encode(text, add_special_tokens=False).ids == want, text


def test_imported_models_run_in_translate_and_hub_names_download(tmp_path, monkeypatch):
    d, _, _ = _marian_like_dir(tmp_path)
    r = tfcli("import", d, "-o", tmp_path / "ckpt")
    assert r.returncode == 0 and "marian -> tfcli seq2seq" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "tfcli", "translate", "-m", str(tmp_path / "ckpt"), "--greedy"],
                       input="w1 w2 w3\nw4\n", capture_output=True, text=True)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2, r.stderr
    attention = tfcli("attention", "-m", tmp_path / "ckpt", "w1 w2 w3", "-o", tmp_path / "att")
    assert attention.returncode == 0, attention.stderr
    # a hub name goes through huggingface_hub (no network here: the download is stood in for)
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub, "snapshot_download", lambda name, allow_patterns: str(d))
    info = import_model("Helsinki-NLP/opus-mt-xx-yy", tmp_path / "from-hub")
    assert info["arch"] == "marian"


# --- import of a hostile or broken Hugging Face directory: checked before anything is allocated or written --------


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """Good GPT-2 and Marian directories exported by tfcli, to break one thing at a time."""
    pytest.importorskip("transformers")
    d = tmp_path_factory.mktemp("hf")
    out = {}
    for name, kind, fields in (("gpt2", "lm", {}), ("marian", "seq2seq", HF_VARIANTS["marian, shared"][1])):
        (d / name).mkdir()
        ckpt = save(d / name, random_model(kind, **fields))
        export(ckpt, "hf", d / name / "hf")
        out[name] = d / name / "hf"
    return out


def _broken(hf_dir: Path, tmp_path: Path, config=None, weights=None) -> Path:
    """A copy of `hf_dir` with its config.json changed by `config(dict)` and its weights by `weights(dict)`."""
    from safetensors.torch import load_file, save_file

    d = Path(shutil.copytree(hf_dir, tmp_path / f"case{len(list(tmp_path.glob('case*')))}"))
    if config is not None:
        data = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(config(data)))
    if weights is not None:
        tensors = load_file(str(d / "model.safetensors"))
        save_file(weights(tensors), str(d / "model.safetensors"))
    return d


def in_process(*args):
    """The command line in this process (what `tfcli` runs, without a Python start per case)."""
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from tfcli.cli import app

    r = CliRunner().invoke(app, [str(a) for a in args])
    return SimpleNamespace(returncode=r.exit_code, stderr=r.stderr, stdout=r.stdout)


def _set(**changes):
    return lambda c: {**c, **changes}


def test_import_checks_the_config_and_the_weights_before_allocating_or_writing(hf_dirs, tmp_path):
    gpt2, marian = hf_dirs["gpt2"], hf_dirs["marian"]

    def extra_layer(t):
        return {**t, **{k.replace("transformer.h.0.", "transformer.h.9."): v.clone() for k, v in t.items()
                        if k.startswith("transformer.h.0.")}}

    def int_weights(t):
        return {**t, "transformer.ln_f.weight": t["transformer.ln_f.weight"].to(torch.int32)}

    cases = [
        (gpt2, dict(config=lambda c: [c]), "expected a JSON object, got list"),
        (gpt2, dict(config=lambda c: {k: v for k, v in c.items() if k != "n_embd"}), "no 'n_embd'"),
        (gpt2, dict(config=_set(n_embd=10**9)), "n_embd 1000000000, but transformer.wte.weight is"),  # not an allocation of 10^9 x vocab
        (gpt2, dict(config=_set(vocab_size=10**12)), "vocab_size 1000000000000 and"),
        (gpt2, dict(config=_set(n_layer=0)), "n_layer is 0; expected a positive integer"),
        (gpt2, dict(config=_set(n_head=-4)), "n_head is -4; expected a positive integer"),
        (gpt2, dict(config=_set(n_layer="2")), "n_layer is '2'; expected a positive integer"),
        (gpt2, dict(config=_set(n_layer=True)), "n_layer is True"),
        (gpt2, dict(config=_set(n_layer=10**9)), "n_layer is 1000000000, but the weights hold"),
        (gpt2, dict(config=_set(n_head=7)), "is not divisible by n_head 7"),
        (gpt2, dict(config=_set(resid_pdrop=2.0)), "resid_pdrop is 2.0"),
        (gpt2, dict(config=_set(model_type="marian")), "no 'd_model', which a marian config holds"),
        (marian, dict(config=_set(model_type="gpt2", n_embd=32, n_head=4, n_layer=2, n_positions=64)),
         "the weights lack transformer.wte.weight: not a gpt2 model"),
        (gpt2, dict(weights=extra_layer), "n_layer is"),  # weights for more layers than the config has
        (gpt2, dict(weights=lambda t: {**t, "transformer.extra.weight": torch.zeros(3)}),
         "tensor transformer.extra.weight is not part of a gpt2 model"),
        (gpt2, dict(weights=int_weights), "tensor transformer.ln_f.weight is I32; model weights are floating point"),
        (gpt2, dict(weights=lambda t: {**t, "transformer.h.0.mlp.c_fc.weight": t["transformer.h.0.mlp.c_fc.weight"][:, :5].clone()}),
         "has shape"),
        (marian, dict(config=_set(encoder_ffn_dim=0)), "encoder_ffn_dim is 0"),
        (marian, dict(config=_set(decoder_layers=7)), "decoder_layers is 7, but the weights hold"),
        (marian, dict(config=_set(scale_embedding="yes")), "scale_embedding is 'yes'; expected true or false"),
        (gpt2, dict(config=_set(tie_word_embeddings=1)), "tie_word_embeddings is 1; expected true or false"),
        (marian, dict(config=_set(activation_function=3)), "activation_function is 3; expected a name"),
    ]
    for source, change, message in cases:
        d = _broken(source, tmp_path, **change)
        r = in_process("import", d, "-o", tmp_path / "out")
        assert r.returncode == 1 and message in r.stderr, (message, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "internal error" not in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()
    # a tokenizer larger than the embedding
    d = _broken(gpt2, tmp_path, config=_set(vocab_size=8))
    r = in_process("import", d, "-o", tmp_path / "out")
    assert r.returncode == 1 and "vocab_size 8 and n_embd" in r.stderr  # the weights' rows say otherwise
    d = _broken(gpt2, tmp_path)
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["model"]["vocab"].update({f"extra{i}": 1000 + i for i in range(50)})
    (d / "tokenizer.json").write_text(json.dumps(tok))
    r = in_process("import", d, "-o", tmp_path / "out")
    assert r.returncode == 1 and "tokens, more than the" in r.stderr and "embedding rows" in r.stderr, r.stderr
    # and the good ones still import
    for source in (gpt2, marian):
        assert in_process("import", source, "-o", tmp_path / f"ok-{source.parent.name}").returncode == 0


@pytest.mark.parametrize("special", ["fifo", "device", "directory"])
def test_import_refuses_a_path_that_is_not_a_regular_file_before_opening_it(hf_dirs, tmp_path, special):
    d = _broken(hf_dirs["gpt2"], tmp_path)
    target = d / "tokenizer.json"
    target.unlink()
    if special == "fifo":
        os.mkfifo(target)  # opening it would block until a writer came
    elif special == "device":
        target.symlink_to("/dev/zero")  # reading it would never end
    else:
        target.mkdir()
    r = subprocess.run([sys.executable, "-m", "tfcli", "import", str(d), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and f"{target}: not a regular file" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_import_and_export_read_one_record_per_architecture():
    """hf.ARCHS holds what sets each transformers architecture apart: the config import derives from a minimal
    config.json of each is one that export maps back to the same record (the same class)."""
    from tfcli.interop.hf import ARCHS, hf_arch
    from tfcli.interop.hf_import import model_config_from_hf

    seq2seq = {"d_model": 16, "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_layers": 1,
               "decoder_layers": 1, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "vocab_size": 50, "pad_token_id": 1}
    llama = {"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 32,
             "vocab_size": 50}
    configs = {"marian": seq2seq, "pegasus": seq2seq, "m2m_100": seq2seq,
               "gpt2": {"n_embd": 16, "n_head": 2, "n_layer": 1, "n_positions": 64, "vocab_size": 50},
               "llama": llama, "mistral": llama, "qwen2": llama, "qwen3": llama, "phi3": llama, "gemma2": llama,
               "gemma3_text": llama}
    # (a Mistral without a sliding window is a Llama; Phi-3 is written as itself when it is the model's own family)
    exported_as = {"mistral": "llama", "phi3": "llama"}
    assert set(configs) == set(ARCHS)
    for name, config in configs.items():
        arch = ARCHS[name]
        cfg = model_config_from_hf({"model_type": name, **config}, arch, Path("hf"))
        assert (cfg.kind, cfg.norm, cfg.positions) == (arch.kind, arch.norm, arch.positions), name
        assert hf_arch(cfg) is ARCHS[exported_as.get(name, name)], name
        assert hf_arch(cfg, name) is arch, name


@pytest.mark.parametrize("rules", [dict(no_repeat_ngram_size=2), dict(repetition_penalty=1.5),
                                   dict(repetition_penalty=0.8, no_repeat_ngram_size=3)])
def test_generate_repetition_rules_are_transformers(tmp_path, rules):
    """generate's --no-repeat-ngram-size and --repetition-penalty give transformers' greedy `generate` output on
    an imported GPT-2 (the prompt counts as text in both)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    import tfcli as api

    vocab = WORDS + ["<|endoftext|>"]
    eot = len(vocab) - 1
    cfg = transformers.GPT2Config(vocab_size=len(vocab), n_positions=32, n_embd=16, n_layer=2, n_head=4,
                                  bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(11)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # (weights larger than the init's, so that the text repeats and the rules act)
        for p in hf.parameters():
            p.normal_(0, 0.3)
    d = tmp_path / "gpt2"
    hf.save_pretrained(d)
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # (a word a token; decoded with spaces between)
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(d / "tokenizer.json"))
    import_model(d, tmp_path / "ckpt")
    lm = api.load(str(tmp_path / "ckpt"))

    def theirs(prompt: str, **kw) -> list[str]:
        ids = torch.tensor([[eot] + [vocab.index(w) for w in prompt.split()]])
        with torch.no_grad():
            out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                              do_sample=False, pad_token_id=eot, **kw)[0, ids.size(1):].tolist()
        return [vocab[i] for i in out[: out.index(eot) if eot in out else len(out)]]

    prompts = ["w3 w4", "w7", "w1 w1 w2"]
    changed = False
    for prompt in prompts:
        want = theirs(prompt, **rules)
        changed |= want != theirs(prompt)
        got = lm.generate([prompt], max_new_tokens=10, greedy=True, **rules)[0].split()
        assert got == want, (prompt, got, want)
    assert changed  # (the rule changes some output: it is tested)
    assert lm.generate(prompts, max_new_tokens=10, greedy=True, **rules) == \
        [lm.generate([p], max_new_tokens=10, greedy=True, **rules)[0] for p in prompts]  # (batch-invariant)


def _tiny_llama(d: Path, **config) -> "torch.nn.Module":
    """A random Llama-layout model of `config` (grouped-query attention, llama3 RoPE scaling, untied) with a word
    tokenizer, saved in bf16 in shards of at most 20 kB, as save_pretrained writes them."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = ["<unk>", "<s>", "</s>", *WORDS]
    cfg = transformers.LlamaConfig(**{**dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16}), **config})
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # (values bf16 holds: the stored copy is exact)
            p.copy_(p.normal_(0, 0.1).to(torch.bfloat16).float())
    model.to(torch.bfloat16).save_pretrained(d, max_shard_size="20kB")
    model.float()
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                               unk_token="<unk>")
    tok.save_pretrained(d)
    return model


def test_a_sharded_bf16_llama_imports_exactly_and_a_missing_shard_is_named(tmp_path):
    """A Llama-layout model in bf16 shards (model.safetensors.index.json) imports to the same log-probs; a shard
    the index names and the directory lacks is one line naming it, nothing written."""
    model = _tiny_llama(tmp_path / "hf")
    shards = sorted((tmp_path / "hf").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    import_model(tmp_path / "hf", tmp_path / "ckpt")
    ours, meta = checkpoint.load(tmp_path / "ckpt")
    tok = checkpoint.tokenizer(meta, "tgt")
    text = "w1 w2 w3 w4 w5 w6 w7"
    hf_ids = [WORDS.index(w) + 3 for w in text.split()]  # (this tokenizer adds no BOS: nor does tfcli)
    ids = meta["text"]["start"] + tok.encode(text, add_special_tokens=False).ids
    assert len(ids) == len(hf_ids)
    with torch.no_grad():
        want = model(torch.tensor([hf_ids])).logits.log_softmax(-1)[0]
        got = ours(torch.tensor([ids])).log_softmax(-1)[0]
    order = [tok.token_to_id(n) for n in ["<unk>", "<s>", "</s>", *WORDS]]  # (HF id -> tfcli id)
    torch.testing.assert_close(got[:, order], want, rtol=1e-5, atol=1e-5)
    shards[-1].unlink()
    with pytest.raises(TfcliError, match=f"{shards[-1]}: missing, a shard model.safetensors.index.json names"):
        import_model(tmp_path / "hf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _tiny_family(d: Path, family: str, **config) -> "torch.nn.Module":
    """A random fp32 model of transformers' `family` class ("Gemma2", "Phi3", "Mistral") with `config`, saved with
    a word tokenizer (BOS added, as the families' tokenizers add it)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = ["<unk>", "<s>", "</s>", *WORDS]
    cfg = getattr(transformers, f"{family}Config")(**{**dict(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=None,
        tie_word_embeddings=False), **config})
    torch.manual_seed(5)
    model = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    model.save_pretrained(d)
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                               unk_token="<unk>")
    tok.save_pretrained(d)
    return model


@pytest.mark.parametrize("family, config", [
    # Gemma 2: a sliding window on every other layer, scores scaled by query_pre_attn_scalar (not head_dim), the
    # scores and the logits soft-capped (caps low enough to bind)
    ("Gemma2", dict(head_dim=16, query_pre_attn_scalar=12, sliding_window=4, attn_logit_softcapping=2.0,
                    final_logit_softcapping=3.0)),
    # Phi-3: q, k, v in one projection, gate and up in another; a sliding window on every layer
    ("Phi3", dict(sliding_window=4)),
    # Phi-3.5 / Phi-4-mini: RoPE on half of each head, longrope (a 4-token prompt switches to the long factors
    # as it is continued past 8 positions, as transformers switches)
    ("Phi3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                   "short_factor": [1.0, 1.3], "long_factor": [3.0, 7.0],
                                   "original_max_position_embeddings": 8})),
    ("Mistral", dict(sliding_window=4)),
])
def test_gemma2_phi3_and_mistral_conventions_import_and_export_exactly(tmp_path, family, config):
    """Each family's conventions, at values that bind on a short text: tfcli's log-probs and greedy continuation
    are transformers', and `export --to hf` writes the family back computing the same logits."""
    transformers = pytest.importorskip("transformers")
    import tfcli

    model = _tiny_family(tmp_path / "hf", family, **config)
    import_model(tmp_path / "hf", tmp_path / "ckpt")
    lm = tfcli.load(str(tmp_path / "ckpt"))
    tok = lm.loaded.tgt_tok
    text = " ".join(WORDS[3:15])
    hf_ids = [1] + [WORDS.index(w) + 3 for w in text.split()]
    ids = lm.loaded.meta["text"]["start"] + tok.encode(text, add_special_tokens=False).ids
    order = [tok.token_to_id(n) for n in ["<unk>", "<s>", "</s>", *WORDS]]  # (HF id -> tfcli id)
    with torch.no_grad():
        want = model(torch.tensor([hf_ids])).logits.log_softmax(-1)[0]
        got = lm.loaded.model(torch.tensor([ids])).log_softmax(-1)[0]
    torch.testing.assert_close(got[:, order], want, rtol=1e-5, atol=1e-5)
    for prompt in (text, " ".join(WORDS[5:9])):
        prompt_ids = [1] + [WORDS.index(w) + 3 for w in prompt.split()]
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=10, do_sample=False, eos_token_id=2,
                                 attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
        out = out[0, len(prompt_ids):].tolist()
        out = out[: out.index(2)] if 2 in out else out
        assert lm.generate([prompt], max_new_tokens=10, greedy=True)[0].split() == [WORDS[i - 3] for i in out]
    export(tmp_path / "ckpt", "hf", tmp_path / "back")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back) is type(model)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "back")(text)["input_ids"] == hf_ids
    with torch.no_grad():
        torch.testing.assert_close(back(torch.tensor([hf_ids])).logits, model(torch.tensor([hf_ids])).logits,
                                   rtol=1e-5, atol=1e-5)


def test_llama_layout_configs_tfcli_cannot_express_are_refused_naming_the_key(tmp_path):
    """A published config whose value tfcli would have to approximate: one line naming the key and value, nothing
    written."""
    _tiny_family(tmp_path / "phi", "Phi3")
    _tiny_family(tmp_path / "qwen", "Qwen2")
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    longrope = {"rope_type": "longrope", "short_factor": [1.0] * 3, "long_factor": [2.0] * 3,
                "original_max_position_embeddings": 16}
    cases = [
        (tmp_path / "qwen", _set(partial_rotary_factor=0.5), "partial_rotary_factor 0.5 in a qwen2 model"),
        (tmp_path / "phi", _set(partial_rotary_factor=0.1), "partial_rotary_factor 0.1"),
        (tmp_path / "qwen", _set(rope_scaling=yarn, rope_parameters=None), "rope_scaling of type 'yarn'"),
        (tmp_path / "phi", _set(rope_scaling=longrope, rope_parameters=None), "longrope has 3 factors"),
        (tmp_path / "qwen", _set(use_sliding_window=True, sliding_window=4, max_window_layers=1),
         "use_sliding_window true with max_window_layers 1"),
    ]
    for source, change, message in cases:
        d = _broken(source, tmp_path, config=change)
        r = in_process("import", d, "-o", tmp_path / "out")
        assert r.returncode == 1 and message in r.stderr, (message, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
