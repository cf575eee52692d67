"""The command line as people use it every day: flags, help, completion, terminals, pipes, logs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_shell_completion_is_offered():
    exe = Path(sys.executable).parent / "tfcli"
    res = subprocess.run([str(exe), "--show-completion", "bash"], capture_output=True, text=True)
    assert res.returncode == 0 and "_tfcli_completion" in res.stdout, res.stderr
    res = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    assert "--install-completion" in res.stdout
