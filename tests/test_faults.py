"""Faults of the machine: two runs at once, a run killed before its first checkpoint, writes that fail (injected
at every write point, and a real file-size limit), kill -9 at seeded moments, a lost KeyboardInterrupt."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import make_parallel_prepared, tiny_train_config
from tfcli import errors
from tfcli.errors import CheckpointError, TfcliError
from tfcli.io import atomic_dir, atomic_open, run_lock

ROOT = Path(__file__).resolve().parents[1]


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
        res = runner.invoke(app, ["train", str(data), "-o", str(tmp_path / "run"), "--arch", "toy", "--max-steps", "2"])
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
    # the same --resume with another setting than the run started with: refused, naming it
    for d in (tmp_path / "run" / "checkpoints").iterdir():
        subprocess.run(["rm", "-rf", str(d)], check=True)
    with pytest.raises(CheckpointError, match="started with other settings \\(seed: 7 -> 8\\)"):
        run_train(None, {"out": str(tmp_path / "run"), "resume": True, "seed": 8})


def test_resume_as_job_scripts_pass_it_starts_a_run_that_has_not_started(tmp_path, capsys):
    """Job scripts on preemptible machines pass --resume on every start: where the run directory holds nothing of a
    run (it does not exist yet, or a kill before its config left an empty checkpoints folder), --resume starts the
    run, saying so, and it trains what a run started without --resume trains; a directory holding other files is
    still refused."""
    import dataclasses

    from tfcli.train.trainer import run as run_train, train

    data = make_parallel_prepared(tmp_path / "prep")
    cfg = tiny_train_config(data, tmp_path / "plain", max_steps=4, valid_every=4, valid_bleu=False, seed=7)
    train(cfg)
    (tmp_path / "killed" / "checkpoints").mkdir(parents=True)  # (what a kill before the config leaves)
    for out in ("fresh", "killed"):
        flags = dict(dataclasses.asdict(cfg), out=str(tmp_path / out), resume=True)
        capsys.readouterr()
        assert run_train(None, flags).step == 4
        assert "no run there yet (nothing to resume); starting it" in capsys.readouterr().err
        for name in ("model.safetensors",):
            want = load_file(tmp_path / "plain" / "checkpoints" / "step-0000004" / name)
            got = load_file(tmp_path / out / "checkpoints" / "step-0000004" / name)
            assert all(torch.equal(want[k], got[k]) for k in want)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a run")
    with pytest.raises(CheckpointError, match="holds files but no run"):
        run_train(None, dict(dataclasses.asdict(cfg), out=str(tmp_path / "other"), resume=True))


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
    args = ["train", data, "-o", run, "--arch", "toy", "--max-steps", "4", "--valid-every", "2", "--no-valid-bleu",
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


@pytest.mark.parametrize("error", [AttributeError("module 'numpy' has no attribute 'void'"), TfcliError("x: bad"),
                                   OSError(5, "Input/output error")])
def test_an_error_after_a_lost_interrupt_is_the_interrupt(monkeypatch, capsys, error):
    """A KeyboardInterrupt lost inside a lazy import leaves a half-made module behind, and the command fails on it
    later: that failure is the interrupt's, so it ends in 130 with `interrupted`, not an internal error."""
    import typer

    from tfcli.cli import run

    def command():
        try:
            errors.interrupt(2, None)  # SIGINT's handler, inside an import ...
        except KeyboardInterrupt:
            pass  # ... which lost its exception
        raise error

    monkeypatch.setattr(errors, "_signalled", None)
    with pytest.raises(typer.Exit) as exit:
        run(command)
    assert exit.value.exit_code == errors.EXIT_INTERRUPTED
    assert capsys.readouterr().err.strip() == "interrupted"


def test_an_error_after_an_interrupt_lost_in_the_start_exits_130():
    """A SIGINT whose KeyboardInterrupt an extension's import swallowed surfaces later as another error (numpy:
    "cannot load module more than once per process"): outside any command, the entry point still ends in
    `interrupted` and 130, without a traceback; the same error with no signal stays an error."""
    code = ("import tfcli.cli as c, tfcli.errors as e, tfcli.__main__ as m\n"
            "def start(watch=None):\n"
            "    e._signalled = {signal}\n"
            "    raise ImportError('cannot load module more than once per process')\n"
            "c.main = start\n"
            "m.main()\n")
    lost = subprocess.run([sys.executable, "-c", code.format(signal=2)], capture_output=True, text=True, timeout=60)
    assert (lost.returncode, lost.stderr.strip()) == (130, "interrupted")
    plain = subprocess.run([sys.executable, "-c", code.format(signal=None)], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 1 and "ImportError" in plain.stderr


def test_a_signal_inside_an_import_waits_for_the_import_to_end(tmp_path):
    """A SIGINT while a module is being imported (where an extension's C++ may have nowhere to put the exception)
    is held until the import is over: the module is imported whole, and the command then ends in 130."""
    (tmp_path / "slow_module.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "for _ in range(20):\n"
        "    time.sleep(0.01)  # (Python checks for signals here)\n"
        "whole = True\n")
    code = ("import sys, time, tfcli.cli as c, tfcli.__main__ as m\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\n"
            "def start(watch=None):\n"
            "    import slow_module\n"
            "    print('whole' if slow_module.whole else 'cut', flush=True)\n"
            "    time.sleep(10)\n"
            "    print('not interrupted', flush=True)\n"
            "c.main = start\n"
            "m.main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (130, "whole\n", "interrupted")


@pytest.mark.slow
def test_sigint_while_export_imports_its_libraries_exits_130_and_writes_nothing(copier, tmp_path):
    """SIGINT at moments spread over `tfcli export --to ctranslate2`'s start (its lazy imports of torch, numpy,
    ctranslate2): every run ends in 130 (or, when the export had finished, 0 or killed by the signal), never an
    internal error; an interrupted one leaves nothing, a finished one the whole export, never a part of it."""
    import signal
    import time

    pytest.importorskip("ctranslate2")
    for i, delay in enumerate((0.5, 0.8, 1.1, 1.4, 1.8, 2.2, 2.8)):  # (tfcli sets its handlers at 0.1-0.2 s)
        out = tmp_path / f"ct2-{i}"
        proc = subprocess.Popen([sys.executable, "-m", "tfcli", "export", str(copier), "--to", "ctranslate2",
                                 "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
        # (-SIGINT: the signal came after the command was over, and ended the process as signals do by default)
        assert proc.returncode in (0, 130, -signal.SIGINT), (delay, stderr)
        assert "internal error" not in stderr and "Traceback" not in stderr, (delay, stderr)
        left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(out.name))
        if proc.returncode == 130 and not out.exists():
            assert left == [], (delay, left)  # interrupted: nothing written, no temporary left over
        else:  # finished (a signal just after the export's rename still ends in 130): the whole export, alone
            assert (out / "model.bin").is_file() and left == [out.name], (delay, left)


# --- a real limit on file size (RLIMIT_FSIZE: the kernel refuses the write, as a full disk does) -----------------


@pytest.mark.slow
def test_a_file_size_limit_stops_training_with_one_line_keeps_the_checkpoint_and_resume_continues(tmp_path):
    import resource

    from tfcli import checkpoint

    data = make_parallel_prepared(tmp_path / "prep")
    base = [sys.executable, "-m", "tfcli", "train", str(data), "--arch", "toy", "--valid-every", "2",
            "--no-valid-bleu", "--threads", "1", "--set", "train.tensorboard=false", "--set", "train.schedule=constant"]

    def train(out, steps, *more, limit=None):
        def set_limit():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))  # Python ignores SIGXFSZ: writes get EFBIG

        return subprocess.run([*base, "-o", str(out), "--max-steps", str(steps), *more], capture_output=True,
                              text=True, cwd=ROOT, preexec_fn=set_limit if limit else None, timeout=300)

    assert train(tmp_path / "whole", 4).returncode == 0  # the uninterrupted run
    run = tmp_path / "run"
    assert train(run, 2).returncode == 0
    weights = (run / "checkpoints" / "step-0000002" / "model.safetensors").stat().st_size
    full = train(run, 4, "--resume", limit=weights // 2)  # the next checkpoint cannot be written
    assert full.returncode == 1
    errors = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "step-0000004: cannot write:" in errors[0] and "File too large" in errors[0]
    assert "MiB needed" in errors[0] and "Traceback" not in full.stderr
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step-0000002"
    checkpoint.load(run / "checkpoints" / "step-0000002")  # whole
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]  # no temp dir left
    # space freed: the run continues where it was, to the weights of the uninterrupted one
    assert train(run, 4, "--resume").returncode == 0
    a = checkpoint.load(run / "checkpoints" / "step-0000004")[0].state_dict()
    b = checkpoint.load(tmp_path / "whole" / "checkpoints" / "step-0000004")[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- kill -9 at seeded moments: every output whole or absent, the command runs again, training resumes exactly ----

KILLS = 4  # seeded moments per command, one in each quarter of its run


def _kill_at(args: list, seconds: float, **kw) -> bool:
    """Run `python -m tfcli ARGS` and kill -9 it after `seconds`; True if it was still running then."""
    proc = subprocess.Popen([sys.executable, "-m", "tfcli", *map(str, args)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, **kw)
    try:
        proc.wait(timeout=seconds)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return True


def _moments(args: list, seed: int) -> list[float]:
    """KILLS moments over one uninterrupted run of `args` (timed here), one drawn (with `seed`) in each of KILLS
    equal parts of it after its first 0.3 s: start-up, work and the final writes are each hit."""
    import random
    import time

    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tfcli", *map(str, args)], cwd=ROOT, check=True, capture_output=True)
    total = time.perf_counter() - start
    rng = random.Random(seed)
    part = (total - 0.3) / KILLS
    return [rng.uniform(0.3 + i * part, 0.3 + (i + 1) * part) for i in range(KILLS)]


def _temp_entries(directory: Path) -> list[str]:
    return [p.name for p in Path(directory).iterdir() if ".tmp-" in p.name or ".old-" in p.name]


@pytest.mark.slow
def test_kill_9_during_prepare(tmp_path):
    from tfcli.data.prepared import PreparedData

    rows = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(i % 9 + 1)) for i in range(30000)]
    (tmp_path / "a.txt").write_text("\n".join(rows) + "\n")
    out = tmp_path / "prep"
    args = ["prepare", "--src", tmp_path / "a.txt", "--tgt", tmp_path / "a.txt", "--vocab-size", "60", "-o", out, "-f"]
    for at in _moments(args, seed=1):
        shutil.rmtree(out, ignore_errors=True)
        _kill_at(args, at)
        if out.exists():  # whole, or not there
            data = PreparedData(out)
            assert len(data.sequences("train", "src")) == 30000
        assert subprocess.run([sys.executable, "-m", "tfcli", *map(str, args)], cwd=ROOT).returncode == 0
        assert _temp_entries(tmp_path) == [] and len(PreparedData(out).sequences("train", "tgt")) == 30000


@pytest.mark.slow
@pytest.mark.parametrize("adapting", [None, "lora", "freeze"])
def test_kill_9_during_training_then_resume_gives_the_uninterrupted_weights(tmp_path, adapting):
    """Training from scratch (killed KILLS times), and fine-tuning a trained model by LoRA or with frozen parts
    (killed twice each)."""
    from tfcli import checkpoint
    from tfcli.train.trainer import train

    data = make_parallel_prepared(tmp_path / "prep", n_train=400)
    common = ["--arch", "toy", "--max-steps", "24", "--valid-every", "4", "--no-valid-bleu", "--threads", "1",
              "--set", "train.tensorboard=false", "--max-tokens", "256"]
    if adapting:
        train(tiny_train_config(data, tmp_path / "base", max_steps=4, valid_every=4, valid_bleu=False))
        common = [*common[2:], "--init-from", tmp_path / "base", "--set", "model.dropout=0.1",
                  *(["--lora-rank", "4", "--lora-dropout", "0.1"] if adapting == "lora" else ["--freeze", "encoder"])]
    whole = tmp_path / "whole"
    moments = _moments(["train", data, "-o", whole, *common], seed=2)
    reference = checkpoint.load(whole / "checkpoints" / "step-0000024")[0].state_dict()
    for i, at in enumerate(moments[1::2] if adapting else moments):
        run = tmp_path / f"run{i}"
        _kill_at(["train", data, "-o", run, *common], at)
        ckpts = run / "checkpoints"
        if (ckpts / "LATEST").exists():  # LATEST and BEST always name a whole checkpoint
            for name in ("LATEST", "BEST"):
                if (ckpts / name).exists():
                    checkpoint.load(ckpts / (ckpts / name).read_text().strip())
        again = ["train", data, "-o", run, *common] + (["--resume"] if (run / "config.yaml").exists() else [])
        r = subprocess.run([sys.executable, "-m", "tfcli", *map(str, again)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        weights = checkpoint.load(ckpts / "step-0000024")[0].state_dict()
        assert all(torch.equal(weights[k], reference[k]) for k in reference), f"killed at {at:.2f} s"
        assert _temp_entries(ckpts) == []


@pytest.mark.slow
def test_kill_9_during_translate_average_and_export(tmp_path):
    from helpers import copy_model, save_model, save_word_tokenizer

    from tfcli import checkpoint

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    lines = [" ".join(f"w{(i + j) % 20}" for j in range(i % 7 + 1)) for i in range(6000)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.txt"
    translate = ["translate", "-m", ckpt, "--greedy", "--threads", "1", tmp_path / "in.txt", "-o", out]
    for at in _moments(translate, seed=3):
        out.write_text("old\n")
        _kill_at(translate, at)
        assert out.read_text() in ("old\n", "\n".join(lines) + "\n")  # the old file or the whole new one
    assert subprocess.run([sys.executable, "-m", "tfcli", *map(str, translate)], cwd=ROOT).returncode == 0
    assert out.read_text() == "\n".join(lines) + "\n"  # after the last kill, the command runs again
    assert [p for p in _temp_entries(tmp_path)] == []

    run = tmp_path / "run"  # a run with four checkpoints to average
    data = make_parallel_prepared(tmp_path / "prep")
    subprocess.run([sys.executable, "-m", "tfcli", "train", data, "-o", run, "--arch", "toy", "--max-steps", "8",
                    "--valid-every", "2", "--no-valid-bleu", "--threads", "1", "--set", "train.tensorboard=false",
                    "--keep-last", "4"], cwd=ROOT, check=True, capture_output=True)
    avg = tmp_path / "avg"
    exported = tmp_path / "ct2"
    jobs = [(["average-checkpoints", run, "--last", "4", "-o", avg, "-f"], avg, lambda: checkpoint.load(avg))]
    if importlib.util.find_spec("ctranslate2") is not None:
        import ctranslate2

        jobs.append((["export", run, "--to", "ctranslate2", "-o", exported], exported,
                     lambda: ctranslate2.Translator(str(exported))))
    for seed, (args, target, load) in enumerate(jobs, 4):
        for at in _moments(args, seed=seed):
            shutil.rmtree(target, ignore_errors=True)
            _kill_at(args, at)
            if target.exists():
                load()  # whole
            else:
                assert subprocess.run([sys.executable, "-m", "tfcli", *map(str, args)], cwd=ROOT).returncode == 0
            load()
            assert _temp_entries(tmp_path) == []


def test_a_prepared_directory_changed_after_prepare_and_a_checkpoint_without_its_tokenizer(tmp_path):
    """Files that still agree with each other but not with meta.json (both cut at a sequence boundary), and a
    checkpoint whose tokenizer file is gone: one line naming the file, nothing written."""
    import numpy as np
    from helpers import copy_model, save_model, save_word_tokenizer
    from typer.testing import CliRunner

    from tfcli.cli import app

    data = make_parallel_prepared(tmp_path / "prep")
    offsets = np.fromfile(data / "train.src.idx", dtype=np.int64)
    half = offsets[: len(offsets) // 2]
    half.tofile(data / "train.src.idx")
    with open(data / "train.src.bin", "r+b") as f:
        f.truncate(int(half[-1]) * 2)  # uint16 ids
    r = CliRunner().invoke(app, ["train", str(data), "-o", str(tmp_path / "run"), "--arch", "toy", "--max-steps", "2"])
    assert r.exit_code == 1 and "train.src.idx" in r.stderr and "changed after prepare" in r.stderr, r.output
    assert not (tmp_path / "run" / "checkpoints").exists()

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    (ckpt / "tokenizer.src.json").unlink()
    r = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "-", "-o", str(tmp_path / "out.txt")], input="w1\n")
    assert r.exit_code == 1 and "tokenizer.src.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.txt").exists()


# --- out of memory: a clear stop, the due checkpoint saved, and --resume goes on ------------------------------

CPU_OOM = "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"


@pytest.mark.parametrize("where", ["validation", "step"])
def test_out_of_memory_stops_with_the_setting_to_lower_and_resume_goes_on(where, tmp_path, monkeypatch):
    from tfcli import checkpoint
    from tfcli.train import trainer as trainer_module
    from tfcli.train.trainer import run as run_train, train

    data = make_parallel_prepared(tmp_path / "prep")
    whole = train(tiny_train_config(data, tmp_path / "whole", max_steps=6, valid_every=2, valid_bleu=False))
    cfg = tiny_train_config(data, tmp_path / "run", max_steps=6, valid_every=2, valid_bleu=False)
    method = "validate" if where == "validation" else "_step"
    original = getattr(trainer_module.Trainer, method)

    def fails_at_step_4(self, *args):
        if self.step == (4 if where == "validation" else 3):
            raise RuntimeError(CPU_OOM)
        return original(self, *args)

    monkeypatch.setattr(trainer_module.Trainer, method, fails_at_step_4)
    with pytest.raises(TfcliError) as e:
        train(cfg)
    message = str(e.value)
    if where == "validation":
        assert message.startswith("out of memory while validating at step 4: lower --bleu-max-sentences")
        assert "step-0000004 is whole: continue with --resume" in message  # the checkpoint that was due
    else:
        assert message.startswith("out of memory at step 4 (a batch of") and "lower --max-tokens" in message
        assert "step-0000002 is whole: continue with --resume" in message
    monkeypatch.setattr(trainer_module.Trainer, method, original)
    result = run_train(None, {"out": str(tmp_path / "run"), "resume": True})
    assert result.step == 6
    a = checkpoint.load(result.checkpoint)[0].state_dict()
    b = checkpoint.load(whole.checkpoint)[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)  # as if nothing had happened


def test_an_output_creates_its_missing_directories_or_says_what_is_in_the_way(tmp_path):
    """One rule for every output: -o new/dir/out.txt creates new/dir, as --output-dir does; a file where a
    directory should be is one line naming it."""
    from helpers import copy_model, save_model, save_word_tokenizer
    from typer.testing import CliRunner

    from tfcli.cli import app

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    out = tmp_path / "missing" / "deeper" / "out.txt"
    r = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "-", "-o", str(out)], input="w1\n")
    assert r.exit_code == 0 and out.read_text() == "w1\n"
    (tmp_path / "afile").write_text("x")
    r = CliRunner().invoke(app, ["translate", "-m", str(ckpt), "-", "-o", str(tmp_path / "afile" / "sub" / "o.txt")],
                           input="w1\n")
    assert r.exit_code == 1 and r.stderr.strip() == (
        f"error: {tmp_path / 'afile' / 'sub'}: cannot be created: {tmp_path / 'afile'} is a file")
    for command in (["plot", str(tmp_path / "nope"), "-o", str(tmp_path / "p" / "q" / "c.png")],):
        r = CliRunner().invoke(app, command)
        assert r.exit_code == 1 and "nope" in r.stderr  # the input's error, not the output's directory


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_quantize_interrupted_at_any_write_leaves_the_checkpoint_as_it_was(dtype, tmp_path):
    from helpers import save_random_translator, stored_layout_decoded

    if not stored_layout_decoded(dtype):
        pytest.skip(f"{dtype} decoding's stored layout is not used here")
    ckpt = save_random_translator(tmp_path, 5)
    before = sorted(p.name for p in ckpt.iterdir())

    def check():
        assert sorted(p.name for p in ckpt.iterdir()) == before  # no stored file, no temp file

    assert _each_fault(["quantize", ckpt, "--dtype", dtype], check) >= 1
    assert (ckpt / f"model.{dtype}.safetensors").is_file()
