"""No command writes over one of its own inputs, however the path is spelled: the same name, relative or absolute,
through a symlink (to the file or to a directory on its path), or a hard link; and no directory output replaces a
directory that holds an input. Each refusal is one line, exit status 1, and the input is left byte for byte."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import WORDS, save_copier, train_tiny_checkpoint
from tfcli import checkpoint_meta
from tfcli.cli import app
from tfcli.errors import TfcliError
from tfcli.io import refuse_overwriting_inputs

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def cli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def refused(result, *fragments):
    assert result.exit_code == 1, (result.exit_code, result.stderr, result.exception)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for f in fragments:
        assert f in lines[0], (f, result.stderr)


def tree(path: Path) -> dict:
    path = Path(path)
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def spellings(target: Path, work: Path) -> list[str]:
    """Other names for the existing file or directory `target`: as given, absolute, with ./ and .., through a
    symlink to it, through a symlink to its directory, and (a file) a hard link. Run from `work` (the cwd)."""
    rel = os.path.relpath(target, work)
    link = work / f"link-to-{target.name}"
    dir_link = work / f"dirlink-{target.parent.name}"
    for p in (link, dir_link):
        if p.is_symlink() or p.exists():
            p.unlink()
    link.symlink_to(target)
    dir_link.symlink_to(target.parent, target_is_directory=True)
    parent = os.path.relpath(target.parent, work)
    names = [rel, str(target.resolve()), os.path.join(".", parent, "..", target.parent.name, target.name),
             os.path.join("no-such-dir", "..", rel), link.name, f"{dir_link.name}/{target.name}"]
    if target.is_file():
        hard = work / f"hard-{target.name}"
        if not hard.exists():
            os.link(target, hard)
        names.append(hard.name)
    return names


@pytest.fixture(scope="module")
def copier_dir(tmp_path_factory):
    return save_copier(tmp_path_factory.mktemp("copier"), WORDS)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A working directory holding an input text (in/text.txt) and a reference (in/ref.txt)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "text.txt").write_text("cat dog\nmoon\n", encoding="utf-8")
    (tmp_path / "in" / "ref.txt").write_text("cat dog\nmoon\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_check_itself(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("x")
    refuse_overwriting_inputs([b], [a])  # a new file is never an input
    refuse_overwriting_inputs([tmp_path / "new-dir"], [a])
    b.write_text("y")
    refuse_overwriting_inputs([b], [a, None, "-"])  # two different files
    os.link(a, tmp_path / "h")
    for out in (a, tmp_path / "h", tmp_path / "." / "a"):
        with pytest.raises(TfcliError, match="is an input"):
            refuse_overwriting_inputs([out], [a])
    with pytest.raises(TfcliError, match="holds the input"):
        refuse_overwriting_inputs([tmp_path], [a])
    refuse_overwriting_inputs([a], [tmp_path / "missing"])


def test_translate_never_writes_over_its_input(copier_dir, work):
    src = work / "in" / "text.txt"
    before = src.read_bytes()
    for name in spellings(src, work):
        refused(cli("translate", "-m", copier_dir, "in/text.txt", "-o", name), "is an input")
        if os.path.exists(name):  # (as an input, the name must be one the OS opens)
            refused(cli("translate", "-m", copier_dir, name, "-o", "in/text.txt"), "is an input")
        assert src.read_bytes() == before
    # --output-dir whose output name is the input's (no --suffix), spelled through a symlink to the directory
    refused(cli("translate", "-m", copier_dir, "in/text.txt", "--output-dir", "dirlink-in"), "is an input")
    # nor over the model's own files
    weights = Path(copier_dir) / "model.safetensors"
    saved = weights.read_bytes()
    refused(cli("translate", "-m", copier_dir, "in/text.txt", "-o", weights), "is an input")
    assert weights.read_bytes() == saved and src.read_bytes() == before
    ok = cli("translate", "-m", copier_dir, "in/text.txt", "-o", "out.txt")  # and a fresh output still works
    assert ok.exit_code == 0 and (work / "out.txt").read_text() == "cat dog\nmoon\n"


def test_translate_refuses_a_stdout_redirected_into_its_input(copier_dir, work):
    src = work / "in" / "text.txt"
    before = src.read_bytes()
    with open(src, "ab") as appended:
        proc = subprocess.run([sys.executable, "-m", "tfcli", "translate", "-m", str(copier_dir), str(src)],
                              stdout=appended, stderr=subprocess.PIPE, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and b"stdout: is an input" in proc.stderr, proc.stderr
    assert src.read_bytes() == before


def test_eval_keeps_its_translations_elsewhere_than_its_inputs(copier_dir, work):
    src, ref = work / "in" / "text.txt", work / "in" / "ref.txt"
    before = tree(work / "in")
    for target in (src, ref):
        for name in spellings(target, work):
            refused(cli("eval", "-m", copier_dir, "--translate", "in/text.txt", "-r", "in/ref.txt", "-o", name),
                    "is an input")
    assert tree(work / "in") == before


def test_export_and_import_never_write_over_their_source(run_with_three, work, tmp_path):
    pytest.importorskip("transformers")
    ckpt = Path(shutil.copytree(checkpoint_meta.resolve(run_with_three), tmp_path / "ckpt"))
    before = tree(ckpt)
    for name in spellings(ckpt, work):
        refused(cli("export", ckpt, "--to", "hf", "-o", name), "is an input")
    refused(cli("export", ckpt, "--to", "hf", "-o", ckpt / "config.json"), "is an input")
    assert tree(ckpt) == before
    hf_dir = tmp_path / "hf"
    assert cli("export", ckpt, "--to", "hf", "-o", hf_dir).exit_code == 0
    exported = tree(hf_dir)
    for name in spellings(hf_dir, work):
        refused(cli("import", hf_dir, "-o", name, "--force"), "is an input")
    assert tree(hf_dir) == exported
    # --force replaces an output that is not an input, in one step
    assert cli("import", hf_dir, "-o", tmp_path / "imported").exit_code == 0
    refused(cli("import", hf_dir, "-o", tmp_path / "imported"), "already exists", "--force")
    assert cli("import", hf_dir, "-o", tmp_path / "imported", "--force").exit_code == 0


@pytest.fixture(scope="module")
def run_with_three(tmp_path_factory):
    return train_tiny_checkpoint(tmp_path_factory.mktemp("avg"), steps=6, valid_every=2, keep_last=3,
                                 valid_bleu=False)


def test_average_checkpoints_never_writes_over_a_source(run_with_three, work):
    ckpts = run_with_three / "checkpoints"
    before = tree(ckpts)
    sources = sorted(p for p in ckpts.iterdir() if p.name.startswith("step-"))
    for name in spellings(sources[-1], work):
        refused(cli("average-checkpoints", run_with_three, "--last", "2", "-o", name, "--force"), "is an input")
        refused(cli("average-checkpoints", "--checkpoint", sources[0], "--checkpoint", sources[-1], "-o", name,
                    "--force"), "is an input")
    for name in spellings(ckpts, work):  # the run's checkpoint directory holds every source
        refused(cli("average-checkpoints", run_with_three, "--last", "2", "-o", name, "--force"), "holds the input")
    refused(cli("average-checkpoints", run_with_three, "--last", "2", "-o", run_with_three, "--force"),
            "holds the input")
    assert tree(ckpts) == before


def test_prepare_never_replaces_a_directory_holding_its_inputs(work, tmp_path):
    (work / "in" / "train.de").write_text("a b c\nd e\n" * 20, encoding="utf-8")
    (work / "in" / "train.en").write_text("x y\nz\n" * 20, encoding="utf-8")
    before = tree(work / "in")
    for name in spellings(work / "in", work):
        refused(cli("prepare", "--src", "in/train.de", "--tgt", "in/train.en", "--tokenizer", "char", "-o", name,
                    "--force"), "holds the input")
    assert tree(work / "in") == before
    # a prepared directory used for its tokenizer is an input too
    assert cli("prepare", "--src", "in/train.de", "--tgt", "in/train.en", "--tokenizer", "char",
               "-o", "prep").exit_code == 0
    prep = tree(work / "prep")
    for name in spellings(work / "prep", work):
        refused(cli("prepare", "--src", "in/train.de", "--tgt", "in/train.en", "--tokenizer-from", "prep", "-o",
                    name, "--force"), "input")
    assert tree(work / "prep") == prep


def test_attention_and_plot_never_write_over_their_inputs(copier_dir, work, tmp_path):
    page = work / "pics" / "attention.html"
    page.parent.mkdir()
    page.write_text("cat dog\n", encoding="utf-8")  # an input file that has the name of an output
    refused(cli("attention", "-m", copier_dir, "--input", page, "-o", "pics", "--no-png"), "is an input")
    assert page.read_text() == "cat dog\n"
    run_dir = work / "run"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"split": "train", "step": 1, "loss": 2.0}\n', encoding="utf-8")
    for name in spellings(metrics, work):
        refused(cli("plot", "run", "-o", name), "is an input")
    assert metrics.read_text() == '{"split": "train", "step": 1, "loss": 2.0}\n'


def test_eval_refuses_a_stdout_redirected_into_a_file_it_scores(work):
    ref = work / "in" / "ref.txt"
    before = ref.read_bytes()
    with open(ref, "ab") as appended:
        proc = subprocess.run([sys.executable, "-m", "tfcli", "eval", str(work / "in" / "text.txt"), "-r", str(ref)],
                              stdout=appended, stderr=subprocess.PIPE, cwd=ROOT, timeout=120)
    assert proc.returncode == 1 and b"stdout: is an input" in proc.stderr, proc.stderr
    assert ref.read_bytes() == before
