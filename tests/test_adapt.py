"""Adapting a trained model: LoRA adapters (trained alone, saved alone, merged for decoding, exported in PEFT's
layout) and full fine-tuning with frozen parts; both resume exactly."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from helpers import make_parallel_prepared, save_model, save_word_tokenizer, stored_layout_decoded, tiny_train_config
from tfcli import checkpoint, checkpoint_meta
from tfcli.errors import CheckpointError, ConfigError, TfcliError
from tfcli.interop.exporter import export
from tfcli.model import lora
from tfcli.model.config import preset
from tfcli.model.transformer import build_model
from tfcli.train.trainer import Trainer, train


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(prepared data, a briefly trained encoder-decoder's run directory)."""
    d = tmp_path_factory.mktemp("adapt")
    data = make_parallel_prepared(d / "prep")
    train(tiny_train_config(data, d / "base", max_steps=100, valid_every=100, valid_bleu=False))
    return data, d / "base"


def lora_config(data, out, base_run, **kw):
    fields = dict(max_steps=6, valid_every=3, valid_bleu=False, init_from=str(base_run), lora_rank=4, lr=1e-2,
                  lora_dropout=0.1, warmup=2)
    return tiny_train_config(data, out, **{**fields, **kw})


def test_lora_trains_the_adapters_alone_saves_them_alone_and_decodes_merged(base, tmp_path):
    data, base_run = base
    train(lora_config(data, tmp_path / "lora", base_run, valid_bleu=True))
    ckpt = checkpoint_meta.resolve(tmp_path / "lora")
    saved = checkpoint.read_weights(ckpt / checkpoint_meta.WEIGHTS)
    assert saved and all(".lora." in k for k in saved)  # the adapters alone
    start, _ = checkpoint.load(base_run)
    attached, meta = checkpoint.load(ckpt, merge=False)
    assert meta["adapter"]["rank"] == 4 and meta["adapter"]["base"] == str(checkpoint_meta.resolve(base_run).resolve())
    a, b = start.state_dict(), attached.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # the base model untouched
    assert any(ad.B.abs().sum() > 0 for ad in lora.adapters(attached).values())  # the adapters trained
    merged, _ = checkpoint.load(ckpt)
    assert not lora.adapters(merged) and merged.state_dict().keys() == a.keys()
    src, tgt = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[1, 8, 7, 6]])
    with torch.no_grad():
        assert torch.allclose(merged(src, tgt), attached(src, tgt), atol=1e-5)
        assert not torch.allclose(merged(src, tgt), start(src, tgt), atol=1e-3)
    # translate decodes the merged model: the outputs of the same weights saved as a plain checkpoint; and the
    # BLEU training logged (validation merges the adapters for the while) is that of `translate --greedy` on valid
    import sacrebleu

    import tfcli

    prepared = (data / "valid.src.txt").read_text().splitlines(), (data / "valid.tgt.txt").read_text().splitlines()
    logged = [json.loads(line) for line in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()
              if '"valid"' in line][-1]["bleu"]
    greedy = tfcli.load(str(ckpt)).translate(prepared[0], beam_size=1)
    assert logged == sacrebleu.corpus_bleu(greedy, [prepared[1]]).score

    save_model(tmp_path / "plain", merged, checkpoint_meta.tokenizer_path(meta, "src"))
    lines = ["w1 w2 w3 w4", "w5 w6 w7", "w9 w3"]
    assert tfcli.load(str(ckpt)).translate(lines) == tfcli.load(str(tmp_path / "plain")).translate(lines)
    if stored_layout_decoded("int8"):  # (int8 quantises the merged weights: as it quantises the plain ones)
        assert tfcli.load(str(ckpt), dtype="int8").translate(lines) == \
            tfcli.load(str(tmp_path / "plain"), dtype="int8").translate(lines)


@pytest.mark.parametrize("how", ["lora", "freeze"])
def test_a_resumed_adaptation_reaches_the_uninterrupted_weights(base, tmp_path, how):
    data, base_run = base
    extra = dict(lora_rank=0, freeze=["encoder", "embeddings"]) if how == "freeze" else {}
    model = {"dropout": 0.1}  # (the random stream resumes too)
    whole = lora_config(data, tmp_path / "whole", base_run, **extra)
    train(whole, model)
    train(dataclasses.replace(whole, out=str(tmp_path / "part"), max_steps=3), model)
    train(dataclasses.replace(whole, out=str(tmp_path / "part"), resume=True), model)
    a = checkpoint.load(tmp_path / "whole" / "checkpoints" / "step-0000006", merge=False)[0].state_dict()
    b = checkpoint.load(tmp_path / "part" / "checkpoints" / "step-0000006", merge=False)[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if how == "freeze":  # the frozen parts are the base's, the rest trained
        start = checkpoint.load(base_run)[0].state_dict()
        frozen = [k for k in a if k.startswith("encoder.") or "embed." in k]
        assert frozen and all(torch.equal(a[k], start[k]) for k in frozen)
        assert any(not torch.equal(a[k], start[k]) for k in a if k.startswith("decoder.layers."))


def test_adaptation_refusals_are_one_line_and_write_nothing(base, tmp_path):
    data, base_run = base
    cases = [
        (dict(lora_rank=64), "train.lora_rank: 64 is more than"),
        (dict(lora_targets=["qkv", "ffn"]), "train.lora_targets: ffn: expected some of"),
        (dict(init_from=""), "adapters adapt a trained model; give it with --init-from"),
        (dict(lora_rank=0, freeze=["decoder.nothing.*"]), "train.freeze: 'decoder.nothing.*' names no parameter"),
        (dict(lora_rank=0, freeze=["encoder", "decoder"]), "leaves nothing to train"),
        (dict(freeze=["encoder"]), "trains its adapters alone; give one or the other"),
    ]
    for i, (fields, message) in enumerate(cases):
        cfg = lora_config(data, tmp_path / f"run{i}", base_run, **fields)
        with pytest.raises(ConfigError, match=message.replace("*", r"\*").replace(".", r"\.")):
            cfg.validate()
            Trainer(cfg)
        assert not (tmp_path / f"run{i}" / "checkpoints").exists()
    # a resume may not change what is trained
    train(lora_config(data, tmp_path / "r", base_run, max_steps=3))
    with pytest.raises(ConfigError, match="what the run trains cannot change"):
        Trainer(dataclasses.replace(lora_config(data, tmp_path / "r", base_run, lora_rank=8), resume=True),
                saved=checkpoint_meta.read_meta(tmp_path / "r" / "checkpoints" / "step-0000003"))
    # adapters on other weights than they were trained on: one line naming both
    other = tmp_path / "other-base"
    train(tiny_train_config(data, other, max_steps=3, valid_every=3, valid_bleu=False))
    train(lora_config(data, tmp_path / "on-other", other, max_steps=3))
    model, meta = checkpoint.load(other)
    with torch.no_grad():
        model.decoder.layers[0].ffn.w1.weight.add_(0.01)
    checkpoint.save(checkpoint_meta.resolve(other), model, {k: v for k, v in meta.items() if k != "dir"},
                    {s: checkpoint_meta.tokenizer_path(meta, s) for s in ("src", "tgt")})
    with pytest.raises(CheckpointError, match="trained on other weights than"):
        checkpoint.load(tmp_path / "on-other")
    with pytest.raises(TfcliError, match="--to peft: .* holds a whole model"):
        export(other, "peft", tmp_path / "peft")
    assert not (tmp_path / "peft").exists()


WORDS = [f"w{i}" for i in range(30)]
PEFT_MODELS = {
    "marian": ("seq2seq", dict(norm="post", share_embeddings=True)),
    "gpt2": ("lm", dict()),
    "llama, grouped-query": ("lm", dict(positions="rope", rms_norm=True, activation="swiglu", bias=False,
                                        n_head=4, n_kv_head=2, tie_output=False)),
}


@pytest.mark.parametrize("name", PEFT_MODELS)
def test_peft_loads_the_adapters_onto_the_transformers_export(tmp_path, name):
    """`export --to peft` of adapters on a model, loaded by peft onto `export --to hf` of that model, computes what
    tfcli's merged model computes."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    kind, fields = PEFT_MODELS[name]
    V = 4 + len(WORDS)
    sizes = dict(src_vocab_size=V, tgt_vocab_size=V) if kind == "seq2seq" else dict(tgt_vocab_size=V)
    torch.manual_seed(0)
    model = build_model(preset("toy" if kind == "seq2seq" else "lm-toy", **sizes, **fields)).eval()
    tok = save_word_tokenizer(tmp_path / "words.json", WORDS)
    base = save_model(tmp_path / "base", model, tok)
    record = {"base": str(base.resolve()), "fingerprint": checkpoint.model_fingerprint(model),
              **lora.LoraConfig(4, 8.0, targets=tuple(lora.TARGETS)).to_dict()}
    lora.attach(model, lora.LoraConfig.from_dict(record))
    with torch.no_grad():
        for adapter in lora.adapters(model).values():
            adapter.B.normal_(0, 0.2)
    sides = {"src": tok, "tgt": tok} if kind == "seq2seq" else {"tgt": tok}
    ckpt = checkpoint.save(tmp_path / "lora", model, {"model": dataclasses.asdict(model.cfg), "adapter": record}, sides)
    export(base, "hf", tmp_path / "hf")
    export(ckpt, "peft", tmp_path / "peft")
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0
    Auto = transformers.AutoModelForSeq2SeqLM if kind == "seq2seq" else transformers.AutoModelForCausalLM
    theirs = peft.PeftModel.from_pretrained(Auto.from_pretrained(tmp_path / "hf"), tmp_path / "peft").eval()
    merged, _ = checkpoint.load(ckpt)
    src = torch.tensor([[5, 9, 12, 7, 2], [6, 8, 4, 2, 2]])
    with torch.no_grad():
        if kind == "seq2seq":
            tgt = torch.tensor([[1, 7, 8, 9], [1, 5, 5, 6]])
            ours, hf = merged(src, tgt), theirs(input_ids=src, decoder_input_ids=tgt).logits
        else:
            ours, hf = merged(src), theirs(input_ids=src).logits
    assert float((ours - hf).abs().max()) < 1e-4
    assert not torch.allclose(ours, checkpoint.load(base)[0](*((src, tgt) if kind == "seq2seq" else (src,))),
                              atol=1e-3)  # (the adapters change the outputs: the test sees them)


def test_corpora_are_drawn_by_their_weights_and_each_valid_set_is_reported(tmp_path):
    """`prepare --corpus NAME=SRC,TGT[,W]` (a new domain beside an earlier one's data replayed): each epoch draws
    from each corpus in proportion to its weight, and training reports each `--valid-corpus` alone."""
    from tfcli.data.config import PrepareConfig
    from tfcli.data.prepare import prepare
    from tfcli.data.prepared import PreparedData
    from tfcli.train.data import ParallelData

    files = {}
    for name, words, n in (("new", "abcdefgh", 120), ("old", "stuvwxyz", 40), ("other", "abcdwxyz", 0)):
        for split, count in (("train", n), ("valid", 10)):
            lines = [" ".join(words[(i + j) % 8] for j in range(3 + i % 4)) for i in range(count)]
            for side in ("src", "tgt"):
                files[name, split, side] = tmp_path / f"{name}.{split}.{side}"
                files[name, split, side].write_text("\n".join(lines) + "\n")
    spec = lambda name, split, w="": f"{name}={files[name, split, 'src']},{files[name, split, 'tgt']}{w}"  # noqa: E731
    cfg = PrepareConfig(out=str(tmp_path / "prep"), corpora=[spec("new", "train"), spec("old", "train", ",3")],
                        valid_corpora=[spec("new", "valid"), spec("old", "valid"), spec("other", "valid")],
                        tokenizer="char", vocab_size=40)  # ("other": a domain to watch, not to train on)
    cfg.validate()
    data = PreparedData(prepare(cfg))
    assert data.meta["corpora"] == {"new": 1.0, "old": 3.0}
    assert data.split_names("train") == ["train.new", "train.old"]
    assert data.split_names("valid") == ["valid.new", "valid.old", "valid.other"]
    pairs = ParallelData(data, data.split_names("train"), 64, 256, 0, 1, weights=[1.0, 3.0])
    rows = pairs.epoch_rows(0)
    old = int((rows >= 120).sum())
    assert len(rows) == 160 and old == 120  # 3/4 of the epoch's 160 rows: the 40 rows of "old", 3 times each
    assert sorted(rows[rows >= 120].tolist()) == sorted(list(range(120, 160)) * 3)
    train(tiny_train_config(data.path, tmp_path / "run", max_steps=4, valid_every=4, bleu_max_sentences=4))
    valid = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if '"valid"' in line]
    assert set(valid[-1]["directions"]) == {"new", "old", "other"} and all("bleu" in m for m in valid[-1]["directions"].values())
    for bad, message in ((dict(corpora=["new=a.de"]), "expected NAME=SRC,TGT,WEIGHT"),
                         (dict(corpora=["new=a,b,0"]), "the weight must be positive"),
                         (dict(corpora=["x=a,b", "x=c,d"]), "x is named twice"),
                         (dict(valid_corpora=["x=a,b"]), "go with training corpora")):
        with pytest.raises(ConfigError, match=message):
            PrepareConfig(out=str(tmp_path / "bad"), **bad).validate()
    with pytest.raises(ConfigError, match="--corpus names every training corpus; drop --src"):
        prepare(PrepareConfig(out=str(tmp_path / "bad"), corpora=[spec("new", "train")], src="a", tgt="b"))
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("how", ["full", "lora"])
def test_activation_checkpointing_trains_the_same_weights(base, tmp_path, how):
    """Recomputing each layer's activations in the backward (dropout on: its random stream replayed) gives the
    weights that keeping them gives, bit for bit."""
    data, base_run = base
    extra = {} if how == "lora" else dict(lora_rank=0)
    runs = {}
    for on in (False, True):
        cfg = lora_config(data, tmp_path / f"ac-{on}", base_run, max_steps=3, activation_checkpointing=on, **extra)
        train(cfg, {"dropout": 0.1})
        runs[on] = checkpoint.load(tmp_path / f"ac-{on}" / "checkpoints" / "step-0000003", merge=False)[0].state_dict()
    assert all(torch.equal(runs[False][k], runs[True][k]) for k in runs[False])
