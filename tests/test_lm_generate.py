"""lm-generate: sampling filters on hand-made distributions, cached batched generation equal to recomputing, seeds,
stop strings, streaming, and the command line."""

import random
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers import WORDS
from tfcli import checkpoint
from tfcli.cli import app
from tfcli.generate.config import GenerateConfig
from tfcli.generate.lm import START_ID, Continuation, generate_ids, lm_generate
from tfcli.generate import native
from tfcli.generate.rules import RepetitionPenalty, RowRules, Step
from tfcli.generate.sampling import (apply_temperature, draw, next_token,
                                     sample_by_uniforms, top_k_filter, top_p_filter)
from tfcli.generate.step import IncrementalDecoder, StaticDecoder, StepModel
from tfcli.model.config import preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS
from tfcli.model.transformer import build_model

ROOT = Path(__file__).resolve().parents[1]
TFCLI = ROOT / ".venv" / "bin" / "tfcli"
VOCAB = SPECIAL_TOKENS + WORDS + ["."]
V = len(VOCAB)
ID = {w: i for i, w in enumerate(VOCAB)}
NEG = float("-inf")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)



@pytest.fixture(scope="module")
def lm_model(counter):
    return checkpoint.load(counter)[0]


# --- filters on hand-made distributions ------------------------------------------------------------------------


def logits_of(probs):
    return torch.tensor(probs).log().unsqueeze(0)


def kept(logits):
    return (logits[0] > NEG).nonzero().flatten().tolist()


def test_top_k_keeps_the_k_most_likely():
    logits = logits_of([0.1, 0.4, 0.05, 0.3, 0.15])
    assert kept(top_k_filter(logits, 2)) == [1, 3]
    assert kept(top_k_filter(logits, 1)) == [1]
    assert kept(top_k_filter(logits, 0)) == [0, 1, 2, 3, 4]  # 0: no filter
    assert kept(top_k_filter(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 2)) == [1, 2]
    assert kept(top_k_filter(torch.tensor([[1.0, 2.0, 2.0, 0.0]]), 1)) == [1, 2]  # ties with the k-th stay
    torch.testing.assert_close(top_k_filter(logits, 3)[0, [1, 3, 4]], logits[0, [1, 3, 4]])  # untouched


@pytest.mark.parametrize("k", [1, 7, 40, 64, 65])
def test_top_k_filter_is_torchs_topk_exactly(k):
    """The filter (rows.c's best_next where it runs, torch's topk past k = 64) keeps exactly what torch's topk
    k-th value keeps: rows of random logits with ties, -inf, fewer than k finite values, odd widths."""
    g = torch.Generator().manual_seed(k)
    logits = torch.randn(6, 8003, generator=g)
    logits[1] = (logits[1] * 4).round()  # many ties, the k-th among them
    logits[2, ::3] = NEG
    logits[3, 5:] = NEG  # five finite values: the k-th is -inf where k > 5
    logits[4, 100] = float("inf")
    logits[5] = 0.0
    expected = logits.masked_fill(logits < logits.topk(k, dim=-1).values[:, -1:], NEG)
    before = logits.clone()
    assert torch.equal(top_k_filter(logits, k), expected)
    assert torch.equal(logits, before)  # the input untouched
    assert torch.equal(top_k_filter(logits.t().contiguous().t(), k), expected)  # not contiguous: torch's topk


@pytest.mark.skipif(native.fp32_kernel() is None, reason="rows.c's kernels do not run here")
def test_rows_c_draw_chooses_what_the_torch_form_chooses():
    """rows.c's draw_rows (top-k 1..64, no top-p, on the CPU) against sample_by_uniforms over the top-k filter, the
    torch form it stands for: the same token in every row (rows of random logits of every scale, with ties at the
    k-th, -inf, fewer finite values than k, odd widths; u anywhere in [0, 1), a hair below 1 too), each a token the
    filter kept. (The two may differ only where u falls within ~1e-16 of a boundary between two tokens, their float64
    sums being taken in another order: none of these rows does, with torch held to any instruction set.) A row
    holding NaN or +inf, or no finite logit, is left to torch's form (None)."""
    g = torch.Generator().manual_seed(0)
    rows = 0
    for trial in range(120):
        R, V = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(50, 3000, (1,), generator=g))
        x = torch.randn(R, V, generator=g) * float(torch.rand(1, generator=g)) * 12
        if trial % 3 == 0:
            x = (x * 2).round() / 2  # ties, the k-th among them
        if trial % 5 == 0:
            x[:, ::4] = NEG
        x[0, 7:] = NEG  # seven finite values
        k = int(torch.randint(1, 65, (1,), generator=g))
        u = torch.rand(R, generator=g, dtype=torch.float64)
        if trial % 7 == 0:
            u[:] = 1 - 2.0**-53
        expected = sample_by_uniforms(top_k_filter(x, k), u)
        assert torch.equal(native.draw(x, k, u), expected), trial
        assert torch.equal(draw(x, k, 1.0, u), expected)
        assert bool((x.gather(1, expected[:, None]) > NEG).all())
        rows += R
    assert rows > 2000
    for bad in (float("nan"), float("inf")):
        x = torch.randn(3, 100, generator=g)
        x[1, 5] = bad
        assert native.draw(x, 5, torch.rand(3, dtype=torch.float64)) is None
    x = torch.randn(3, 100, generator=g)
    x[2] = NEG  # every token banned
    assert native.draw(x, 5, torch.rand(3, dtype=torch.float64)) is None


def test_top_p_keeps_the_smallest_nucleus():
    logits = logits_of([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5 (1), 0.3 (3), 0.15 (2), 0.05 (0)
    assert kept(top_p_filter(logits, 0.4)) == [1]
    assert kept(top_p_filter(logits, 0.7)) == [1, 3]  # 0.5 < 0.7 <= 0.8
    assert kept(top_p_filter(logits, 0.9)) == [1, 2, 3]
    assert kept(top_p_filter(logits, 0.99)) == [0, 1, 2, 3]
    assert kept(top_p_filter(logits, 1e-6)) == [1]  # the most likely token always stays
    two_rows = torch.cat([logits, logits_of([0.7, 0.1, 0.1, 0.1])])
    assert (top_p_filter(two_rows, 0.6) > NEG).tolist() == [[False, True, False, True], [True, False, False, False]]


def test_temperature_sharpens_and_flattens():
    logits = logits_of([0.2, 0.8])
    assert apply_temperature(logits, 1.0).softmax(-1)[0].tolist() == pytest.approx([0.2, 0.8])
    cold, hot = apply_temperature(logits, 0.5).softmax(-1)[0], apply_temperature(logits, 2.0).softmax(-1)[0]
    assert cold.tolist() == pytest.approx([0.04 / 0.68, 0.64 / 0.68])  # p^(1/T), renormalised
    assert hot[1] < 0.8 < cold[1]
    with pytest.raises(ValueError):
        apply_temperature(logits, 0.0)


def test_repetition_penalty_is_ctrls():
    logits = torch.tensor([[2.0, -1.0, 3.0, 0.5]])
    out = RowRules([RepetitionPenalty(2.0)]).penalise(logits.clone(), Step(1, torch.tensor([[0, 1, 1]]), length=3))
    assert out.tolist() == [[1.0, -2.0, 3.0, 0.5]]  # seen: positive / 2, negative * 2; unseen untouched
    # a row's text past its own length is not read (but as <pad>, id 0, banned anyway)
    out = RowRules([RepetitionPenalty(2.0)]).penalise(
        logits.expand(2, 4).clone(), Step(1, torch.tensor([[0, 1, 1], [2, 2, 3]]), length=torch.tensor([3, 1])))
    assert out[:, 1:].tolist() == [[-2.0, 3.0, 0.5], [-1.0, 1.5, 0.5]]


def test_sampling_follows_the_filtered_distribution():
    # ids 0 and 1 (<pad>, <s>) are the most likely by far, but must never come out
    logits = torch.cat([torch.full((4000, 2), 5.0), logits_of([0.1, 0.2, 0.3, 0.4]).expand(4000, -1)], 1)
    g = torch.Generator().manual_seed(0)
    ids = next_token(logits, RowRules([]), Step(1), top_k=2, generator=g)
    counts = torch.bincount(ids, minlength=6).tolist()
    assert counts[0] == counts[1] == 0  # <pad>, <s> banned
    assert counts[2] == counts[3] == 0  # outside the top 2
    assert counts[5] / 4000 == pytest.approx(0.4 / 0.7, abs=0.03)
    again = torch.Generator().manual_seed(0)
    assert torch.equal(ids, next_token(logits, RowRules([]), Step(1), top_k=2, generator=again))
    assert next_token(logits[:1], RowRules([]), Step(1), greedy=True).item() == 5


# --- generation ------------------------------------------------------------------------------------------------


def recompute_greedy(model, prompt, n):
    """The slow way: the whole sequence through the model at every step, no cache, no padding."""
    ids = list(prompt)
    out = []
    for _ in range(n):
        logits = model(torch.tensor([ids]))[0, -1].float()
        logits[[PAD_ID, BOS_ID]] = NEG
        t = int(logits.argmax())
        if t == EOS_ID:
            break
        out.append(t)
        ids.append(t)
    return out


def random_lm(positions="learned"):
    torch.manual_seed(0)
    return build_model(preset("lm-toy", tgt_vocab_size=V, positions=positions, max_len=48)).eval()


class Calls:
    """Records each prefill (rows, positions) and step (rows) of the incremental decoder, and the positions it held
    before each."""

    def __init__(self, monkeypatch):
        self.prefills, self.steps, self.held = [], [], []
        prefill, step = IncrementalDecoder.prefill, IncrementalDecoder.step

        def spy_prefill(dec, ids, valid=None):
            self.prefills.append(tuple(ids.shape))
            self.held.append((dec.t, ids.size(1)))
            return prefill(dec, ids, valid)

        def spy_step(dec, tok):
            self.steps.append(tok.numel())
            self.held.append((dec.t, 1))
            return step(dec, tok)

        monkeypatch.setattr(IncrementalDecoder, "prefill", spy_prefill)
        monkeypatch.setattr(IncrementalDecoder, "step", spy_step)


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_cached_left_padded_batch_equals_recomputing(positions, monkeypatch):
    model = random_lm(positions)
    rng = random.Random(1)
    prompts = [[START_ID] + [rng.randrange(4, V) for _ in range(rng.randint(0, 9))] for _ in range(8)]
    calls = Calls(monkeypatch)
    got = generate_ids(model, prompts, GenerateConfig(max_new_tokens=12, greedy=True))
    monkeypatch.undo()
    assert got == [recompute_greedy(model, p, 12) for p in prompts]
    assert calls.prefills == [(8, 10)]  # the prompts run once, left-padded
    assert calls.steps == sorted(calls.steps, reverse=True)  # then one new token per row, rows leaving as they end


def no_end(model, static: bool = False) -> StepModel:
    """The model's StepModel, with </s> and "." banned, so that it never ends a text."""
    sm = StepModel(model, static=static)
    head = sm.lm_head
    sm.lm_head = lambda x: head(x).index_fill(-1, torch.tensor([EOS_ID, ID["."]]), NEG)
    return sm


def test_generation_slides_past_the_context(monkeypatch):
    """Past max_len (48) tokens, generation goes on from the last 24, as nanoGPT crops its context: the same tokens
    as recomputing each step over that window, never a position beyond max_len, one prefill per 24 new tokens."""
    model = random_lm()
    prompts = [[START_ID, ID["cat"], ID["dog"]], [START_ID, ID["moon"]]]  # different lengths: left padding
    cfg = GenerateConfig(max_new_tokens=100, greedy=True)
    calls = Calls(monkeypatch)
    out = generate_ids(no_end(model), prompts, cfg)
    monkeypatch.undo()
    assert [len(o) for o in out] == [100, 100]
    assert all(held + new <= 48 for held, new in calls.held)
    # the prompt (3 positions), then a refill of 24 each time the context is full: after 45, 24 and 24 single steps
    assert [positions for _, positions in calls.prefills] == [3, 24, 24, 24]
    for prompt, got in zip(prompts, out):  # the slow way: one full forward pass per token over the window
        tokens, start = list(prompt), 0
        for _ in range(100):
            if len(tokens) - start > 48:
                start = len(tokens) - 24
            logits = model(torch.tensor([tokens[start:]]))[0, -1]
            logits[[EOS_ID, ID["."]]] = NEG
            tokens.append(int(logits.argmax()))
        assert got == tokens[len(prompt):]


def test_greedy_follows_the_model(lm_model):
    out = generate_ids(lm_model, [[START_ID, ID["cat"], ID["dog"]]], GenerateConfig(max_new_tokens=30, greedy=True))
    assert [VOCAB[i] for i in out[0]] == WORDS[WORDS.index("egg"):] + ["."]  # then </s>, which is not returned


def run_lm(ckpt, tmp_path, prompts, **kw):
    out = tmp_path / "out.txt"
    cfg = GenerateConfig(device="cpu", **kw)
    n = lm_generate(str(ckpt), prompts, None, str(out), cfg)
    lines = out.read_text().split("\n")[:-1]
    assert len(lines) == n
    return lines


def test_seed_gives_the_same_text(counter, tmp_path):
    kw = dict(max_new_tokens=15, temperature=3.0, nbest=3)
    a = run_lm(counter, tmp_path, ["cat", "moon sun"], seed=1, **kw)
    b = run_lm(counter, tmp_path, ["cat", "moon sun"], seed=1, **kw)
    c = run_lm(counter, tmp_path, ["cat", "moon sun"], seed=2, **kw)
    assert a == b
    assert a != c
    assert len(set(a[:3])) > 1  # samples of one prompt differ
    assert [line.split()[0] for line in a] == ["cat"] * 3 + ["moon"] * 3  # prompt order, samples together


def test_a_prompts_sample_does_not_depend_on_its_batch(counter, tmp_path):
    """Each prompt samples from numbers keyed by the seed, its index and the step: the same texts at any batch
    size (batches group prompts by length, so its neighbours change too), with a stop string or without."""
    prompts = ["cat", "moon sun", "ice", "apple bird cat", "dog", "sun"]
    for kw in (dict(temperature=3.0), dict(temperature=2.0, top_k=5, stop=["owl"])):
        runs = [run_lm(counter, tmp_path, prompts, seed=4, max_new_tokens=12, batch_size=bs, **kw) for bs in (1, 2, 6)]
        assert runs[0] == runs[1] == runs[2]
        assert len(set(runs[0])) == len(prompts)


def test_stop_strings_and_eos(counter, tmp_path):
    out = run_lm(counter, tmp_path, ["cat dog", "moon"], greedy=True, max_new_tokens=30, stop=["goat"])
    assert out[0] == "cat dog egg fish "  # cut before the stop string, which is not printed
    assert out[1].startswith("moon nest owl") and out[1].endswith(" .")  # ended by </s> after ".", not max length
    assert len(out[1].split()) < 30
    assert run_lm(counter, tmp_path, ["cat"], greedy=True, max_new_tokens=2) == ["cat dog egg"]


def test_translating_through_a_prompt_continues_it(counter):
    """translate with a decoder-only model: the prompt template around each line, greedy and beam 4, prompts of
    unequal length in one batch, give the counter's continuation; a prompted beam search's prefill leaves the other
    beams' slots unwritten, which must not read the memory's old contents (NaN here)."""
    import tfcli

    lm = tfcli.load(str(counter), device="cpu")
    lines = ["queen", "moon nest owl", "apple bird"]
    want = ["rat sun tree .", "pig queen rat sun tree .", "cat dog egg fish goat hat ice jam kite lamp"]
    for beam in (1, 4):
        lm.loaded.steps._workspace = torch.full((1 << 16,), float("nan"))
        assert lm.translate(lines, beam_size=beam, prompt_template="{text}", max_len_a=0.0, max_len_b=10) == want


def test_streaming_single_prompt_equals_batch_output(counter, tmp_path):
    res = subprocess.run(
        [str(TFCLI), "lm-generate", "-m", str(counter), "cat dog", "--seed", "3", "-n", "12", "--threads", "1",
         "--stop", "jam"],
        capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert res.returncode == 0, res.stderr.decode()
    batch = run_lm(counter, tmp_path, ["cat dog"], seed=3, max_new_tokens=12, stop=["jam"])
    assert res.stdout.decode() == batch[0] + "\n"


def test_single_prompt_streams_token_by_token(counter, monkeypatch):
    """With one prompt and one sample, text is written and flushed as each token arrives, not at the end."""
    import contextlib

    import tfcli.generate.lm as lm

    events = []

    class Recorder:
        def write(self, text):
            events.append(("write", text))

        def flush(self):
            events.append(("flush", None))

    monkeypatch.setattr(lm, "open_output", lambda path: contextlib.nullcontext(Recorder()))
    lm_generate(str(counter), ["cat"], None, None, GenerateConfig(device="cpu", greedy=True, max_new_tokens=4))
    text = "".join(t for kind, t in events if kind == "write")
    assert text == "cat dog egg fish goat\n"
    pieces = [t for kind, t in events if kind == "write" and t]
    assert len(pieces) >= 5  # the prompt, then one piece per new word (and the final newline)
    assert events.count(("flush", None)) >= 5


def test_continuation_holds_back_a_possible_stop_string():
    class Chars:  # a stand-in tokenizer: id i is chr(i)
        @staticmethod
        def decode_batch(ids, skip_special_tokens=False):
            return ["".join(chr(i) for i in seq if i > 2) for seq in ids]

    c = Continuation(Chars, [START_ID, ord("a")], stop=["xyz"])
    c.update([ord("b"), ord("x")])
    assert c.text == "bx" and c.safe_prefix() == ""  # "bx" could be the start of "xyz"... keep len-2 back
    c.update([ord("b"), ord("x"), ord("q"), ord("r")])
    assert c.safe_prefix() == "bx"
    assert c.update([ord("b"), ord("x"), ord("q"), ord("x"), ord("y"), ord("z"), ord("w")])
    assert c.text == "bxq" and c.safe_prefix() == "bxq"


def test_prompts_from_file_and_stdin_and_errors(counter, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("cat\nmoon\n")
    runner = CliRunner()
    res = runner.invoke(app, ["lm-generate", "-m", str(counter), "-i", str(prompts), "--greedy", "-n", "3"])
    assert res.exit_code == 0, res.output
    assert res.output == "cat dog egg fish\nmoon nest owl pig\n"
    res = runner.invoke(app, ["lm-generate", "-m", str(counter), "--greedy", "-n", "2"], input="egg\n")
    assert res.output == "egg fish goat\n"
    res = runner.invoke(app, ["lm-generate", "-m", str(counter), "x", "--top-p", "1.5"])
    assert res.exit_code == 1 and "--top-p" in res.output
    long = " ".join(WORDS * 4)
    res = runner.invoke(app, ["lm-generate", "-m", str(counter), long, "--greedy", "-n", "5"])
    assert res.exit_code == 0 and "keeping the last 47" in res.output


def test_jsonl_gives_one_object_per_sample_in_order(counter, tmp_path):
    """--jsonl: each sample one JSON line with its prompt's and its own index; the same texts as the plain output, and
    a single prompt with a single sample (which streams in plain mode) is one object too."""
    import json

    prompts = tmp_path / "p.txt"
    prompts.write_text("cat\nmoon\n")
    runner = CliRunner()
    base = ["lm-generate", "-m", str(counter), "-i", str(prompts), "-n", "3", "-N", "2", "--top-k", "1"]
    plain = runner.invoke(app, base)
    res = runner.invoke(app, base + ["--jsonl", "-o", str(tmp_path / "out.jsonl")])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["index"], r["sample"]) for r in records] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["prompt"] for r in records] == ["cat", "cat", "moon", "moon"]
    assert [r["prompt"] + r["continuation"] for r in records] == plain.output.splitlines()
    assert records[0]["continuation"] == " dog egg fish"
    one = runner.invoke(app, ["lm-generate", "-m", str(counter), "sun", "--greedy", "--jsonl"])
    assert json.loads(one.stdout) == {"index": 0, "sample": 0, "prompt": "sun", "continuation": " tree ."}


def test_early_end_warns_and_min_new_tokens_or_ignore_eos_go_on(counter):
    """The counter LM ends "sun" with "tree . </s>": two new tokens of the 8 asked for."""
    runner = CliRunner()
    base = ["lm-generate", "-m", str(counter), "sun", "--greedy", "-n", "8"]
    res = runner.invoke(app, base)
    assert res.exit_code == 0 and res.stdout == "sun tree .\n"
    assert "1 of 1 sample(s) ended at </s> after 2 of --max-new-tokens 8" in res.stderr
    res = runner.invoke(app, base + ["--ignore-eos"])
    assert res.exit_code == 0 and len(res.stdout.split()) == 1 + 8 and "ended at </s>" not in res.stderr
    res = runner.invoke(app, base + ["--min-new-tokens", "5"])
    assert res.exit_code == 0 and 1 + 5 <= len(res.stdout.split()) <= 1 + 8
    res = runner.invoke(app, base + ["--min-new-tokens", "9"])
    assert res.exit_code == 1 and "--min-new-tokens" in res.output


def test_no_prompts_on_an_empty_stdin_is_said(counter):
    res = CliRunner().invoke(app, ["lm-generate", "-m", str(counter), "--greedy"], input="")
    assert res.exit_code == 0 and res.stdout == "" and "no prompts: stdin was empty" in res.stderr


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_fixed_shape_steps_generate_what_recomputing_does(positions):
    """The fixed-shape decoder a GPU replays as a CUDA graph (StaticDecoder, run eagerly here): left-padded prompts,
    rows leaving as they end, and the context sliding past max_len give the tokens of recomputing."""
    model = random_lm(positions)
    rng = random.Random(2)
    prompts = [[START_ID] + [rng.randrange(4, V) for _ in range(rng.randint(0, 9))] for _ in range(6)]
    got = generate_ids(StepModel(model, static=True), prompts, GenerateConfig(max_new_tokens=12, greedy=True))
    assert got == [recompute_greedy(model, p, 12) for p in prompts]
    long = generate_ids(StepModel(model, static=True), prompts[:2], GenerateConfig(max_new_tokens=60, ignore_eos=True,
                                                                                   greedy=True))
    assert long == generate_ids(StepModel(model), prompts[:2], GenerateConfig(max_new_tokens=60, ignore_eos=True,
                                                                              greedy=True))


# --- continuous batching and reads every N steps ----------------------------------------------------------------


def _prompts(n, seed, longest=9):
    rng = random.Random(seed)
    return [[START_ID] + [rng.randrange(4, V) for _ in range(rng.randint(0, longest))] for _ in range(n)]


@pytest.mark.parametrize("positions", ["learned", "rope"])
@pytest.mark.parametrize("slots", [1, 3])
@pytest.mark.parametrize("every", [1, 4])
def test_prompts_refilling_fixed_places_generate_what_recomputing_does(positions, slots, every):
    """On the fixed-shape decoder, `slots` places: a finished row's place goes to the next prompt, prefilled into
    it (at the next read of the device, every N steps): greedy texts are recomputing's; sampled ones (keyed by the
    prompt's index and the token's number) are those of the shrinking batch; none depends on places or N."""
    model = random_lm(positions)
    prompts = _prompts(7, seed=3)
    greedy = GenerateConfig(max_new_tokens=10, greedy=True)
    got = generate_ids(StepModel(model, static=True), prompts, greedy, slots=slots, check_every=every)
    assert got == [recompute_greedy(model, p, 10) for p in prompts]
    sampled = GenerateConfig(max_new_tokens=10, temperature=2.0, top_k=20, seed=11, min_new_tokens=3)
    want = generate_ids(StepModel(model), prompts, sampled, rows=list(range(10, 17)))
    assert generate_ids(StepModel(model, static=True), prompts, sampled, rows=list(range(10, 17)), slots=slots,
                        check_every=every) == want
    assert all(len(t) >= 3 for t in want) and len({tuple(t) for t in want}) > 1


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_each_admitted_prompt_slides_past_the_context_as_it_would_alone(penalty):
    """A prompt prefilled into a place (no padding) gets what it gets alone: past max_len (48) it goes on from its
    last 24 tokens on its own schedule, and the repetition penalty sees its own text only, not the text of the row
    that held the place before."""
    model = random_lm()
    prompts = _prompts(5, seed=4)
    cfg = GenerateConfig(max_new_tokens=70, greedy=True, repetition_penalty=penalty)
    alone = [generate_ids(no_end(model), [p], cfg)[0] for p in prompts]
    for slots in (1, 2):
        got = generate_ids(no_end(model, static=True), prompts, cfg, slots=slots, check_every=5)
        assert [len(t) for t in got] == [70] * 5
        # (the first `slots` prompts are prefilled together, left-padded: with one place, that is one alone)
        assert got[slots:] == alone[slots:] and (slots > 1 or got == alone)


def test_stop_callbacks_and_fixed_places(monkeypatch):
    """With on_token (stop strings, streaming) the host reads every step; a row stopped by it frees its place."""
    model = random_lm()
    prompts = _prompts(6, seed=5)
    cfg = GenerateConfig(max_new_tokens=12, greedy=True)
    want = [recompute_greedy(model, p, 12)[:3] for p in prompts]
    seen = []

    def stop_at_three(row, ids):
        seen.append(row)
        return len(ids) >= 3

    got = generate_ids(StepModel(model, static=True), prompts, cfg, stop_at_three, slots=2, check_every=8)
    assert got == want
    assert sorted(set(seen)) == list(range(6))


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("every", [1, 4])
def test_the_host_reads_the_device_once_every_n_steps(static, every, monkeypatch):
    """Without a stop callback, generation reads the device once every N steps (one read for the new ids of those
    steps and the ended flags), and the texts do not depend on N."""
    import math

    model = random_lm()
    prompts = _prompts(5, seed=6)
    cfg = GenerateConfig(max_new_tokens=9, greedy=True)
    sm = StepModel(model, static=static)
    reads, steps = [], []
    for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _o=original, _n=name: reads.append(_n) or _o(t, *a))
    decoder = StaticDecoder if static else IncrementalDecoder
    step = decoder.step
    monkeypatch.setattr(decoder, "step", lambda d, tok: steps.append(1) or step(d, tok))
    got = generate_ids(sm, prompts, cfg, slots=2 if static else None, check_every=every)
    monkeypatch.undo()
    assert got == [recompute_greedy(model, p, 9) for p in prompts]
    loops = len(steps) + 1  # (the last loop reads, and stops)
    assert reads == ["tolist"] * math.ceil(loops / every), reads


def test_a_prompt_that_fills_the_context_slides_as_it_would_alone():
    """Prompts that generate past max_len (48) are batched by their length only, so that each slides its context
    when it would alone (a left-padded batch slides every row when its longest prompt fills the context); prompts
    that never fill it are batched across lengths."""
    from tfcli.generate.lm import plan_batches

    model = random_lm()
    some = _prompts(4, seed=6, longest=12)
    prompts = some + [[START_ID] + p[:0:-1] for p in some]  # each length twice
    cfg = GenerateConfig(max_new_tokens=60, greedy=True)
    batches = plan_batches(prompts, 4, 48, cfg.max_new_tokens)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert all(len({len(prompts[i]) for i in b}) == 1 for b in batches) and max(len(b) for b in batches) == 2
    alone = [generate_ids(no_end(model), [p], cfg)[0] for p in prompts]
    for b in batches:
        assert generate_ids(no_end(model), [prompts[i] for i in b], cfg) == [alone[i] for i in b]
    # short generations never slide: one batch across lengths, in order of the earliest prompt
    by_length = sorted(range(8), key=lambda i: len(prompts[i]))
    assert plan_batches(prompts, 4, 48, 10) == sorted([by_length[:4], by_length[4:]], key=min)
