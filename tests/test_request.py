"""A line's one record (tfcli.request.Request), made the same by every way in, each field checked once;
and the one name per concept, with the old spellings of flags, config keys and API options still working."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
from typer.testing import CliRunner

import tfcli
from helpers import WORDS
from tfcli.cli import app
from tfcli.config import from_dict
from tfcli.cli.common import FLAG_ALIASES, unalias
from tfcli.errors import ConfigError, InputError, TfcliError
from tfcli.generate.config import TranslateConfig, translate_config
from tfcli.request import FieldError, Request, jsonl_requests, requests, with_side_file
from tfcli.io import InputLine


def cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def items(lines, name="in.txt"):
    return [InputLine(name, i + 1, t) for i, t in enumerate(lines)]


def test_every_reader_makes_the_same_record():
    """The text reader with side files, the JSONL reader and a Request made by hand agree field for field."""
    text = requests(items(["ein Hund", ""]))
    text = with_side_file(text, "prefix", ["a", ""], "p.txt")
    text = with_side_file(text, "avoid", ["cat\tdog", ""], "a.txt")
    text = with_side_file(text, "constraints", ["egg ||| fish\tgoat", ""], "c.txt")
    rows = [{"text": "ein Hund", "prefix": "a", "avoid": ["cat", "dog"], "constraints": [["egg", "fish"], "goat"]},
            {"text": ""}]
    jsonl = jsonl_requests(items([json.dumps(r) for r in rows]))
    by_hand = [Request("ein Hund", "in.txt", 1, prefix="a", avoid=["cat", "dog"], constraints=[["egg", "fish"], "goat"]),
               Request("", "in.txt", 2)]
    assert list(text) == list(jsonl) == by_hand
    r = by_hand[0]
    assert r.avoid == ("cat", "dog") and r.constraints == (("egg", "fish"), "goat")  # frozen, normalised
    assert r.where == "in.txt:1" and not r.empty and by_hand[1].empty
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.text = "x"
    assert list(requests([None, InputLine("<stdin>", 1, "x"), None])) == [None, Request("x", "<stdin>", 1), None]


def test_a_malformed_field_is_one_error_naming_the_line_or_the_argument(copier):
    """The same check for each way in: JSONL names the file, line and field; the API the argument and the text
    (a TypeError for a wrong type, a ConfigError for an impossible value); side files name their file."""
    for row, message in (({"text": "x", "avoid": "cat"}, 'in.txt:1: field "avoid" must be a list of strings'),
                         ({"text": "x", "avoid": [3]}, 'in.txt:1: field "avoid" must be a list of strings'),
                         ({"text": "x", "constraints": [[]]}, 'field "constraints" a set of alternatives needs'),
                         ({"text": "x", "tgt_lang": 3}, 'in.txt:1: field "tgt_lang" is int, expected a string'),
                         ({"text": "x", "prefix": 0}, 'in.txt:1: field "prefix" is int, expected a string'),
                         ({"text": "x", "glossary": []}, 'in.txt:1: unknown field "glossary"')):
        with pytest.raises(InputError, match=message):
            list(jsonl_requests(items([json.dumps(row)])))
    with pytest.raises(FieldError):
        Request("x", avoid=("cat", None))
    t = tfcli.load(str(copier), device="cpu")
    with pytest.raises(TypeError, match=r"avoid\[1\]: must be a list of strings \(phrases\), got str"):
        t.translate(["cat", "dog"], avoid=[[], "dog"])
    with pytest.raises(ConfigError, match=r"constraints\[0\]: a set of alternatives needs at least one phrase"):
        t.translate(["cat"], constraints=[[[]]])
    with pytest.raises(TfcliError, match="c.txt: 3 lines for 2 input lines"):
        list(with_side_file(requests(items(["a", "b"])), "constraints", ["x", "y", "z"], "c.txt"))
    with pytest.raises(TfcliError, match="p.txt: 1 prefixes, but the input has more lines"):
        list(with_side_file(requests(items(["a", "b"])), "prefix", ["x"], "p.txt"))


def test_the_record_carries_what_a_stage_adds_without_changing_the_translation(copier):
    """`extra` is room for a format's or a glossary's data: the translation does not read it."""
    from tfcli.generate.loader import load
    from tfcli.generate.translate import Pipeline
    import torch

    translator = Pipeline(load(str(copier), torch.device("cpu"), "seq2seq"), TranslateConfig(device="cpu"),
                            torch.device("cpu"))
    plain = [Request("cat dog", "in.txt", 1), Request("egg", "in.txt", 2)]
    marked = [dataclasses.replace(r, extra={"offsets": [(0, 4)]}) for r in plain]
    assert list(translator.run(marked)) == list(translator.run(plain)) == ["cat dog", "egg"]


def test_every_old_flag_spelling_still_works(copier, tmp_path):
    """--alpha, --topk and --topp (hidden from --help) are --len-penalty, --top-k and --top-p: the same output, in
    translate and in eval --translate; --old=VALUE too; after `--` nothing is rewritten."""
    assert FLAG_ALIASES == {"--alpha": "--len-penalty", "--topk": "--top-k", "--topp": "--top-p",
                            "--num-samples": "--nbest", "--precision": "--dtype", "--quantization": "--dtype"}
    assert unalias(["--topk=3", "--alpha", "1", "--", "--topk"]) == ["--top-k=3", "--len-penalty", "1", "--",
                                                                   "--topk"]
    rng = random.Random(4)
    src = tmp_path / "in.txt"
    src.write_text("\n".join(" ".join(rng.choice(WORDS[:12]) for _ in range(5)) for _ in range(6)) + "\n")
    for old, new, value, extra in (("--alpha", "--len-penalty", "2.0", ["--nbest", "2"]),
                                   ("--topk", "--top-k", "2", ["--sampling", "--seed", "4"]),
                                   ("--topp", "--top-p", "0.5", ["--sampling", "--seed", "4"])):
        want = cli("translate", "-m", copier, src, new, value, *extra)
        assert want.exit_code == 0, want.output
        for spelling in ([old, value], [f"{old}={value}"]):
            got = cli("translate", "-m", copier, src, *spelling, *extra)
            assert got.exit_code == 0 and got.stdout == want.stdout, (spelling, got.output)
    ref = tmp_path / "ref.txt"
    ref.write_text(src.read_text())
    scored = [cli("eval", "--model", copier, "--translate", src, "-r", ref, flag, "1.0")
              for flag in ("--alpha", "--len-penalty")]
    assert scored[0].exit_code == 0 and scored[0].stdout == scored[1].stdout
    text = cli("translate", "--help", env={"COLUMNS": "200"}).stdout
    assert "--top-k" in text and "--len-penalty" in text
    assert not any(f"{old} " in text or f"{old}," in text for old in FLAG_ALIASES)


def test_old_config_keys_and_api_options_still_work(copier, tmp_path):
    """topk/topp, the old names of top_k/top_p: in a config file, in --set-style overrides and as API options;
    both names with different values is an error naming them."""
    cfg = tmp_path / "t.yaml"
    cfg.write_text("translate:\n  topk: 3\n  topp: 0.5\n")
    assert (translate_config(cfg).top_k, translate_config(cfg).top_p) == (3, 0.5)
    cfg.write_text("translate:\n  topk: 3\n  top_k: 4\n")
    with pytest.raises(ConfigError, match="translate.topk: the old name of top_k, which is given too"):
        translate_config(cfg)
    assert translate_config(None, topk=7).top_k == 7
    t = tfcli.load(str(copier), device="cpu")
    texts = ["cat dog egg", "fish goat"]
    assert t.translate(texts, sampling=True, topk=2, seed=3) == t.translate(texts, sampling=True, top_k=2, seed=3)
    assert t.translate_nbest(texts, n=2) == t.translate_nbest(texts, nbest=2)
    # one name per concept: num_samples -> nbest (generate), precision -> dtype (train), saved runs' keys too
    from tfcli.generate.config import generate_config
    from tfcli.train.config import TrainConfig

    cfg.write_text("generate:\n  num_samples: 3\n")
    assert generate_config(cfg).nbest == 3
    assert from_dict(TrainConfig, {"precision": "fp32"}, "train").dtype == "fp32"


def test_the_new_names_of_old_flags_give_the_same_output(copier, counter, tmp_path):
    """generate --num-samples is --nbest; lm-generate is generate; export --quantization is --dtype."""
    want = cli("generate", "-m", counter, "cat", "--nbest", "2", "--max-new-tokens", "4")
    assert want.exit_code == 0 and len(want.stdout.splitlines()) == 2, want.output
    for argv in (["lm-generate", "-m", counter, "cat", "--nbest", "2"], ["generate", "-m", counter, "cat", "-N", "2"],
                 ["generate", "-m", counter, "cat", "--num-samples", "2"]):
        got = cli(*argv, "--max-new-tokens", "4")
        assert got.exit_code == 0 and got.stdout == want.stdout, (argv, got.output)
    pytest.importorskip("ctranslate2")
    for flag in ("--dtype", "--quantization"):
        res = cli("export", copier, "--to", "ctranslate2", "-o", tmp_path / flag.strip("-"), flag, "int8")
        assert res.exit_code == 0 and "int8" in res.stdout, res.output


def test_verbose_names_the_decoding_plan(copier, tmp_path):
    """--verbose says which search, precision and step backends run (as CTranslate2 logs its compute type)."""
    src = tmp_path / "in.txt"
    src.write_text("cat dog\n")
    res = cli("translate", "-m", copier, src, "--verbose", "--beam-size", "3")
    assert res.exit_code == 0 and res.stdout == "cat dog\n"
    line = next(x for x in res.stderr.splitlines() if x.startswith("decoding:"))
    assert "beam search (beam 3), fp32 on cpu; step: " in line and "encoder" in line
    quiet = cli("translate", "-m", copier, src, "--greedy")
    assert quiet.exit_code == 0 and "decoding:" not in quiet.stderr
    greedy = cli("translate", "-m", copier, src, "--greedy", "-v")
    assert "decoding: greedy search" in greedy.stderr
