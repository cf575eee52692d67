"""Published decoder-only families imported exactly: each built in transformers from its real config.json (one
layer; every other value real) with random weights, saved with its real tokenizer files (../shared/models/llm), and
imported. tfcli must read text into the family's token ids, score a text with the same per-token log-likelihoods,
and continue prompts greedily with the same tokens as transformers' `generate`, in any batch, fp32 and int8."""

from __future__ import annotations

import atexit
import shutil
from pathlib import Path

import pytest
import torch

from tfcli.device import int8_available

pytestmark = [pytest.mark.shared_data, pytest.mark.slow]

LLM = Path(__file__).resolve().parents[2] / "shared" / "models" / "llm"
FAMILIES = ["llama-2-7b-hf", "llama-3.2-1b-instruct", "qwen2.5-0.5b-instruct", "qwen3-1.7b", "gemma-3-270m-it",
            "gemma-2-2b", "phi-3-mini-4k-instruct"]
TEXTS = [
    "Hello world, ça va? Größe naïve café",
    "東京は日本の首都です。北京欢迎你！",
    "emoji 🙂👍🏽 and ZWJ 👨‍👩‍👧",
    "def f(x):\n\treturn x  **  2   # spaces\n\n\n",
    "   leading and trailing whitespace runs   ",
]
PROMPTS = ["The capital of France is", "def fib(n):", "Bonjour, je m'appelle", "東京", "<s>", "1, 2, 3,", "   x"]
NEW = 8


_BUILT: dict = {}  # the last family this worker built: its "name", "dir" and what the fixture gives ("built")


@atexit.register
def _remove_the_last_family():  # (not a fixture's teardown: xdist tears every fixture down between batches)
    if _BUILT:
        shutil.rmtree(_BUILT.pop("dir"), ignore_errors=True)


# (each family's tests on one worker: `make test` runs pytest-xdist with --dist loadgroup)
@pytest.fixture(scope="module", params=[pytest.param(f, marks=pytest.mark.xdist_group(f)) for f in FAMILIES])
def family(request, tmp_path_factory):
    """(transformers tokenizer, transformers model, tfcli Generator) of one family, built once a worker. (xdist may
    set the fixture up again for one family, between two batches of its tests: that setup gives the first's
    objects; a family's files go when the next family is built.)"""
    transformers = pytest.importorskip("transformers")
    src = LLM / request.param
    if not src.is_dir():
        pytest.skip(f"{src} absent")
    import tfcli

    if _BUILT.get("name") != request.param:
        if _BUILT:
            shutil.rmtree(_BUILT.pop("dir"), ignore_errors=True)
            _BUILT.clear()
        d = tmp_path_factory.mktemp(request.param)
        model = _build(transformers, src, d / "hf", d / "ckpt")
        built = transformers.AutoTokenizer.from_pretrained(d / "hf"), model, tfcli.load(str(d / "ckpt"))
        _BUILT.update(name=request.param, dir=d, built=built)
    yield _BUILT["built"]


def _build(transformers, src: Path, hf_dir: Path, ckpt: Path):
    """The family of `src` built from its real config.json (one layer, or one of each layer kind) with random
    weights, saved with its real tokenizer files, and imported; returns the transformers model."""
    from tfcli.interop.hf_import import import_model

    config = transformers.AutoConfig.from_pretrained(src)
    types = getattr(config, "layer_types", None) or []
    kinds = sorted(set(types), key=types.index)  # (Gemma's sliding and full layers: one of each)
    config.num_hidden_layers = max(1, len(kinds))
    if types:
        config.layer_types = kinds or types[:1]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # (larger than the init's, so that greedy continuations vary)
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
    model.save_pretrained(hf_dir)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, hf_dir / f.name)
    import_model(hf_dir, ckpt)
    return model


def tfcli_ids(lm, text: str) -> list[int]:
    """The ids tfcli reads `text` into, the model's start (BOS or none) first."""
    from tfcli.generate.lm import text_conventions

    start, _ = text_conventions(lm.loaded.meta)
    return start + lm.loaded.tgt_tok.encode(text, add_special_tokens=False).ids


def to_hf(lm, tok, ids: list[int]) -> list[int]:
    """tfcli ids as the family's ids (through the tokens' names, which the import keeps)."""
    return [tok.convert_tokens_to_ids(lm.loaded.tgt_tok.id_to_token(i)) for i in ids]


def test_text_becomes_the_familys_token_ids_and_back(family):
    tok, _, lm = family
    specials = [t for t in tok.all_special_tokens if t not in (tok.unk_token,)][:3]
    for text in TEXTS + [f"{specials[0]}a{specials[-1]} b"]:
        ids = tfcli_ids(lm, text)
        assert to_hf(lm, tok, ids) == tok(text)["input_ids"], text
    from tfcli.data.tokenizer import decode_batch

    for text in TEXTS:
        plain = lm.loaded.tgt_tok.encode(text, add_special_tokens=False).ids
        assert decode_batch(lm.loaded.tgt_tok, [plain]) == [tok.decode(tok(text, add_special_tokens=False)
                                                                        ["input_ids"])], text


def test_log_likelihoods_are_the_familys(family):
    """Teacher-forced per-token log-likelihood within 1e-5 relative of transformers' (the softmax over every
    embedding row, Qwen's rows past its tokens included)."""
    tok, model, lm = family
    for text in TEXTS:
        hf_ids = tok(text)["input_ids"]
        ids = tfcli_ids(lm, text)
        with torch.no_grad():
            theirs = model(torch.tensor([hf_ids])).logits[0].log_softmax(-1)
            ours = lm.loaded.model(torch.tensor([ids]))[0].log_softmax(-1)
        want = theirs[:-1].gather(1, torch.tensor(hf_ids[1:])[:, None])
        got = ours[:-1].gather(1, torch.tensor(ids[1:])[:, None])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def guide_nll(model, ids: list[int], window: int, stride: int) -> tuple[float, int]:
    """Total NLL and tokens scored as transformers' perplexity guide computes them (its loop, summed)."""
    nll, count, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        trg_len = end - prev_end
        inputs = torch.tensor([ids[begin:end]])
        targets = inputs.clone()
        targets[:, :-trg_len] = -100
        with torch.no_grad():
            logits = model(inputs).logits[0, :-1]
        labels = targets[0, 1:]
        nll += float(torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum"))
        count += int((labels != -100).sum())
        prev_end = end
        if end == len(ids):
            break
    return nll, count


def test_perplexity_of_a_text_file_is_the_guides(family, tmp_path):
    """`tfcli eval --model --text`: the whole file as the family's tokenizer reads it, scored in the windows of
    transformers' perplexity guide, gives its total NLL over the same tokens."""
    from tfcli.evaluate.config import PerplexityConfig
    from tfcli.evaluate.perplexity import evaluate_text

    tok, model, lm = family
    text = "\n\n".join(TEXTS * 3)
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    ids = tok(text)["input_ids"]
    for window, stride in ((48, 48), (48, 16)):
        want, n = guide_nll(model, ids, window, stride)
        got = evaluate_text(lm.loaded.meta["dir"], str(tmp_path / "text.txt"),
                            PerplexityConfig(window=window, stride=stride, device="cpu"))
        assert got.tokens == n  # (stride = window: the guide leaves each window's first token unscored)
        assert got.nll == pytest.approx(want, rel=1e-5)
    assert n == len(ids) - 1  # (with overlap, every token but the first)


def test_a_text_past_the_sliding_window_is_read_as_the_family_reads_it(family):
    """A model whose layers see a window of the last tokens (Gemma 3: 512): the hidden states of a text longer
    than the window, and a greedy continuation of a prompt that fills it, as transformers computes them."""
    tok, model, lm = family
    window = lm.loaded.cfg.sliding_window
    if window is None:
        pytest.skip("no sliding window")
    if window > 2048:  # (Gemma 2's 4096 at width 2304 takes minutes)
        pytest.skip("a window past 2048 tokens (Gemma 2's windows and caps: tests/test_interop.py, hand-built)")
    words = " ".join(f"word{i} ça 東" for i in range(window))
    ids = tok(words)["input_ids"][: window + 40]
    ours = tfcli_ids(lm, words)[: window + 40]
    assert to_hf(lm, tok, ours) == ids
    with torch.no_grad():
        theirs = model.model(torch.tensor([ids])).last_hidden_state[0]
        got = lm.loaded.model.features(torch.tensor([ours]))[0]
    torch.testing.assert_close(got, theirs, rtol=1e-4, atol=1e-4)
    prompt = ids[: window - 3]
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=NEW, do_sample=False,
                             bad_words_ids=[[i] for i in (tok.pad_token_id,) if i is not None] or None)
    want = out[0, len(prompt):].tolist()
    ends = model.generation_config.eos_token_id
    ends = ends if isinstance(ends, list) else [ends]
    want = want[: next((k for k, t in enumerate(want) if t in ends), len(want))]
    assert to_hf(lm, tok, greedy(lm, [ours[: window - 3]])[0]) == want


def greedy(lm, prompts: list[list[int]], dtype_lm=None) -> list[list[int]]:
    from tfcli.generate.config import GenerateConfig
    from tfcli.generate.lm import generate_ids, text_conventions

    lm = dtype_lm or lm
    _, ends = text_conventions(lm.loaded.meta)
    cfg = GenerateConfig(max_new_tokens=NEW, greedy=True, batch_size=len(prompts))
    return generate_ids(lm.loaded.steps, prompts, cfg, ends=ends)


def test_greedy_continuations_are_generates_in_any_batch(family):
    tok, model, lm = family
    prompts = [tfcli_ids(lm, p) for p in PROMPTS]
    eos = model.generation_config.eos_token_id
    never = [i for i in (tok.bos_token_id, tok.pad_token_id) if i is not None]  # (tfcli never outputs these)
    want = []
    for p in PROMPTS:
        ids = torch.tensor([tok(p)["input_ids"]])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                 do_sample=False, bad_words_ids=[[i] for i in never] or None,
                                 pad_token_id=tok.pad_token_id or 0)[0, ids.size(1):].tolist()
        ends = eos if isinstance(eos, list) else [eos]
        cut = next((k for k, t in enumerate(out) if t in ends), len(out))
        want.append(out[:cut])
    alone = [greedy(lm, [p])[0] for p in prompts]
    assert [to_hf(lm, tok, ids) for ids in alone] == want
    assert greedy(lm, prompts) == alone  # (all seven in one batch)


CONVERSATIONS = [
    [{"role": "user", "content": "Translate to German: the cat sleeps"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Why? 🙂"}],
]


def test_chat_replies_are_transformers(family):
    """--chat: the conversation written as apply_chat_template writes it, and the greedy reply generate gives from
    it, under the model's generation_config.json (Qwen's repetition_penalty 1.1 included); a model without a
    template (Llama 2 base) is refused in one line."""
    tok, model, lm = family
    from tfcli.errors import TfcliError
    from tfcli.generate.lm import chat_prompts

    if not tok.chat_template:
        with pytest.raises(TfcliError, match="no chat template"):
            lm.generate(["Hi"], chat=True, greedy=True)
        return
    for conversation in CONVERSATIONS:
        want = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
        assert chat_prompts(lm.loaded.meta, [conversation], None) == [want]
        ids = tok.apply_chat_template(conversation, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=NEW, do_sample=False)[0, ids["input_ids"].size(1):]
        reply = lm.generate([conversation], chat=True, greedy=True, max_new_tokens=NEW)
        assert reply == [tok.decode(out, skip_special_tokens=True)]
    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert chat_prompts(lm.loaded.meta, ["Hi"], "Be brief.") == chat_prompts(lm.loaded.meta, [system], None)


def test_generate_chat_writes_the_replies_alone(family, tmp_path):
    """`tfcli generate --chat`: a line of text is the user's message (--system said first), a JSON line with
    "messages" a whole conversation; one reply a line, as the API gives them."""
    import json
    import subprocess
    import sys

    tok, _, lm = family
    if not tok.chat_template:
        pytest.skip("a base model: no chat template")
    lines = ["Hi", json.dumps({"messages": CONVERSATIONS[1]}, ensure_ascii=False)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "tfcli", "generate", "-m", lm.loaded.meta["dir"], "-i",
                        str(tmp_path / "in.txt"), "--chat", "--system", "Be brief.", "--greedy", "-n", str(NEW),
                        "--jsonl", "-q"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = [json.loads(line)["continuation"] for line in r.stdout.splitlines()]
    want = lm.generate(["Hi", CONVERSATIONS[1]], chat=True, system="Be brief.", greedy=True, max_new_tokens=NEW)
    assert got == want


SOURCES = ["Der Hund schläft.", "Ein Mann fährt Fahrrad auf der Straße, 東京 🙂", "Hallo"]
TEMPLATE = "German: {text}\n{tgt_lang}:"


def test_translate_through_a_prompt_is_generates(family):
    """translate with a decoder-only model: the chat template around Tower's instruction (a model without one:
    --prompt-template), greedy and beam 4, batch 1 and all, the reply equal to transformers' `generate` on the same
    rendered prompt (its end tokens, no length penalty)."""
    from tfcli.generate.prompting import INSTRUCTION, fill, reply_line

    tok, model, lm = family
    template = None if tok.chat_template else TEMPLATE
    ends = model.generation_config.eos_token_id
    ends = ends if isinstance(ends, list) else [ends]
    never = [[i] for i in (tok.bos_token_id, tok.pad_token_id) if i is not None]
    for beam in (1, 4):
        options = dict(beam_size=beam, len_penalty=0.0, max_len_a=0.0, max_len_b=NEW, src_lang="de", tgt_lang="en",
                       prompt_template=template)
        got = lm.translate(SOURCES, **options)
        assert got == [lm.translate([s], **options)[0] for s in SOURCES]
        want = []
        for text in SOURCES:
            if template is None:
                prompt = tok.apply_chat_template([{"role": "user", "content": fill(INSTRUCTION, text, "de", "en")}],
                                                 tokenize=False, add_generation_prompt=True)
                ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
            else:
                ids = tok(fill(template, text, "de", "en"), return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), num_beams=beam,
                                     max_new_tokens=NEW, length_penalty=0.0, early_stopping=True, do_sample=False,
                                     bad_words_ids=never or None)[0, ids.size(1):].tolist()
            out = out[: next((k for k, t in enumerate(out) if t in ends), len(out))]
            want.append(reply_line(tok.decode(out, skip_special_tokens=True)))
        assert got == want, beam
    sampled = dict(sampling=True, seed=3, max_len_a=0.0, max_len_b=NEW, src_lang="de", tgt_lang="en",
                   prompt_template=template)  # (each line's draws keyed by its index: any batch size)
    assert lm.translate(SOURCES, batch_size=1, **sampled) == lm.translate(SOURCES, batch_size=3, **sampled)


def test_gpt2_with_its_2020_tokenizer_json_imports(tmp_path):
    """GPT-2's published tokenizer.json is the 2020 format (no `model.type`): it imports, and reads text into
    GPT-2's ids."""
    transformers = pytest.importorskip("transformers")
    src = LLM / "gpt2-xl"
    if not src.is_dir():
        pytest.skip(f"{src} absent")
    from tfcli.interop.hf_import import import_model

    import tfcli

    config = transformers.AutoConfig.from_pretrained(src)
    config.n_layer = 1
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "hf")
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy(f, tmp_path / "hf" / f.name)
    import_model(tmp_path / "hf", tmp_path / "ckpt")
    lm = tfcli.load(str(tmp_path / "ckpt"))
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:
        ids = lm.loaded.tgt_tok.encode(text, add_special_tokens=False).ids
        assert to_hf(lm, tok, ids) == tok(text)["input_ids"], text


def test_int8_continuations_do_not_depend_on_the_batch(family):
    """int8 greedy continuations: the same at batch 1, 7 and 64."""
    if not int8_available():
        pytest.skip("int8 kernels unavailable on this CPU")
    import tfcli

    _, _, lm = family
    q = tfcli.load(lm.loaded.meta["dir"], dtype="int8")
    prompts = [tfcli_ids(lm, p) for p in PROMPTS]
    alone = [greedy(lm, [p], q)[0] for p in prompts]
    assert greedy(lm, prompts, q) == alone  # (batch 7)
    many = [prompts[i % len(prompts)] for i in range(64)]
    assert greedy(lm, many, q) == [alone[i % len(prompts)] for i in range(64)]


def test_quantize_stores_what_int8_decoding_makes(family, tmp_path):
    """`tfcli quantize`: the int8 layers stored beside the weights, read from there at load, give the
    continuations int8 decoding gives when it quantises at load."""
    if not int8_available():
        pytest.skip("int8 kernels unavailable on this CPU")
    import os

    import tfcli
    from tfcli.generate.loader import quantize

    _, _, lm = family
    ckpt = shutil.copytree(lm.loaded.meta["dir"], tmp_path / "ckpt", copy_function=os.link)  # (files shared)
    prompts = [tfcli_ids(lm, p) for p in PROMPTS]
    want = greedy(lm, prompts, tfcli.load(str(ckpt), dtype="int8"))
    quantize(str(ckpt))
    q = tfcli.load(str(ckpt), dtype="int8")
    assert q.loaded.steps.stored
    assert greedy(lm, prompts, q) == want


def test_ctranslate2_generator_continues_as_tfcli(family, tmp_path):
    """`export --to ctranslate2` of an imported family gives a Generator whose greedy continuations are tfcli's
    (RoPE theta and scaling, head width, grouped KV heads, QK-norm, biases as the family has them); Gemma's layout
    is refused in one line."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tfcli.errors import TfcliError
    from tfcli.generate.lm import text_conventions
    from tfcli.interop import export
    from tfcli.specials import EOS_ID

    _, _, lm = family
    if lm.loaded.cfg.norm == "sandwich":
        with pytest.raises(TfcliError, match="Gemma's layout"):
            export(lm.loaded.meta["dir"], "ctranslate2", tmp_path / "ct2")
        return
    export(lm.loaded.meta["dir"], "ctranslate2", tmp_path / "ct2")
    generator = ctranslate2.Generator(str(tmp_path / "ct2"))
    tok = lm.loaded.tgt_tok
    _, ends = text_conventions(lm.loaded.meta)
    prompts = [tfcli_ids(lm, p) for p in PROMPTS]
    for prompt, want in zip(prompts, [greedy(lm, [p])[0] for p in prompts]):
        res = generator.generate_batch([[tok.id_to_token(i) for i in prompt]], max_length=NEW + len(prompt),
                                       sampling_topk=1, include_prompt_in_result=False,
                                       end_token=[tok.id_to_token(i) for i in [EOS_ID, *ends]],
                                       suppress_sequences=[[tok.id_to_token(i)] for i in (0, 1)])
        assert [tok.token_to_id(t) for t in res[0].sequences[0]][:NEW] == want


def test_training_loss_and_steps_are_transformers(family):
    """The training objective of the imported model on a batch is transformers' loss on it (1e-4 relative); and two
    AdamW steps of both on the layers' weights (lr 1e-3, eps 1e-6; the embedding tables held, for time) move each
    weight tensor the same way: the difference's norm under 1% of the move's, each element within 1e-4 but for one
    in 1,000 (Adam's step is lr * sign(g) where g is at rounding level, and rounding differs), none past 2 lr."""
    import copy

    from tfcli.interop.hf import ARCHS, _pairs, from_hf_state
    from tfcli.train.loss import Objective

    tok, model, lm = family
    texts = [TEXTS[0], TEXTS[3]]
    n = min(len(tfcli_ids(lm, t)) for t in texts)
    ids = torch.tensor([tfcli_ids(lm, t)[:n] for t in texts])
    hf_ids = torch.tensor([to_hf(lm, tok, row) for row in ids.tolist()])
    ours, theirs = copy.deepcopy(lm.loaded.model).train(), copy.deepcopy(model).train()
    for m, table in ((ours, "embed.tok"), (theirs, "embed_tokens")):
        for name, p in m.named_parameters():
            p.requires_grad_(table not in name and "lm_head" not in name and "wte" not in name)
    objective = Objective(ours, 0.0)
    options = dict(lr=1e-3, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)
    opt_ours = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], **options)
    opt_theirs = torch.optim.AdamW([p for p in theirs.parameters() if p.requires_grad], **options)
    for step in range(2):
        loss, _ = objective(None, ids[:, :-1], ids[:, 1:])
        mean = loss / ids[:, 1:].numel()
        hf_loss = theirs(input_ids=hf_ids, labels=hf_ids).loss
        if step == 0:
            assert float(mean.detach()) == pytest.approx(float(hf_loss.detach()), rel=1e-4)
        for opt, value in ((opt_ours, mean), (opt_theirs, hf_loss)):
            opt.zero_grad()
            value.backward()
            opt.step()
    cfg, arch = ours.cfg, ARCHS[model.config.model_type]
    want = from_hf_state({k: v.detach() for k, v in theirs.state_dict().items()}, cfg, arch)
    got, start = ours.state_dict(), lm.loaded.model.state_dict()
    layers = {t for t, *_ in _pairs(cfg, arch) if t.startswith("decoder.layers.") or t == "decoder.norm.weight"}
    for name in sorted(layers):
        move, off = got[name] - start[name], (got[name] - want[name]).abs()
        assert float(move.abs().max()) > 1e-3, name  # (the steps moved it)
        assert float(off.norm()) < 0.01 * float(move.norm()), name
        assert float((off > 1e-4).float().mean()) < 1e-3 and float(off.max()) < 2e-3, name


def test_export_to_hf_gives_the_family_back(family, tmp_path):
    """`export --to hf` of an imported family writes that family again: its own token ids (special tokens where
    the family has them, BOS added as its tokenizer adds it, no rows import added), its chat template, end tokens
    and sampling defaults, and a model computing the original's logits."""
    transformers = pytest.importorskip("transformers")
    from tfcli.interop import export

    tok, model, lm = family
    export(lm.loaded.meta["dir"], "hf", tmp_path / "hf")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    back_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(back).__name__ == type(model).__name__ and back.config.vocab_size == model.config.vocab_size
    for text in TEXTS:
        assert back_tok(text)["input_ids"] == tok(text)["input_ids"], text
        assert back_tok.decode(tok(text)["input_ids"]) == tok.decode(tok(text)["input_ids"]), text
    if tok.chat_template:
        for conversation in CONVERSATIONS:
            assert back_tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True) == \
                tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    ends = model.generation_config.eos_token_id
    assert set(back.generation_config.eos_token_id if isinstance(back.generation_config.eos_token_id, list) else
               [back.generation_config.eos_token_id]) >= set(ends if isinstance(ends, list) else [ends])
    ids = torch.tensor([tok(TEXTS[0])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
