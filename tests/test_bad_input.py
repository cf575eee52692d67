"""Whatever users' pipelines produce: odd text, broken parallel data, wrong or hostile checkpoints, bad configs,
signals, a full disk, a read-only directory. Each case either works (translate: one output line per input line) or
fails with exit status != 0 and ONE line on stderr naming the file (and line), with no traceback, no temp file left
behind, and a good output that was already there unchanged.

Most cases run the command line in-process (typer's CliRunner: the same code path as the shell, without a torch import
per case); exit codes under signals, --debug, the read-only directory and the file-size limit need real processes.
"""

import errno
import json
import os
import pickle
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_model
from typer.testing import CliRunner

from helpers import make_parallel_prepared, train_tiny_checkpoint, word_tokenizer
from tfcli import checkpoint
from tfcli import checkpoint_meta
from tfcli.cli import app
from tfcli.config import to_dict
from tfcli.data.prepared import PreparedData
from tfcli.model.config import preset
from tfcli.model.transformer import build_model
from tfcli.train.trainer import run as run_train_config

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


# --- helpers ----------------------------------------------------------------------------------------------------


def cli(*args, input=None, env=None):
    """`tfcli ARGS` in this process; returns click's Result (exit_code, stdout, stderr)."""
    return runner.invoke(app, [str(a) for a in args], input=input, env=env)


def assert_one_line_error(stderr: str, *fragments: str, after_log: bool = False) -> None:
    """ONE line, "error: ...", no traceback, containing every fragment (file names, line numbers, the reason).

    `after_log`: the error ends a training log (resolved config, steps), which comes before it on stderr."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith("warning: ")]
    if after_log:
        assert [line for line in lines if line.startswith("error")] == lines[-1:], stderr
        lines = lines[-1:]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for f in fragments:
        assert f in lines[0], (f, stderr)


def failed(result, *fragments: str, code: int = 1) -> None:
    assert result.exit_code == code, (result.exit_code, result.stderr, result.exception)
    assert_one_line_error(result.stderr, *fragments)


def leftovers(directory: Path) -> list[str]:
    """Temp entries of tfcli's atomic writes (`.NAME.tmp-PID...`, `.NAME.old-PID`) in `directory`."""
    return sorted(p.name for p in Path(directory).iterdir() if re.match(r"^\..+\.(tmp|old)-", p.name))


def snapshot(path: Path) -> dict:
    """Every file under `path` (or the file itself) with its bytes, to show nothing changed."""
    path = Path(path)
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def tfcli_process(*args, **kw) -> subprocess.Popen:
    """`python -m tfcli ARGS` as a real process (signals, exit codes)."""
    env = {k: v for k, v in os.environ.items() if k != "TFCLI_DEBUG"}
    env.update({"PYTHONUNBUFFERED": "1", **kw.pop("env", {})})
    cmd = [*kw.pop("prefix", []), sys.executable, "-m", "tfcli", *map(str, args)]
    return subprocess.Popen(cmd, cwd=kw.pop("cwd", ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **kw)


def tfcli_run(*args, timeout=180, **kw) -> tuple[int, str, str]:
    proc = tfcli_process(*args, **kw)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def wait_for(condition, timeout: float = 120, what: str = "condition") -> None:
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models; the test machine's cores are shared
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run directory with a tiny translation checkpoint (word-level tokenizer over w0..w19, max_len 64)."""
    return train_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"), steps=10, model={"max_len": 64})


@pytest.fixture(scope="module")
def ckpt(run_dir):
    return checkpoint_meta.resolve(run_dir)


@pytest.fixture
def ckpt_copy(ckpt, tmp_path):
    """A private copy of the checkpoint directory, for tests that damage it."""
    return Path(shutil.copytree(ckpt, tmp_path / "ckpt"))


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    return make_parallel_prepared(tmp_path_factory.mktemp("par"), n_train=200, task="reverse")


def corpus(d: Path, n: int = 300) -> tuple[Path, Path]:
    """A small parallel text corpus (two aligned files) for `tfcli prepare`."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 8))) for _ in range(n)]
    (d / "train.xx").write_text("".join(s + "\n" for s in src), encoding="utf-8")
    (d / "train.yy").write_text("".join(" ".join(s.split()[::-1]) + "\n" for s in src), encoding="utf-8")
    return d / "train.xx", d / "train.yy"


PREPARE = ["--tokenizer", "wordpiece", "--vocab-size", "60"]


@pytest.fixture
def prepared(tmp_path):
    """A good prepared directory at tmp_path/prep, and the arguments that made it."""
    src, tgt = corpus(tmp_path)
    args = ["prepare", "--src", src, "--tgt", tgt, *PREPARE, "-o", tmp_path / "prep"]
    r = cli(*args)
    assert r.exit_code == 0, r.stderr
    return tmp_path / "prep", args


def translate_file(ckpt, tmp_path, data: bytes, *extra):
    """Translate `data` (written to in.txt) to out.txt; returns (result, output lines or None)."""
    (tmp_path / "in.txt").write_bytes(data)
    out = tmp_path / "out.txt"
    r = cli("translate", "-m", ckpt, "--greedy", "--threads", "1", tmp_path / "in.txt", "-o", out, *extra)
    lines = out.read_text(encoding="utf-8").split("\n")[:-1] if out.exists() else None
    return r, lines


def input_lines(data: bytes) -> int:
    """Lines as tfcli counts them: LF-terminated, plus a last line without one."""
    return data.count(b"\n") + (not data.endswith(b"\n") and len(data) > 0)


# --- input text: translate prints one line per input line, or fails naming file:line ---------------------------


def test_translate_empty_file_gives_empty_output(ckpt, tmp_path):
    r, lines = translate_file(ckpt, tmp_path, b"")
    assert r.exit_code == 0, r.stderr
    assert lines == [] and (tmp_path / "out.txt").read_bytes() == b""


def test_translate_only_empty_lines_gives_as_many_empty_lines(ckpt, tmp_path):
    data = b"\n\n   \n\t\n\n"
    r, lines = translate_file(ckpt, tmp_path, data)
    assert r.exit_code == 0, r.stderr
    assert lines == [""] * 5


def test_translate_crlf_line_endings(ckpt, tmp_path):
    r, crlf = translate_file(ckpt, tmp_path, b"w1 w2 w3\r\n\r\nw4 w5\r\nw6")
    assert r.exit_code == 0, r.stderr
    _, lf = translate_file(ckpt, tmp_path, b"w1 w2 w3\n\nw4 w5\nw6")
    assert crlf == lf and len(crlf) == 4 and crlf[1] == ""
    assert b"\r" not in (tmp_path / "out.txt").read_bytes()


def test_translate_bom_is_dropped_from_files_and_stdin(ckpt, tmp_path):
    r, with_bom = translate_file(ckpt, tmp_path, b"\xef\xbb\xbfw1 w2 w3\nw4\n")
    assert r.exit_code == 0, r.stderr
    _, without = translate_file(ckpt, tmp_path, b"w1 w2 w3\nw4\n")
    assert with_bom == without and len(with_bom) == 2
    piped = cli("translate", "-m", ckpt, "--greedy", input=b"\xef\xbb\xbfw1 w2 w3\r\nw4\r\n")
    assert piped.exit_code == 0, piped.stderr
    assert piped.stdout.split("\n")[:-1] == without


def test_translate_invalid_utf8_names_file_and_line_and_keeps_the_old_output(ckpt, tmp_path):
    (tmp_path / "out.txt").write_text("good\n")
    r, lines = translate_file(ckpt, tmp_path, b"w1 w2\nw3 \xff\xfe w4\nw5\n")
    failed(r, f"{tmp_path / 'in.txt'}:2: invalid UTF-8")
    assert lines == ["good"] and leftovers(tmp_path) == []


def test_translate_nul_bytes_name_file_and_line_and_keep_the_old_output(ckpt, tmp_path):
    (tmp_path / "out.txt").write_text("good\n")
    r, lines = translate_file(ckpt, tmp_path, b"w1 w2\nw3\nw4\x00w5\n")
    failed(r, f"{tmp_path / 'in.txt'}:3: contains a NUL byte")
    assert lines == ["good"] and leftovers(tmp_path) == []


def test_translate_a_1mb_single_line_is_cut_with_a_warning(ckpt, tmp_path):
    data = " ".join(f"w{i % 20}" for i in range(350_000)).encode()[: 1 << 20] + b"\n"
    assert len(data) > 1_000_000
    r, lines = translate_file(ckpt, tmp_path, data)
    assert r.exit_code == 0, r.stderr
    assert len(lines) == 1
    assert f"{tmp_path / 'in.txt'}:1:" in r.stderr and "longer than the model's max_len (64)" in r.stderr


def test_translate_emoji_cjk_and_rtl_text(ckpt, tmp_path):
    data = "w1 😀 w2 👩‍👩‍👧\n中文 w3 日本語\nשלום עולם w4\nمرحبا بالعالم\n\u202ew5 w6\u202c\n".encode()
    r, lines = translate_file(ckpt, tmp_path, data)
    assert r.exit_code == 0, r.stderr
    assert len(lines) == input_lines(data) == 5
    assert "unknown (<unk>)" in r.stderr  # the model's vocabulary has none of these words: a warning, not an error


def test_translate_control_characters_and_unicode_line_separators(ckpt, tmp_path):
    # \v \f \x1c-\x1e \x85 \u2028 \u2029 end lines for Python's str.splitlines, but not for tfcli: lines end at \n
    data = "w1\x01\x07w2\x1b[31m\x7f\nw3\x0bw4\x0cw5\nw6\x1cw7\x1d\x1e\nw8\x85w9\u2028w1\u2029w2\n\x08\x1f".encode()
    r, lines = translate_file(ckpt, tmp_path, data)
    assert r.exit_code == 0, r.stderr
    assert len(lines) == input_lines(data) == 5
    for kind in ("--raw", "--nbest"):  # the other output formats keep one line per input too
        extra = [kind] if kind == "--raw" else [kind, "1"]
        r, lines = translate_file(ckpt, tmp_path, data, *extra)
        assert r.exit_code == 0 and len(lines) == 5, r.stderr


@pytest.mark.parametrize("command", ["translate", "lm-generate", "eval-hyp", "eval-ref", "prepare", "attention"])
def test_every_text_reader_names_file_and_line(command, ckpt, lm_ckpt, tmp_path):
    """The strict reader (tfcli.io) is shared: every command that reads text reports file:line."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w1\nw2\nw3 \xc3\x28\n")
    good = tmp_path / "good.txt"
    good.write_text("w1\nw2\nw3\n")
    args = {
        "translate": ["translate", "-m", ckpt, bad],
        "lm-generate": ["lm-generate", "-m", lm_ckpt, "-i", bad],
        "eval-hyp": ["eval", bad, "-r", good],
        "eval-ref": ["eval", good, "-r", bad],
        "prepare": ["prepare", "--src", good, "--tgt", bad, "-o", tmp_path / "prep"],
        "attention": ["attention", "-m", ckpt, "-i", bad, "-o", tmp_path / "pics"],
    }[command]
    failed(cli(*args), f"{bad}:3: invalid UTF-8")
    assert not (tmp_path / "prep").exists() and not (tmp_path / "pics").exists()


def test_prepare_a_1mb_line_without_spaces(tmp_path):
    """A subword trainer re-scans a word at every merge: one 1 MB "word" (base64, a hash dump) once took it hours.
    Now it trains in seconds and the row is dropped by the length filter, which the cleaning report counts."""
    src, tgt = corpus(tmp_path, 50)
    blob = "".join("abcdefghij"[(i * 7919) % 10] for i in range(1 << 20))
    with open(src, "a") as f:
        f.write(blob + "\n")
    with open(tgt, "a") as f:
        f.write("w1\n")
    r = cli("prepare", "--src", src, "--tgt", tgt, "--tokenizer", "bpe", "--vocab-size", "200", "-o", tmp_path / "prep")
    assert r.exit_code == 0, r.stderr
    counts = PreparedData(tmp_path / "prep").meta["cleaning"]["train"]
    assert counts["input"] == 51 and counts["kept"] == 50 and counts["too_long"] + counts["ratio"] == 1


# --- parallel data ----------------------------------------------------------------------------------------------


def prepare_fails_and_keeps(prepared, args: list, *fragments: str) -> None:
    """`tfcli prepare ARGS --force -o PREP` fails with one line; the good PREP already there is untouched."""
    prep, _ = prepared
    before = snapshot(prep)
    failed(cli("prepare", *args, *PREPARE, "--force", "-o", prep), *fragments)
    assert snapshot(prep) == before
    assert leftovers(prep.parent) == []


def test_parallel_files_with_different_line_counts(prepared, tmp_path):
    (tmp_path / "a.xx").write_text("w1\nw2\nw3\n")
    (tmp_path / "a.yy").write_text("w1\nw2\n")
    prepare_fails_and_keeps(prepared, ["--src", tmp_path / "a.xx", "--tgt", tmp_path / "a.yy"],
                            f"{tmp_path / 'a.xx'} has 3 lines but {tmp_path / 'a.yy'} has 2")


def test_tsv_row_without_a_tab(prepared, tmp_path):
    (tmp_path / "rows.tsv").write_text("w1\tw2\nw3\tw4\nw5 w6\nw7\tw8\n")
    prepare_fails_and_keeps(prepared, ["--train", tmp_path / "rows.tsv"],
                            f"{tmp_path / 'rows.tsv'}:3: expected 2 tab-separated columns, found no tab")


def test_jsonl_line_that_is_not_json(prepared, tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"x": "w1", "y": "w2"}\n{"x": "w3", "y": "w4"\n')
    prepare_fails_and_keeps(prepared, ["--train", tmp_path / "rows.jsonl", "--src-field", "x", "--tgt-field", "y"],
                            f"{tmp_path / 'rows.jsonl'}:2: not valid JSON")


def test_jsonl_row_without_the_field(prepared, tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"x": "w1", "y": "w2"}\n\n{"x": "w3"}\n')
    prepare_fails_and_keeps(prepared, ["--train", tmp_path / "rows.jsonl", "--src-field", "x", "--tgt-field", "y"],
                            f"{tmp_path / 'rows.jsonl'}:3: no field 'y'")


# --- checkpoints --------------------------------------------------------------------------------------------------


def test_truncated_weights(ckpt_copy, tmp_path):
    weights = ckpt_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"), f"{weights}: corrupt or truncated")
    weights.write_bytes(weights.read_bytes()[:5])  # not even a header
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"), f"{weights}: corrupt or truncated")


def test_text_file_as_checkpoint(ckpt_copy, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    failed(cli("translate", "-m", notes, input=b"w1\n"), f"{notes}: not a tfcli checkpoint")
    (ckpt_copy / "model.safetensors").write_text("not a model\n")
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"), "model.safetensors: corrupt or truncated")
    (ckpt_copy / "config.json").write_text("not json\n")
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"), "config.json: unreadable or corrupt")


@pytest.mark.parametrize("change", ["d_model", "layers"])
def test_weights_of_another_architecture(change, ckpt_copy):
    """config.json of this model, weights of another one: a shape mismatch, or missing/unexpected tensors."""
    cfg = checkpoint_meta.model_config(checkpoint_meta.read_meta(ckpt_copy))
    other = {"d_model": 32, "d_ff": 64} if change == "d_model" else {"n_encoder_layers": 1}
    model = build_model(preset("toy", **{**to_dict(cfg), **other}))
    save_model(model, str(ckpt_copy / "model.safetensors"))
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"),
           f"{ckpt_copy / 'model.safetensors'}: does not match the model in config.json")


def test_weights_of_another_vocabulary(ckpt_copy):
    meta = json.loads((ckpt_copy / "config.json").read_text())
    meta["model"]["src_vocab_size"] += 7
    meta["model"]["tgt_vocab_size"] += 7
    (ckpt_copy / "config.json").write_text(json.dumps(meta))
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"),
           f"{ckpt_copy / 'model.safetensors'}: does not match the model in config.json")


@pytest.fixture
def lm_ckpt(tmp_path):
    """An (untrained) language model checkpoint with a word-level tokenizer over w0..w19."""
    tok = word_tokenizer([f"w{i}" for i in range(20)])
    tok.save(str(tmp_path / "tok.json"))
    cfg = preset("lm-toy", tgt_vocab_size=tok.get_vocab_size(), max_len=32)
    return checkpoint.save(tmp_path / "lm", build_model(cfg).eval(), {"model": to_dict(cfg)},
                           {"tgt": tmp_path / "tok.json"})


@pytest.mark.parametrize("command", ["translate", "lm-generate", "eval", "attention"])
def test_tokenizer_that_does_not_match_the_model(command, ckpt_copy, lm_ckpt, run_dir, tmp_path):
    other = word_tokenizer([f"v{i}" for i in range(30)])  # 34 tokens; the models have 24
    model = lm_ckpt if command == "lm-generate" else ckpt_copy
    other.save(str(model / "tokenizer.tgt.json"))
    args = {
        "translate": ["translate", "-m", model],
        "lm-generate": ["lm-generate", "-m", model, "-n", "3"],
        "eval": ["eval", "--model", model, "--data", run_dir.parent / "prep"],
        "attention": ["attention", "-m", model, "-o", tmp_path / "pics"],
    }[command]
    failed(cli(*args, input=b"w1 w2\n"),
           f"{model / 'tokenizer.tgt.json'}: has 34 tokens but the model's tgt vocabulary has 24")


class _Marker:
    """Unpickling this creates a file: proof that something was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickles_are_never_unpickled(ckpt_copy, run_dir, tmp_path):
    marker = tmp_path / "UNPICKLED"
    pt = tmp_path / "model.pt"
    torch.save({"weights": _Marker(marker)}, pt)
    (ckpt_copy / "model.safetensors").write_bytes(pickle.dumps({"weights": _Marker(marker)}))
    assert not marker.exists()
    failed(cli("translate", "-m", pt, input=b"w1\n"), f"{pt}: not a tfcli checkpoint", "never loads pickled")
    failed(cli("translate", "-m", ckpt_copy, input=b"w1\n"), "model.safetensors: corrupt or truncated")
    failed(cli("eval", "--model", pt, "--data", run_dir.parent / "prep"), f"{pt}: not a tfcli checkpoint")
    failed(cli("average-checkpoints", "--checkpoint", ckpt_copy, "--checkpoint", ckpt_copy, "-o", tmp_path / "avg"),
           "model.safetensors: corrupt or truncated")
    assert not marker.exists()


def test_the_code_never_unpickles():
    """Weights are safetensors and metadata JSON: no torch.load, pickle, or numpy pickles anywhere in tfcli/."""
    forbidden = re.compile(r"torch\.load\(|torch\.jit\.load\(|\b(pickle|marshal|dill|joblib)\.loads?\(|"
                           r"^\s*(import|from)\s+(pickle|_pickle|cPickle|dill|cloudpickle|joblib|marshal)\b|"
                           r"allow_pickle\s*=\s*True|weights_only\s*=\s*False")
    hits = [f"{p}:{i}: {line.strip()}" for p in (ROOT / "tfcli").rglob("*.py")
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if forbidden.search(line)]
    assert hits == []


# --- config -------------------------------------------------------------------------------------------------------

CONFIG_CASES = {
    # name: (command, config file text or None, --set items, expected fragments)
    "train-unknown-key": ("train", "train:\n  max_tokenz: 100\n", [], ["train.max_tokenz: unknown config key",
                                                                      "did you mean 'max_tokens'"]),
    "train-unknown-model-key": ("train", "model:\n  n_heads: 4\n", [], ["model.n_heads: unknown config key",
                                                                         "did you mean 'n_head'"]),
    "train-unknown-section": ("train", "trian:\n  lr: 1\n", [], ["unknown section 'trian'"]),
    "train-wrong-type": ("train", "train:\n  lr: fast\n", [], ["train.lr: expected a number, got 'fast'"]),
    "train-impossible": ("train", "model:\n  d_model: 30\n", [], ["d_model (30) must be divisible by n_head (4)"]),
    "train-out-of-range": ("train", "train:\n  label_smoothing: 1.5\n", [], ["label_smoothing: must be in [0, 1)"]),
    "train-syntax": ("train", "train:\n  lr: [0.1,\n", [], [".yaml:3: cannot parse config"]),
    "train-not-utf8": ("train", b"train:\n  lr: 0.1 \xff\n", [], [".yaml:2: invalid UTF-8"]),
    "train-not-a-mapping": ("train", "- lr\n- 0.1\n", [], ["a config file must be a mapping"]),
    "set-unknown-key": ("train", None, ["model.dmodel=64"], ["model.dmodel: unknown config key",
                                                              "did you mean 'd_model'"]),
    "set-wrong-type": ("train", None, ["train.warmup=many"], ["train.warmup: expected an integer, got 'many'"]),
    "set-impossible": ("train", None, ["model.n_head=5"], ["d_model (32) must be divisible by n_head (5)"]),
    "set-malformed": ("train", None, ["d_model=64"], ["expected section.key=value"]),
    "prepare-unknown-key": ("prepare", "prepare:\n  vocab_sise: 100\n", [], ["prepare.vocab_sise: unknown config key",
                                                                            "did you mean 'vocab_size'"]),
    "prepare-wrong-type": ("prepare", "prepare:\n  vocab_size: lots\n", [], ["expected an integer, got 'lots'"]),
    "prepare-impossible": ("prepare", "prepare:\n  valid_ratio: 1.5\n", [], ["valid_ratio: must be in [0, 1)"]),
    "prepare-bad-choice": ("prepare", "prepare:\n  tokenizer: sentencepeice\n", [], ["prepare.tokenizer: must be one of"]),
    "prepare-toml-syntax": ("prepare", "[prepare]\nvocab_size = \n", [], [".toml:2: cannot parse config"]),
    "translate-impossible": ("translate", "translate:\n  beam_size: 0\n", [], ["beam-size must be at least 1"]),
}


@pytest.mark.parametrize("case", list(CONFIG_CASES))
def test_config_errors_are_one_clear_line(case, parallel, tmp_path):
    command, text, sets, fragments = CONFIG_CASES[case]
    suffix = ".toml" if "toml" in case else ".yaml"
    args = []
    if text is not None:
        conf = tmp_path / f"conf{suffix}"
        conf.write_bytes(text if isinstance(text, bytes) else text.encode())
        args += ["--config", conf]
        fragments = [f.replace(suffix + ":", f"{conf}:") for f in fragments]
    for item in sets:
        args += ["--set", item]
    out = tmp_path / "out"
    if command == "train":
        args = ["train", parallel, "-o", out, "--arch", "toy", "--max-steps", "1", *args]
    elif command == "prepare":
        src, tgt = corpus(tmp_path, 20)
        args = ["prepare", "--src", src, "--tgt", tgt, "-o", out, *args]
    else:
        args = ["translate", "-m", tmp_path / "no-model", *args]
    failed(cli(*args), *fragments)
    assert not out.exists()


def test_average_last_above_the_checkpoints_written_averages_what_there_is(parallel, tmp_path):
    flags = dict(data=str(parallel), out=str(tmp_path / "run"), arch="toy", max_tokens=200, max_steps=4,
                 max_epochs=0, valid_every=2, valid_bleu=False, average_last=5, device="cpu", threads=1,
                 tensorboard=False)
    result = run_train_config(None, flags)
    assert result.step == 4
    ckpts = tmp_path / "run" / "checkpoints"
    assert (ckpts / "avg-last2").is_dir() and not (ckpts / "avg-last5").exists()
    assert checkpoint_meta.read_meta(ckpts / "avg-last2")["averaged_from"] == [
        str(ckpts / "step-0000002"), str(ckpts / "step-0000004")]


def test_joint_vocabulary_from_prepare_shares_embeddings(prepared, tmp_path):
    prep, _ = prepared
    assert PreparedData(prep).meta["joint_vocab"] is True
    flags = dict(data=str(prep), out=str(tmp_path / "run"), arch="toy", max_tokens=200, max_steps=1,
                 max_epochs=0, valid_every=1, valid_bleu=False, device="cpu", threads=1, tensorboard=False)
    run_train_config(None, flags)
    assert checkpoint_meta.read_meta(tmp_path / "run")["model"]["share_embeddings"] is True


def test_shared_embeddings_over_two_vocabularies_of_one_size_are_refused(tmp_path):
    # two vocabularies of the same size pass the model's size check: tying them would give unrelated tokens one row
    src, tgt = corpus(tmp_path)
    r = cli("prepare", "--src", src, "--tgt", tgt, *PREPARE, "--separate-vocab", "-o", tmp_path / "prep")
    assert r.exit_code == 0, r.stderr
    sizes = {side: PreparedData(tmp_path / "prep").vocab_size(side) for side in ("src", "tgt")}
    assert sizes["src"] == sizes["tgt"]
    out = tmp_path / "run"
    failed(cli("train", tmp_path / "prep", "-o", out, "--arch", "toy", "--max-steps", "1",
               "--set", "model.share_embeddings=true"),
           "--separate-vocab", "model.share_embeddings=false", "--joint-vocab")
    assert not out.exists()


# --- interruption -------------------------------------------------------------------------------------------------

TRAIN = ["--arch", "toy", "--max-tokens", "200", "--lr", "3e-3", "--warmup", "10", "--log-every", "1",
         "--no-valid-bleu", "--max-epochs", "0", "--device", "cpu", "--threads", "1", "--set", "model.dropout=0.1",
         "--set", "train.tensorboard=false"]


def train_records(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            pass
    return [r for r in records if r["split"] == "train"]


def latest(run: Path) -> Path:
    ckpts = run / "checkpoints"
    return ckpts / (ckpts / "LATEST").read_text().strip()


@pytest.mark.slow
def test_train_sigterm_saves_a_checkpoint_exits_130_and_resumes(parallel, tmp_path):
    run = tmp_path / "run"
    proc = tfcli_process("train", parallel, "-o", run, "--max-steps", "5000", "--valid-every", "1000", *TRAIN)
    wait_for(lambda: len(train_records(run)) >= 3 or proc.poll() is not None, what="training steps")
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 130, err
    assert "SIGTERM" in err and "interrupted at step" in err and "Traceback" not in err
    stopped = json.loads((latest(run) / "trainer_state.json").read_text())["step"]
    assert 3 <= stopped < 5000
    code, out, err = tfcli_run("train", "-o", run, "--resume", "--max-steps", stopped + 2, "--threads", "1")
    assert code == 0, err
    assert out.strip() == str(run / "checkpoints" / f"step-{stopped + 2:07d}")
    # that the resumed weights equal an uninterrupted run's is shown for SIGINT in test_train.py (same handler)


@pytest.mark.slow
def test_train_kill_9_leaves_a_complete_latest_checkpoint_and_resume_equals_an_uninterrupted_run(parallel, tmp_path):
    run = tmp_path / "run"
    proc = tfcli_process("train", parallel, "-o", run, "--max-steps", "5000", "--valid-every", "2", *TRAIN)
    wait_for(lambda: proc.poll() is not None or (
        (run / "checkpoints" / "LATEST").exists() and len(train_records(run)) >= 5), what="checkpoints")
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # LATEST names a complete checkpoint: weights, config, tokenizers and trainer state all load
    ckpt = latest(run)
    checkpoint.load(ckpt)
    tensors, state = checkpoint.load_trainer_state(ckpt)
    target = state["step"] + 3
    code, out, err = tfcli_run("train", "-o", run, "--resume", "--max-steps", target, "--threads", "1")
    assert code == 0, err
    assert leftovers(run / "checkpoints") == [] and not list((run / "checkpoints").glob(".step-*"))
    flags = dict(data=str(parallel), out=str(tmp_path / "full"), arch="toy", max_tokens=200, lr=3e-3, warmup=10,
                 log_every=1, valid_every=2, valid_bleu=False, max_epochs=0, device="cpu", threads=1,
                 max_steps=target, tensorboard=False)
    run_train_config(None, flags, ["model.dropout=0.1"])
    a, b = load_file(str(latest(tmp_path / "full") / "model.safetensors")), load_file(str(latest(run) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the log continues where the checkpoint was: what the killed run logged after it is gone, each step once
    steps = [(r["step"], r["loss"]) for r in train_records(run)]
    assert steps == [(r["step"], r["loss"]) for r in train_records(tmp_path / "full")]


def start_translating_into(ckpt, out: Path) -> subprocess.Popen:
    """`translate -o OUT` reading stdin that stays open: it blocks with its temp file open until stdin closes."""
    proc = tfcli_process("translate", "-m", ckpt, "--greedy", "--threads", "1", "-", "-o", out, stdin=subprocess.PIPE)
    proc.stdin.write(b"w1 w2 w3\nw4\n")
    proc.stdin.flush()
    wait_for(lambda: proc.poll() is not None or leftovers(out.parent), what="the temp output file")
    assert proc.poll() is None, proc.communicate()[1]
    return proc


def test_an_interrupt_lost_in_a_callback_prints_no_traceback():
    """A signal's KeyboardInterrupt raised where Python cannot propagate it (a callback during an import, a __del__)
    is printed by Python as "Exception ignored in ... Traceback": the CLI's hook keeps it quiet (the signal is
    remembered and ends the command at its next commit), and shows every other such exception as before."""
    code = """if True:
        import sys
        from tfcli.cli import _unraisable
        sys.unraisablehook = _unraisable
        class Interrupted:
            def __del__(self):
                raise KeyboardInterrupt
        class Broken:
            def __del__(self):
                raise ValueError("still shown")
        Interrupted()
        Broken()
        """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "KeyboardInterrupt" not in proc.stderr and "still shown" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_translate_interrupted_keeps_the_old_output_and_no_temp_file(sig, ckpt, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("good\n")
    proc = start_translating_into(ckpt, out)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err.decode()
    assert out.read_text() == "good\n" and leftovers(tmp_path) == []


@pytest.mark.slow
def test_translate_kill_9_keeps_the_old_output_and_the_next_run_removes_the_temp_file(ckpt, tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("good\n")
    proc = start_translating_into(ckpt, out)
    proc.kill()
    proc.communicate(timeout=60)
    assert out.read_text() == "good\n"
    # unavoidable after kill -9: the temp file, a dot-file named after the dead process ...
    assert leftovers(tmp_path) == [f".out.txt.tmp-{proc.pid}"]
    # ... which the next write of out.txt removes
    r = cli("translate", "-m", ckpt, "--greedy", "-", "-o", out, input=b"w1\nw2\nw3\n")
    assert r.exit_code == 0, r.stderr
    assert len(out.read_text().split("\n")) == 4 and leftovers(tmp_path) == []


# `tfcli prepare` with a signal sent to itself just after it wrote the first chunk of token ids into its temp
# directory: a deterministic "mid-way" (the writing stage of a small corpus is too short to hit from outside).
SIGNAL_MID_WRITE = """
import os, signal, sys
import tfcli.data.prepare as prepare
from tfcli.cli import main

class WriteThenSignal(prepare.SequenceWriter):
    def append(self, seqs):
        super().append(seqs)
        os.kill(os.getpid(), signal.{sig})
prepare.SequenceWriter = WriteThenSignal
sys.argv[0] = "tfcli"
main()
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_prepare_interrupted_mid_write_keeps_the_old_directory(sig, prepared, tmp_path):
    prep, args = prepared
    before = snapshot(prep)
    cmd = [sys.executable, "-c", SIGNAL_MID_WRITE.format(sig=sig), *map(str, args), "--force"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert snapshot(prep) == before  # the old prepared directory, intact
    if sig == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL
        # the temp directory of the killed process stays behind, a dot-dir named after its pid ...
        (stale,) = leftovers(tmp_path)
        assert re.match(r"^\.prep\.tmp-\d+-", stale) and (tmp_path / stale / "train.src.bin").exists()
    else:
        assert proc.returncode == 130, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1] == "interrupted"
        assert leftovers(tmp_path) == []
    # ... and a re-run works and leaves nothing else
    r = cli(*args, "--force")
    assert r.exit_code == 0, r.stderr
    assert leftovers(tmp_path) == [] and PreparedData(prep).vocab_size("src") > 4


# --- disk full, read-only directory -----------------------------------------------------------------------------


def no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_translate_disk_full_keeps_the_old_output(ckpt, tmp_path, monkeypatch):
    """The error a full disk gives when the data is flushed (fsync), in-process."""
    (tmp_path / "out.txt").write_text("good\n")
    monkeypatch.setattr("tfcli.io.os.fsync", no_space)
    r, lines = translate_file(ckpt, tmp_path, b"w1 w2\nw3\n")
    failed(r, f"{tmp_path / 'out.txt'}: cannot write: No space left on device")
    assert lines == ["good"] and leftovers(tmp_path) == []


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs Linux's /dev/full")
def test_translate_to_a_full_device_through_a_symlink(ckpt, tmp_path):
    link = tmp_path / "out.txt"
    link.symlink_to("/dev/full")  # never read it: /dev/full reads as endless zeros
    r = cli("translate", "-m", ckpt, "--greedy", "-o", link, input=b"w1 w2\nw3\n")
    failed(r, f"{link}: cannot write: No space left on device")
    # written through the link, never replacing it (or the device) with a file
    assert link.is_symlink() and os.readlink(link) == "/dev/full" and Path("/dev/full").is_char_device()


def test_translate_into_a_named_pipe_writes_through_it(ckpt, tmp_path):
    """-o on a FIFO (or /dev/stdout, a device): written directly, never replaced by a regular file."""
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    r = cli("translate", "-m", ckpt, "--greedy", "-o", fifo, input=b"w1 w2\n\nw3\n")
    reader.join(timeout=60)
    assert r.exit_code == 0, r.stderr
    assert got and got[0].count("\n") == 3
    assert fifo.is_fifo() and leftovers(tmp_path) == []


def _file_size_limit(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then an oversized write fails with EFBIG, as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def test_prepare_disk_full_keeps_the_old_directory(prepared, tmp_path):
    """A real failing write: the process's file-size limit makes writes past 1 kB fail (EFBIG)."""
    prep, args = prepared
    before = snapshot(prep)
    code, _, err = tfcli_run(*args, "--force", preexec_fn=_file_size_limit(1000))
    assert code == 1
    assert_one_line_error(err, f"{prep}: cannot write: File too large")
    assert snapshot(prep) == before and leftovers(tmp_path) == []


@pytest.mark.slow
def test_train_disk_full_writes_no_checkpoint(parallel, tmp_path):
    run = tmp_path / "run"
    code, _, err = tfcli_run("train", parallel, "-o", run, "--max-steps", "2", "--valid-every", "2", *TRAIN,
                             preexec_fn=_file_size_limit(20_000))
    assert code == 1
    assert_one_line_error(err, f"{run / 'checkpoints' / 'step-0000002'}: cannot write", "File too large",
                          after_log=True)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == []  # no LATEST, no half checkpoint


def readonly_prefix(directory: Path) -> list[str]:
    """How to run a command for which chmod 555 on `directory` holds. Root ignores file modes; in a user namespace
    of its own (`unshare -U`) it keeps its files but loses that power."""
    prefix = []
    if os.geteuid() == 0:
        if not shutil.which("unshare") or subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode:
            pytest.skip("running as root, where chmod does not stop writes, and `unshare -U` is not available")
        prefix = ["unshare", "-U"]
    probe = subprocess.run([*prefix, "touch", str(directory / "probe")], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{directory} stays writable after chmod 555 here")
    return prefix


@pytest.mark.parametrize("command", [
    "prepare", pytest.param("translate", marks=pytest.mark.slow), pytest.param("train", marks=pytest.mark.slow)])
def test_read_only_output_directory(command, prepared, ckpt, parallel, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "out.txt").write_text("good\n")
    if command == "prepare":
        shutil.copytree(prepared[0], ro / "prep")
    ro.chmod(0o555)
    try:
        prefix = readonly_prefix(ro)
        before = snapshot(ro)
        (tmp_path / "in.txt").write_text("w1\n")
        args = {
            "prepare": [*prepared[1][:-1], ro / "prep", "--force"],
            "translate": ["translate", "-m", ckpt, tmp_path / "in.txt", "-o", ro / "out.txt", "--threads", "1"],
            "train": ["train", parallel, "-o", ro / "run", "--max-steps", "2", *TRAIN],
        }[command]
        code, _, err = tfcli_run(*args, prefix=prefix)
        assert code == 1
        assert_one_line_error(err, str(ro))
        assert re.search(r"not writable|Permission denied", err), err
        assert snapshot(ro) == before and leftovers(ro) == []
    finally:
        ro.chmod(0o755)


# --- tracebacks only with --debug -------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["plain", "--debug", "TFCLI_DEBUG=1"])
def test_tracebacks_only_with_debug(how, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w1\n\xff\n")
    args = ["prepare", "--src", bad, "--tgt", bad, "-o", tmp_path / "prep"]
    code, _, err = tfcli_run(*(["--debug", *args] if how == "--debug" else args),
                             env={"TFCLI_DEBUG": "1"} if how == "TFCLI_DEBUG=1" else {})
    assert code == 1
    if how == "plain":
        assert err == (f"error: {bad}:2: invalid UTF-8 (byte 0xff at column 1); convert the file to UTF-8 (or read it "
                       "with --encoding-errors replace)\n")
    else:
        assert "Traceback (most recent call last)" in err and f"{bad}:2: invalid UTF-8" in err


def test_unexpected_errors_are_one_line_too(tmp_path, monkeypatch):
    """A bug (any exception that is not a user error) is one line pointing at --debug, not a traceback."""
    def broken(*args, **kwargs):
        return {}["missing"]

    monkeypatch.setattr("tfcli.data.prepare.prepare", broken)
    src, tgt = corpus(tmp_path, 20)
    r = cli("prepare", "--src", src, "--tgt", tgt, "-o", tmp_path / "prep")
    failed(r, "internal error: KeyError: 'missing'", "--debug")
    r = cli("prepare", "--src", src, "--tgt", tgt, "-o", tmp_path / "prep", env={"TFCLI_DEBUG": "1"})
    assert isinstance(r.exception, KeyError)


def test_os_errors_name_the_file(parallel, tmp_path):
    """An OSError no reader turned into a message (a file where the run directory's parent should be)."""
    (tmp_path / "file").write_text("not a directory\n")
    r = cli("train", parallel, "-o", tmp_path / "file" / "run", "--arch", "toy", "--max-steps", "1", "--threads", "1")
    failed(r, f"{tmp_path / 'file' / 'run'}", "Not a directory")


def test_error_with_brackets_on_a_terminal(tmp_path, monkeypatch):
    """On a terminal the message goes through rich: a path with [brackets] must print as it is, not as markup."""
    import io

    from rich.console import Console

    import tfcli.cli.common

    buf = io.StringIO()
    monkeypatch.setattr(tfcli.cli.common, "err", Console(file=buf, force_terminal=True, width=300, highlight=False))
    weird = tmp_path / "[red]x.txt"  # as markup, "[red]" would vanish
    weird.write_bytes(b"\xff\n")
    r = cli("eval", weird, "-r", weird)
    assert r.exit_code == 1
    text = re.sub(r"\x1b\[[0-9;]*m", "", buf.getvalue())
    assert text == (f"error: {weird}:1: invalid UTF-8 (byte 0xff at column 1); convert the file to UTF-8 (or read it "
                    "with --encoding-errors replace)\n")


def test_a_prepared_directory_given_as_the_model_says_what_it_is_and_what_to_pass(parallel, tmp_path):
    r = cli("translate", "-m", parallel, input="a b\n")
    failed(r, str(parallel), "a prepared directory", "tfcli train", "-m RUN")
    (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
    failed(cli("translate", "-m", tmp_path / "empty-run", input="a b\n"), "a run directory without a saved checkpoint")


def test_import_of_a_config_nested_too_deep_to_read_is_bad_input(tmp_path):
    """A config.json nested 100,000 deep makes Python's JSON reader give up (RecursionError): one line naming the
    file, exit 1, nothing written."""
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    failed(cli("import", hf, "-o", tmp_path / "out"), str(hf / "config.json"), "unreadable")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kernels", ["rows.c", "torch"])
def test_a_checkpoint_whose_weights_hold_nan_fails_in_one_line_never_prints_what_it_chose(kernels, tmp_path,
                                                                                          monkeypatch):
    """A checkpoint whose weights hold NaN (a diverged run's, a broken conversion) computes no numbers: translate
    (beam, greedy, sampling, with or without scores) and lm-generate stop at its first line with one line naming the
    checkpoint and the input line, on rows.c's kernels (best_next finds the NaN) and on torch's operators (the
    scores carry it); --dtype int8 at load, naming the tensor. Before, rows.c printed <pad> tokens and exit 0."""
    from helpers import WORDS, random_translator, save_counter, save_model as save_checkpoint, save_word_tokenizer
    from tfcli.generate import native

    if kernels == "torch":
        monkeypatch.setattr(native, "library", lambda: None)
    elif native.fp32_kernel() is None:
        pytest.skip("rows.c's kernels do not run here")
    model = random_translator(3)
    with torch.no_grad():
        model.decoder.layers[0].ffn.w1.weight[5, 7] = float("nan")  # (through the ReLU: it must stay NaN)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, save_word_tokenizer(tmp_path / "tok", WORDS))
    src = tmp_path / "in.txt"
    src.write_text(f"{WORDS[0]} {WORDS[1]}\n{WORDS[2]}\n")
    for flags in ([], ["--greedy"], ["--greedy", "--scores"], ["--sampling", "--seed", "1"]):
        res = cli("translate", "-m", ckpt, src, *flags)
        failed(res, str(ckpt), "not numbers (NaN)", "input line")
        assert res.stdout == ""
    from tfcli import device

    if device.int8_available():
        failed(cli("translate", "-m", ckpt, src, "--dtype", "int8"), "model.safetensors",
               "decoder.layers.0.ffn.w1.weight holds NaN or inf")
    lm = save_counter(tmp_path, WORDS[:6])
    weights = load_file(str(lm / "model.safetensors"))
    weights["decoder.layers.0.ffn.w1.weight"][0, 0] = float("nan")
    from safetensors.torch import save_file

    save_file(weights, str(lm / "model.safetensors"))
    for flags in (["--greedy"], ["--top-k", "3", "--seed", "1"]):
        failed(cli("lm-generate", "-m", lm, WORDS[0], "--max-new-tokens", "4", *flags), str(lm), "not numbers (NaN)")
    # logits that overflow to +inf (a finite weight times a large activation): their softmax is NaN, nothing chosen
    weights = load_file(str(lm / "model.safetensors"))
    weights["decoder.layers.0.ffn.w1.weight"][0, 0] = 0.0
    weights["lm_head.weight"][weights["lm_head.weight"] > 0] = 3e38
    save_file(weights, str(lm / "model.safetensors"))
    for flags in (["--greedy"], ["--top-k", "3", "--seed", "1"], ["--seed", "1"]):
        failed(cli("lm-generate", "-m", lm, WORDS[0], "--max-new-tokens", "4", *flags), str(lm), "not numbers (NaN)")
