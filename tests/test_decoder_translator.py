"""Decoder-only translators trained here: parallel data as one sequence a pair (tfcli.train.data.PairData), the loss
on the target only, causal or prefix attention (model.prefix_attention), and `translate` through the same prompt,
equal to recomputing the whole sequence at every step."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers import WORDS, make_parallel_prepared, random_decoder_translator, tiny_train_config
from tfcli import checkpoint
from tfcli.data.prepared import PreparedData
from tfcli.errors import ConfigError
from tfcli.model.config import preset
from tfcli.model.transformer import build_model
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS
from tfcli.train.data import PairData

V = len(SPECIAL_TOKENS) + len(WORDS)
LINES = ["cat dog egg", "moon", "sun tree apple bird cat dog egg fish goat", "hat ice"]


def pair_data(d, length=64, **kw) -> PairData:
    """PairData of a small prepared copy or reverse task, `length` its max_len."""
    data = make_parallel_prepared(d, n_train=30, n_valid=0, n_test=0, **kw)
    return PairData(PreparedData(data), "train", length, 4096, 0, seed=1)


def test_a_pair_is_one_sequence_with_its_loss_on_the_target(tmp_path):
    data = pair_data(tmp_path / "d", task="reverse")
    idx = np.arange(5)
    batch = data.collate(idx)
    for row, i in enumerate(idx):
        x, y = list(data.src[i]), list(data.tgt[i])
        seq = [EOS_ID, *x, BOS_ID, *y, EOS_ID]
        n = len(seq) - 1
        assert batch.inputs[row, :n].tolist() == seq[:-1] and set(batch.inputs[row, n:].tolist()) <= {PAD_ID}
        # (the loss: the target's tokens and its </s>, predicted from sep on; nothing of the prompt)
        assert batch.targets[row].tolist() == [PAD_ID] * (len(x) + 1) + y + [EOS_ID] + [PAD_ID] * (
            batch.targets.size(1) - n)
        assert int(batch.prefix[row]) == len(x) + 2
    assert batch.tgt_tokens == sum(len(data.tgt[i]) + 1 for i in idx)
    # a multilingual directory's sources start with the target's tag: it becomes the separator
    data.tagged = True
    x, y = list(data.src[0]), list(data.tgt[0])
    assert data.sequence(x, y) == ([EOS_ID, *x[1:], x[0], *y, EOS_ID], len(x) + 1)


def test_a_long_pair_loses_its_source_end_first(tmp_path):
    data = pair_data(tmp_path / "d", length=12, min_len=3, max_len=8)
    x, y = list(range(10, 20)), list(range(30, 38))
    ids, p = data.sequence(x, y)
    assert len(ids) == 13 and ids[:p] == [EOS_ID, *x[:5], BOS_ID] and ids[p:] == [*y[:5], EOS_ID]
    assert data.sequence(x[:3], y) == ([EOS_ID, *x[:3], BOS_ID, *y[:7], EOS_ID], 5)  # (a short source: room for more)
    assert data.truncated == sum(len(data.src[i]) + len(data.tgt[i]) + 2 > 12 for i in range(len(data)))


@pytest.mark.parametrize("prefix_attention", [False, True])
def test_prefix_attention_sees_the_prompt_both_ways(prefix_attention):
    torch.manual_seed(0)
    model = build_model(preset("lm-toy", tgt_vocab_size=V, prefix_attention=prefix_attention)).eval()
    ids = torch.randint(4, V, (2, 9))
    changed = ids.clone()
    changed[:, 3] = (ids[:, 3] - 3) % (V - 4) + 4  # (another word at position 3, inside the prefix of 5)
    with torch.no_grad():
        a, b = (model(t, prefix=torch.tensor([5, 5])) for t in (ids, changed))
    before = (a[:, :3] - b[:, :3]).abs().amax()
    assert (before > 1e-4) if prefix_attention else (before == 0)
    late = ids.clone()
    late[:, 7] = (ids[:, 7] - 3) % (V - 4) + 4  # (after the prefix: causal either way)
    with torch.no_grad():
        c = model(late, prefix=torch.tensor([5, 5]))
    assert torch.equal(a[:, :7], c[:, :7])


def recompute_greedy(model, prompt: list[int], n: int) -> list[int]:
    """The slow way: the whole sequence through the model at each step, the prompt its prefix."""
    ids, out = list(prompt), []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids]), prefix=torch.tensor([len(prompt)]))[0, -1]
        logits[[PAD_ID, BOS_ID]] = float("-inf")
        t = int(logits.argmax())
        if t == EOS_ID:
            break
        out.append(t)
        ids.append(t)
    return out


@pytest.mark.parametrize("prefix_attention", [False, True])
def test_translating_is_recomputing_the_sequence(tmp_path, prefix_attention):
    """Greedy translations equal the full forward at every step on </s> x.. <s> (the prompt seen both ways with
    prefix attention), in any batch; beam 4's do not depend on the batch either."""
    import tfcli

    model, ckpt = random_decoder_translator(tmp_path, 3, prefix_attention)
    lm = tfcli.load(str(ckpt), device="cpu")
    tok = lm.loaded.tgt_tok
    want = []
    for line in LINES:
        out = recompute_greedy(model, [EOS_ID, *tok.encode(line).ids, BOS_ID], 12)
        want.append(tok.decode(out, skip_special_tokens=False))  # (translate shows <unk>)
    options = dict(max_len_a=0.0, max_len_b=12, len_penalty=0.0)
    assert lm.translate(LINES, beam_size=1, **options) == want
    assert [lm.translate([s], beam_size=1, **options)[0] for s in LINES] == want
    beam = lm.translate(LINES, beam_size=4, **options)
    assert beam == [lm.translate([s], beam_size=4, **options)[0] for s in LINES]


def test_a_decoder_only_translator_trains_on_parallel_data(tmp_path):
    """`train` with a decoder-only preset on a prepared parallel directory: it learns to copy (validation loss 0.5 nats
    below the uniform one at least), its validation BLEU is that of translate's greedy translations."""
    import sacrebleu
    from typer.testing import CliRunner

    from tfcli.cli import app
    from tfcli.train.trainer import train

    data = make_parallel_prepared(tmp_path / "data", n_train=300, task="copy")
    cfg = tiny_train_config(data, tmp_path / "run", arch="lm-toy", max_steps=150, valid_every=150)
    result = train(cfg, model_overrides={"prefix_attention": True})
    vocab = PreparedData(data).vocab_size("tgt")
    meta = json.loads((result.best / "config.json").read_text())
    assert meta["metrics"]["valid"]["loss"] < np.log(vocab) - 0.5  # (uniform: log(vocab))
    assert meta["model"]["prefix_attention"] and meta["data"]["kind"] == "parallel"
    res = CliRunner().invoke(app, ["translate", "-m", str(tmp_path / "run"), "--greedy", str(data / "valid.src.txt")])
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 20, res.stderr
    # (validation's BLEU: the greedy translations translate gives, scored against the references)
    refs = (data / "valid.tgt.txt").read_text().splitlines()
    assert meta["metrics"]["valid"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(res.stdout.splitlines(),
                                                                                   [refs]).score)


def test_a_decoder_only_translator_needs_one_vocabulary(tmp_path):
    from tfcli.train.trainer import train

    data = make_parallel_prepared(tmp_path / "data", n_train=30)
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "joint_vocab": False}))
    with pytest.raises(ConfigError, match="--joint-vocab"):
        train(tiny_train_config(data, tmp_path / "run", arch="lm-toy", max_steps=1))


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    """A decoder-only translator (prefix attention) trained here on copying sentences of WORDS: its run dir."""
    from tfcli.train.trainer import train

    d = tmp_path_factory.mktemp("translator")
    data = make_parallel_prepared(d / "data", n_train=300, n_test=0, task="copy", words=WORDS, min_len=2)
    train(tiny_train_config(data, d / "run", arch="lm-toy", max_steps=150, valid_every=150),
          model_overrides={"prefix_attention": True})
    return d / "run"


def test_prompt_alignment_is_the_self_attention_onto_the_source(tmp_path):
    """prompt_alignments reads, for each output token, the argmax of the full forward's self-attention weights
    (heads averaged, of the aligning layer) from the position that predicts it, over the prompt's source span."""
    from tfcli.generate.alignment import prompt_alignments

    model, _ = random_decoder_translator(tmp_path, 3, prefix_attention=True)
    prompts = [[EOS_ID, 5, 6, 7, BOS_ID], [EOS_ID, 9, BOS_ID]]
    hyps = [[8, 9, 10], [11, 12, 13, 14]]
    got = prompt_alignments(model, prompts, [(1, 4), (1, 2)], hyps, layer=2)
    for prompt, hyp, aligned in zip(prompts, hyps, got):
        attn = {"self": [], "cross": []}
        ids = torch.tensor([prompt + hyp[:-1]])
        with torch.no_grad():
            model(ids, attn_out=attn, prefix=torch.tensor([len(prompt)]))
        w = attn["self"][1][0].mean(0)  # (T, T) of layer 2
        P = len(prompt)
        assert aligned == [int(w[P - 1 + t, 1 : P - 1].argmax()) for t in range(len(hyp))]


def test_tagged_lines_po_and_a_glossary_through_a_decoder_only_translator(translator, tmp_path):
    """The file formats work for a decoder-only translator as for an encoder-decoder one: tags put back by the
    alignment onto the source in its prompt, a PO file filled and valid, a glossary's terms held."""
    import shutil
    import subprocess

    import polib
    from typer.testing import CliRunner

    from tfcli.cli import app

    from test_formats import DATA, structure, untagged

    def cli(*args, **kw):
        return CliRunner().invoke(app, [str(a) for a in args], **kw)

    lines = ["cat <b>dog</b> egg", "<i>moon <b>sun</b></i> tree", "cat %d dog {name}", "<br/>", ""]
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines))
    res = cli("translate", "-m", translator, src, "--input-format", "xml")
    assert res.exit_code == 0, res.output
    out = res.stdout.splitlines()
    assert [structure(o) for o in out] == [structure(line) for line in lines]
    assert "%d" in out[2] and "{name}" in out[2] and out[4] == ""
    plain = cli("translate", "-m", translator, "-", input="".join(untagged(line) + "\n" for line in lines[:2]))
    assert [untagged(o) for o in out[:2]] == plain.stdout.splitlines()

    po_out = tmp_path / "out.po"
    res = cli("translate", "-m", translator, DATA / "djangojs.po", "-o", po_out)
    assert res.exit_code == 0, res.output
    po = polib.pofile(po_out.read_text())
    entries = [e for e in po if e.msgid]
    assert entries and all(e.msgstr and "fuzzy" in e.flags for e in entries)
    assert "%s" in po.find("Available %s").msgstr
    if shutil.which("msgfmt"):
        subprocess.run(["msgfmt", "--check-format", "-o", "/dev/null", po_out], check=True)

    glossary = tmp_path / "g.tsv"
    glossary.write_text("egg\tkite\n")
    res = cli("translate", "-m", translator, "--glossary", glossary, "-", input="cat dog egg\nmoon sun\n")
    assert res.exit_code == 0, res.output
    held, other = res.stdout.splitlines()
    assert "kite" in held.split() and other == cli("translate", "-m", translator, "-", input="moon sun\n").stdout.strip()


def test_attention_shows_the_prompt_and_the_greedy_translation(translator):
    """`tfcli attention` on a decoder-only translator: its prompt as translate writes it, then its greedy
    translation; the prompt's tokens see each other both ways (prefix attention), the translation's causally."""
    import tfcli
    from tfcli.viz.attention import collect

    model, meta = checkpoint.load(translator)
    (sample,) = collect(model, meta, ["cat dog egg"])
    assert sample.target_text == tfcli.load(str(translator), device="cpu").translate(["cat dog egg"],
                                                                                     beam_size=1)[0]
    tokens = sample.tokens["tgt"]
    assert tokens[:5] == ["</s>", "cat", "dog", "egg", "<s>"] and sample.prefix == 5
    w = sample.maps["self"][0]  # (n_head, T, T)
    assert w.shape[1:] == (len(tokens), len(tokens))
    above = np.triu(np.ones((len(tokens), len(tokens)), dtype=bool), 1)
    assert (w[:, :5, :5][:, above[:5, :5]] > 0).all() and (w[:, 5:][:, above[5:]] == 0).all()


def test_eval_scores_a_decoder_only_translators_targets(translator, tmp_path):
    """`eval --model --data` on parallel data: the target's tokens given the source, as training validated them
    (the nll is the run's last validation loss: tiny_train_config trains without label smoothing)."""
    from tfcli.evaluate.config import PerplexityConfig
    from tfcli.evaluate.perplexity import evaluate_checkpoint

    best = translator / "checkpoints" / (translator / "checkpoints" / "BEST").read_text().strip()
    meta = json.loads((best / "config.json").read_text())
    data = meta["data"]["path"]
    result = evaluate_checkpoint(str(translator), data, PerplexityConfig(split="valid", device="cpu"))
    assert result.kind == "lm" and result.window is None and result.sequences == 20
    assert result.tokens == sum(len(PreparedData(data).sequences("valid", "tgt")[i]) + 1 for i in range(20))
    assert result.loss == pytest.approx(meta["metrics"]["valid"]["nll"], rel=1e-4)


def test_replies_cut_by_the_length_limit_are_counted_and_a_template_needs_its_text(tmp_path):
    """A reply the length limit cuts before the model ends it is counted in one warning; a prompt template
    without {text} is refused in one line, one without {tgt_lang} warns that --tgt-lang is unused, and a model
    translating into one language refuses --tgt-lang."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    model, ckpt = random_decoder_translator(tmp_path, 3, prefix_attention=False)
    src = "".join(line + "\n" for line in LINES)
    res = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "--greedy", "--max-len-a", "0", "--max-len-b", "1"],
                             input=src)
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == len(LINES)
    cut = sum(len(line.split()) == 1 for line in res.stdout.splitlines())  # (a word, then the limit: cut)
    assert cut and f"{cut} of {len(LINES)} replies reached the length limit" in res.stderr
    res = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "--prompt-template", "Translate:"], input=src)
    assert res.exit_code != 0 and "no {text}" in res.stderr and res.stdout == ""
    res = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "--prompt-template", "{text} =", "--tgt-lang", "de",
                                   "--max-len-b", "2"], input=src)
    assert res.exit_code == 0 and "--tgt-lang de: the prompt template has no {tgt_lang}" in res.stderr
    res = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "--tgt-lang", "de"], input=src)
    assert res.exit_code != 0 and "drop --tgt-lang" in res.stderr and res.stdout == ""


def test_search_options_work_for_a_decoder_only_translator(translator, tmp_path):
    """What translate's search takes works on the generated side of a decoder-only translator as for an
    encoder-decoder one: n-best lists (the best the beam's translation), --prefix, --avoid, --no-repeat-ngram-size,
    seeded sampling independent of the batch, and --resume in parts the same bytes as one run."""
    from typer.testing import CliRunner

    from tfcli.cli import app

    def run(*args, input=None):
        res = CliRunner().invoke(app, ["translate", "-m", str(translator), *map(str, args)], input=input)
        assert res.exit_code == 0, res.output
        return res.stdout.splitlines()

    lines = ["cat dog egg", "moon sun tree", "hat ice cat dog"]
    src = tmp_path / "in.txt"
    src.write_text("".join(line + "\n" for line in lines))
    beam = run("-b", "4", src)
    rows = [json.loads(r) for r in run("-b", "4", "--nbest", "3", "--jsonl", src)]
    assert [r["index"] for r in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for k in range(3):
        best = rows[3 * k : 3 * k + 3]
        assert best[0]["text"] == beam[k] and len({r["text"] for r in best}) == 3
        assert [r["score"] for r in best] == sorted((r["score"] for r in best), reverse=True)

    (tmp_path / "prefix.txt").write_text("moon\n\nfish goat\n")
    prefixed = run("-b", "4", "--prefix", tmp_path / "prefix.txt", src)
    assert prefixed[0].split()[0] == "moon" and prefixed[1] == beam[1] and prefixed[2].split()[:2] == ["fish", "goat"]

    first, (a, *_, b) = beam[0].split()[0], beam[2].split() + [""]  # (words its beam translations hold)
    (tmp_path / "avoid.txt").write_text(f"{first}\n\n{a}\t{b}\n" if b else f"{first}\n\n{a}\n")
    avoided = run("-b", "4", "--avoid", tmp_path / "avoid.txt", src)
    assert first not in avoided[0].split() and avoided[1] == beam[1]
    assert a not in avoided[2].split() and (not b or b not in avoided[2].split())

    for out in run("-b", "4", "--no-repeat-ngram-size", "1", src):
        assert len(set(out.split())) == len(out.split())

    sampled = run("--sampling", "--seed", "7", src)
    assert run("--sampling", "--seed", "7", src) == sampled
    assert run("--sampling", "--seed", "7", "--batch-size", "1", src) == sampled  # (a draw per line and step)

    out = tmp_path / "out.txt"
    run("-b", "4", src, "-o", out, "--resume", "--part-lines", "1")
    assert out.read_text().splitlines() == beam
