"""Faults of the machine: two runs at once, a run killed before its first checkpoint."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from helpers import make_parallel_prepared, tiny_train_config
from tfcli.errors import TfcliError
from tfcli.io import run_lock


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
