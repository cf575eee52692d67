"""`tfcli eval`: sacrebleu scores that agree with the sacrebleu command line, significance tests, and
teacher-forced perplexity of checkpoints checked against a direct forward pass."""

import dataclasses
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from helpers import make_mono_prepared, make_parallel_prepared, train_tiny_checkpoint

from tfcli import checkpoint
from tfcli.cli import app
from tfcli.data.batching import lm_stream
from tfcli.data.prepared import PreparedData
from tfcli.errors import CheckpointError, TfcliError
from tfcli.evaluate.config import PerplexityConfig
from tfcli.evaluate.perplexity import evaluate_checkpoint, lm_windows
from tfcli.model.config import preset
from tfcli.specials import BOS_ID, EOS_ID
from tfcli.model.transformer import build_model

runner = CliRunner()


def tfcli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def sacrebleu_cli(*args) -> str:
    """Run the real sacrebleu command line (the reference implementation we must agree with)."""
    out = subprocess.run(
        [sys.executable, "-m", "sacrebleu", *map(str, args), "-q"],
        capture_output=True, text=True, check=True, env={**os.environ, "NO_COLOR": "1"},
    )
    return out.stdout


def write(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def perturb(lines, every=3, seed=0):
    """A plausible system output: every `every`-th line's words shuffled (deterministically)."""
    rng = random.Random(seed)
    out = []
    for i, line in enumerate(lines):
        words = line.split()
        if i % every == every - 1:
            rng.shuffle(words)
        out.append(" ".join(words))
    return out


REFS = [
    "The cat sat on the mat.",
    "A man is riding a bicycle down the street.",
    "Two children play in the park, laughing loudly!",
    "She reads a book under the old tree.",
    "Dogs run across the green field at noon.",
    "The market is crowded on Saturday mornings.",
    "He's cooking dinner for his family tonight.",
    "Bright lights shine over the city at night.",
]
HYPS = [
    "The cat sat on a mat.",
    "A man rides a bike down the street.",
    "Two kids play in the park, laughing.",
    "She is reading a book under an old tree.",
    "dogs run across the GREEN field at noon .",
    "The market is busy on Saturday morning.",
    "He cooks dinner for his family tonight.",
    "Bright lights shine over the town at night.",
]


@pytest.fixture
def text_files(tmp_path):
    ref = write(tmp_path / "ref.en", REFS)
    ref2 = write(tmp_path / "ref2.en", perturb(REFS, every=2, seed=1))
    hyp = write(tmp_path / "hyp.en", HYPS)
    hyp2 = write(tmp_path / "hyp2.en", perturb(HYPS, every=2, seed=3))
    return ref, ref2, hyp, hyp2


def cli_json(*args, input=None) -> dict:
    r = tfcli("eval", *args, "--json", input=input)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def assert_agrees(ours: dict, theirs: list, width=4):
    """Our full-precision scores, rounded as sacrebleu rounds, and our signatures equal the sacrebleu CLI's."""
    system = ours["systems"][0]["scores"]
    assert [t["name"] for t in theirs] == list(system)
    for t in theirs:
        assert round(system[t["name"]]["score"], width) == t["score"], t["name"]
        assert ours["signatures"][t["name"]] == t["signature"]
        if t["name"] == "BLEU":
            assert system["BLEU"]["verbose_score"] == t["verbose_score"]


# --- text scoring ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ([], []),
        (["--tokenize", "intl"], ["-tok", "intl"]),
        (["--tokenize", "char"], ["-tok", "char"]),
        (["--tokenize", "none", "--lowercase"], ["-tok", "none", "-lc", "--chrf-lowercase"]),
        (["--chrf-word-order", "2", "--ter-case-sensitive"], ["--chrf-word-order", "2", "--ter-case-sensitive"]),
    ],
)
def test_scores_and_signatures_agree_with_sacrebleu_cli(text_files, ours, theirs):
    ref, _, hyp, _ = text_files
    mine = cli_json(hyp, "-r", ref, *ours)
    assert_agrees(mine, json.loads(sacrebleu_cli(ref, "-i", hyp, "-m", "bleu", "chrf", "ter", "-w", "4", *theirs)))


def test_options_change_the_signature(text_files):
    ref, _, hyp, _ = text_files
    sig = cli_json(hyp, "-r", ref, "--tokenize", "intl", "--lowercase", "--chrf-word-order", "2")["signatures"]
    assert "tok:intl" in sig["BLEU"] and "case:lc" in sig["BLEU"]
    assert "nw:2" in sig["chrF2++"] and "case:lc" in sig["chrF2++"]
    scores = cli_json(hyp, "-r", ref, "--metrics", "bleu")["systems"][0]["scores"]
    lower = cli_json(hyp, "-r", ref, "--metrics", "bleu", "--lowercase")["systems"][0]["scores"]
    assert lower["BLEU"]["score"] > scores["BLEU"]["score"]  # "dogs"/"GREEN" match once case is ignored


def test_multiple_references_agree_with_sacrebleu_cli(text_files):
    ref, ref2, hyp, _ = text_files
    mine = cli_json(hyp, "-r", ref, "-r", ref2)
    assert_agrees(mine, json.loads(sacrebleu_cli(ref, ref2, "-i", hyp, "-m", "bleu", "chrf", "ter", "-w", "4")))
    assert mine["signatures"]["BLEU"].startswith("nrefs:2|")


def test_plain_text_output(text_files):
    ref, _, hyp, _ = text_files
    r = tfcli("eval", hyp, "-r", ref)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert re.match(r"BLEU\s+= \d+\.\d\d \d+\.\d/", lines[0])
    assert re.match(r"chrF2\s+= \d+\.\d\d$", lines[1]) and re.match(r"TER\s+= \d+\.\d\d$", lines[2])
    assert any("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2." in line for line in lines)
    only = tfcli("eval", hyp, "-r", ref, "--score-only", "-w", "1").stdout.split()
    assert len(only) == 3 and all(re.fullmatch(r"\d+\.\d", s) for s in only)


def test_hypotheses_from_stdin(text_files):
    ref, _, hyp, _ = text_files
    from_file = cli_json(hyp, "-r", ref)["systems"][0]["scores"]
    stdin = hyp.read_text()
    for args in (["-"], []):
        got = cli_json(*args, "-r", ref, input=stdin)["systems"][0]
        assert got["name"] == "<stdin>" and got["scores"] == from_file


def test_trailing_whitespace_is_ignored_like_sacrebleu(text_files, tmp_path):
    ref, _, hyp, _ = text_files
    crlf = tmp_path / "crlf.en"
    crlf.write_bytes("".join(h + "  \r\n" for h in HYPS).encode())
    assert cli_json(crlf, "-r", ref)["systems"][0]["scores"] == cli_json(hyp, "-r", ref)["systems"][0]["scores"]


def test_mismatched_line_counts_name_both_files(text_files, tmp_path):
    ref, _, hyp, _ = text_files
    short = write(tmp_path / "short.en", HYPS[:5])
    r = tfcli("eval", short, "-r", ref)
    assert r.exit_code == 1
    assert f"{short} has 5 lines" in r.stderr and f"{ref} has 8" in r.stderr
    r = tfcli("eval", hyp, "-r", ref, "-r", short)
    assert r.exit_code == 1 and "short.en has 5 lines" in r.stderr
    r = tfcli("eval", "-r", ref, input="one line\n")
    assert r.exit_code == 1 and "<stdin> has 1 lines" in r.stderr


def test_usage_errors(text_files, tmp_path):
    ref, _, hyp, hyp2 = text_files
    assert tfcli("eval", hyp).exit_code == 2  # no reference
    r = tfcli("eval", hyp, "-r", ref, "--metrics", "bleu,meteor")  # a flag's value outside its choices: usage
    assert r.exit_code == 2 and "--metrics meteor: unknown; choose from bleu, chrf, ter" in r.stderr
    r = tfcli("eval", hyp, "-r", ref, "--tokenize", "moses")
    assert r.exit_code == 2 and "--tokenize moses: unknown; choose from" in r.stderr
    r = tfcli("eval", hyp, "-r", ref, "--paired-bs")
    assert r.exit_code == 1 and "at least two systems" in r.stderr
    assert tfcli("eval", hyp, hyp2, "-r", ref, "--paired-bs", "--paired-ar").exit_code == 2
    r = tfcli("eval", tmp_path / "missing.en", "-r", ref)
    assert r.exit_code == 1 and "missing.en: no such file" in r.stderr
    r = tfcli("eval", hyp, hyp, "-r", ref)
    assert r.exit_code == 1 and "given twice as a hypothesis" in r.stderr
    r = tfcli("eval", hyp, "-r", ref, "-r", ref)
    assert r.exit_code == 1 and "given twice as a reference" in r.stderr
    assert tfcli("eval", hyp, "-r", ref, "-o", tmp_path / "out.txt").exit_code == 2  # -o is for --translate


def test_several_systems_table(text_files):
    ref, _, hyp, hyp2 = text_files
    r = tfcli("eval", hyp, hyp2, "-r", ref, "--metrics", "bleu,chrf")
    assert r.exit_code == 0, r.output
    one = cli_json(hyp, "-r", ref, "--metrics", "bleu,chrf")["systems"][0]["scores"]
    two = cli_json(hyp2, "-r", ref, "--metrics", "bleu,chrf")["systems"][0]["scores"]
    rows = {line.split("|")[1].strip(): line for line in r.stdout.splitlines() if "hyp" in line and "|" in line}
    assert f"{one['BLEU']['score']:.2f}" in rows[str(hyp)] and f"{two['chrF2']['score']:.2f}" in rows[str(hyp2)]
    assert "Signatures:" in r.stdout


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_paired_significance_agrees_with_sacrebleu_cli(text_files, test):
    ref, _, hyp, hyp2 = text_files
    n = "200" if test == "bs" else "500"
    mine = cli_json(hyp, hyp2, "-r", ref, f"--paired-{test}", "--n-samples", n)
    flag = ["--paired-bs", "--paired-bs-n", n] if test == "bs" else ["--paired-ar", "--paired-ar-n", n]
    table = sacrebleu_cli(ref, "-i", hyp, hyp2, "-m", "bleu", "chrf", "ter", *flag, "-f", "text", "-w", "4")
    theirs = [float(p) for p in re.findall(r"\(p = ([0-9.]+)\)", table)]
    base, system = mine["systems"]
    assert base["baseline"] and "p_value" not in base["scores"]["BLEU"]
    ours = [system["scores"][m]["p_value"] for m in ("BLEU", "chrF2", "TER")]
    assert theirs == [round(p, 4) for p in ours]
    assert mine["significance"] == {"test": f"paired-{test}", "n_samples": int(n), "seed": "12345", "baseline": str(hyp)}
    assert f"{test}:{n}|seed:12345|" in mine["signatures"]["BLEU"]
    if test == "bs":  # bootstrap means and 95% CIs as sacrebleu prints them
        mean, ci = system["scores"]["BLEU"]["bootstrap_mean"], system["scores"]["BLEU"]["bootstrap_ci95"]
        assert f"({mean:.4f} ± {ci:.4f})" in table


def test_baseline_option_puts_the_baseline_first(text_files):
    ref, _, hyp, hyp2 = text_files
    mine = cli_json(hyp, hyp2, "-r", ref, "--paired-ar", "--n-samples", "100", "--baseline", hyp2, "--metrics", "bleu")
    assert [s["name"] for s in mine["systems"]] == [str(hyp2), str(hyp)]
    assert mine["systems"][0]["baseline"] and "p_value" in mine["systems"][1]["scores"]["BLEU"]
    r = tfcli("eval", hyp, hyp2, "-r", ref, "--paired-ar", "--n-samples", "100", "--metrics", "bleu")
    assert r.exit_code == 0 and f"Baseline: {hyp}" in r.stdout and "(p = " in r.stdout


@pytest.mark.shared_data
@pytest.mark.parametrize(
    "metrics, ours, theirs",
    [
        # TER on shuffled words is slow (shift search): once, with the defaults
        pytest.param(["bleu", "chrf", "ter"], [], [], marks=pytest.mark.slow),
        (["bleu", "chrf"], ["--tokenize", "intl"], ["-tok", "intl"]),
        (["bleu", "chrf"], ["--lowercase"], ["-lc", "--chrf-lowercase"]),
        (["bleu", "chrf"], ["--chrf-word-order", "2"], ["--chrf-word-order", "2"]),
    ],
)
def test_multi30k_agrees_with_sacrebleu_cli(shared_data, tmp_path, metrics, ours, theirs):
    ref = shared_data / "multi30k" / "valid.en"
    hyp = write(tmp_path / "hyp.en", perturb(ref.read_text(encoding="utf-8").splitlines()))
    mine = cli_json(hyp, "-r", ref, "--metrics", ",".join(metrics), *ours)
    assert_agrees(mine, json.loads(sacrebleu_cli(ref, "-i", hyp, "-m", *metrics, "-w", "4", *theirs)))
    assert 0 < mine["systems"][0]["scores"]["BLEU"]["score"] < 100


# --- model scoring ---------------------------------------------------------------------------------------------


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def encode(tok_file: Path, lines):
    from tokenizers import Tokenizer

    return [e.ids for e in Tokenizer.from_file(str(tok_file)).encode_batch(lines)]


def tiny_checkpoint(path: Path, prep: Path, kind: str, max_len=64) -> Path:
    """An untrained tiny model with the prepared directory's tokenizer(s), saved with tfcli.checkpoint (the scoring
    arithmetic is what is tested, so no training is needed)."""
    data = PreparedData(prep)
    V = data.vocab_size("tgt")
    if kind == "lm":
        cfg = preset("lm-toy", tgt_vocab_size=V, max_len=max_len)
    else:
        cfg = preset("toy", src_vocab_size=V, tgt_vocab_size=V, max_len=max_len)
    torch.manual_seed(1)
    model = build_model(cfg)
    for p in model.parameters():  # larger than the init, so that the predictions are far from uniform
        p.data.mul_(1.5)
    checkpoint.save(path, model, {"model": dataclasses.asdict(cfg)}, data.tokenizer_files())
    return path


@pytest.fixture
def lm_setup(tmp_path):
    prep = make_mono_prepared(tmp_path / "lm-prep", n_train=0, n_valid=0, n_test=40)
    return tiny_checkpoint(tmp_path / "lm-ckpt", prep, "lm"), prep


@pytest.fixture
def mt_setup(tmp_path):
    prep = make_parallel_prepared(tmp_path / "mt-prep", n_train=0, n_valid=30, n_test=0)
    return tiny_checkpoint(tmp_path / "mt-ckpt", prep, "seq2seq"), prep


def test_seq2seq_perplexity_equals_a_direct_forward(mt_setup):
    ckpt, prep = mt_setup
    tok = prep / "tokenizer.tgt.json"
    src, tgt = lines_of(prep / "valid.src.txt"), lines_of(prep / "valid.tgt.txt")
    model, _ = checkpoint.load(ckpt)
    nll, n = 0.0, 0
    with torch.no_grad():
        for x, y in zip(encode(tok, src), encode(tok, tgt)):  # one pair at a time: no padding, no batching
            logits = model(torch.tensor([x + [EOS_ID]]), torch.tensor([[BOS_ID] + y]))
            nll += F.cross_entropy(logits[0], torch.tensor(y + [EOS_ID]), reduction="sum").item()
            n += len(y) + 1
    # a small --max-tokens: several padded batches
    r = evaluate_checkpoint(ckpt, prep, PerplexityConfig(split="valid", max_tokens=40, device="cpu"))
    assert r.kind == "seq2seq" and r.sequences == 30 and r.tokens == n
    assert r.loss == pytest.approx(nll / n, rel=1e-5)
    assert r.ppl == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert r.ppl > 5  # an untrained model is far from perfect
    words = sum(len(t.split()) for t in tgt) + len(tgt)  # + one </s> per line
    assert r.words == words and r.word_ppl == pytest.approx(math.exp(nll / words), rel=1e-5)


def test_lm_stream_perplexity_equals_a_direct_forward(tmp_path):
    prep = make_mono_prepared(tmp_path / "prep", n_train=0, n_valid=0, n_test=12)
    ckpt = tiny_checkpoint(tmp_path / "ckpt", prep, "lm", max_len=256)
    lines = lines_of(prep / "test.tgt.txt")
    stream = [EOS_ID] + [t for ids in encode(prep / "tokenizer.tgt.json", lines) for t in ids + [EOS_ID]]
    assert len(stream) <= 256  # one window holds the whole stream
    model, _ = checkpoint.load(ckpt)
    with torch.no_grad():
        logits = model(torch.tensor([stream[:-1]]))
        nll = F.cross_entropy(logits[0], torch.tensor(stream[1:]), reduction="sum").item()
    r = evaluate_checkpoint(ckpt, prep, PerplexityConfig(device="cpu"))
    assert r.kind == "lm" and r.tokens == len(stream) - 1
    assert r.ppl == pytest.approx(math.exp(nll / (len(stream) - 1)), rel=1e-5)
    n_words = sum(len(line.split()) for line in lines) + len(lines)
    assert r.words == n_words and r.word_ppl == pytest.approx(math.exp(nll / n_words), rel=1e-5)
    r = evaluate_checkpoint(ckpt, prep, PerplexityConfig(device="cpu", words=1000))
    assert r.words == 1000 and r.word_ppl == pytest.approx(math.exp(nll / 1000), rel=1e-5)


def test_lm_windows_match_hand_computed_chunks(lm_setup):
    ckpt, prep = lm_setup
    model, _ = checkpoint.load(ckpt)
    seqs = PreparedData(prep).sequences("test", "tgt")
    stream = torch.tensor(lm_stream(np.asarray(seqs.flat, dtype=np.int64), seqs.offsets))
    assert stream[0] == EOS_ID and (stream == EOS_ID).sum() == 40 + 1
    W = 16
    nll, n = 0.0, 0
    with torch.no_grad():
        for b in range(0, len(stream) - 1, W):  # consecutive, non-overlapping windows
            y = stream[b + 1 : b + W + 1]
            x = stream[b : b + len(y)]
            nll += F.cross_entropy(model(x[None])[0], y, reduction="sum").item()
            n += len(y)
    r = evaluate_checkpoint(ckpt, prep, PerplexityConfig(window=W, max_tokens=50, device="cpu"))
    assert (r.tokens, r.window, r.stride) == (n, W, W)
    assert r.loss == pytest.approx(nll / n, rel=1e-5)
    # a sliding window scores the same tokens, each with more context: another loss
    slide = evaluate_checkpoint(ckpt, prep, PerplexityConfig(window=W, stride=4, device="cpu"))
    assert slide.tokens == n and slide.loss != pytest.approx(r.loss, rel=1e-4)


@pytest.mark.parametrize("window, stride", [(8, 8), (8, 3), (8, 1), (5, 2), (100, 7)])
def test_sliding_windows_score_every_token_once_with_enough_context(window, stride):
    n_targets = 37
    seen = []
    for begin, end, n_new in lm_windows(n_targets, window, stride):
        assert 0 < end - begin <= window and 0 < n_new <= end - begin
        first = end - n_new  # input position of the first newly scored target
        if begin > 0:
            assert first - begin >= window - stride  # context before the first newly scored token
        seen += range(first, end)
    assert seen == list(range(n_targets))


def test_tokenizer_mismatch_is_an_error(tmp_path, lm_setup):
    ckpt, _ = lm_setup
    other = make_mono_prepared(tmp_path / "other-prep", n_train=0, n_valid=0, n_test=10, n_words=31)
    with pytest.raises(CheckpointError, match="tokenizer mismatch"):
        evaluate_checkpoint(ckpt, other, PerplexityConfig(device="cpu"))
    r = tfcli("eval", "--model", ckpt, "--data", other)
    assert r.exit_code == 1 and "tokenizer mismatch" in r.stderr and "other-prep/tokenizer.tgt.json" in r.stderr


def test_same_vocabulary_in_another_file_is_accepted(lm_setup):
    ckpt, prep = lm_setup
    compact = json.dumps(json.loads((prep / "tokenizer.tgt.json").read_text()))  # other bytes, same tokenizer
    (prep / "tokenizer.tgt.json").write_text(compact)
    assert evaluate_checkpoint(ckpt, prep, PerplexityConfig(device="cpu")).tokens > 0


def test_wrong_data_kind_split_or_window(mt_setup, lm_setup):
    mt_ckpt, _ = mt_setup
    lm_ckpt, lm_prep = lm_setup
    with pytest.raises(TfcliError, match="translation model; it needs parallel data"):
        evaluate_checkpoint(mt_ckpt, lm_prep, PerplexityConfig(device="cpu"))
    with pytest.raises(TfcliError, match="has no 'valid' split"):
        evaluate_checkpoint(lm_ckpt, lm_prep, PerplexityConfig(split="valid", device="cpu"))
    with pytest.raises(TfcliError, match="longer than the model's context"):
        evaluate_checkpoint(lm_ckpt, lm_prep, PerplexityConfig(window=1000, device="cpu"))
    with pytest.raises(TfcliError, match="longer than the window"):
        evaluate_checkpoint(lm_ckpt, lm_prep, PerplexityConfig(window=8, stride=9, device="cpu"))


def test_seq2seq_pairs_longer_than_max_len_are_counted(tmp_path):
    prep = make_parallel_prepared(tmp_path / "prep", n_train=0, n_valid=0, n_test=20, min_len=5, max_len=30)
    ckpt = tiny_checkpoint(tmp_path / "ckpt", prep, "seq2seq", max_len=20)
    lengths = [len(t.split()) for t in lines_of(prep / "test.tgt.txt")]  # reverse task: source as long
    r = evaluate_checkpoint(ckpt, prep, PerplexityConfig(device="cpu"))
    assert r.truncated == sum(n + 1 > 20 for n in lengths) > 0
    assert r.tokens == sum(min(n + 1, 20) for n in lengths)  # y_1 .. y_19 </s> of a cut target
    assert "cut" in r.format()


def test_model_scoring_cli(lm_setup):
    ckpt, prep = lm_setup
    r = tfcli("eval", "--model", ckpt, "--data", prep, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    direct = evaluate_checkpoint(ckpt, prep, PerplexityConfig(device="cpu"))
    assert out["ppl"] == pytest.approx(direct.ppl) and out["tokens"] == direct.tokens
    assert out["word_ppl"] == pytest.approx(math.exp(out["nll"] / out["words"]))
    text = tfcli("eval", "--model", ckpt, "--data", prep).stdout
    assert f"ppl  = {direct.ppl:.2f} per token" in text and "per word" in text
    assert tfcli("eval", "--model", ckpt).exit_code == 2  # neither --data nor --translate
    assert tfcli("eval", "--data", prep).exit_code == 2  # no --model


# --- translate and score -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_translate_and_score_equals_translate_then_eval(tmp_path):
    run_dir = train_tiny_checkpoint(tmp_path, kind="parallel", task="copy")
    prep = tmp_path / "prep"
    src, ref = prep / "test.src.txt", prep / "test.tgt.txt"
    hyp = tmp_path / "hyp.txt"
    r = tfcli("eval", "--model", run_dir, "--translate", src, "-r", ref, "--beam-size", "2", "-o", hyp, "--json")
    assert r.exit_code == 0, r.output
    one_step = json.loads(r.stdout)
    # the same, in two steps: tfcli translate, then tfcli eval on its output
    two = tmp_path / "two.txt"
    assert tfcli("translate", "-m", run_dir, src, "-o", two, "--beam-size", "2").exit_code == 0
    assert hyp.read_text() == two.read_text()
    two_step = cli_json(two, "-r", ref)
    assert one_step["systems"][0]["scores"] == two_step["systems"][0]["scores"]
    # --split-sentences as translate takes it
    split, three = tmp_path / "split.txt", tmp_path / "three.txt"
    assert tfcli("eval", "--model", run_dir, "--translate", src, "-r", ref, "--split-sentences", "always", "-o",
                 split).exit_code == 0
    assert tfcli("translate", "-m", run_dir, src, "-o", three, "--split-sentences", "always").exit_code == 0
    assert split.read_text() == three.read_text()
    r = tfcli("eval", "--model", run_dir, "--translate", src, "-r", ref, "--split-sentences", "often")
    assert r.exit_code == 2 and "--split-sentences" in r.stderr
    # line counts are checked before translating
    short = write(tmp_path / "short.txt", lines_of(src)[:3])
    r = tfcli("eval", "--model", run_dir, "--translate", short, "-r", ref)
    assert r.exit_code == 1 and "short.txt has 3 lines" in r.stderr
    r = tfcli("eval", "--translate", src, "-r", ref)
    assert r.exit_code == 2  # no --model
