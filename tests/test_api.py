"""The Python API (tfcli/api.py), used only through its public surface: tfcli.load, Translator.translate /
translate_nbest, Generator.generate, tfcli.score. The models are hand-built (tests/helpers.py), so their outputs are
known by construction."""

import pytest
import sacrebleu
import torch
from safetensors.torch import load_file

import tfcli
from helpers import WORDS
from tfcli.errors import ConfigError
from tfcli.specials import EOS_ID

TEXTS = ["cat dog egg", "moon", "", "tree sun rat queen pig owl"]


def test_translate_gives_the_copy_for_any_beam(copier):
    translator = tfcli.load(str(copier), device="cpu")
    assert isinstance(translator, tfcli.Translator)
    for beam in (1, 4):
        assert translator.translate(TEXTS, beam_size=beam, batch_size=2) == TEXTS
        assert translator.translate(TEXTS, beam_size=beam, check_every=5) == TEXTS  # how often the device is read


def test_nbest_are_sorted_with_their_scores(copier):
    translator = tfcli.load(str(copier), device="cpu")
    nbest = translator.translate_nbest(TEXTS, n=3, beam_size=4, scores=True, len_penalty=1.0)
    assert [len(hyps) for hyps in nbest] == [3, 3, 1, 3]  # an empty text: one empty translation
    for text, hyps in zip(TEXTS, nbest):
        assert hyps[0].text == text
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:  # the score is the GNMT-normalised sum of the token log-probs (</s> included)
            n = len(h.token_scores)
            assert h.score == pytest.approx(sum(h.token_scores) / ((5 + n) / 6) ** 1.0, abs=1e-4) if n else h.score == 0
    assert nbest[2][0].text == "" and nbest[2][0].score == 0.0


def test_options_are_checked(copier):
    translator = tfcli.load(str(copier), device="cpu")
    # an impossible value is named as the method's argument, never as the command line's flag
    with pytest.raises(ConfigError, match=r"^translate\(\): beam_size must be at least 1$"):
        translator.translate(TEXTS, beam_size=0)
    with pytest.raises(TypeError, match="no_such_option"):
        translator.translate(TEXTS, no_such_option=1)
    with pytest.raises(ConfigError, match=r"^translate\(\): check_every must not be negative"):
        translator.translate(TEXTS, check_every=-1)
    with pytest.raises(ConfigError, match=r"^translate\(\): beam_size: expected an integer, got 'a'$"):
        translator.translate(TEXTS, beam_size="a")
    with pytest.raises(ConfigError) as e:
        translator.translate(TEXTS, sampling=True, topp=2.0)
    assert "top_p in (0, 1]" in str(e.value) and "--" not in str(e.value)


def test_generate_continues_the_prompts(counter):
    lm = tfcli.load(str(counter), device="cpu")
    assert isinstance(lm, tfcli.Generator)
    out = lm.generate(["cat dog", "ice", "sun"], greedy=True, max_new_tokens=30)
    assert [o.split() for o in out] == [WORDS[4:] + ["."], WORDS[9:] + ["."], ["tree", "."]]
    assert lm.generate(["cat"], greedy=True, max_new_tokens=3)[0].split() == ["dog", "egg", "fish"]
    assert lm.generate(["cat"], greedy=True, stop=["fish"])[0].split() == ["dog", "egg"]
    same = [lm.generate(["apple"] * 3, temperature=2.0, max_new_tokens=5, seed=7) for _ in range(2)]
    assert same[0] == same[1]  # a seed makes sampling repeatable


def test_loading_leaves_the_process_and_the_model_as_they_were(copier, monkeypatch):
    """No thread count or allocator change; the model keeps its parameters (the checkpoint's values, trainable) after
    loading and translating."""
    from tfcli import runtime as process

    def forbidden():
        raise AssertionError("the allocator was tuned")

    monkeypatch.setattr(process, "keep_freed_memory", forbidden)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        translator = tfcli.load(str(copier), device="cpu")
        translator.translate(TEXTS, beam_size=3)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    model = translator.model
    saved = load_file(str(copier / "model.safetensors"))
    state = model.state_dict()
    for name, value in saved.items():
        assert torch.equal(state[name], value), name
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in model.parameters())
    src, tgt = torch.tensor([[5, 6, EOS_ID]]), torch.tensor([[1, 5, 6]])
    model(src, tgt).sum().backward()  # still trainable
    assert all(p.grad is not None for p in model.parameters())


def test_score_is_sacrebleu(copier):
    hyps = ["the cat sat on the mat .", "a dog runs", "hello"]
    refs = ["the cat sat on a mat .", "the dog runs", "hello there"]
    refs2 = ["a cat sat on the mat .", "a dog is running", "hi"]
    scores = tfcli.score(hyps, refs, metrics=["bleu", "chrf", "ter"])
    assert set(scores) == {"BLEU", "chrF2", "TER"}
    bleu = sacrebleu.metrics.BLEU()
    assert scores["BLEU"].score == bleu.corpus_score(hyps, [refs]).score
    assert scores["BLEU"].signature == bleu.get_signature().format()
    assert scores["chrF2"].score == sacrebleu.corpus_chrf(hyps, [refs]).score
    two = tfcli.score(hyps, [refs, refs2], metrics=["bleu"], lowercase=True)
    assert two["BLEU"].score == sacrebleu.metrics.BLEU(lowercase=True).corpus_score(hyps, [refs, refs2]).score


def test_a_string_where_a_list_is_expected_is_a_type_error(copier, counter):
    """A str is iterable: translate("Ein Hund") would translate each character. Every list argument refuses it, and
    None, bytes and other objects as items, naming the argument and what to pass."""
    translator, lm = tfcli.load(str(copier), device="cpu"), tfcli.load(str(counter), device="cpu")
    calls = {
        "texts": lambda v: translator.translate(v),
        "texts ": lambda v: translator.translate_nbest(v, n=2),
        "prompts": lambda v: lm.generate(v, max_new_tokens=2),
        "hypotheses": lambda v: tfcli.score(v, ["cat"]),
    }
    for name, call in calls.items():
        name = name.strip()
        with pytest.raises(TypeError, match=rf"{name}: expected a list of strings, got one str; pass \[text\]"):
            call("cat dog")
        with pytest.raises(TypeError, match=rf"{name}: expected a list of strings, got one bytes"):
            call(b"cat dog")
        with pytest.raises(TypeError, match=rf"{name}\[1\]: None; expected a string"):
            call(["cat", None])
        with pytest.raises(TypeError, match=rf"{name}\[0\]: expected a string, got bytes; decode it first"):
            call([b"cat"])
        with pytest.raises(TypeError, match=rf"{name}\[0\]: expected a string, got int"):
            call([3])
        with pytest.raises(TypeError, match=rf"{name}: expected a list of strings, got int"):
            call(3)
    with pytest.raises(TypeError, match="references: expected a list of strings, got one str"):
        tfcli.score(["cat"], "cat")
    with pytest.raises(TypeError, match=r"references\[1\]: expected a list of strings, got one str"):
        tfcli.score(["cat"], [["cat"], "cat"])
    assert translator.translate(("cat", "moon")) == ["cat", "moon"]  # any sequence of strings is fine
    assert translator.translate(iter(["cat"])) == ["cat"]


def test_options_a_method_does_not_take_are_refused_by_name(copier, counter):
    translator, lm = tfcli.load(str(copier), device="cpu"), tfcli.load(str(counter), device="cpu")
    cases = [
        (lambda: translator.translate(TEXTS, scores=True), "'scores': it is an option of translate_nbest"),
        (lambda: translator.translate(TEXTS, nbest=2), "'nbest': it is an option of translate_nbest"),
        (lambda: translator.translate(TEXTS, device="cpu"), r"'device': it is fixed when the model is loaded"),
        (lambda: translator.translate_nbest(TEXTS, dtype="bf16"), r"'dtype': it is fixed when the model is loaded"),
        (lambda: translator.translate(TEXTS, threads=2), "never changes the process's thread count"),
        (lambda: lm.generate(["cat"], nbest=2), "repeat a prompt"),
        (lambda: lm.generate(["cat"], beam_size=2), "'beam_size': it takes max_new_tokens"),
        (lambda: tfcli.score(["a"], ["a"], beam_size=2), "'beam_size': it takes tokenize"),
        (lambda: translator.translate_nbest(TEXTS, n="2"), "nbest: expected an int"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()


def test_values_are_checked_by_name(copier, tmp_path):
    with pytest.raises(ConfigError, match="dtype: unknown dtype 'int4'"):
        tfcli.load(str(copier), device="cpu", dtype="int4")
    with pytest.raises(ValueError, match="dtype"):  # a ConfigError is a ValueError too
        tfcli.load(str(copier), device="cpu", dtype="float32")
    with pytest.raises(TypeError, match="device: expected a string"):
        tfcli.load(str(copier), device=None)
    with pytest.raises(ConfigError, match="hypotheses: empty"):
        tfcli.score([], [])
    with pytest.raises(ConfigError, match="references: 1 lines for 2 hypotheses"):
        tfcli.score(["a", "b"], ["a"])
    with pytest.raises(ConfigError, match="unknown metric 'blue'"):
        tfcli.score(["a"], ["a"], metrics=["blue"])


def test_one_string_of_metrics_or_stops_means_what_the_command_line_means(counter):
    hyps, refs = ["the cat sat", "a dog"], ["the cat sat down", "a dog"]
    assert tfcli.score(hyps, refs, metrics="bleu").keys() == {"BLEU"}  # not b, l, e, u
    both = tfcli.score(hyps, refs, metrics="bleu,chrf")
    listed = tfcli.score(hyps, refs, metrics=["bleu", "chrf"])
    assert both.keys() == {"BLEU", "chrF2"} and {k: s.score for k, s in both.items()} == {
        k: s.score for k, s in listed.items()}
    lm = tfcli.load(str(counter), device="cpu")
    assert lm.generate(["cat"], greedy=True, stop="fish") == lm.generate(["cat"], greedy=True, stop=["fish"])
    assert lm.generate(["cat"], greedy=True, stop="fish")[0].split() == ["dog", "egg"]


def test_loading_leaves_torch_random_stream_as_it_was(copier, counter):
    for path in (copier, counter):
        torch.manual_seed(123)
        expected = torch.rand(4)
        torch.manual_seed(123)
        tfcli.load(str(path), device="cpu")
        assert torch.equal(torch.rand(4), expected)


def test_config_json_is_read_once_per_load(copier, counter, tmp_path, monkeypatch):
    """One load, one read of the checkpoint's config.json: tfcli.load, `tfcli translate` and `tfcli lm-generate`."""
    from pathlib import Path

    from typer.testing import CliRunner

    from tfcli.cli import app

    reads = []
    read_text = Path.read_text

    def counting(self, *args, **kwargs):
        if self.name == "config.json":
            reads.append(self)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    for path in (copier, counter):
        reads.clear()
        tfcli.load(str(path), device="cpu")
        assert len(reads) == 1, path
    (tmp_path / "in.txt").write_text("cat dog\n")
    for args in (["translate", "-m", copier, tmp_path / "in.txt", "-o", tmp_path / "out.txt"],
                 ["lm-generate", "-m", counter, "cat", "-o", tmp_path / "gen.txt", "--max-new-tokens", "2"]):
        reads.clear()
        result = CliRunner().invoke(app, [str(a) for a in args])
        assert result.exit_code == 0, result.output
        assert len(reads) == 1, args


def test_a_shared_tokenizer_file_is_parsed_once(tmp_path):
    """Source and target tokenizer files of the same bytes give one Tokenizer for both sides; files that differ
    (here: the same tokenizer written with another layout) are each loaded."""
    import json

    from helpers import save_random_translator
    from tfcli.generate import loader

    ckpt = save_random_translator(tmp_path, seed=0)
    shared = loader.load(str(ckpt), torch.device("cpu"), "seq2seq")
    assert shared.src_tok is shared.tgt_tok
    src = ckpt / json.loads((ckpt / "config.json").read_text())["tokenizers"]["src"]
    src.write_text(json.dumps(json.loads(src.read_text()), indent=1))
    apart = loader.load(str(ckpt), torch.device("cpu"), "seq2seq")
    assert apart.src_tok is not apart.tgt_tok
    line = " ".join(WORDS[:5])
    assert apart.src_tok.encode(line).ids == shared.src_tok.encode(line).ids


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_mapped_checkpoints_embedding_rows_read_from_the_file_translate_the_same(dtype, tmp_path, monkeypatch):
    """Decoding looks up a large mapped embedding table by reading the file (tfcli.checkpoint.rows_reader): the
    same translations as lookups in memory."""
    from helpers import save_random_translator
    from tfcli import checkpoint
    from tfcli.generate import int8

    if dtype == "int8" and not int8.default_engines():
        pytest.skip("no int8 linear layers here")
    ckpt = save_random_translator(tmp_path, seed=4)
    lines = [" ".join(WORDS[i : i + 6]) for i in range(0, 30, 3)]
    want = tfcli.load(str(ckpt), dtype=dtype).translate(lines, beam_size=3)
    monkeypatch.setattr(checkpoint, "READ_ROWS_MIN", 0)
    reading = tfcli.load(str(ckpt), dtype=dtype)
    assert reading.loaded.steps.tok.__name__ == "read"  # (the file's rows, not the map's)
    assert reading.translate(lines, beam_size=3) == want
