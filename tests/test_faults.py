"""Faults of the machine: two runs at once, a run killed before its first checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import make_parallel_prepared, tiny_train_config
from tfcli import errors
from tfcli.errors import TfcliError
from tfcli.io import atomic_dir, atomic_open, run_lock


def test_a_second_writer_of_a_directory_is_refused_and_a_dead_ones_lock_is_taken_over(tmp_path):
    target = tmp_path / "run"
    with run_lock(target, "train"):
        with pytest.raises(TfcliError, match=r"run: in use by another tfcli train \(pid \d+ on"):
            with run_lock(target, "train"):
                pass
    assert not (tmp_path / ".run.lock").exists()  # released
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a process that is gone, as after kill -9
    (tmp_path / ".run.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "command": "train"}))
    with run_lock(target, "train"):
        assert json.loads((tmp_path / ".run.lock").read_text())["pid"] == os.getpid()
    (tmp_path / ".run.lock").write_text("{half-writ")  # a lock file cut short by a kill
    with run_lock(target, "prepare"):
        pass


def test_train_and_prepare_refuse_a_directory_another_live_process_writes(tmp_path):
    from typer.testing import CliRunner

    from tfcli.cli import app

    data = make_parallel_prepared(tmp_path / "prep")
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name in ("run", "prep2"):
            (tmp_path / f".{name}.lock").write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(),
                                                               "command": "x", "since": "now"}))
        runner = CliRunner()
        res = runner.invoke(app, ["train", str(data), "-o", str(tmp_path / "run"), "--arch", "tiny", "--max-steps", "2"])
        assert res.exit_code == 1 and "in use by another tfcli" in res.output
        assert not (tmp_path / "run").exists()  # nothing written
        (tmp_path / "a.txt").write_text("w1 w2\nw3\n")
        res = runner.invoke(app, ["prepare", "--src", str(tmp_path / "a.txt"), "--tgt", str(tmp_path / "a.txt"),
                                  "-o", str(tmp_path / "prep2")])
        assert res.exit_code == 1 and "in use by another tfcli" in res.output
    finally:
        holder.kill()


def test_resume_of_a_run_killed_before_its_first_checkpoint_starts_it_again(tmp_path, capsys):
    from tfcli.train.trainer import run as run_train, train

    data = make_parallel_prepared(tmp_path / "prep")
    cfg = tiny_train_config(data, tmp_path / "run", max_steps=4, valid_every=4, valid_bleu=False, seed=7)
    train(cfg)
    # as a kill before step 4 leaves it: config.yaml and metrics, no checkpoint
    for d in (tmp_path / "run" / "checkpoints").iterdir():
        subprocess.run(["rm", "-rf", str(d)], check=True)
    capsys.readouterr()
    result = run_train(None, {"out": str(tmp_path / "run"), "resume": True})
    assert result.step == 4
    assert "starting it again from step 0 with its saved config" in capsys.readouterr().err
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-0000004" / "config.json").read_text())
    assert saved["train"]["seed"] == 7 and saved["model"]["d_model"] == 32  # the run's own settings
    with pytest.raises(TfcliError, match="nothing to resume"):
        run_train(None, {"out": str(tmp_path / "empty"), "resume": True})


# --- injected write faults (io.fault_point): every output whole or absent, and a re-run succeeds ----------------


def _with_fault(n: int, args: list) -> "object":
    import tfcli.io
    from typer.testing import CliRunner

    from tfcli.cli import app

    tfcli.io._write_points = 0
    return CliRunner().invoke(app, [str(a) for a in args], env={"TFCLI_FAIL_AT": str(n)} if n else {"TFCLI_FAIL_AT": ""})


def _each_fault(args: list, check, limit: int = 40) -> int:
    """Run `args` failing at write point 1, 2, ... until it runs through; `check()` after each failure."""
    for n in range(1, limit):
        res = _with_fault(n, args)
        if res.exit_code == 0:
            return n - 1
        assert res.exit_code == 1, res.output
        errors = [line for line in res.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "No space left on device (injected" in errors[0], res.output
        check()
    raise AssertionError(f"still failing after {limit} write points")


def test_prepare_interrupted_at_any_write_leaves_nothing_that_looks_prepared(tmp_path):
    from tfcli.data.prepared import PreparedData

    (tmp_path / "a.txt").write_text("w1 w2 w3\nw4 w5\nw6\n" * 20)
    (tmp_path / "v.txt").write_text("w1 w2\nw3\n")
    out = tmp_path / "prep"
    args = ["prepare", "--src", tmp_path / "a.txt", "--tgt", tmp_path / "a.txt", "--valid-src", tmp_path / "v.txt",
            "--valid-tgt", tmp_path / "v.txt", "--tokenizer", "bpe", "--vocab-size", "40", "-o", out]

    def check():
        assert not out.exists()
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".prep")] == []  # no temp dir, no lock

    points = _each_fault(args, check)
    assert points >= 5  # the .bin/.idx files of each split and side, and the final rename
    PreparedData(out).sequences("train", "src")  # the run through is whole


def test_translate_interrupted_at_any_write_keeps_the_old_output(tmp_path):
    from helpers import copy_model, save_model, save_word_tokenizer

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    (tmp_path / "in.txt").write_text("w1 w2\nw3\n")
    out = tmp_path / "out.txt"
    out.write_text("old\n")

    def check():
        assert out.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["ck", "in.txt",
                                                                                           "out.txt", "w.json"]

    assert _each_fault(["translate", "-m", ckpt, "--greedy", tmp_path / "in.txt", "-o", out], check) >= 1
    assert out.read_text() == "w1 w2\nw3\n"


def test_training_interrupted_at_any_write_keeps_a_whole_checkpoint_and_resumes(tmp_path):
    from tfcli import checkpoint

    data = make_parallel_prepared(tmp_path / "prep")
    run = tmp_path / "run"
    args = ["train", data, "-o", run, "--arch", "tiny", "--max-steps", "4", "--valid-every", "2", "--no-valid-bleu",
            "--threads", "1", "--set", "train.tensorboard=false"]
    for n in range(1, 40):
        shutil.rmtree(run, ignore_errors=True)
        res = _with_fault(n, args)
        if res.exit_code == 0:
            break
        assert res.exit_code == 1 and "No space left on device (injected" in res.output, res.output
        latest = run / "checkpoints" / "LATEST"
        if latest.exists():  # LATEST always names a whole checkpoint
            checkpoint.load(run / "checkpoints" / latest.read_text().strip())
        resumed = _with_fault(0, args + ["--resume"] if (run / "config.yaml").exists() else args)
        assert resumed.exit_code == 0, resumed.output
        assert (run / "checkpoints" / "step-0000004").is_dir()
    else:
        raise AssertionError("training still failing after 40 write points")
    assert n > 5


def test_a_checkpoint_from_a_newer_format_is_refused_with_the_version(tmp_path):
    from helpers import copy_model, save_model, save_word_tokenizer
    from tfcli import checkpoint
    from tfcli.errors import CheckpointError

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    meta = json.loads((ckpt / "config.json").read_text())
    meta["format_version"] += 1
    (ckpt / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="reads up to format 1: upgrade tfcli"):
        checkpoint.load(ckpt)


def test_a_signal_whose_keyboardinterrupt_was_lost_still_stops_every_commit(tmp_path, monkeypatch):
    """C code (Cython's import-time hooks, seen in numpy.random) can swallow the KeyboardInterrupt raised by the
    signal handler; the remembered signal still keeps every output as it was, and the command still ends in 130."""
    monkeypatch.setattr(errors, "_signalled", None)
    out = tmp_path / "out.txt"
    out.write_text("good\n")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(out) as f:
            f.write("new\n")
            try:
                errors.interrupt(15, None)  # the handler, as SIGTERM runs it ...
            except KeyboardInterrupt:
                pass  # ... and its exception lost
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "dir") as d:
            (d / "x").write_text("x")
    assert out.read_text() == "good\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]

    import typer

    from tfcli.cli import run

    with pytest.raises(typer.Exit) as exit:
        run(lambda: 0)  # a command that returned normally after the lost interrupt
    assert exit.value.exit_code == errors.EXIT_INTERRUPTED
