"""Recipes: their scripts refuse bad arguments clearly, and benchmarks/recipe_results.py reports what the run files
say (figures are read, never typed in)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "recipes"))

import len_penalty  # noqa: E402
import recipe_results  # noqa: E402


def run_script(name, *args, env=None):
    return subprocess.run(["bash", str(ROOT / "recipes" / name), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


@pytest.mark.parametrize("script, args", [("multi30k.sh", ["de", "en", "huge"]), ("shakespeare.sh", ["huge"])])
def test_recipe_rejects_an_unknown_size(script, args):
    r = run_script(script, *args)
    assert r.returncode == 2 and "SIZE must be cpu" in r.stderr and "or full" in r.stderr


@pytest.mark.parametrize("script, args", [("multi30k.sh", ["de", "en", "cpu"]), ("shakespeare.sh", ["cpu"]),
                                          ("wikitext2.sh", []), ("distill.sh", ["de", "en", "cpu-long"])])
def test_recipe_without_data_says_where_it_looked(script, args, tmp_path):
    r = run_script(script, *args, str(tmp_path / "out"), env={"DATA": str(tmp_path)})
    assert r.returncode == 1 and str(tmp_path) in r.stderr and "set DATA" in r.stderr
    assert not (tmp_path / "out").exists()


def fake_run(out: Path, bleu: float) -> None:
    run = out / "run"
    run.mkdir(parents=True)
    lines = [
        {"step": 50, "epoch": 1, "time": 60.0, "split": "train", "loss": 5.0, "tgt_tokens_per_s": 1000.0},
        {"step": 100, "epoch": 1, "time": 130.0, "split": "train", "loss": 4.0, "tgt_tokens_per_s": 1200.0},
        {"step": 100, "epoch": 1, "time": 135.5, "split": "valid", "loss": 3.5, "ppl": 33.1, "bleu": 20.0},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 100}, "model": {"d_model": 64}}))
    sig = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
    report = {"signatures": {"BLEU": sig, "chrF2": "chrF-sig"},
              "systems": [{"scores": {"BLEU": {"score": bleu}, "chrF2": {"score": 55.5}}}]}
    (out / "sacrebleu.json").write_text(json.dumps(report))
    tok = {"signatures": {"BLEU": "tok:none"}, "systems": [{"scores": {"BLEU": {"score": bleu + 3}}}]}
    (out / "tokbleu.json").write_text(json.dumps(tok))


def test_record_reads_the_run_and_scores_into_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe_results, "RESULTS", tmp_path / "results" / "recipes")
    monkeypatch.setattr(recipe_results, "README", tmp_path / "README.md")
    out = tmp_path / "m30k"
    fake_run(out, 31.25)
    args = type("A", (), dict(recipe="multi30k", out=str(out), name=None, pair="de-en", size="cpu",
                              checkpoint="ck", ppl=None, train_args="", wall_s=800.0,
                              len_penalty=None, resumed=False, vocab=None, bpe=None, seed=None, lowercase=False))
    entry = recipe_results.record(args)
    assert entry["training"]["steps"] == 100 and entry["training"]["wall_s"] == 135.5
    assert entry["training"]["median_tgt_tokens_per_s"] == 1200.0 and entry["training"]["best_valid_loss"] == 3.5
    assert entry["sacrebleu"]["BLEU"]["score"] == 31.25 and entry["tokenised_bleu"]["score"] == 34.25
    assert json.loads((out / "result.json").read_text()) == entry
    md = (tmp_path / "results" / "recipes.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| de-en"))
    # training, then the whole recipe
    assert "| 31.25 | 55.50 | 34.25 | – | 0.6 | – | 100 | 2.3 min | 13.3 min |" in row
    assert "tok:13a" in md
    # the valid scores the recipe chose its length penalty by are kept, and the chosen one is shown
    (out / "valid_len_penalty.tsv").write_text("1.0\t30.5\n1.4\t31.75\n")
    entry = recipe_results.record(type("A", (), {**vars(args), "len_penalty": 1.4}))
    assert entry["valid_sacrebleu_by_len_penalty"] == {"1": 30.5, "1.4": 31.75}
    row = next(line for line in (tmp_path / "results" / "recipes.md").read_text().splitlines()
               if line.startswith("| de-en"))
    assert "| 34.25 | – | 1.4 | 31.75 | 100 |" in row
    # a second run of the same recipe replaces its entry; another recipe adds one
    fake_run(tmp_path / "again", 32.0)
    recipe_results.record(type("A", (), {**vars(args), "out": str(tmp_path / "again")}))
    recipe_results.record(type("A", (), {**vars(args), "pair": "en-de", "out": str(tmp_path / "again")}))
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    assert sorted(all_) == ["multi30k-de-en/cpu", "multi30k-en-de/cpu"]
    assert all_["multi30k-de-en/cpu"]["sacrebleu"]["BLEU"]["score"] == 32.0
    # a variant (extra training arguments) goes beside the recipe's own entry, not over it
    fake_run(tmp_path / "post", 30.0)
    recipe_results.record(type("A", (), {**vars(args), "out": str(tmp_path / "post"),
                                         "train_args": " --set model.norm=post "}))
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    assert all_["multi30k-de-en/cpu"]["sacrebleu"]["BLEU"]["score"] == 32.0
    assert all_["multi30k-de-en/cpu (--set model.norm=post)"]["sacrebleu"]["BLEU"]["score"] == 30.0
    # the README's table of the recipes as they ship: their own entries, no variant
    blocks = recipe_results.readme_blocks(all_)
    shipped = blocks["current"].splitlines()  # one line per shipped recipe
    assert len(shipped) == 2 and all("`cpu`" in r for r in shipped) and "norm=post" in blocks["recipes"]
    assert shipped[0].startswith("- Multi30k de->en `cpu`: 32.00 sacreBLEU")
    # so does another vocabulary, BPE size or seed than the recipe's own, named first
    recipe_results.record(type("A", (), {**vars(args), "out": str(tmp_path / "post"), "vocab": "joint", "bpe": 4000,
                                         "seed": 2, "train_args": "--set train.lr=0.001"}))
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    assert "multi30k-de-en/cpu (VOCAB=joint BPE=4000 SEED=2 --set train.lr=0.001)" in all_
    # and text prepared lowercased: every score of it lowercased too, and the README's table says so
    fake_run(tmp_path / "lc", 33.0)
    for name in ("sacrebleu.json", "tokbleu.json"):
        f = tmp_path / "lc" / name
        f.write_text(f.read_text().replace("case:mixed", "case:lc").replace('"tok:none"', '"case:lc|tok:none"'))
    recipe_results.record(type("A", (), {**vars(args), "out": str(tmp_path / "lc"), "lowercase": True}))
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    assert all_["multi30k-de-en/cpu (LOWERCASE=1)"]["sacrebleu"]["BLEU"]["score"] == 33.0
    row = next(r for r in recipe_results.readme_blocks(all_)["recipes"].splitlines() if "LOWERCASE=1" in r)
    assert "| lowercased: 33.00 sacreBLEU, 36.00 tokenised BLEU |" in row
    # a resumed recipe's clock saw only its last part: no whole-recipe time is claimed for it
    entry = recipe_results.record(type("A", (), {**vars(args), "out": str(tmp_path / "again"), "resumed": True}))
    assert entry["resumed"] and "recipe_wall_s" not in entry
    row = next(line for line in (tmp_path / "results" / "recipes.md").read_text().splitlines()
               if line.startswith("| de-en | cpu |"))
    assert "| 2.3 min | (resumed) |" in row


def test_demo_records_its_scores_time_and_machine(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe_results, "RESULTS", tmp_path / "results" / "recipes")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- demo:begin -->\nold figures\n<!-- demo:end -->\nafter\n<!-- recipes:begin -->\n"
                      "<!-- recipes:end -->\n")
    monkeypatch.setattr(recipe_results, "README", readme)
    out = tmp_path / "demo"
    fake_run(out, 98.5)
    args = type("A", (), dict(recipe="demo", out=str(out), name="demo", pair=None, size="cpu", checkpoint="ck",
                              ppl=None, train_args="", wall_s=114.0, len_penalty=None, resumed=False, vocab=None, bpe=None, seed=None, lowercase=False))
    entry = recipe_results.record(args)
    assert entry["sacrebleu"]["BLEU"]["score"] == 98.5 and entry["recipe_wall_s"] == 114.0
    assert entry["hardware"]["cpu"] and entry["hardware"]["cpus"]
    md = (tmp_path / "results" / "recipes.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| 98.50"))
    assert "| 98.50 | 55.50 | 100 | 2.3 min | 1.9 min |" in row and entry["hardware"]["cpu"] in row
    # the README's demo sentence and recipe table are rewritten from recipes.json, the rest of the README is kept
    text = readme.read_text()
    assert "old figures" not in text and text.startswith("intro\n") and "\nafter\n" in text
    assert f"{entry['hardware']['cpus']}-core {entry['hardware']['cpu']}" in text
    assert "1.9 min, BLEU 98.50, chrF2 55.50." in text
    assert text.count("<!-- demo:begin -->") == 1 and text.count("<!-- recipes:end -->") == 1


def test_a_cpu_without_native_bf16_records_its_fp32_run_beside_the_bf16_one(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe_results, "RESULTS", tmp_path / "results" / "recipes")
    monkeypatch.setattr(recipe_results, "README", tmp_path / "README.md")
    args = dict(recipe="multi30k", name=None, pair="de-en", size="cpu-long", checkpoint="ck", ppl=None,
                train_args="", wall_s=800.0, len_penalty=None, resumed=False, vocab=None, bpe=None, seed=None, lowercase=False)
    for name, precision, bleu in (("amx", "bf16", 42.0), ("fp32", "fp32", 41.0)):
        out = tmp_path / name
        fake_run(out, bleu)
        (out / "run" / "config.yaml").write_text(yaml.safe_dump({"train": {"precision": "native-bf16"}}))
        (out / "run" / "train.log").write_text(f"model: encoder-decoder (small), 7.58M parameters; device cpu, "
                                               f"{precision}, 1 process(es)\n")
        entry = recipe_results.record(type("A", (), {**args, "out": str(out)}))
        assert entry["precision"] == precision
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    assert all_["multi30k-de-en/cpu-long"]["sacrebleu"]["BLEU"]["score"] == 42.0
    assert all_["multi30k-de-en/cpu-long (fp32)"]["sacrebleu"]["BLEU"]["score"] == 41.0
    assert recipe_results.anchor(all_["multi30k-de-en/cpu-long (fp32)"])[1] == "tokenised_bleu_lowercased"


def test_the_readme_table_shows_one_option_variants_and_leaves_the_rest_to_recipes_md(tmp_path, monkeypatch):
    monkeypatch.setattr(recipe_results, "RESULTS", tmp_path / "results" / "recipes")
    monkeypatch.setattr(recipe_results, "README", tmp_path / "README.md")
    args = dict(recipe="multi30k", name=None, pair="de-en", size="cpu", checkpoint="ck", ppl=None, wall_s=800.0,
                len_penalty=None, resumed=False, vocab=None, bpe=None, seed=None, lowercase=False)
    for i, (extra, bpe, seed) in enumerate([("", None, None), ("--set model.qk_norm=false", None, None),
                                            ("--set train.max_tokens=3000", None, None),
                                            ("--set train.lr=0.002 --set model.qk_norm=true", None, None),
                                            ("", 8000, None), ("", 8000, 2), ("", None, 2)]):
        fake_run(tmp_path / str(i), 30.0 + i)
        recipe_results.record(type("A", (), {**args, "out": str(tmp_path / str(i)), "train_args": extra, "bpe": bpe,
                                             "seed": seed}))
    fake_run(tmp_path / "joint", 29.0)
    recipe_results.record(type("A", (), {**args, "out": str(tmp_path / "joint"), "train_args": "", "vocab": "joint"}))
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    table = recipe_results.readme_blocks(all_)["recipes"]
    assert "`cpu (VOCAB=joint)`" in table  # another vocabulary is one option
    assert "`cpu`" in table and "`cpu (--set model.qk_norm=false)`" in table and "train.lr" not in table
    assert "`cpu (--set train.max_tokens=3000)`" in table and "`cpu (BPE=8000)`" in table
    assert "SEED=2" not in table  # a second seed is a check of the recipe's row, not a recipe
    assert "train.lr" in (tmp_path / "results" / "recipes.md").read_text()

GRID = [round(0.2 + 0.4 * i, 1) for i in range(8)]  # 0.2 ... 3.0: every penalty the walk may reach


def walk(curve):
    scores = {}
    while (alpha := len_penalty.next_penalty(scores)) is not None:
        scores[alpha] = curve(alpha)
    return scores


@pytest.mark.parametrize("peak", GRID)
def test_the_length_penalty_walk_finds_the_full_grids_choice_on_a_single_peaked_curve(peak):
    curve = lambda a: 40.0 - 3.0 * abs(a - peak) ** 1.5  # noqa: E731
    scores = walk(curve)
    assert len_penalty.best(scores) == max(GRID, key=curve) == peak
    # 1.0, 1.4 and 1.8, then out to the peak and one step past it (where the range allows)
    lo, hi = GRID.index(min(peak, 1.0)), GRID.index(max(peak, 1.8))
    assert sorted(scores) == GRID[max(lo - 1, 0) if peak <= 1.0 else lo:hi + 2 if peak >= 1.8 else hi + 1]


def test_the_length_penalty_walk_keeps_the_lowest_of_equal_scores_and_stops_between_worse_ones():
    assert walk(lambda a: 30.0) == {1.0: 30.0, 1.4: 30.0, 1.8: 30.0, 0.6: 30.0, 0.2: 30.0}  # a tie at the low end
    assert len_penalty.best({1.0: 30.0, 1.4: 31.0, 1.8: 31.0}) == 1.4
    assert len_penalty.next_penalty({1.0: 30.0, 1.4: 31.0, 1.8: 29.0}) is None


def test_the_length_penalty_script_reads_and_answers_in_the_recipes_format(tmp_path):
    tsv = tmp_path / "valid_len_penalty.tsv.tmp"
    tsv.write_text("")
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "recipes" / "len_penalty.py"), *a, str(tsv)],  # noqa: E731
                                    capture_output=True, text=True)
    assert run("next").stdout == "1\n"
    assert run("best").returncode == 1 and "holds no scores" in run("best").stderr
    tsv.write_text("1\t39.10\n1.4\t39.13\n1.8\t39.29\n2.2\t39.41\n")  # as the recipe writes it
    assert run("next").stdout == "2.6\n"
    tsv.write_text(tsv.read_text() + "2.6\t38.86\n")
    assert run("next").stdout == "" and run("best").stdout == "2.2\n"


def test_every_recipe_script_parses():
    """`bash -n` on each recipe: a quoting slip (an apostrophe inside ${VAR:-...}) otherwise shows only when a
    45-minute run reaches that line."""
    import subprocess

    for script in sorted((ROOT / "recipes").glob("*.sh")):
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, (script.name, r.stderr)


def test_a_distillation_run_is_recorded_as_teacher_against_student(tmp_path, monkeypatch):
    """recipes/distill.sh's run: its two recorded runs, the speed benchmark's figures and its time as one entry,
    shown in recipes.md and in docs/recipes.md's distill block (never among the recipes as they ship)."""
    monkeypatch.setattr(recipe_results, "RESULTS", tmp_path / "results" / "recipes")
    monkeypatch.setattr(recipe_results, "README", tmp_path / "README.md")
    doc = tmp_path / "recipes-doc.md"
    doc.write_text("before\n<!-- distill:begin -->\n<!-- distill:end -->\nafter\n")
    args = dict(recipe="multi30k", name=None, pair="de-en", size="cpu", checkpoint="ck", ppl=None, train_args="",
                wall_s=800.0, len_penalty=1.0, resumed=False, vocab=None, bpe=None, seed=None, lowercase=False)
    shapes = {"teacher": (4, 36.0), "student": (1, 35.5)}
    for who, (layers, bleu) in shapes.items():
        out = tmp_path / "d" / who
        fake_run(out, bleu)
        model = {"kind": "seq2seq", "src_vocab_size": 50, "tgt_vocab_size": 50, "d_model": 16, "n_head": 2,
                 "n_encoder_layers": 2, "n_decoder_layers": layers, "d_ff": 32}
        (out / "run" / "config.yaml").write_text(yaml.safe_dump({"train": {"max_steps": 100}, "model": model}))
        (out / "valid_len_penalty.tsv").write_text(f"1.0\t{bleu + 1}\n")
        recipe_results.record(type("A", (), {**args, "out": str(out),
                                             "name": "multi30k-de-en" if who == "teacher" else "multi30k-distill-de-en"}))
    speed = {"sent_per_s": {"teacher int8 / beam 5": 100.0, "student int8 / beam 5": 250.0,
                            "teacher CT2 int8 / beam 5": 50.0}, "bleu": {}, "batch": 64, "threads": 2, "cpu": "x",
             "date": "d"}
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    d = dict(out=str(tmp_path / "d"), pair="de-en", size="cpu", tag="", speed=str(tmp_path / "speed.json"),
             wall_s=1800.0)
    # a teacher trained before the run (found in OUT/teacher) adds the time its recipe recorded
    assert recipe_results.record_distill(type("A", (), {**d, "add_teacher_time": True}))["whole_wall_s"] == 2600.0
    entry = recipe_results.record_distill(type("A", (), {**d, "add_teacher_time": False}))
    assert entry["teacher"]["layers"] == "2+4 x 16" and entry["student"]["layers"] == "2+1 x 16"
    assert entry["teacher"]["parameters"] > entry["student"]["parameters"] > 0
    assert entry["student"]["valid_sacrebleu"] == 36.5 and entry["student"]["test_sacrebleu"] == 35.5
    row = "| 37.00 / 36.50 | 36.00 / 35.50 (-0.50) | 100 / 250 (2.50x) | 5.00x | 30.0 min |"
    assert row in (tmp_path / "results" / "recipes.md").read_text()
    all_ = json.loads((tmp_path / "results" / "recipes.json").read_text())
    recipe_results.update_readme(all_, doc)
    assert row in doc.read_text() and doc.read_text().endswith("<!-- distill:end -->\nafter\n")
    assert sorted(all_) == ["distill-de-en/cpu", "multi30k-de-en/cpu", "multi30k-distill-de-en/cpu"]  # each kept
    current = recipe_results.readme_blocks(all_)["current"]
    assert "Multi30k de->en `cpu`" in current and "student" not in current


def test_a_multilingual_run_is_recorded_per_direction_beside_the_bilingual_recipe(tmp_path, monkeypatch):
    """recipes/multi30k-multi.sh records one row per direction; the multilingual table sets each beside the
    bilingual recipe of the same budget (its latest run), and a zero-shot direction says so."""
    monkeypatch.setattr(recipe_results, "RESULTS", tmp_path / "results" / "recipes")
    monkeypatch.setattr(recipe_results, "README", tmp_path / "README.md")
    doc = tmp_path / "recipes-doc.md"
    doc.write_text("<!-- multilingual:begin -->\n<!-- multilingual:end -->\n")
    args = dict(recipe="multi30k", size="cpu-long", checkpoint="ck", ppl=None, train_args="", wall_s=2700.0,
                len_penalty=1.0, resumed=False, vocab=None, bpe=None, seed=None, lowercase=False)
    runs = [("multi30k-de-en", "de-en", 40.0, True), ("multi30k-multi-de-en", "de-en", 39.2, True),
            ("multi30k-multi-en-fr", "en-fr", 50.0, True), ("multi30k-multi-zs-de-fr", "de-fr", 20.5, False)]
    for name, pair, bleu, valid in runs:
        out = tmp_path / name
        fake_run(out, bleu)
        if valid:
            (out / "valid_len_penalty.tsv").write_text(f"1.0\t{bleu + 1}\n")
        recipe_results.record(type("A", (), {**args, "out": str(out), "name": name, "pair": pair}))
    rows = recipe_results.multilingual_table(json.loads((tmp_path / "results" / "recipes.json").read_text()))
    assert rows[2].startswith("| de->en | `cpu-long` | 40.20 | 39.20 | 40.00 | -0.80 |")
    assert rows[3].startswith("| en->fr | `cpu-long` | 51.00 | 50.00 | – | – |")  # no bilingual run of it
    assert rows[4].startswith("| de->fr | `cpu-long`, zero-shot | – | 20.50 |")
    recipe_results.update_readme(json.loads((tmp_path / "results" / "recipes.json").read_text()), doc)
    assert rows[2] in doc.read_text()
    assert "one multilingual model" in (tmp_path / "results" / "recipes.md").read_text()


def test_a_distilled_students_variant_is_named_in_the_tables():
    def label(name):
        return recipe_results._student({"name": name})

    assert label("multi30k-distill-de-en") == " distilled student"
    assert label("multi30k-distill-teacher-size-de-en") == " distilled student of the teacher's size"
    assert label("multi30k-distill-orig-en-de") == " distilled student (with the original pairs)"
