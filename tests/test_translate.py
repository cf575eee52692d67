"""translate: the batched, cached beam/greedy search equals a slow reference; batching, order, formats and the
command line (files, stdin/stdout pipelines, odd input) behave."""

import random
import subprocess
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tfcli import checkpoint
from tfcli.cli import app
from tfcli.data.batching import pad, source_ids
from reference_search import assert_same_nbest, reference_beam_search, reference_greedy
from tfcli.device import int8_available, onednn_available
from tfcli.generate.schedule import keep_order
from tfcli.generate.step import IncrementalDecoder, StaticDecoder, StepModel
from helpers import beam_search, greedy_decode, greedy_search
from tfcli.generate.choose import top_k
from tfcli.generate.source import length_penalty
from tfcli.generate.config import TranslateConfig
from tfcli.request import Request
from tfcli.generate.translate import Pipeline, translate
from tfcli.generate.loader import load
from tfcli.model.config import preset
from tfcli.specials import BOS_ID, PAD_ID, SPECIAL_TOKENS
from tfcli.model.transformer import build_model

from helpers import WORDS

ROOT = Path(__file__).resolve().parents[1]
TFCLI = ROOT / ".venv" / "bin" / "tfcli"


V = len(SPECIAL_TOKENS) + len(WORDS)


@pytest.fixture(scope="module")
def copier_model(copier):
    return checkpoint.load(copier)[0]


def random_model():
    torch.manual_seed(1)
    return build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V)).eval()


def sources(n, seed=0, max_words=10):
    rng = random.Random(seed)
    return [source_ids([rng.randrange(4, V) for _ in range(rng.randint(1, max_words))]) for _ in range(n)]


def words(ids):
    return " ".join(WORDS[i - 4] for i in ids)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- search ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["copier", "random", "packed", "static", "static-copier"])
def test_cached_batched_search_equals_slow_reference(which, copier_model):
    """Greedy and beam search (KV cache, batched, sentences leaving the batch) equal the no-cache reference run one
    sentence at a time: same hypotheses in the same order, same scores. `packed`: CPU inference as translate runs it
    (oneDNN weights, fused linear layers in the search); `static`: the fixed-shape step a GPU replays as a CUDA
    graph (StaticDecoder), run eagerly."""
    model = copier_model if which.endswith("copier") else random_model()
    if which == "packed" and not onednn_available():
        pytest.skip("oneDNN is not available in this torch build")
    steps = StepModel(model, pack=which == "packed", static=which.startswith("static"))
    srcs = sources(20, seed=3, max_words=8)
    beams = beam_search(steps, pad(srcs), beam_size=4, len_penalty=0.6, nbest=4, token_scores=True)
    greedy = greedy_decode(steps, pad(srcs))
    ended_early = 0
    for src, hyps, g in zip(srcs, beams, greedy):
        ref = reference_beam_search(model, src, beam_size=4, len_penalty=0.6, nbest=4)
        assert_same_nbest(hyps, ref)
        ref_g = reference_greedy(model, src)
        assert g.tokens == ref_g.tokens
        assert g.score == pytest.approx(ref_g.score, abs=1e-4)
        ended_early += len(g.token_scores) == len(g.tokens) + 1  # ended with </s>
    if which.endswith("copier"):  # it ends every sentence (by construction), so the </s> paths are exercised
        assert ended_early == len(srcs)
        assert all(b[0].tokens == s[:-1] for s, b in zip(srcs, beams))



@pytest.mark.parametrize("V", [8000, 8001, 2000, 40])
def test_blockwise_top_k_is_torch_topk(V):
    """The search's top_k finds what torch.topk finds: the same values in the same order, at indices that hold
    them; with banned (-inf) entries, a vocabulary that is no multiple of the block width, and ties."""
    g = torch.Generator().manual_seed(V)
    x = torch.randn(70, V, generator=g).log_softmax(-1)
    x[:, [0, 1, 3]] = float("-inf")
    x[5] = x[5].round(decimals=1)  # many equal values
    x[6, -10:] = 5.0  # the best all in the last, partial block
    x[7] = float("-inf")
    x[7, 2] = 0.0
    for k in (1, 10):
        values, ids = top_k(x, k)
        ref_values, _ = x.topk(k, dim=1)
        assert torch.equal(values, ref_values)
        assert torch.equal(x.gather(1, ids), values)
        assert all(len(set(row)) == k for row in ids.tolist())


@pytest.mark.parametrize("V", [8000, 8003, 40])
def test_the_c_choice_of_next_tokens_is_the_log_softmaxs_top_k(V):
    """rows.c's best_next picks each row's k best tokens on the logits (banned ones excluded: <pad>, <s>, and </s>
    in the rows asked) and normalises only those: the ids torch's log_softmax + topk picks (of equal values the lower
    id first), log-probs within float rounding of torch's, and a row's result the same bit for bit alone and in
    any batch."""
    from tfcli.generate import native
    from tfcli.device import never_chosen
    from tfcli.specials import EOS_ID

    if native.fp32_kernel() is None:
        pytest.skip("rows.c's kernels do not run here (no C compiler, no AVX2, or ATEN_CPU_CAPABILITY=default)")
    g = torch.Generator().manual_seed(V)
    x = torch.randn(70, V, generator=g) * 4
    x[3, [7, 9]] = x[3].max() + 1  # a tie for the best
    x[4, [0, 1]] = x[4].max() + 1  # the best banned
    x[5] = x[5].round(decimals=0)  # many equal values
    ban, ban_eos = never_chosen(x.device), torch.arange(70) % 3 == 0
    ref = x.log_softmax(-1)
    ref[:, ban] = float("-inf")
    ref[ban_eos, EOS_ID] = float("-inf")
    for k in (1, 10):
        values, ids, norm = native.best_next(x.clone(), ban, ban_eos, EOS_ID, k)
        ref_values = ref.topk(k, dim=1)[0]
        torch.testing.assert_close(values, ref_values, atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(norm, x.logsumexp(-1), atol=1e-5, rtol=1e-6)
        assert torch.equal(values, x.gather(1, ids) - norm[:, None])  # the chosen tokens' log-probs
        # the ids: those of the k largest logits, lower ids first among equal values
        assert torch.equal(ids, x.masked_fill(ref == float("-inf"), float("-inf")).neg().sort(stable=True)[1][:, :k])
        for rows in (slice(3, 4), slice(0, 33), slice(40, 70)):
            part = native.best_next(x[rows].clone(), ban, ban_eos[rows], EOS_ID, k)
            assert all(torch.equal(a, b[rows]) for a, b in zip(part, (values, ids, norm)))
        # unnormalised (a greedy search that is not scored): the same tokens, and their logits
        logits, same_ids, none = native.best_next(x.clone(), ban, ban_eos, EOS_ID, k, normalise=False)
        assert none is None and torch.equal(same_ids, ids) and torch.equal(logits, x.gather(1, ids))
        # pieces that may not follow (a constraint's end), in some rows: never chosen there, still normalised over
        after, cont = torch.arange(70) % 4 == 1, torch.arange(V) % 2 == 1
        cont[x[after].argmax(1)[:2]] = True  # (two such rows' best among them; at least k left in every row)
        p_values, p_ids, p_norm = native.best_next(x.clone(), ban, ban_eos, EOS_ID, k, pieces=(after, cont))
        assert torch.equal(p_norm, norm) and torch.equal(p_values, x.gather(1, p_ids) - norm[:, None])
        assert torch.equal(p_ids[~after], ids[~after]) and not cont[p_ids[after]].any()
        kept = x.masked_fill(ref == float("-inf"), float("-inf")).masked_fill(after[:, None] & cont, float("-inf"))
        assert torch.equal(p_ids, kept.neg().sort(stable=True)[1][:, :k])


@pytest.mark.parametrize("which", ["copier", "random", "packed"])
def test_unscored_greedy_search_gives_the_scored_ones_tokens(which, copier_model):
    """greedy_decode(scored=False), as translate() and training's validation run it: the same outputs as the scored
    search (and the slow reference), with prefixes too, and no score."""
    model = copier_model if which == "copier" else random_model()
    steps = StepModel(model, pack=which == "packed")
    srcs = sources(20, seed=4, max_words=8)
    prefix = pad([[s[0]] if i % 3 == 0 else [] for i, s in enumerate(srcs)], pad_id=-1)
    for p in (None, prefix):
        scored = greedy_decode(steps, pad(srcs), prefix=p)
        unscored = greedy_decode(steps, pad(srcs), prefix=p, scored=False)
        assert [h.tokens for h in unscored] == [h.tokens for h in scored]
        assert all(h.score is None and h.token_scores is None for h in unscored)
        assert all(h.score is not None for h in scored)
        if p is None:
            assert [h.tokens for h in unscored] == [reference_greedy(model, s).tokens for s in srcs]


def test_rows_leave_with_few_moves():
    assert keep_order(6, [1, 4]) == [0, 5, 2, 3]  # row 5 fills the place of row 1; 4 was past the end anyway
    assert keep_order(5, []) == [0, 1, 2, 3, 4]
    assert keep_order(3, [0, 1, 2]) == []
    for n, gone in ((8, [0, 2, 3]), (7, [6]), (9, [1, 2, 3, 4])):
        keep = keep_order(n, gone)
        assert sorted(keep) == sorted(set(range(n)) - set(gone))
        assert sum(j != s for j, s in enumerate(keep)) == sum(s < len(keep) for s in gone)


@pytest.mark.parametrize("which", ["copier", "random"])
def test_batch_equals_one_by_one(which, copier_model):
    model = copier_model if which == "copier" else random_model()
    srcs = sources(16, seed=5)
    batched = beam_search(model, pad(srcs), beam_size=5, nbest=3)
    for src, hyps in zip(srcs, batched):
        alone = beam_search(model, pad([src]), beam_size=5, nbest=3)[0]
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in alone], abs=1e-5)
    assert greedy_search(model, pad(srcs)) == [greedy_search(model, pad([s]))[0] for s in srcs]


def test_greedy_is_beam_search_with_beam_one(copier_model):
    srcs = sources(10, seed=6)
    greedy = greedy_decode(copier_model, pad(srcs), len_penalty=0.6)
    for g, b in zip(greedy, beam_search(copier_model, pad(srcs), beam_size=1)):
        assert g.tokens == b[0].tokens and g.score == pytest.approx(b[0].score, abs=1e-5)


class Recorder:
    """Records how often `model`'s encoder runs and how many rows each decoder step gets (by wrapping its `encode`
    and IncrementalDecoder.step, which the searches use); `boost` makes some tokens the most likely by far."""

    def __init__(self, monkeypatch, model, boost=()):
        self.encodes, self.rows = 0, []
        encode, step = model.encode, IncrementalDecoder.step

        def counted_encode(src):
            self.encodes += 1
            return encode(src)

        def recorded_step(decoder, tok):
            self.rows.append(tok.shape[0])
            logits = step(decoder, tok)
            if boost:
                logits[..., list(boost)] += 100.0
            return logits

        monkeypatch.setattr(model, "encode", counted_encode)
        monkeypatch.setattr(IncrementalDecoder, "step", recorded_step)


def test_encoder_runs_once_and_finished_sentences_leave_the_batch(copier_model, monkeypatch):
    words = [[5 + i for i in range(n)] for n in (1, 3, 8)]
    srcs = [source_ids(w) for w in words]
    rec = Recorder(monkeypatch, copier_model)
    hyps = beam_search(copier_model, pad(srcs), beam_size=3)
    assert rec.encodes == 1
    rows = rec.rows  # one new token per beam and step: the cache holds the prefix
    assert rows[0] == 3 and rows[1] == 9  # first step one row per sentence, then K beams each
    assert rows[-1] == 3  # at the end only the longest sentence is left
    assert all(a >= b for a, b in zip(rows[1:], rows[2:]))
    assert [h[0].tokens for h in hyps] == [reference_beam_search(copier_model, s, beam_size=3)[0].tokens for s in srcs]
    lengths = [len(h[0].tokens) for h in hyps]
    assert lengths[0] < lengths[1] < lengths[2]  # so the longest sentence is the last one left


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_search_stops_once_the_best_is_settled(alpha, copier_model, monkeypatch):
    """A sentence leaves as soon as no live beam can beat its n best finished hypotheses; the answer is the one
    the slow reference finds (which runs until K hypotheses end), and with alpha = 0 the search stops at the step
    the best hypothesis ends."""
    for model in (copier_model, random_model()):
        srcs = sources(12, seed=5, max_words=8)
        for nbest in (1, 2):
            hyps = beam_search(model, pad(srcs), beam_size=4, len_penalty=alpha, nbest=nbest)
            for src, h in zip(srcs, hyps):
                ref = reference_beam_search(model, src, beam_size=4, len_penalty=alpha, nbest=nbest)
                assert [x.tokens for x in h] == [x.tokens for x in ref]
                assert [x.score for x in h] == pytest.approx([x.score for x in ref], abs=1e-4)
    # the copier ends its sentences confidently (by 18 logits or more): with alpha 0 the search stops once the copy
    # ends, long before the other beams would end or reach the max length (1.2 * (n + 1) + 10 tokens)
    if alpha == 0.0:
        for src in sources(12, seed=5, max_words=8):
            rec = Recorder(monkeypatch, copier_model)
            best = beam_search(copier_model, pad([src]), beam_size=4, len_penalty=0.0)[0][0]
            monkeypatch.undo()
            assert best.tokens == src[:-1]
            assert len(rec.rows) == len(src)  # n words, then </s>: n + 1 steps


def test_never_emits_pad_or_bos(monkeypatch):
    model = random_model()
    Recorder(monkeypatch, model, boost=[PAD_ID, BOS_ID])
    srcs = sources(4)
    for hyps in beam_search(model, pad(srcs), beam_size=3, nbest=3):
        assert all(PAD_ID not in h.tokens and BOS_ID not in h.tokens for h in hyps)
    for h in greedy_decode(model, pad(srcs)):
        assert PAD_ID not in h.tokens and BOS_ID not in h.tokens


def test_length_limits(copier_model):
    srcs = sources(6, seed=2)
    # forced length (what the speed benchmark uses): exactly L tokens, no </s>
    for hyps in beam_search(copier_model, pad(srcs), beam_size=3, max_len_a=0, max_len_b=7, min_len=7, nbest=3):
        assert [len(h.tokens) for h in hyps] == [7, 7, 7]
    assert {len(h.tokens) for h in greedy_decode(copier_model, pad(srcs), 0, 7, min_len=7)} == {7}
    # max length a * src_len + b, capped by the model's max_len
    for src, hyps in zip(srcs, beam_search(copier_model, pad(srcs), beam_size=3, max_len_a=0.5, max_len_b=0)):
        assert len(hyps[0].tokens) <= max(1, int(len(src) * 0.5))
    long = beam_search(copier_model, pad(srcs[:1]), beam_size=2, max_len_a=0, max_len_b=500, min_len=500)
    assert len(long[0][0].tokens) == copier_model.cfg.max_len


def test_scores_are_gnmt_normalised(copier_model):
    assert length_penalty(5, 0.6) == pytest.approx((10 / 6) ** 0.6)
    assert length_penalty(7, 0.0) == 1.0
    for hyps in beam_search(copier_model, pad(sources(5)), beam_size=4, nbest=4, len_penalty=1.0, token_scores=True):
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.score == pytest.approx(sum(h.token_scores) / length_penalty(len(h.token_scores), 1.0), abs=1e-5)


# --- translating lines -----------------------------------------------------------------------------------------


def translator(ckpt, **kw):
    cfg = TranslateConfig(device="cpu", **kw)
    return Pipeline(load(str(ckpt), torch.device("cpu"), "seq2seq"), cfg, torch.device("cpu"))


def lines_in(texts, name="in.txt"):
    return [Request(t, name, i + 1) for i, t in enumerate(texts)]


def test_order_is_preserved_across_batches_and_chunks(copier):
    rng = random.Random(7)
    texts = [words([rng.randrange(4, V) for _ in range(rng.randint(1, 9))]) for _ in range(40)]
    texts[5] = texts[17] = ""
    small = translator(copier, max_tokens=20, batch_size=3, buffer_size=11, beam_size=3)
    out = list(small.run(lines_in(texts)))
    one_by_one = [list(translator(copier, beam_size=3).run(lines_in([t])))[0] for t in texts]
    assert out == one_by_one
    assert out == texts  # the copier's output, known by construction


def test_memory_is_bounded_by_the_buffer_not_the_input(copier):
    """However long the input, at most --buffer-size lines are held: the count read ahead of the output never
    reaches it (so `translate` of a 1M-line file holds what 10k lines hold; benchmarks/translate_memory.py)."""
    read = 0

    def endless():
        nonlocal read
        while True:
            read += 1
            yield Request(words([4 + read % 7, 5 + read % 3]), "in.txt", read)

    ahead = []
    for n, _ in enumerate(translator(copier, buffer_size=13, max_tokens=20).run(endless()), 1):
        ahead.append(read - n)
        if n == 100:
            break
    assert max(ahead) == 12 and min(ahead) == 0


def test_int8_translates_the_copier_as_fp32_does(copier):
    """The hand-built copier's margins are far wider than int8's rounding: the same output, beam and greedy."""

    if not int8_available():
        pytest.skip("this torch build has no quantised int8 linear layers")
    rng = random.Random(3)
    texts = [words([rng.randrange(4, V) for _ in range(rng.randint(1, 9))]) for _ in range(30)]
    for beam in (1, 4):
        int8 = list(translator(copier, dtype="int8", beam_size=beam).run(lines_in(texts)))
        assert int8 == list(translator(copier, beam_size=beam).run(lines_in(texts))) == texts


def test_int8_is_for_the_cpu():
    from tfcli.errors import ConfigError
    from tfcli.device import precision

    with pytest.raises(ConfigError, match="--dtype int8 is for the CPU"):
        precision(torch.device("cuda"), "int8")


def test_empty_odd_and_long_lines(copier, capsys):
    odd = ["", "   ", "\t", "cat 🐈 dog", "猫 と 犬", "a\x01b\x1b[31m red\x7f", "</s> cat <pad> <s>",
           "e\u0301 \u200b\ufeff x", "\u2028 apple \u0085 egg"]
    long = " ".join(["cat", "dog"] * 40)
    out = list(translator(copier).run(lines_in(odd + [long])))
    assert len(out) == len(odd) + 1
    assert out[:3] == ["", "", ""]
    assert all("\n" not in o and "\r" not in o for o in out)
    assert out[-1] == long  # never cut: translated in windows of the model's max_len
    err = capsys.readouterr().err
    assert "in.txt:10: a sentence of 80 tokens, longer than the model's max_len (32)" in err
    assert err.count("unknown (<unk>)") == 1  # warned once


def test_nbest_scores_and_raw_formats(copier):
    texts = ["cat dog egg", "", "moon"]
    out = "\n".join(translator(copier, nbest=3, beam_size=4).run(lines_in(texts))).split("\n")
    assert [line.split("\t")[0] for line in out] == ["0", "0", "0", "1", "2", "2", "2"]
    first = [line.split("\t") for line in out[:3]]
    assert first[0][2] == "cat dog egg"
    assert [float(f[1]) for f in first] == sorted((float(f[1]) for f in first), reverse=True)
    assert out[3] == "1\t0.0000\t"
    scored = list(translator(copier, scores=True).run(lines_in(["cat dog egg"])))[0].split("\t")
    assert len(scored) == 4 and len(scored[3].split()) == 4  # three words, then </s>
    assert float(scored[1]) == pytest.approx(sum(map(float, scored[3].split())) / length_penalty(4, 0.6), abs=1e-3)
    raw = list(translator(copier, raw=True, beam_size=1).run(lines_in(["cat dog"])))
    assert raw == ["cat dog"]  # word-level: tokens are words


# --- command line ----------------------------------------------------------------------------------------------


def test_pipeline_through_a_real_subprocess(copier, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("cat dog egg\n\nmoon sun\nfish 🐟 ✓\n", encoding="utf-8")
    cmd = [str(TFCLI), "translate", "-m", str(copier), "--threads", "1"]
    with open(src, "rb") as fin:
        res = subprocess.run(cmd, stdin=fin, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    out = res.stdout.decode("utf-8").split("\n")
    assert out[:3] == ["cat dog egg", "", "moon sun"] and len(out) == 5 and out[4] == ""
    assert "unknown (<unk>)" in res.stderr.decode()  # two of the last line's three tokens
    # files and -o: the same text, written atomically
    out_file = tmp_path / "out.txt"
    res = subprocess.run(cmd + [str(src), "-", "-o", str(out_file)], input=b"owl\n", capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode()
    assert (tmp_path / "out.txt").read_text().split("\n")[:3] == ["cat dog egg", "", "moon sun"]
    assert (tmp_path / "out.txt").read_text().endswith("owl\n")


def test_streams_a_line_before_input_ends(copier):
    """In a pipeline with --buffer-size 1, each translation comes out (flushed) while stdin is still open."""
    cmd = [str(TFCLI), "translate", "-m", str(copier), "--threads", "1", "--buffer-size", "1"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p.stdin.write(b"cat dog\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"cat dog\n"
        p.stdin.write(b"egg fish goat\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"egg fish goat\n"
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    finally:
        p.kill()


def test_cli_errors_are_one_line(copier, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["translate", "-m", str(tmp_path / "nope"), "x"])
    assert res.exit_code == 1 and "no such checkpoint" in res.output
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"cat\n\xff\xfe dog\n")
    res = runner.invoke(app, ["translate", "-m", str(copier), str(bad)])
    assert res.exit_code == 1 and f"{bad}:2: invalid UTF-8" in res.output
    res = runner.invoke(app, ["translate", "-m", str(copier), "--nbest", "9", "x"])
    assert res.exit_code == 1 and "--nbest must be between 1 and the beam size" in res.output
    res = runner.invoke(app, ["translate", "-m", str(copier), "--dtype", "fp16", "--device", "cpu", "x"])
    assert res.exit_code == 1 and "fp16 needs a CUDA device" in res.output


def test_config_file_section_and_flags(copier, tmp_path):
    conf = tmp_path / "decode.yaml"
    conf.write_text("translate:\n  beam_size: 1\n  nbest: 1\n")
    src = tmp_path / "in.txt"
    src.write_text("cat dog\n")
    res = CliRunner().invoke(app, ["translate", "-m", str(copier), "-c", str(conf), str(src)])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("0\t") and res.output.rstrip().endswith("cat dog")
    conf.write_text("translate:\n  beam_sise: 2\n")
    res = CliRunner().invoke(app, ["translate", "-m", str(copier), "-c", str(conf), str(src)])
    assert res.exit_code == 1 and "did you mean 'beam_size'" in res.output


def test_translate_function_writes_output_file(copier, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("cat\ndog egg\n")
    n = translate(str(copier), [str(src)], str(tmp_path / "o.txt"), TranslateConfig(device="cpu", dtype="bf16"))
    assert n == 2
    assert (tmp_path / "o.txt").read_text() == "cat\ndog egg\n"


def test_device_reads_in_one_copy_are_the_plain_reads():
    """Beam search reads its small per-step tensors from a GPU in one float64 copy: every float32, bool and token id
    comes back exactly as .tolist() gives it."""
    from tfcli.generate.source import to_lists as _to_lists

    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(3, 5, generator=g), torch.randint(0, 50304, (3, 5), generator=g),
               torch.rand(3, generator=g) > 0.5, torch.tensor([2, 0, 7]), torch.tensor([float("-inf"), 1e-30, 3e38])]
    assert _to_lists(*tensors, one_copy=True) == [t.tolist() for t in tensors]


@pytest.mark.parametrize("token_scores", [False, True])
def test_beam_search_reading_in_one_copy_is_the_same(monkeypatch, token_scores):
    """The whole search with the GPU's way of reading (one copy per step) on the CPU: the same hypotheses."""
    import functools

    from tfcli.generate import beam

    model, srcs = random_model(), pad(sources(12, seed=5, max_words=8))
    want = beam_search(model, srcs, beam_size=4, len_penalty=0.6, nbest=2, token_scores=token_scores)
    monkeypatch.setattr(beam, "to_lists", functools.partial(beam.to_lists, one_copy=True))
    assert beam_search(model, srcs, beam_size=4, len_penalty=0.6, nbest=2, token_scores=token_scores) == want


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("every", [1, 3, 8, 100])
def test_greedy_reads_the_device_every_n_steps_and_its_outputs_do_not_depend_on_it(every, static, copier_model,
                                                                                   monkeypatch):
    """Greedy decoding keeps its bookkeeping on the device and reads it once every N steps (plus once for the
    batch's length limit and once for the outputs, one read per tensor on the CPU): the outputs are the slow
    reference's for any N, in any sentence order, with the shrinking or the fixed-shape decoder."""
    import math

    for model in (copier_model, random_model()):
        steps = StepModel(model, static=static)
        srcs = sources(14, seed=7, max_words=9)
        reads = []
        for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
            original = getattr(torch.Tensor, name)

            def counted(t, *a, _original=original, _name=name):
                reads.append(_name)
                return _original(t, *a)

            monkeypatch.setattr(torch.Tensor, name, counted)
        calls = []
        step = StaticDecoder.step if static else IncrementalDecoder.step
        monkeypatch.setattr(StaticDecoder if static else IncrementalDecoder, "step",
                            lambda d, tok: calls.append(1) or step(d, tok))
        hyps = greedy_decode(steps, pad(srcs), check_every=every)
        monkeypatch.undo()
        n_steps = len(calls)
        assert len(reads) == 1 + math.ceil(n_steps / every) + 4, reads
        for src, h in zip(srcs, hyps):
            ref = reference_greedy(model, src)
            assert h.tokens == ref.tokens and h.score == pytest.approx(ref.score, abs=1e-4)
        order = list(range(len(srcs)))[::-1]
        again = greedy_decode(steps, pad([srcs[i] for i in order]), check_every=every)
        assert [(h.tokens, h.score) for h in again] == [(hyps[i].tokens, hyps[i].score) for i in order]


def test_sampled_lines_do_not_depend_on_how_often_the_device_is_read():
    """A sampled line's random numbers are keyed by its index and step: rows that ended run on unread until the
    next check, and take none of the others' numbers."""
    from tfcli.generate.sampling import LineSampling

    model, srcs = random_model(), sources(10, seed=2, max_words=9)
    lines = torch.arange(len(srcs))
    runs = [greedy_decode(StepModel(model, static=static), pad(srcs), sampling=LineSampling(3.0, 0, 1.0, 7),
                          lines=lines, check_every=every) for every in (1, 4) for static in (False, True)]
    for r in runs[1:]:  # (the fixed-shape decoder attends over more, masked, slots: scores round differently)
        assert [h.tokens for h in r] == [h.tokens for h in runs[0]]
        assert [h.score for h in r] == pytest.approx([h.score for h in runs[0]], abs=1e-4)
    assert len({tuple(h.tokens) for h in runs[0]}) > 1


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("every", [1, 3, 8])
def test_beam_search_reads_the_device_every_n_steps_and_its_nbest_does_not_depend_on_it(every, static,
                                                                                         copier_model, monkeypatch):
    """Beam search keeps each sentence's K best finished hypotheses, their count and its done flag on the device;
    with N > 1 the host reads it once every N steps (plus once for the batch's length limit and once per output
    tensor): the n-best lists, scores and per-token scores are the slow reference's for any N, in any order."""
    import math

    for model, alpha in ((copier_model, 0.6), (random_model(), 0.6), (random_model(), 0.0)):
        steps = StepModel(model, static=static)
        srcs = sources(12, seed=11, max_words=8)
        reads, calls = [], []
        if every > 1:
            for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
                original = getattr(torch.Tensor, name)
                monkeypatch.setattr(torch.Tensor, name,
                                    lambda t, *a, _o=original, _n=name: reads.append(_n) or _o(t, *a))
        step = StaticDecoder.step if static else IncrementalDecoder.step
        monkeypatch.setattr(StaticDecoder if static else IncrementalDecoder, "step",
                            lambda d, tok: calls.append(1) or step(d, tok))
        hyps = beam_search(steps, pad(srcs), beam_size=4, len_penalty=alpha, nbest=4, token_scores=True,
                           check_every=every)
        monkeypatch.undo()
        if every > 1:
            assert len(reads) == 1 + math.ceil(len(calls) / every) + 5, reads
        for src, h in zip(srcs, hyps):
            assert_same_nbest(h, reference_beam_search(model, src, beam_size=4, len_penalty=alpha, nbest=4))
            assert all(len(x.token_scores) in (len(x.tokens), len(x.tokens) + 1) for x in h)
        order = [5, 0, 11, 3, 8, 1, 10, 2, 9, 4, 7, 6]
        again = beam_search(steps, pad([srcs[i] for i in order]), beam_size=4, len_penalty=alpha, nbest=2,
                            check_every=every)
        for i, h in zip(order, again):
            assert [x.tokens for x in h] == [x.tokens for x in hyps[i][:2]]
            assert [x.score for x in h] == pytest.approx([x.score for x in hyps[i][:2]], abs=1e-5)


# --- continuous batching ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def references(copier_model):
    """The slow reference's n-best and greedy output of each test sentence, once per model."""
    srcs = sources(13, seed=21, max_words=9)
    models = {"copier": (copier_model, 0.6), "random": (random_model(), 0.0)}
    return srcs, {name: (model, alpha, [reference_beam_search(model, s, beam_size=3, len_penalty=alpha, nbest=3)
                                        for s in srcs], [reference_greedy(model, s) for s in srcs])
                  for name, (model, alpha) in models.items()}


@pytest.mark.parametrize("slots", [1, 4, 13])
@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("which", ["copier", "random"])
def test_continuous_batching_gives_the_slow_references_outputs(slots, every, which, references):
    """With a fixed-shape decoder of `slots` places, a finished sentence's place goes to the next sentence (at the
    next read of the device): whatever the place count, the order sentences come in (so which one joins where and
    when), and N, each gets the slow reference's n-best, scores and per-token scores, and its greedy output."""
    srcs, refs = references
    model, alpha, ref_beams, ref_greedy = refs[which]
    steps = StepModel(model, static=True)
    for order in (list(range(13)), list(range(13))[::-1], [5, 0, 11, 3, 8, 1, 12, 10, 2, 9, 4, 7, 6]):
        src = pad([srcs[i] for i in order])
        beams = beam_search(steps, src, beam_size=3, len_penalty=alpha, nbest=3, token_scores=True,
                            check_every=every, slots=slots)
        greedy = greedy_decode(steps, src, check_every=every, slots=slots)
        for i, hyps, g in zip(order, beams, greedy):
            assert_same_nbest(hyps, ref_beams[i])
            assert g.tokens == ref_greedy[i].tokens
            assert g.score == pytest.approx(ref_greedy[i].score, abs=1e-4)


def test_continuous_batching_keeps_prefixes_samples_and_min_len(copier_model):
    """Everything a sentence carries goes with it into its place: its target prefix, its sampled tokens (keyed by
    its line and its own step, not the batch's), and --min-len counted from its own start."""
    from tfcli.generate.sampling import LineSampling

    model = random_model()
    srcs = sources(9, seed=4, max_words=8)
    src = pad(srcs)
    prefix = pad([[6, 7], [], [5], [9, 4, 8], [], [7], [], [4, 4], [10]], pad_id=-1)
    lines = torch.arange(9) + 100
    for kind in ("beam", "greedy", "sampling"):
        runs = []
        for steps, slots in ((StepModel(model), None), (StepModel(model, static=True), 2),
                             (StepModel(model, static=True), 5)):
            if kind == "beam":
                out = beam_search(steps, src, beam_size=3, nbest=2, prefix=prefix, min_len=4, slots=slots)
                runs.append([[(h.tokens, h.score) for h in hs] for hs in out])
            else:
                sampling = LineSampling(2.0, 0, 1.0, 5) if kind == "sampling" else None
                out = greedy_decode(steps, src, prefix=prefix, min_len=4, sampling=sampling, lines=lines,
                                    slots=slots)
                runs.append([(h.tokens, h.score) for h in out])
        for other in runs[1:]:
            flat = lambda r: [x for item in r for x in (item if kind == "beam" else [item])]  # noqa: E731
            assert [t for t, _ in flat(other)] == [t for t, _ in flat(runs[0])]
            assert [s for _, s in flat(other)] == pytest.approx([s for _, s in flat(runs[0])], abs=1e-4)
        for p, hyp in zip(prefix.tolist(), [r[0] for r in runs[0]] if kind == "beam" else runs[0]):
            want = [w for w in p if w >= 0]
            assert hyp[0][: len(want)] == want and len(hyp[0]) >= 4


def test_fewer_slots_than_sentences_needs_the_fixed_shape_decoder():
    model = random_model()
    with pytest.raises(ValueError, match="fixed-shape decoder"):
        beam_search(StepModel(model), pad(sources(3)), slots=2)


def test_a_file_decodes_with_continuous_batching_in_one_graph_per_source_width(copier, monkeypatch):
    """With a fixed-shape decoder (a GPU's), translate groups each chunk's lines by padded source width and keeps a
    group's places full to its end: the same output, in order, and the step (what a GPU captures as a CUDA graph)
    compiles once per width for the whole file, none in the second chunk."""
    from torch._dynamo.utils import counters

    rng = random.Random(9)
    # each chunk of 24 lines: 12 of at most 16 tokens, 12 of 17 to 32 (the copier's max_len)
    texts = [words([rng.randrange(4, V) for _ in range(2 + i % 11 if i % 2 else 17 + i % 9)]) for i in range(48)]
    loaded = load(str(copier), torch.device("cpu"), "seq2seq")
    loaded.steps = StepModel(loaded.steps.model, static=True)
    fixed = Pipeline(loaded, TranslateConfig(device="cpu", beam_size=3, batch_size=4, buffer_size=24),
                       torch.device("cpu"))
    torch._dynamo.reset()
    counters.clear()
    step = torch.compile(StaticDecoder._static_step, fullgraph=True, backend="eager", dynamic=False)
    monkeypatch.setattr(StaticDecoder, "_static_step", lambda d: step(d))
    assert list(fixed.run(lines_in(texts))) == texts
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert not counters["graph_break"]
    torch._dynamo.reset()


@pytest.mark.parametrize("every", [2, 5])
def test_continuous_batching_reads_the_device_at_most_once_every_n_steps(every, monkeypatch):
    """Refilling places happens at the reads the search makes anyway: one read per N steps, one for the length
    limits, one more at most at the end (the step by which the last sentences begun are done), and one per output
    tensor."""
    import math

    model, srcs = random_model(), pad(sources(11, seed=8, max_words=8))
    steps = StepModel(model, static=True)
    for search, outputs in ((lambda: beam_search(steps, srcs, beam_size=3, nbest=2, token_scores=True,
                                                 check_every=every, slots=3), 5),
                            (lambda: greedy_decode(steps, srcs, check_every=every, slots=3), 4)):
        want = search()
        reads, calls = [], []
        for name in ("tolist", "item", "__bool__", "__int__", "__float__"):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, lambda t, *a, _o=original, _n=name: reads.append(_n) or _o(t, *a))
        step = StaticDecoder.step
        monkeypatch.setattr(StaticDecoder, "step", lambda d, tok: calls.append(1) or step(d, tok))
        got = search()
        monkeypatch.undo()
        assert got == want
        assert len(reads) <= 1 + math.ceil(len(calls) / every) + 1 + outputs, (len(reads), len(calls))


@pytest.mark.parametrize("every", [1, 3])
def test_while_sentences_wait_a_read_takes_the_flags_copied_at_the_read_before(every, monkeypatch):
    """With fixed shapes and sentences waiting for a place, each read takes the ended flags copied at the read
    before (schedule.Behind: on CUDA behind the queued steps, so that the device never waits for the host) and the
    device is read at once only when none waits or past the horizon; a finished sentence's place is refilled
    `every` steps later, and every translation is still the shrinking decoder's."""
    from tfcli.generate import schedule
    from tfcli.generate.source import SourceSearch as _SourceSearch

    model, srcs = random_model(), pad(sources(11, seed=8, max_words=8))
    want_beam = beam_search(StepModel(model), srcs, beam_size=3, nbest=2, token_scores=True)  # (shrinking)
    want_greedy = greedy_decode(StepModel(model), srcs)
    behind, at_once = [], []
    read, copy = _SourceSearch.read, schedule.Behind.read
    monkeypatch.setattr(_SourceSearch, "read", lambda self: at_once.append(len(self.sched.queue)) or read(self))
    monkeypatch.setattr(schedule.Behind, "read", lambda self: behind.append(1) or copy(self))
    steps = StepModel(model, static=True)
    for got, want in zip(beam_search(steps, srcs, beam_size=3, nbest=2, token_scores=True, check_every=every,
                                     slots=3), want_beam):
        assert_same_nbest(got, want)
    got = greedy_decode(steps, srcs, check_every=every, slots=3)
    assert [h.tokens for h in got] == [h.tokens for h in want_greedy]
    assert len(behind) >= 8 // every  # (eight sentences wait for a place at first, each search)
    assert at_once.count(0) >= len(at_once) // 2  # the reads at once: mostly with none waiting


def test_a_fixed_shape_search_step_traces_into_one_graph(monkeypatch):
    """On CUDA the whole search step (the decoder's and the search's own work) is captured as one CUDA graph
    (schedule.StepGraph, from search_graph), which no read of the device, no host-side value and no new shape may interrupt. Dynamo's
    tracing checks the same here: the beam and greedy steps a capture would hold trace into one graph without a
    break, and running them so changes no output."""
    from tfcli.generate import source as search

    reports = []

    class Traced:  # in place of the StepGraph: the step that would be captured is traced (and run) by Dynamo
        def __init__(self, decoder):
            self.calls = 0

        def __call__(self, step, capture):
            if capture and self.calls == 1:
                reports.append(torch._dynamo.explain(step)())
            else:
                step()
            self.calls += capture

    from tfcli.generate.sampling import LineSampling

    model, src = random_model(), pad(sources(9, seed=1, max_words=8))
    prefix = pad([[6, 7], [], [5], [9, 4, 8], [], [7], [], [4], []], pad_id=-1)
    runs = (lambda: beam_search(StepModel(model, static=True), src, beam_size=3, nbest=2, token_scores=True,
                                check_every=3, slots=3),
            lambda: beam_search(StepModel(model, static=True), src, beam_size=3, prefix=prefix, min_len=3,
                                check_every=3, slots=3),
            lambda: greedy_decode(StepModel(model, static=True), src, check_every=3, slots=3),
            lambda: greedy_decode(StepModel(model, static=True), src, sampling=LineSampling(2.0, 10, 0.9, 3),
                                  lines=torch.arange(9), prefix=prefix, min_len=3, check_every=3, slots=3))
    want = [run() for run in runs]
    torch._dynamo.reset()
    monkeypatch.setattr(search, "search_graph", Traced)
    assert [run() for run in runs] == want
    assert [(r.graph_count, r.graph_break_count) for r in reports] == [(1, 0)] * 4
    torch._dynamo.reset()


def test_many_empty_translations_are_said_once_with_the_flag_that_forbids_them(tmp_path):
    """A model whose best output is </s> at once gives empty lines: said once on stderr, with --min-len; with
    --min-len 1 the outputs have words and nothing is said."""
    from helpers import WORDS, copy_model, save_model, save_word_tokenizer
    from tfcli.specials import EOS_ID

    model = copy_model(n_words=len(WORDS), max_len=32)
    V = 4 + len(WORDS)
    with torch.no_grad():
        model.parts().lm_head.weight[EOS_ID, V : V + 32] += 100.0  # </s> first at every position
    ckpt = save_model(tmp_path / "eos", model, save_word_tokenizer(tmp_path / "tok", WORDS))
    text = " ".join(WORDS[:3]) + "\n" + WORDS[4] + "\n\n"
    r = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "--device", "cpu"], input=text)
    assert r.exit_code == 0 and r.stdout == "\n\n\n"
    warnings = [line for line in r.stderr.splitlines() if "empty" in line]
    assert len(warnings) == 1 and "2 of 2 translation(s) are empty" in warnings[0] and "--min-len 1" in warnings[0]
    r = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "--device", "cpu", "--min-len", "1"], input=text)
    assert r.exit_code == 0 and all(r.stdout.splitlines()[:2]) and "empty" not in r.stderr


def test_best_next_says_when_a_rows_logits_hold_nan():
    """rows.c's best_next chooses nothing from a row holding NaN or +inf (anywhere: a full block, the last partial
    block, a banned id) and says so (NotANumber); -inf and finite rows are chosen from as ever."""
    from tfcli.errors import NotANumber
    from tfcli.generate import native

    if native.fp32_kernel() is None:
        pytest.skip("rows.c's kernels do not run here")
    torch.manual_seed(0)
    ban = torch.tensor([0, 1], dtype=torch.long)
    x = torch.randn(3, 21)
    x[1, :5] = float("-inf")
    assert native.best_next(x.clone(), ban, None, 2, 3)[1].tolist() == x[:, 2:].topk(3).indices.add(2).tolist()
    for at in (3, 20, 1):
        for bad in (float("nan"), float("inf")):  # (+inf: its log-softmax is NaN, the normaliser written out or not)
            y = x.clone()
            y[2, at] = bad
            for normalise in (True, False):
                with pytest.raises(NotANumber, match="not numbers"):
                    native.best_next(y.clone(), ban, None, 2, 3, normalise)
