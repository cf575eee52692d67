"""What a new user hit, fixed as kinds of failure: input that is not UTF-8 (strict by default, --encoding-errors
replace keeps every line), flags a mode does not use (refused by name, never ignored), defaults that fit together
(average-checkpoints averages what training keeps), import's checks of a Hugging Face directory, and a Ctrl-C after
a command has finished."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import WORDS, save_copier, save_counter, train_tiny_checkpoint
from tfcli.cli import app
from tfcli.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def cli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_error(result, *fragments, code=1):
    assert result.exit_code == code, (result.exit_code, result.stderr, result.exception)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for f in fragments:
        assert f in lines[0], (f, result.stderr)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return save_copier(d, WORDS), save_counter(d, WORDS)


# --- input that is not UTF-8 -----------------------------------------------------------------------------------

BAD = b"cat dog\nmoon \xff sun\n\xc3\x28 tree\nowl\n"  # lines 2 and 3 hold invalid bytes


def test_translate_is_strict_by_default_and_replace_keeps_every_line(models, tmp_path):
    copier, _ = models
    src = tmp_path / "in.txt"
    src.write_bytes(BAD)
    out = tmp_path / "out.txt"
    r = cli("translate", "-m", copier, src, "-o", out)
    one_error(r, f"{src}:2: invalid UTF-8 (byte 0xff at column 6)", "--encoding-errors replace")
    assert not out.exists()
    for spelling in (["--encoding-errors", "replace"], ["--encoding-errors=replace"]):
        r = cli("translate", "-m", copier, src, "-o", out, *spelling)
        assert r.exit_code == 0, r.stderr
        lines = out.read_text(encoding="utf-8").split("\n")[:-1]
        # the line count holds; U+FFFD is no word of the copier's, so it becomes <unk>, the rest is copied
        assert len(lines) == 4 and lines[0] == "cat dog" and lines[3] == "owl"
        assert "moon" in lines[1] and "sun" in lines[1] and "tree" in lines[2]
        assert "warning: " + str(src) + ": 2 line(s) with invalid UTF-8" in r.stderr and "first: line 2" in r.stderr
    # stdin too
    r = runner.invoke(app, ["translate", "-m", str(copier), "--encoding-errors", "replace"], input=BAD)
    assert r.exit_code == 0 and len(r.stdout.split("\n")[:-1]) == 4
    r = cli("translate", "-m", copier, src, "--encoding-errors", "ignore")
    assert r.exit_code == 2 and "strict" in r.stderr and "replace" in r.stderr  # a usage error


def test_lm_generate_is_strict_by_default_and_replace_keeps_every_prompt(models, tmp_path):
    _, counter = models
    src = tmp_path / "prompts.txt"
    src.write_bytes(BAD)
    r = cli("lm-generate", "-m", counter, "-i", src, "--greedy", "--max-new-tokens", "2")
    one_error(r, f"{src}:2: invalid UTF-8 (byte 0xff at column 6)", "--encoding-errors replace")
    r = cli("lm-generate", "-m", counter, "-i", src, "--greedy", "--max-new-tokens", "2", "--encoding-errors", "replace")
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.split("\n")[:-1]
    assert len(lines) == 4 and lines[0].startswith("cat dog") and lines[1].startswith("moon \ufffd sun")
    assert "2 line(s) with invalid UTF-8" in r.stderr


def test_attention_is_strict_by_default_and_replace_draws_every_sentence(models, tmp_path):
    copier, _ = models
    src = tmp_path / "in.txt"
    src.write_bytes(BAD)
    out = tmp_path / "pictures"
    r = cli("attention", "-m", copier, "-i", src, "-o", out, "--no-png")
    one_error(r, f"{src}:2: invalid UTF-8 (byte 0xff at column 6)", "--encoding-errors replace")
    assert not out.exists()
    r = cli("attention", "-m", copier, "-i", src, "-o", out, "--no-png", "--encoding-errors", "replace")
    assert r.exit_code == 0, r.stderr
    assert (out / "attention.html").exists() and "2 line(s) with invalid UTF-8" in r.stderr
    r = cli("attention", "-m", copier, "-i", src, "-o", out, "--encoding-errors", "ignore")
    assert r.exit_code == 2 and "replace" in r.stderr


def test_eval_is_strict_by_default_and_replace_scores_every_line(models, tmp_path):
    copier, _ = models
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_bytes(BAD)
    ref.write_bytes(b"cat dog\nmoon ? sun\n? tree\nowl\n")
    one_error(cli("eval", hyp, "-r", ref), f"{hyp}:2: invalid UTF-8", "--encoding-errors replace")
    r = cli("eval", hyp, "-r", ref, "--metrics", "bleu", "--json", "--encoding-errors", "replace")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["systems"][0]["lines"] == 4
    one_error(cli("eval", "-m", copier, "--translate", ref, "-r", hyp), f"{hyp}:2: invalid UTF-8")
    r = cli("eval", "-m", copier, "--translate", hyp, "-r", ref, "--encoding-errors", "replace", "--metrics", "bleu")
    assert r.exit_code == 0, r.stderr


def test_prepare_is_strict_by_default_and_replace_keeps_every_row(tmp_path):
    src, tgt = tmp_path / "train.xx", tmp_path / "train.yy"
    src.write_bytes(BAD * 5)
    tgt.write_bytes(b"a b\nc d\ne f\ng h\n" * 5)
    args = ["prepare", "--src", src, "--tgt", tgt, "--tokenizer", "char", "--max-ratio", "0"]
    one_error(cli(*args, "-o", tmp_path / "strict"), f"{src}:2: invalid UTF-8", "--encoding-errors replace")
    assert not (tmp_path / "strict").exists()
    r = cli(*args, "-o", tmp_path / "prep", "--encoding-errors", "replace")
    assert r.exit_code == 0, r.stderr
    meta = json.loads((tmp_path / "prep" / "meta.json").read_text())
    assert meta["cleaning"]["train"]["kept"] == 20
    vocab = (tmp_path / "prep" / "tokenizer.src.json").read_text(encoding="utf-8")
    assert "\ufffd" in vocab or "\\ufffd" in vocab  # U+FFFD is a character of the corpus now


# --- flags a mode does not use ----------------------------------------------------------------------------------


def test_a_flag_the_mode_does_not_use_is_refused_by_name(models, tmp_path):
    copier, counter = models
    (tmp_path / "h.txt").write_text("cat\n")
    (tmp_path / "prep").mkdir()
    cases = [
        (("eval", "-m", copier, "--data", tmp_path / "prep", "--dtype", "int8"), "--dtype is not used by perplexity"),
        (("eval", "-m", copier, "--data", tmp_path / "prep", "--beam-size", "4"), "--beam-size is not used by"),
        (("eval", "-m", copier, "--data", tmp_path / "prep", "--tokenize", "intl"), "--tokenize is not used by"),
        (("eval", tmp_path / "h.txt", "-r", tmp_path / "h.txt", "--dtype", "bf16"), "--dtype is for --translate"),
        (("eval", tmp_path / "h.txt", "-r", tmp_path / "h.txt", "--window", "8"), "--window is for perplexity"),
        (("eval", tmp_path / "h.txt", "-r", tmp_path / "h.txt", "--device", "cpu"), "--device is for --translate"),
        (("eval", "-m", copier, "--translate", tmp_path / "h.txt", "-r", tmp_path / "h.txt", "--stride", "2"),
         "--stride is for perplexity"),
        (("translate", "-m", copier, "--greedy", "--beam-size", "4"), "--beam-size is not used with --greedy"),
        (("lm-generate", "-m", counter, "--greedy", "--top-p", "0.9", "cat"), "--top-p is not used with --greedy"),
        (("lm-generate", "-m", counter, "--greedy", "--seed", "3", "cat"), "--seed is not used with --greedy"),
        (("lm-generate", "-m", counter, "--ignore-eos", "--min-new-tokens", "3", "cat"),
         "--min-new-tokens is not used with --ignore-eos"),
        (("plot", tmp_path, "--terminal", "--title", "x"), "--title is the figure's title"),
        (("attention", "-m", copier, "cat", "--no-png", "--layers", "1"), "--layers picks the layers of the PNGs"),
        (("average-checkpoints", "--checkpoint", copier, "--last", "2", "-o", tmp_path / "a"),
         "--last counts a RUN's checkpoints"),
    ]
    for args, message in cases:
        one_error(cli(*args), message, code=2)
    # what the mode uses is still fine, and --greedy with --beam-size 1 says the same thing twice
    assert cli("translate", "-m", copier, "--greedy", "--beam-size", "1", input="cat\n").stdout == "cat\n"
    r = cli("lm-generate", "-m", counter, "--greedy", "-n", "2", "cat")
    assert r.exit_code == 0 and r.stdout.split() == ["cat", "dog", "egg"]


# --- defaults that fit together ---------------------------------------------------------------------------------


def test_average_checkpoints_by_default_averages_what_training_keeps(tmp_path):
    keep = TrainConfig().keep_last
    run = train_tiny_checkpoint(tmp_path, steps=2 * (keep + 2), valid_every=2, valid_bleu=False)
    kept = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert len(kept) == keep  # (and the best, which is the last here)
    r = cli("average-checkpoints", run)
    assert r.exit_code == 0, r.stderr
    assert Path(r.stdout.strip()) == run / "checkpoints" / f"avg-last{keep}"
    averaged = json.loads((run / "checkpoints" / f"avg-last{keep}" / "config.json").read_text())["averaged_from"]
    assert [Path(p).name for p in averaged] == kept
    # a shorter run: its checkpoints, all of them
    short = train_tiny_checkpoint(tmp_path / "short", steps=4, valid_every=2, valid_bleu=False)
    r = cli("average-checkpoints", short)
    assert r.exit_code == 0 and r.stdout.strip().endswith("avg-last2")
    one_error(cli("average-checkpoints", short, "--last", "5"), "asked to average the last 5", "there are 2")


def test_the_readme_install_names_every_extra_make_installs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    make_extras = makefile.split('-e ".[', 1)[1].split("]", 1)[0]
    assert f'pip install -e ".[{make_extras}]"' in readme
    for extra in ("interop", "plot", "test"):
        assert extra in make_extras


def test_a_language_model_prompt_outside_the_vocabulary_is_warned_about(models):
    _, counter = models
    r = cli("lm-generate", "-m", counter, "--greedy", "-n", "1", "zebra xylophone")
    assert r.exit_code == 0 and "warning:" in r.stderr and "unknown" in r.stderr
    r = cli("lm-generate", "-m", counter, "--greedy", "-n", "1", "cat")
    assert "unknown" not in r.stderr


def test_an_unknown_arch_is_a_usage_error(tmp_path):
    from helpers import make_parallel_prepared

    data = make_parallel_prepared(tmp_path / "prep", n_train=50)
    r = cli("train", data, "-o", tmp_path / "run", "--arch", "smal", "--max-steps", "1")
    one_error(r, "smal", "small", code=2)


def test_the_signal_handler_does_not_outlive_the_command():
    """A Ctrl-C that arrives after the command finished (during interpreter shutdown) must not print a traceback
    from tfcli's handler: once main() is done, SIGINT and SIGTERM act as they do by default."""
    code = (
        "import os, signal, sys, time\n"
        "from tfcli.cli import main\n"
        "from tfcli.errors import interrupt\n"
        "sys.argv = ['tfcli', '--version']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None)\n"
        "assert signal.getsignal(signal.SIGINT) is not interrupt\n"
        "assert signal.getsignal(signal.SIGTERM) is not interrupt\n"
        "sys.stdout.flush()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(5)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == -2, (proc.returncode, proc.stderr)  # ended by the signal, as the shell expects
    assert proc.stdout.startswith("tfcli ") and "Traceback" not in proc.stderr and proc.stderr == ""


def _file_size_limit(limit: int):
    import resource
    import signal

    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write then fails with EFBIG, as a full disk does
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("target", ["hf", "ctranslate2"])
def test_export_write_failure_is_one_line_naming_the_path_and_leaves_nothing(tmp_path, target):
    """A write that fails inside transformers' or CTranslate2's own writer (here a file-size limit) is one line
    naming the output, never "internal error", and no directory is left behind."""
    pytest.importorskip("transformers" if target == "hf" else "ctranslate2")
    run = train_tiny_checkpoint(tmp_path, steps=2, valid_bleu=False)
    out = tmp_path / "exported"
    proc = subprocess.run([sys.executable, "-m", "tfcli", "export", str(run), "--to", target, "-o", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, preexec_fn=_file_size_limit(20_000))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: cannot write") and "internal" not in lines[0], lines
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".exported")]


def test_export_to_hf_prints_no_progress_bar_of_its_own_and_nothing_with_quiet(tmp_path):
    pytest.importorskip("transformers")
    run = train_tiny_checkpoint(tmp_path, steps=2, valid_bleu=False)
    for quiet, out in (([], "a"), (["-q"], "b")):
        proc = subprocess.run([sys.executable, "-m", "tfcli", *quiet, "export", str(run), "--to", "hf", "-o",
                               str(tmp_path / out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr  # no "Writing model shards" bar
    import transformers

    assert transformers.utils.logging.is_progress_bar_enabled()  # and the caller's setting is as it was


def test_prepare_refuses_a_setting_its_data_does_not_use(tmp_path):
    src, tgt, mono = tmp_path / "a.de", tmp_path / "a.en", tmp_path / "text.txt"
    for f in (src, tgt, mono):
        f.write_text("a b c\nd e\n" * 10, encoding="utf-8")
    pair = ["prepare", "--src", src, "--tgt", tgt, "--tokenizer", "char", "-o", tmp_path / "out"]
    lm = ["prepare", "--train", mono, "--tokenizer", "char", "-o", tmp_path / "out"]
    cases = [
        (pair + ["--mono-mode", "paragraph"], "prepare.mono_mode (--mono-mode) is not used"),
        (pair + ["--text-field", "body"], "prepare.text_field (--text-field) is not used"),
        (pair + ["--src-field", "de", "--tgt-field", "en"], "prepare.src_field (--src-field) is not used"),
        (pair + ["--format", "tsv"], "prepare.format (--format) is not used"),
        (pair + ["--valid-src", src, "--valid-tgt", tgt, "--valid-ratio", "0.1"], "prepare.valid_ratio"),
        (lm + ["--separate-vocab"], "prepare.joint_vocab (--joint-vocab/--separate-vocab) is not used"),
        (lm + ["--max-ratio", "2"], "prepare.max_ratio (--max-ratio) is not used"),
        (["prepare", "--src", src, "--tgt", tgt, "--tokenizer-from", tmp_path / "tok.json", "--vocab-size", "100",
          "-o", tmp_path / "out"], "prepare.vocab_size (--vocab-size) is not used: it trains a tokenizer"),
    ]
    for args, message in cases:
        one_error(cli(*args), message)
        assert not (tmp_path / "out").exists()
    assert cli(*pair).exit_code == 0 and cli(*lm[:-1], tmp_path / "lm").exit_code == 0


def test_train_refuses_an_arch_that_init_from_would_ignore(tmp_path):
    r = cli("train", tmp_path, "-o", tmp_path / "run", "--init-from", tmp_path / "ck", "--arch", "base")
    one_error(r, "--arch is not used with --init-from", code=2)


def test_the_readme_stays_short():
    """What a newcomer needs first fits 200 lines; the rest lives in docs/ (the recipe table in docs/recipes.md)."""
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 200
