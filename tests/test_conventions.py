"""Each published family's conventions in its training data (`prepare --tokenizer-from` an imported checkpoint,
tfcli/data/conventions.py): M2M-100 and NLLB-200 language tokens as transformers' tokenizers write them, a chat
model's conversations as its template renders them with the loss on the replies alone, and new languages grown
from a named one. Each checked against transformers on the same text: ids, the loss mask, and the loss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import m2m_tokenizer_files, spm_bpe
from tfcli import checkpoint, checkpoint_meta
from tfcli.data.config import PrepareConfig
from tfcli.data.prepare import prepare
from tfcli.data.prepared import PreparedData
from tfcli.errors import TfcliError
from tfcli.interop.hf_import import import_model
from tfcli.specials import BOS_ID, PAD_ID
from tfcli.train.data import ChatData, ParallelData
from tfcli.train.trainer import train

pytestmark = pytest.mark.slow

SHARED = Path(__file__).resolve().parents[2] / "shared"
M30K = SHARED / "data" / "multi30k"
LLM = SHARED / "models" / "llm"
M2M = {"m2m100": ("en", "fr"), "nllb": ("eng_Latn", "fra_Latn")}


def lines(lang: str, n: int = 6, start: int = 0) -> list[str]:
    return (M30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()[start:start + n]


def write(path: Path, texts: list[str]) -> str:
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return str(path)


def to_theirs(tok, ttok, ids) -> list[int]:
    """tfcli ids as the family's (through the tokens' names, which the import keeps)."""
    return [tok.convert_tokens_to_ids(ttok.id_to_token(int(i))) for i in ids]


def one_error(fn, *words):
    with pytest.raises(TfcliError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg
    return msg


# --- M2M-100 and NLLB-200 --------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=list(M2M))
def m2m(request, tmp_path_factory):
    """(family, transformers model, its tokenizer, the imported checkpoint, the work directory)."""
    transformers = pytest.importorskip("transformers")
    if not M30K.is_dir():
        pytest.skip(f"{M30K} not present")
    d = tmp_path_factory.mktemp(request.param)
    (d / "hf").mkdir()
    tok = m2m_tokenizer_files(request.param, d / "hf", spm_bpe(d, M30K))
    V = tok.encoder_size + len(tok.lang_code_to_id) + tok.num_madeup_words if request.param == "m2m100" else len(tok)
    cfg = transformers.M2M100Config(
        vocab_size=V, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, scale_embedding=True,
        max_position_embeddings=128, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)
    torch.manual_seed(0)
    hf = transformers.M2M100ForConditionalGeneration(cfg).eval()
    hf.save_pretrained(d / "hf")
    import_model(d / "hf", d / "ckpt")
    return request.param, hf, tok, d / "ckpt", d


def test_m2m_pairs_carry_the_language_tokens_as_transformers_writes_them(m2m):
    """prepare writes the source language's token first in each source and the target's first in each target; a
    batch of them is transformers' input_ids, labels and decoder inputs, and the loss is transformers' loss."""
    family, hf, tok, ckpt, d = m2m
    src_lang, tgt_lang = M2M[family]
    src, tgt = lines("en"), lines("fr")
    out = prepare(PrepareConfig(src=write(d / "s.en", src), tgt=write(d / "s.fr", tgt), out=str(d / "prep"),
                                lang_pairs=[f"{src_lang}-{tgt_lang}"], tokenizer_from=str(ckpt)))
    data = PreparedData(out)
    assert data.meta["convention"] == "tokens"
    batch = ParallelData(data, f"train.{src_lang}-{tgt_lang}", 128, 10_000, 0, seed=0).collate(np.arange(len(src)))
    tok.src_lang, tok.tgt_lang = src_lang, tgt_lang
    enc = tok(src, text_target=tgt)
    ttok = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "tgt")
    for row in range(len(src)):
        ours = lambda t: to_theirs(tok, ttok, [i for i in t[row].tolist() if i != PAD_ID])  # noqa: E731
        assert ours(batch.src) == enc["input_ids"][row]
        assert ours(batch.targets) == enc["labels"][row]
        # (the decoder starts at tfcli's <s>, whose rows the import took from transformers' decoder start)
        assert batch.inputs[row, 0] == BOS_ID and ours(batch.inputs)[1:] == enc["labels"][row][:-1]
    model, _ = checkpoint.load(ckpt)
    with torch.no_grad():
        logits = model(batch.src, batch.inputs)
        ours = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=PAD_ID)
        labels = torch.nn.utils.rnn.pad_sequence([torch.tensor(x) for x in enc["labels"]], batch_first=True,
                                                 padding_value=-100)
        inputs = tok.pad({"input_ids": enc["input_ids"]}, return_tensors="pt")
        theirs = hf(**inputs, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=0)


def test_a_fine_tuned_m2m_model_keeps_its_languages_and_gains_a_new_one(m2m):
    """--add-language CODE=LIKE: the token is added after the vocabulary, the targets of its direction start with
    it, the grown model's rows for it are LIKE's (the mean's without LIKE), and the fine-tuned checkpoint
    translates into it, its old languages kept."""
    from tfcli.train import adapt
    from tfcli.train.model_config import run_model_config
    from tfcli.train.config import TrainConfig

    family, hf, tok, ckpt, d = m2m
    src_lang, tgt_lang = M2M[family]
    new = "xx" if family == "m2m100" else "xxx_Latn"
    token = f"__{new}__" if family == "m2m100" else new
    out = prepare(PrepareConfig(src=write(d / "n.en", lines("en")), tgt=write(d / "n.de", lines("de")),
                                out=str(d / "prep-new"), lang_pairs=[f"{src_lang}-{new}"], tokenizer_from=str(ckpt),
                                add_languages=[f"{new}={tgt_lang}"]))
    data = PreparedData(out)
    meta = checkpoint_meta.read_meta(ckpt)
    V = meta["model"]["tgt_vocab_size"]
    new_id = data.meta["vocab"]["tgt"] - 1
    assert data.meta["new_languages"] == {new: {"token": token, "like": f"__{tgt_lang}__" if family == "m2m100"
                                                else tgt_lang}}
    assert all(int(s[0]) == new_id for s in (data.sequences(f"train.{src_lang}-{new}", "tgt")[i] for i in range(6)))
    cfg = run_model_config(TrainConfig(data=str(out), out=str(d / "x"), init_from=str(ckpt)), data, {}, None)
    assert cfg.tgt_vocab_size == max(V, new_id + 1)
    rows = adapt.new_rows(meta, data)
    like = checkpoint.tokenizer(meta, "tgt").token_to_id(data.meta["new_languages"][new]["like"])
    assert rows == {"src": {new_id: like}, "tgt": {new_id: like}}
    grown = adapt.grown(meta, cfg, rows, "cpu").state_dict()
    old, _ = checkpoint.load(ckpt)
    for name, t in old.state_dict().items():
        assert torch.equal(grown[name][: t.shape[0]], t), name
        if t.shape[0] == V:
            assert torch.equal(grown[name][new_id], t[like]), name
    mean = adapt.grown(meta, cfg, {"src": {new_id: None}, "tgt": {new_id: None}}, "cpu").state_dict()
    torch.testing.assert_close(mean["lm_head.weight"][new_id], old.state_dict()["lm_head.weight"][4:].mean(0))

    run = d / "run-new"
    train(TrainConfig(data=str(out), out=str(run), init_from=str(ckpt), max_steps=2, valid_every=2, warmup=1,
                      max_tokens=512, lr=1e-3))
    tuned = checkpoint_meta.read_meta(run)
    assert tuned["language_tokens"] == {**meta["language_tokens"], new: token}
    import tfcli

    translator = tfcli.load(str(run))
    for lang in (new, tgt_lang):
        (out_text,) = translator.translate([lines("en", 1)[0]], src_lang=src_lang, tgt_lang=lang, beam_size=1,
                                           max_len_b=4)
        assert isinstance(out_text, str)


def test_m2m_data_refusals_are_one_line_and_write_nothing(m2m, tmp_path):
    family, _, tok, ckpt, d = m2m
    src_lang, tgt_lang = M2M[family]
    files = dict(src=write(tmp_path / "s.en", lines("en", 2)), tgt=write(tmp_path / "s.fr", lines("fr", 2)),
                 tokenizer_from=str(ckpt), out=str(tmp_path / "p"))
    run = lambda **kw: prepare(PrepareConfig(**{**files, **kw}))  # noqa: E731
    one_error(lambda: run(), "--lang-pairs")
    one_error(lambda: run(lang_pairs=[f"{src_lang}-zz"]), "no language 'zz'", "--add-language")
    one_error(lambda: run(lang_pairs=[f"{src_lang}-{tgt_lang}"], add_languages=[tgt_lang]), "has this language")
    one_error(lambda: run(lang_pairs=[f"{src_lang}-zz"], add_languages=["zz=qq"]), "no language 'qq'")
    if family == "nllb":  # (NLLB's language tokens are the codes: a code that is another token collides)
        piece = next(t for t in sorted(tok.get_vocab()) if t.isalpha() and t.isascii() and len(t) > 3)
        one_error(lambda: run(lang_pairs=[f"{src_lang}-{piece}"], add_languages=[piece]), "in the vocabulary",
                  "another token")
    assert not (tmp_path / "p").exists()


# --- chat models ----------------------------------------------------------------------------------------------

CHAT = ["qwen2.5-0.5b-instruct", "llama-3.2-1b-instruct", "gemma-3-270m-it", "qwen3-1.7b"]


@pytest.fixture(scope="module", params=CHAT)
def chat(request, tmp_path_factory):
    """(transformers tokenizer, transformers model, the imported checkpoint, the work directory) of a family's
    real config and tokenizer at a tiny width."""
    transformers = pytest.importorskip("transformers")
    src = LLM / request.param
    if not src.is_dir() or not M30K.is_dir():
        pytest.skip(f"{src} or {M30K} absent")
    d = tmp_path_factory.mktemp(request.param)
    config = transformers.AutoConfig.from_pretrained(src)
    text_config = getattr(config, "text_config", config)
    for key, value in dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1,
                           head_dim=8, num_hidden_layers=1).items():
        setattr(text_config, key, value)
    if getattr(text_config, "query_pre_attn_scalar", None):  # (Gemma: its attention scaled by 1/sqrt(head_dim))
        text_config.query_pre_attn_scalar = 8
    if getattr(text_config, "layer_types", None):
        text_config.layer_types = text_config.layer_types[:1]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(d / "hf")
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, d / "hf" / f.name)
    import_model(d / "hf", d / "ckpt")
    yield transformers.AutoTokenizer.from_pretrained(d / "hf"), model, d / "ckpt", d
    shutil.rmtree(d)


def theirs_chat(tok, messages, **kw) -> list[int]:
    return list(tok.apply_chat_template(messages, tokenize=True, return_dict=False, **kw))


def test_pairs_become_the_conversation_translate_holds_with_the_loss_on_the_reply(chat):
    """A chat model's parallel data: each pair the template's conversation (translate's instruction, the target as
    the reply), ids as transformers' apply_chat_template gives them, the mask on the reply's tokens (from the end
    of the generation prompt on), and the loss on them equal to transformers' with the rest labelled -100."""
    from tfcli.generate.prompting import instruction

    tok, hf, ckpt, d = chat
    src, tgt = lines("de", 4), lines("en", 4)
    out = prepare(PrepareConfig(src=write(d / "s.de", src), tgt=write(d / "s.en", tgt), out=str(d / "prep"),
                                lang_pairs=["de-en"], tokenizer_from=str(ckpt)))
    data = PreparedData(out)
    assert data.kind == "chat" and data.meta["convention"] == "chat"
    ttok = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "tgt")
    labels = []
    for i in range(len(src)):
        messages = [instruction(src[i], "de", "en"), {"role": "assistant", "content": tgt[i]}]
        full = theirs_chat(tok, messages)
        asked = theirs_chat(tok, messages[:1], add_generation_prompt=True)
        assert to_theirs(tok, ttok, data.sequences("train.de-en", "tgt")[i]) == full
        assert data.sequences("train.de-en", "mask")[i].tolist() == [int(j >= len(asked)) for j in range(len(full))]
        labels.append(torch.tensor([t if j >= len(asked) else -100 for j, t in enumerate(full)]))
    batch = ChatData(data, "train.de-en", 512, 10_000, 0, seed=0).collate(np.arange(len(src)))
    model, _ = checkpoint.load(ckpt)
    with torch.no_grad():
        logits = model(batch.inputs)
        ours = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=PAD_ID)
        ids = torch.nn.utils.rnn.pad_sequence([torch.tensor(theirs_chat(tok, [instruction(s, "de", "en"),
                                                                               {"role": "assistant", "content": t}]))
                                               for s, t in zip(src, tgt)], batch_first=True)
        labels = torch.nn.utils.rnn.pad_sequence(labels, batch_first=True, padding_value=-100)
        theirs = hf(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=0)


def test_chat_datasets_train_on_every_reply_and_the_tuned_model_keeps_its_template(chat):
    """A JSONL chat dataset ("messages"): the mask marks each assistant turn as transformers renders it (from the
    generation prompt before it to its end of turn); a line without a reply is refused naming its line. The
    fine-tuned checkpoint keeps the chat template, so translate prompts it as the original."""
    tok, _, ckpt, d = chat
    de, en = lines("de", 4), lines("en", 4)
    conversations = [[{"role": "system", "content": "You translate."}, {"role": "user", "content": de[i]},
                      {"role": "assistant", "content": en[i]}, {"role": "user", "content": de[i + 1]},
                      {"role": "assistant", "content": en[i + 1]}] for i in range(3)]
    path = d / "chats.jsonl"
    path.write_text("".join(json.dumps({"messages": m}) + "\n" for m in conversations), encoding="utf-8")
    cfg = PrepareConfig(train=str(path), text_field="messages", tokenizer_from=str(ckpt), out=str(d / "chats"))
    if "qwen3" in str(ckpt.parent):  # (its template drops earlier turns' reasoning: the history is rewritten)
        one_error(lambda: prepare(cfg), "rewrites the history", "one reply a line")
        return
    data = PreparedData(prepare(cfg))
    ttok = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "tgt")
    for i, messages in enumerate(conversations):
        full = theirs_chat(tok, messages)
        want = np.zeros(len(full), dtype=int)
        for turn in (2, 4):
            start = len(theirs_chat(tok, messages[:turn], add_generation_prompt=True))
            want[start: len(theirs_chat(tok, messages[: turn + 1]))] = 1
        assert to_theirs(tok, ttok, data.sequences("train", "tgt")[i]) == full
        assert data.sequences("train", "mask")[i].tolist() == want.tolist()

    bad = d / "bad.jsonl"
    bad.write_text(json.dumps({"messages": conversations[0]}) + "\n"
                   + json.dumps({"messages": conversations[0][:2]}) + "\n", encoding="utf-8")
    one_error(lambda: prepare(PrepareConfig(train=str(bad), text_field="messages", tokenizer_from=str(ckpt),
                                            out=str(d / "bad"))), "bad.jsonl:2", "without a reply")
    assert not (d / "bad").exists()

    run = d / "run"
    train(dict_config(data.path, run, ckpt))
    tuned, original = checkpoint_meta.read_meta(run), checkpoint_meta.read_meta(ckpt)
    assert tuned["text"] == original["text"]
    import tfcli

    (reply,) = tfcli.load(str(run)).translate([de[0]], src_lang="de", tgt_lang="en", beam_size=1, max_len_b=3)
    assert isinstance(reply, str)


def dict_config(data, run, ckpt):
    from tfcli.train.config import TrainConfig

    return TrainConfig(data=str(data), out=str(run), init_from=str(ckpt), max_steps=1, valid_every=2, warmup=1,
                       max_tokens=512)


def test_plain_text_for_continued_pretraining_is_read_as_the_family_reads_it(chat):
    tok, _, ckpt, d = chat
    texts = lines("en", 5)
    data = PreparedData(prepare(PrepareConfig(train=write(d / "t.txt", texts), tokenizer_from=str(ckpt),
                                              out=str(d / "mono"))))
    assert data.kind == "mono"
    ttok = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "tgt")
    for i, text in enumerate(texts):
        assert to_theirs(tok, ttok, data.sequences("train", "tgt")[i]) == tok(text, add_special_tokens=False)["input_ids"]
