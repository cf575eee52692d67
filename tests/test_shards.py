"""One file over several processes (torchrun) and --resume (tfcli/generate/shards.py): the parts joined in input order
are byte for byte what one process writes; a stopped run keeps its finished parts; parts of another translation are
never mixed in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import WORDS, random_decoder_translator, save_random_translator
from tfcli.cli import app
from tfcli.generate import translate as translate_module
from tfcli.generate.config import TranslateConfig
from tfcli.generate.translate import translate


@pytest.fixture(scope="module", params=["encoder-decoder", "decoder-only"])
def random_ckpt(request, tmp_path_factory) -> Path:
    """A random tiny model over WORDS, an encoder-decoder or a decoder-only translator (its source and target in one
    sequence, prefilled as a prompt): its outputs are arbitrary but fixed, a sterner check than the copier that a
    sentence's translation does not depend on which process or batch it is in."""
    d = tmp_path_factory.mktemp("random")
    if request.param == "decoder-only":
        return random_decoder_translator(d, 0, prefix_attention=True)[1]
    return save_random_translator(d, 0)


def corpus(path: Path, n: int, seed: int = 0) -> Path:
    import random

    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9))) for _ in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_resume_in_one_process_writes_what_a_plain_run_writes(random_ckpt, tmp_path):
    src = corpus(tmp_path / "in.txt", 23)
    plain = cli("translate", "-m", random_ckpt, src, "-o", tmp_path / "plain.txt", "--beam-size", "3")
    assert plain.exit_code == 0, plain.output
    parts = cli("translate", "-m", random_ckpt, src, "-o", tmp_path / "parts.txt", "--beam-size", "3", "--resume",
                "--part-lines", "5", "--batch-size", "2")
    assert parts.exit_code == 0, parts.output
    assert (tmp_path / "parts.txt").read_bytes() == (tmp_path / "plain.txt").read_bytes()
    assert not (tmp_path / "parts.txt.parts").exists()
    nbest = cli("translate", "-m", random_ckpt, src, "-o", tmp_path / "nbest.txt", "--nbest", "2", "--resume",
                "--part-lines", "4")
    whole = cli("translate", "-m", random_ckpt, src, "-o", tmp_path / "nbest-plain.txt", "--nbest", "2")
    assert nbest.exit_code == whole.exit_code == 0
    assert (tmp_path / "nbest.txt").read_text() == (tmp_path / "nbest-plain.txt").read_text()  # line numbers too


def test_a_stopped_run_keeps_its_parts_and_resume_translates_only_the_rest(random_ckpt, tmp_path, monkeypatch):
    src = corpus(tmp_path / "in.txt", 14)
    out = tmp_path / "out.txt"
    cfg = TranslateConfig(part_lines=4, device="cpu")
    translate(str(random_ckpt), [str(src)], str(tmp_path / "plain.txt"), TranslateConfig(device="cpu"))

    run = translate_module.Pipeline.run
    calls = []

    def stopping(self, items):
        calls.append(len(items))
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the third part
        return run(self, items)

    monkeypatch.setattr(translate_module.Pipeline, "run", stopping)
    with pytest.raises(KeyboardInterrupt):
        translate(str(random_ckpt), [str(src)], str(out), cfg, resume=True)
    assert not out.exists()
    assert sorted(p.name for p in (tmp_path / "out.txt.parts").iterdir()) == [
        "manifest.json", "part-0000000.txt", "part-0000001.txt"]

    calls.clear()
    monkeypatch.setattr(translate_module.Pipeline, "run", lambda self, items: (calls.append(len(items)),
                                                                               run(self, items))[1])
    assert translate(str(random_ckpt), [str(src)], str(out), cfg, resume=True) == 6  # parts 2 and 3: 4 + 2 lines
    assert calls == [4, 2]
    assert out.read_bytes() == (tmp_path / "plain.txt").read_bytes()
    assert not (tmp_path / "out.txt.parts").exists()


def test_parts_of_another_translation_are_refused_and_a_plain_run_starts_over(random_ckpt, tmp_path):
    src = corpus(tmp_path / "in.txt", 10)
    out = tmp_path / "out.txt"
    work = tmp_path / "out.txt.parts"
    work.mkdir()
    (work / "manifest.json").write_text('{"inputs": []}')
    (work / "part-0000000.txt").write_text("stale\n")
    res = cli("translate", "-m", random_ckpt, src, "-o", out, "--resume", "--part-lines", "4")
    assert res.exit_code == 1 and "holds parts of another translation" in res.output
    assert res.output.count("\n") == 1 and not out.exists()
    assert (work / "part-0000000.txt").read_text() == "stale\n"  # left for the run they belong to
    (work / "manifest.json").unlink()  # a parts directory without its manifest is no one's to resume either
    res = cli("translate", "-m", random_ckpt, src, "-o", out, "--resume", "--part-lines", "4")
    assert res.exit_code == 1 and "holds parts of another translation" in res.output


def test_parts_need_a_named_output_and_a_file_input(random_ckpt, tmp_path):
    src = corpus(tmp_path / "in.txt", 3)
    res = cli("translate", "-m", random_ckpt, src, "--resume")
    assert res.exit_code == 1 and "give -o FILE" in res.output
    res = CliRunner().invoke(app, ["translate", "-m", str(random_ckpt), "-o", str(tmp_path / "o"), "--resume"],
                             input="cat dog\n")
    assert res.exit_code == 1 and "not stdin" in res.output
    res = cli("translate", "-m", random_ckpt, src, "-o", tmp_path / "o", "--part-lines", "3")
    assert res.exit_code == 2 and "--part-lines" in res.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 3])
def test_several_processes_write_the_bytes_one_process_writes(random_ckpt, tmp_path, world):
    """Ranks started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT; gloo), each with other batch
    settings: the joined file is byte for byte the one-process output."""
    src = corpus(tmp_path / "in.txt", 37, seed=world)
    one = cli("translate", "-m", random_ckpt, src, "-o", tmp_path / "one.txt", "--beam-size", "4")
    assert one.exit_code == 0, one.output
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tfcli", "translate", "-m", str(random_ckpt), str(src), "-o",
             str(tmp_path / "many.txt"), "--beam-size", "4", "--part-lines", "5", "--device", "cpu",
             "--batch-size", str(rank + 1), "--threads", "1"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert (tmp_path / "many.txt").read_bytes() == (tmp_path / "one.txt").read_bytes()
    assert not (tmp_path / "many.txt.parts").exists()
