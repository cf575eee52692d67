"""The command line as people use it every day: flags, help, completion, terminals, pipes, logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from tfcli.cli import app


def _commands():
    group = typer.main.get_command(app)
    return {name: cmd for name, cmd in group.commands.items()}


def test_one_short_flag_one_meaning_across_commands():
    """-m is always the model, -o always the output, and so on: a short flag's long names agree everywhere."""
    meaning: dict[str, tuple[str, set[str]]] = {}
    for name, cmd in _commands().items():
        for p in cmd.params:
            if p.param_type_name != "option":
                continue
            longs = {o for o in p.opts + p.secondary_opts if o.startswith("--")}
            for short in (o for o in p.opts if len(o) == 2):
                if short in meaning:
                    first, names = meaning[short]
                    assert names & longs, f"{short}: {sorted(names)} in {first} but {sorted(longs)} in {name}"
                else:
                    meaning[short] = (name, longs)
    assert "--model" in meaning["-m"][1] and "--output" in meaning["-o"][1]
    assert {c for c, cmd in _commands().items() if any({"--model", "-m"} <= set(p.opts) for p in cmd.params)} >= {
        "translate", "lm-generate", "eval", "attention"}


def test_help_shows_value_types_for_options_and_none_for_flags():
    from typer.testing import CliRunner

    runner = CliRunner()
    for name in _commands():
        res = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, name
        assert "<bool>" not in res.output, name
    res = runner.invoke(app, ["translate", "--help"], env={"COLUMNS": "200"})
    row = next(line for line in res.output.splitlines() if "--beam-size" in line and "Beam size" in line)
    assert "<int>" in row


def test_no_help_text_loses_brackets_to_markup():
    """Help is rendered as rich markup, where `[word]` is a style and vanishes (`pip install 'tfcli[tensorboard]'`
    showed as 'tfcli'): every bracket a help text means literally is escaped (\\[), and the extra shows."""
    import re

    from typer.testing import CliRunner

    markup = re.compile(r"(?<!\\)\[[a-z/#@][^\]]*\]")
    for name, cmd in _commands().items():
        texts = [cmd.help or ""] + [getattr(p, "help", None) or "" for p in cmd.params]
        for text in texts:
            assert not markup.search(text), (name, markup.search(text).group(0), text)
    res = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"})
    assert "tfcli[tensorboard]" in res.output


def test_shell_completion_is_offered():
    exe = Path(sys.executable).parent / "tfcli"
    # the shell named, not detected from the parent processes (a test runner's parent may be no shell at all):
    # typer's own switch for that
    res = subprocess.run([str(exe), "--show-completion", "bash"], capture_output=True, text=True,
                         env={**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert res.returncode == 0 and "_tfcli_completion" in res.stdout, res.stderr
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert "--install-completion" in res.stdout


def test_resume_of_a_finished_run_says_so_and_how_to_extend_it(tmp_path, capsys):
    from helpers import make_parallel_prepared, tiny_train_config
    from tfcli.train.trainer import run as run_train, train

    data = make_parallel_prepared(tmp_path / "prep")
    train(tiny_train_config(data, tmp_path / "run", max_steps=4, valid_every=4, valid_bleu=False))
    capsys.readouterr()
    result = run_train(None, {"out": str(tmp_path / "run"), "resume": True})
    assert result.step == 4
    err = capsys.readouterr().err
    assert "this run has finished (step 4, max_steps 4)" in err and "--max-steps" in err


def test_the_train_command_keeps_freed_memory_and_the_library_does_not(tmp_path, monkeypatch):
    """`tfcli train` tunes its process's allocator (a training step's logits are reused, not faulted in afresh);
    the library's train() leaves the process alone."""
    from helpers import make_parallel_prepared, tiny_train_config
    from typer.testing import CliRunner

    from tfcli import runtime as process
    from tfcli.train.trainer import train

    calls = []
    monkeypatch.setattr(process, "keep_freed_memory", lambda: calls.append("tuned") or True)
    data = make_parallel_prepared(tmp_path / "prep")
    train(tiny_train_config(data, tmp_path / "lib", max_steps=2, valid_every=2, valid_bleu=False))
    assert calls == []
    res = CliRunner().invoke(app, ["train", str(data), "-o", str(tmp_path / "cli"), "--arch", "toy", "--max-steps",
                                   "2", "--valid-every", "2", "--no-valid-bleu", "--device", "cpu", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert calls == ["tuned"]


def test_train_and_eval_name_the_smoothed_loss_and_the_plain_nll():
    from tfcli.train.log import format_record

    line = format_record({"split": "valid", "step": 5, "loss": 2.5, "nll": 2.0, "ppl": 7.39})
    assert "loss 2.500 | nll 2.000 | ppl 7.39" in line


def test_attention_help_names_the_files_it_writes(tmp_path):
    from helpers import copy_model, save_model, save_word_tokenizer
    from typer.testing import CliRunner

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    runner = CliRunner()
    res = runner.invoke(app, ["attention", "-m", str(ckpt), "w1 w2", "-o", str(tmp_path / "att"), "--no-html"])
    assert res.exit_code == 0, res.output
    written = sorted(p.name for p in (tmp_path / "att").iterdir())
    assert written == ["sentence1-cross.png", "sentence1-decoder-self.png", "sentence1-encoder-self.png"]
    help_text = " ".join(runner.invoke(app, ["attention", "--help"], env={"COLUMNS": "300"}).output.split())
    for name in ("sentence<i>-encoder-self.png", "-decoder-self.png", "-cross.png", "attention.html"):
        assert name in help_text


def test_tensorboard_is_opt_in_and_asking_for_it_without_the_package_says_what_to_install(tmp_path, capsys):
    import importlib.util

    from helpers import make_parallel_prepared, tiny_train_config
    from tfcli.errors import ConfigError
    from tfcli.train.config import TrainConfig
    from tfcli.train.trainer import train

    assert TrainConfig().tensorboard is False
    data = make_parallel_prepared(tmp_path / "prep")
    train(tiny_train_config(data, tmp_path / "plain", max_steps=2, valid_every=2, valid_bleu=False))
    assert "TensorBoard" not in capsys.readouterr().err and not (tmp_path / "plain" / "tensorboard").exists()
    cfg = tiny_train_config(data, tmp_path / "run", max_steps=4, valid_every=2, log_every=1, valid_bleu=False,
                            tensorboard=True)
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(ConfigError, match=r"pip install 'tfcli\[tensorboard\]'"):
            train(cfg)
        assert not (tmp_path / "run").exists()
    else:
        train(cfg)
        assert any((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def _read_line(proc, timeout: float = 90.0) -> str:
    import select

    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "no output line within the timeout: translate waited for more input"
    return proc.stdout.readline()


def test_translate_answers_each_line_of_a_pipe_when_input_pauses(tmp_path):
    """A co-process: a line in, its translation out, before the next line is written (the buffer holds 10,000)."""
    from helpers import copy_model, save_model, save_word_tokenizer

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    exe = Path(sys.executable).parent / "tfcli"
    proc = subprocess.Popen([str(exe), "translate", "-m", str(ckpt), "--greedy", "--threads", "1"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        for line in ("w1 w2 w3", "w7", "", "w4 w4"):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            assert _read_line(proc) == line + "\n"
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()


def test_translate_output_dir_writes_one_file_per_input(tmp_path):
    from helpers import copy_model, save_model, save_word_tokenizer
    from typer.testing import CliRunner

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    (tmp_path / "a.src").write_text("w1 w2\nw3\n")
    (tmp_path / "b.src").write_text("w5\n")
    runner = CliRunner()
    args = ["translate", "-m", str(ckpt), "--greedy", str(tmp_path / "a.src"), str(tmp_path / "b.src")]
    res = runner.invoke(app, args + ["--output-dir", str(tmp_path / "hyp"), "--suffix", ".tgt"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "hyp" / "a.src.tgt").read_text() == "w1 w2\nw3\n"
    assert (tmp_path / "hyp" / "b.src.tgt").read_text() == "w5\n"
    res = runner.invoke(app, args + ["--output-dir", str(tmp_path)])  # the outputs would be the inputs
    assert res.exit_code == 1 and "is an input of this command" in res.output
    res = runner.invoke(app, args + ["--output-dir", str(tmp_path / "x"), "-o", str(tmp_path / "y")])
    assert res.exit_code == 2 and "exclude each other" in res.output
    assert (tmp_path / "a.src").read_text() == "w1 w2\nw3\n" and not (tmp_path / "x").exists()


def test_progress_rate_is_the_average_so_far_not_a_burst():
    import time

    from tfcli.console import Progress

    with Progress("translating", 200, "sent", enabled=True) as bar:
        time.sleep(0.5)
        for _ in range(100):  # a batch finishes: many lines at once
            bar.advance(1)
        rate = float(bar._bar.tasks[0].fields["rate"].split()[0])
    assert rate < 100 / 0.5 * 1.01  # rich's moving estimate said thousands a second here


def test_translate_output_and_progress_bar_share_a_terminal_without_mixing(tmp_path):
    """stdout and stderr are one pseudo-terminal: every translation is a line of its own, the bar above or below."""
    import pty
    import re
    from collections import Counter

    from helpers import copy_model, save_model, save_word_tokenizer

    tok = save_word_tokenizer(tmp_path / "w.json", [f"w{i}" for i in range(20)])
    ckpt = save_model(tmp_path / "ck", copy_model(), tok)
    lines = [" ".join(f"w{(i * 7 + j) % 20}" for j in range(1 + i % 6)) for i in range(600)]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    exe = Path(sys.executable).parent / "tfcli"
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(exe), "translate", "-m", str(ckpt), "--greedy", "--threads", "1", "--batch-size", "1",
                             str(tmp_path / "in.txt")], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**os.environ, "COLUMNS": "100", "TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=60) == 0
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;]*m", "", b"".join(chunks).decode("utf-8", "replace"))  # colours: no break
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text)  # cursor moves and erasures end a screen line
    got = Counter(ln.strip() for ln in text.replace("\r", "\n").split("\n"))
    want = Counter(lines)
    assert all(got[line] >= n for line, n in want.items())  # each translation whole, on a line of its own


def test_config_prints_every_key_with_its_default_as_a_file_train_accepts(tmp_path):
    import dataclasses

    from typer.testing import CliRunner

    from tfcli.model.config import preset
    from tfcli.train.config import TrainConfig, load_train_config

    runner = CliRunner()
    for arch in ("small", "lm-cpu"):
        res = runner.invoke(app, ["config", "--arch", arch])
        assert res.exit_code == 0, res.output
        assert "# peak learning rate" in res.stdout  # the help beside each key
        path = tmp_path / f"{arch}.yaml"
        path.write_text(res.stdout)
        cfg, model = load_train_config(path)
        assert cfg == TrainConfig(arch=arch)
        assert preset(arch, **model) == preset(arch)
        keys = {f.name for f in dataclasses.fields(TrainConfig)}
        assert all(f"\n  {k}:" in res.stdout for k in keys)
    res = runner.invoke(app, ["config", "nonsense"])
    assert res.exit_code == 2 and "SECTION nonsense: unknown; choose from model, train" in res.output


def test_quiet_training_keeps_the_console_clean_and_train_log_keeps_everything(tmp_path, capsys, monkeypatch):
    from helpers import make_parallel_prepared, tiny_train_config
    from tfcli.train.trainer import train

    data = make_parallel_prepared(tmp_path / "prep")
    train(tiny_train_config(data, tmp_path / "loud", max_steps=4, valid_every=2, log_every=1, valid_bleu=False))
    err = capsys.readouterr().err
    assert "step 4" in err and "config: " in err and "resolved config" not in err  # one line, not 70
    log = (tmp_path / "loud" / "train.log").read_text()
    assert "resolved config:" in log and "step 4 | valid" in log
    from tfcli import console

    console.set_levels(quiet=True)  # what -q does for one command
    train(tiny_train_config(data, tmp_path / "quiet", max_steps=4, valid_every=2, log_every=1, valid_bleu=False,
                            average_last=9))
    err = capsys.readouterr().err
    assert "step 4" not in err and "warning: average_last 9" in err  # warnings still show
    assert "step 4 | valid" in (tmp_path / "quiet" / "train.log").read_text()
    console.set_levels(quiet=False, verbose=True)
    try:
        train(tiny_train_config(data, tmp_path / "verbose", max_steps=2, valid_every=2, valid_bleu=False))
    finally:
        console.set_levels(quiet=False, verbose=False)
    assert "resolved config:" in capsys.readouterr().err


def test_quiet_flag_is_accepted_by_every_command():
    for name, cmd in _commands().items():
        assert any("--quiet" in p.opts and "-q" in p.opts for p in cmd.params), name


def test_prepare_accepts_a_sentencepiece_model_as_its_tokenizer(tmp_path):
    """`--tokenizer-from m.model`: the prepared ids are SentencePiece's own pieces (in tfcli's id layout)."""
    spm = __import__("pytest").importorskip("sentencepiece")
    from typer.testing import CliRunner

    from tfcli.data.prepared import PreparedData
    from tfcli.data.tokenizer import load_tokenizer

    src = [f"ein Hund läuft über die Wiese Nummer {i} und {i * 7} Katzen schauen zu." for i in range(200)]
    tgt = [f"a dog runs across meadow number {i} while {i * 3} cats watch." for i in range(200)]
    (tmp_path / "train.de").write_text("\n".join(src) + "\n")
    (tmp_path / "train.en").write_text("\n".join(tgt) + "\n")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "train.de"), input_format="text",
                                   model_prefix=str(tmp_path / "joint"), vocab_size=90, model_type="unigram",
                                   character_coverage=1.0, minloglevel=2, user_defined_symbols=[])
    res = CliRunner().invoke(app, ["prepare", "--src", str(tmp_path / "train.de"), "--tgt", str(tmp_path / "train.en"),
                                   "--tokenizer-from", str(tmp_path / "joint.model"), "-o", str(tmp_path / "prep")])
    assert res.exit_code == 0, res.output
    prep = PreparedData(tmp_path / "prep")
    tok = load_tokenizer(prep.tokenizer_file("src"))
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "joint.model"))
    for text in (src[3], "  Hunde   und Katzen!", "ﬁne ＡＢＣ"):
        pieces = sp.encode(text, out_type=str)
        ids = tok.encode(text, add_special_tokens=False).ids
        want = [tok.token_to_id(p) if tok.token_to_id(p) is not None else 3 for p in pieces]
        assert ids == want, text
    res = CliRunner().invoke(app, ["prepare", "--src", str(tmp_path / "train.de"), "--tgt", str(tmp_path / "train.en"),
                                   "--tokenizer-from", str(tmp_path / "train.de.model"), "-o", str(tmp_path / "x")])
    assert res.exit_code == 1


def _bpe_prepared(tmp_path):
    from typer.testing import CliRunner

    words = "the a dog cat runs sleeps over under big small red green house garden tree river".split()
    rng = __import__("random").Random(0)
    for split, n in (("train", 300), ("valid", 20)):
        src = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 8))) for _ in range(n)]
        (tmp_path / f"{split}.src").write_text("\n".join(src) + "\n")
        (tmp_path / f"{split}.tgt").write_text("\n".join(s.upper() for s in src) + "\n")
    res = CliRunner().invoke(app, [
        "prepare", "--src", str(tmp_path / "train.src"), "--tgt", str(tmp_path / "train.tgt"),
        "--valid-src", str(tmp_path / "valid.src"), "--valid-tgt", str(tmp_path / "valid.tgt"),
        "--tokenizer", "bpe", "--vocab-size", "120", "-o", str(tmp_path / "prep")])
    assert res.exit_code == 0, res.output
    return tmp_path / "prep"


def test_bpe_dropout_recuts_training_pairs_reproducibly(tmp_path):
    import numpy as np
    import torch

    from helpers import tiny_train_config
    from tfcli.data.prepared import PreparedData
    from tfcli.data.tokenizer import BpeDropout, encode_batch, load_tokenizer
    from tfcli.train.data import ParallelData
    from tfcli.train.trainer import run as run_train, train

    prep = _bpe_prepared(tmp_path)
    data = PreparedData(prep)
    tok = load_tokenizer(data.tokenizer_file("src"))
    lines = (tmp_path / "train.src").read_text().splitlines()
    exact = BpeDropout(tok, 0.0)
    assert all(exact.encode(t, None) == ids for t, ids in zip(lines, encode_batch(tok, lines)))  # p = 0: the same cut
    drop = BpeDropout(tok, 0.3)
    cuts = [drop.encode(lines[0], np.random.default_rng(s)) for s in range(20)]
    assert len({tuple(c) for c in cuts}) > 1  # different pieces from draw to draw
    assert all(tok.decode(c) == lines[0] for c in cuts)  # the same text
    # in training batches: epoch-dependent, and a resumed run repeats the uninterrupted one bit for bit
    pd = ParallelData(data, "train", 64, 400, 0, seed=1, bpe_dropout=0.3)
    first = pd.batches(0)[0]
    a = pd.collate(first).src
    pd.batches(1)
    assert not torch.equal(a, pd.collate(first).src)
    pd.batches(0)
    assert torch.equal(a, pd.collate(first).src)
    opts = dict(max_steps=8, valid_every=4, log_every=1, valid_bleu=False, bpe_dropout=0.2, max_tokens=200)
    train(tiny_train_config(prep, tmp_path / "full", **opts))
    train(tiny_train_config(prep, tmp_path / "part", **{**opts, "max_steps": 4}))
    run_train(None, {"out": str(tmp_path / "part"), "resume": True, "max_steps": 8})
    from safetensors.torch import load_file

    w = [load_file(str(tmp_path / run / "checkpoints" / "step-0000008" / "model.safetensors")) for run in ("full", "part")]
    assert all(torch.equal(w[0][k], w[1][k]) for k in w[0])


def test_option_defaults_in_help_come_from_the_config_dataclasses():
    """An option named after a config field shows that field's default (the dataclass is its one place), and no help
    text states a different one."""
    import dataclasses
    import re

    from tfcli.cli.common import _shown
    from tfcli.data.config import PrepareConfig
    from tfcli.evaluate.config import MetricsConfig, PerplexityConfig
    from tfcli.generate.config import GenerateConfig, TranslateConfig
    from tfcli.train.config import TrainConfig

    configs = {"train": [TrainConfig], "prepare": [PrepareConfig], "translate": [TranslateConfig],
               "lm-generate": [GenerateConfig], "eval": [MetricsConfig, PerplexityConfig, TranslateConfig]}
    checked = 0
    for command, classes in configs.items():
        fields = {}
        for cls in reversed(classes):
            fields.update({f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)})
        for p in _commands()[command].params:
            value = fields.get(p.name)
            if p.param_type_name != "option" or value in (None, "", []) or (p.is_flag and not p.secondary_opts):
                continue
            stated = re.findall(r"\[default: ([^\]]*)\]", (p.help or "").replace("\\[", "["))
            if p.default is not None and not stated:  # typer shows the option's own default
                assert p.default == value or str(p.default) == ",".join(map(str, value)), (command, p.name)
                continue
            assert stated, f"{command} --{p.name}: no default in its help"
            if isinstance(value, bool) and stated[0] not in ("on", "off"):
                continue  # named by the flag's own words (--drop-empty: drop)
            if not any(c in stated[0] for c in "(;:' "):  # a plain value, not an explanation
                assert stated[0] == _shown(value), (command, p.name, stated[0], value)
                checked += 1
    assert checked > 40


def test_the_collector_skips_the_start_and_collects_during_the_work(copier):
    """`python -m tfcli`: no collection while a command's modules import (torch's objects, which live to the end,
    are frozen out of the collector's passes when the command starts its work), and the collector on after that,
    so that a long run's garbage is still collected."""
    probe = ("import atexit, gc, sys; from tfcli import __main__ as m; frozen = []; "
             "gc.callbacks.append(lambda phase, info: phase == 'start' and frozen.append(gc.get_freeze_count())); "
             "atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count(), *frozen[:1], file=sys.stderr)); "
             "sys.argv = ['tfcli'] + sys.argv[1:]; m.main()")
    r = subprocess.run([sys.executable, "-c", probe, "translate", "-m", str(copier), "--threads", "1", "-q"],
                       input="cat dog\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout == "cat dog\n", r.stderr
    enabled, frozen, *first = r.stderr.strip().splitlines()[-1].split()
    assert enabled == "True" and int(frozen) > 50_000  # torch's modules, among others
    assert all(int(n) > 50_000 for n in first)  # the first collection (if any) came after the freeze


def test_the_watch_of_the_cpus_takes_out_this_processs_own_work_and_sleeps_only_the_rest(monkeypatch):
    """The command line begins its look at the CPUs before its imports: the busy share of each CPU since then, less
    this process's own CPU time over the interval, after at least the sample time (sleeping only what is left)."""
    from tfcli import cpu_watch

    clock = {"wall": 10.0, "own": 3.0}
    slept = []

    class FakeTime:
        monotonic = staticmethod(lambda: clock["wall"])
        process_time = staticmethod(lambda: clock["own"])

        @staticmethod
        def sleep(s):
            slept.append(s)
            clock["wall"] += s

    ticks = iter([{"cpu0": (100, 1000), "cpu1": (50, 1000)}, {"cpu0": (109, 1010), "cpu1": (51, 1010)}])
    monkeypatch.setattr(cpu_watch, "time", FakeTime)
    monkeypatch.setattr(cpu_watch.Watch, "_ticks", lambda self: next(ticks))
    watch = cpu_watch.Watch()
    clock["wall"] += 0.07  # the imports: 0.07 s, 0.05 s of it this process's CPU time
    clock["own"] += 0.05
    # busy 9 of cpu0's 10 ticks and 1 of cpu1's: 1.0 core, less this process's 0.05 s over 0.1 s: 0.5
    assert watch.busy_cores(0.1) == pytest.approx(0.5) and slept == [pytest.approx(0.03)]
    # a watch begun longer ago than the sample sleeps nothing
    ticks = iter([{"cpu0": (0, 100)}, {"cpu0": (0, 200)}])
    watch = cpu_watch.Watch()
    clock["wall"] += 0.5
    assert watch.busy_cores(0.1) == 0.0 and slept[-1] == 0.0


def test_a_given_thread_count_is_used_without_watching_the_cpus(monkeypatch):
    """`--threads N` on the command line: OMP_NUM_THREADS and RAYON_NUM_THREADS are N before torch loads, and the
    start skips its 0.1 s look at what other work keeps busy; OMP_NUM_THREADS already set is the user's choice."""
    from tfcli.cli import process

    assert [process.threads_flag(a) for a in (["-m", "ck", "--threads", "2"], ["--threads=3"], ["--threads", "0"],
                                              ["--threads", "x"], ["--", "--threads", "2"], ["--threads"], [])] \
        == [2, 3, None, None, None, None, None]

    def watched(sample_s, watch=None):
        raise AssertionError("the CPUs were watched")

    monkeypatch.setattr(process, "busy_cores", watched)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    assert process.choose_threads(given=3) == 3
    assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ["RAYON_NUM_THREADS"] == "3"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert process.choose_threads(given=3) is None and os.environ["OMP_NUM_THREADS"] == "1"
    monkeypatch.setattr(process, "busy_cores", lambda sample_s, watch=None: 0.0)  # no --threads: the watch decides
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert process.choose_threads() == process.usable_cores()
