"""translate --glossary: each source term found in a line becomes one of its constraints (tfcli/generate/glossary.py),
matched as whole words, in any case unless cased, by lemma where simplemma knows the language, longest first; and
constraints never fail silently (a phrase both held and avoided is an error, a missed one a warning)."""

from __future__ import annotations

import html
import json
import random
import re
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

import tfcli
from helpers import WORDS, holds
from tfcli.cli import app
from tfcli.errors import InputError, TfcliError
from tfcli.generate.glossary import Glossary, Term, words


def glossary(pairs: dict) -> Glossary:
    return Glossary([Term(s, (t,) if isinstance(t, str) else tuple(t), f"g:{i + 1}") for i, (s, t) in
                     enumerate(pairs.items())])


def found(g: Glossary, text: str, lang=None) -> list[tuple[str, str]]:
    return [(m.term.source, text[m.start : m.end]) for m in g.find(text, lang)]


def test_terms_match_whole_words_in_any_case_unless_cased():
    g = glossary({"neural network": "neuronales Netz", "cat": "Katze", "iPhone": "iPhone", "NASA": "NASA"})
    assert found(g, "A Neural Network and a NEURAL  network.") == [("neural network", "Neural Network"),
                                                                   ("neural network", "NEURAL  network")]
    assert found(g, "category cats concat cat-like (cat)") == [("cat", "cat"), ("cat", "cat")]
    assert found(g, "my iPhone, an iphone, IPHONE") == [("iPhone", "iPhone")]
    assert found(g, "NASA and Nasa and nasa") == [("NASA", "NASA")]
    assert found(g, "nothing here") == [] and found(glossary({}), "cat") == []


def test_inflected_forms_match_by_lemma_where_the_language_has_a_lemmatiser():
    pytest.importorskip("simplemma")
    g = glossary({"Hund": "dog", "network": "Netz", "mouse": "Maus"})
    assert found(g, "Die Hunde bellen.", "de") == [("Hund", "Hunde")]
    assert found(g, "Die Hunde bellen.") == []  # (no language: surface forms only)
    assert found(g, "two networks and three mice", "en") == [("network", "networks"), ("mouse", "mice")]
    assert found(g, "two networks", "eng_Latn") == [("network", "networks")]  # (an NLLB code: its language)
    assert found(g, "zwei Hunde", "xx") == []  # (a language it has no dictionary for)


def test_the_longest_match_wins_and_overlaps_resolve_once():
    g = glossary({"New York": "A", "New York Times": "B", "York": "C", "Times Square": "D", "square": "E"})
    assert found(g, "the New York Times Square") == [("New York Times", "New York Times"), ("square", "Square")]
    assert found(g, "New York, then York") == [("New York", "New York"), ("York", "York")]
    later = Glossary([Term("cat", ("x",), "a:1"), Term("Cat", ("y",), "b:1")])  # (a later entry replaces one)
    assert [m.term.targets for m in later.find("a cat")] == [("y",)]


def test_chinese_and_japanese_terms_match_without_spaces():
    g = glossary({"北京": "Beijing", "東京タワー": "Tokyo Tower", "AI": "KI"})
    assert found(g, "我爱北京天安门") == [("北京", "北京")]
    assert found(g, "東京タワーに行った。北京AI") == [("東京タワー", "東京タワー"), ("北京", "北京"), ("AI", "AI")]
    assert [w for w, _, _ in words("我爱AI和北京")] == ["我", "爱", "AI", "和", "北", "京"]


def test_glossary_files_tsv_and_csv_with_alternatives_and_errors(tmp_path):
    tsv, csv = tmp_path / "g.tsv", tmp_path / "g.csv"
    tsv.write_text("# source\ttarget\n\ncat\tdog ||| egg\nfish goat\that\n", encoding="utf-8")
    csv.write_text('"tree, big",moon\nsun,"owl ||| pig"\n', encoding="utf-8")
    g = Glossary.load([str(tsv), str(csv)])
    assert [(t.source, t.targets, t.where) for t in g.terms] == [
        ("cat", ("dog", "egg"), f"{tsv}:3"), ("fish goat", ("hat",), f"{tsv}:4"), ("tree, big", ("moon",), f"{csv}:1"),
        ("sun", ("owl", "pig"), f"{csv}:2")]
    assert g.terms[0].constraint == ("dog", "egg") and g.terms[1].constraint == "hat"
    bad = tmp_path / "bad.tsv"
    bad.write_text("cat\tdog\nfish\n")
    with pytest.raises(InputError, match=rf"{bad}:2: expected a source term and a target term separated by a tab"):
        Glossary.load([str(bad)])
    with pytest.raises(TfcliError, match="no such glossary file"):
        Glossary.load([str(tmp_path / "none.tsv")])


def test_a_term_found_becomes_a_constraint_and_lines_without_terms_are_unchanged(copier):
    """The copier copies its input: with the glossary, a line holding a term also holds the term's target (an
    alternative: one of them), every other line is exactly its translation without the glossary, at any batch
    size and order; Translation.constraints says which were held."""
    c = tfcli.load(copier)
    rng = random.Random(3)
    texts = [" ".join(rng.choice(WORDS[:12]) for _ in range(rng.randint(1, 6))) for _ in range(24)]
    terms = {"dog": "moon", "fish goat": ["nest", "owl pig"]}
    plain = c.translate(texts, beam_size=4)
    got = c.translate(texts, beam_size=4, glossary=terms)
    times = lambda text, phrase: len(re.findall(rf"(?<!\S){re.escape(phrase)}(?!\S)", text))  # noqa: E731
    for text, p, g in zip(texts, plain, got):  # (a term found k times: its target at least k times)
        assert times(g, "moon") >= times(text, "dog")
        assert times(g, "nest") + times(g, "owl pig") >= times(text, "fish goat")
        if not holds(text, "dog") and not holds(text, "fish goat"):
            assert g == p
    for b in (1, 5):
        assert c.translate(texts, beam_size=4, glossary=terms, batch_size=b) == got
    assert c.translate(texts[::-1], beam_size=4, glossary=terms)[::-1] == got
    both = c.translate_nbest(["cat dog", "egg"], beam_size=4, glossary=terms, constraints=[["queen"], []])
    assert both[0][0].constraints == [("queen", True), ("moon", True)] and both[1][0].constraints is None
    twice = c.translate_nbest(["dog cat dog", "dog egg"], beam_size=4, glossary=terms, constraints=[[], ["moon"]])
    assert times(twice[0][0].text, "moon") == 2 and twice[0][0].constraints == [("moon", True), ("moon", True)]
    assert times(twice[1][0].text, "moon") == 1 and twice[1][0].constraints == [("moon", True)]


def test_a_term_goes_with_the_sentence_or_window_its_words_are_in(copier):
    """With --split-sentences a term is held by the translation of its own sentence: the line is its sentences
    translated alone (each with the glossary) and joined; a window of an over-long sentence likewise."""
    c = tfcli.load(copier)
    terms = {"goat": "moon"}
    sentences = ["cat dog egg.", "fish goat.", "hat ice jam kite."]
    alone = [c.translate([s], beam_size=3, glossary=terms)[0] for s in sentences]
    assert holds(alone[1], "moon") and not any(holds(a, "moon") for a in (alone[0], alone[2]))
    joined = c.translate([" ".join(sentences)], beam_size=3, glossary=terms, split_sentences="always")[0]
    assert joined == " ".join(alone)
    filler = [w for w in WORDS[:8] if w != "goat"]
    long = " ".join(filler[i % 7] for i in range(40)) + " goat"  # (past the copier's max_len of 32: two windows)
    out = c.translate_nbest([long], beam_size=3, glossary=terms, n=1)[0][0]
    assert out.constraints == [("moon", True)]
    assert out.text.split().index("moon") > 30  # (in the second window's translation, beside its word)


def test_a_glossary_on_tagged_lines_and_files_holds_the_term_and_keeps_the_tags(copier, tmp_path):
    """With inline markup the glossary sees the plain text: a tagged line's output without its tags is the plain
    line's output with the glossary, the term's target held, the tags put back well-formed; the same in a file
    format (a PO catalogue's msgstr)."""
    c = tfcli.load(copier)
    terms = {"goat": "moon"}
    tagged = ["cat <b>fish goat</b> egg.", "<i>hat</i> ice jam."]
    plain = c.translate([re.sub(r"<[^>]+>", "", t) for t in tagged], beam_size=3, glossary=terms)
    out = c.translate(tagged, beam_size=3, glossary=terms, input_format="xml", split_sentences="always")
    assert [html.unescape(re.sub(r"<[^>]+>", "", o)) for o in out] == plain and holds(plain[0], "moon")
    for o in out:
        ET.fromstring(f"<r>{o}</r>")  # (well-formed)
    assert out[0].count("<b>") == 1 and out[1].startswith("<i>")
    po = tmp_path / "in.po"
    po.write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\n'
                  'msgid "cat fish goat egg."\nmsgstr ""\n')
    c.translate_file(po, tmp_path / "out.po", glossary=terms, beam_size=3)
    assert f'msgstr "{plain[0]}"' in (tmp_path / "out.po").read_text()


def cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def test_the_command_line_glossary_with_jsonl_and_constraints(copier, tmp_path):
    src, g, out = tmp_path / "in.jsonl", tmp_path / "g.tsv", tmp_path / "out.txt"
    src.write_text(json.dumps({"text": "cat dog", "constraints": ["egg"]}) + "\n" + json.dumps({"text": "fish"})
                   + "\n")
    g.write_text("dog\tmoon\nfish\tsun\n")
    res = cli("translate", "-m", copier, src, "--input-format", "jsonl", "--glossary", g, "-o", out)
    assert res.exit_code == 0, res.output
    first, second = out.read_text().splitlines()
    assert holds(first, "moon") and holds(first, "egg") and holds(second, "sun")
    res = cli("translate", "-m", copier, src, "--input-format", "jsonl", "--glossary", g, "--sampling")
    assert res.exit_code == 1 and "--glossary makes constraints, which need beam search" in res.output


def test_jsonl_output_says_which_terms_each_translation_holds(copier, tmp_path):
    """--jsonl: one object a translation, with the line's constraints (its own and the glossary's) and whether
    the translation holds each; the other fields as --nbest, --scores and --alignment give them."""
    src, g = tmp_path / "in.jsonl", tmp_path / "g.tsv"
    src.write_text(json.dumps({"text": "cat dog", "constraints": ["egg"]}) + "\n" + json.dumps({"text": "fish"})
                   + "\n\n")
    g.write_text("dog\tmoon\n")
    res = cli("translate", "-m", copier, src, "--input-format", "jsonl", "--glossary", g, "--jsonl")
    assert res.exit_code == 0, res.output
    first, second, third = map(json.loads, res.stdout.splitlines())
    assert first["index"] == 0 and holds(first["text"], "moon") and holds(first["text"], "egg")
    assert first["constraints"] == [{"phrase": "egg", "held": True}, {"phrase": "moon", "held": True}]
    assert "constraints" not in second and second["text"] == "fish" and set(second) == {"index", "text", "score"}
    assert third == {"index": 2, "text": "", "score": 0.0}
    plain = cli("translate", "-m", copier, src, "--input-format", "jsonl", "--glossary", g, "--nbest", "2",
                "--scores", "--alignment")
    res = cli("translate", "-m", copier, src, "--input-format", "jsonl", "--glossary", g, "--nbest", "2",
              "--scores", "--alignment", "--jsonl")
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    tabs = [line.split("\t") for line in plain.stdout.splitlines()]
    assert [(r["index"], r["rank"], r["text"]) for r in rows] == [(int(t[0]), k, t[2]) for t, k in zip(
        tabs, [0, 1, 0, 1, 0])]
    assert all(" ".join(f"{x:.4f}" for x in r["token_scores"]) == t[3] for r, t in zip(rows, tabs))
    assert all(" ".join(f"{i}-{j}" for i, j in r["alignment"]) == t[-1] for r, t in zip(rows, tabs) if r["text"])


def test_a_phrase_both_held_and_avoided_is_an_error_naming_the_line(copier, tmp_path):
    c = tfcli.load(copier)
    with pytest.raises(InputError, match=r"<text>:2: the phrase to hold 'dog' holds the phrase to avoid 'dog'"):
        c.translate(["cat", "cat dog"], constraints=[[], ["dog"]], avoid=[[], ["dog"]])
    with pytest.raises(InputError, match=r"<text>:1: the phrase to hold 'egg fish' holds the phrase to avoid 'fish'"):
        c.translate(["cat"], constraints=[[["egg fish", "moon"]]], avoid=[["fish"]])
    with pytest.raises(InputError, match=r"<text>:1: the phrase to hold 'moon' holds the phrase to avoid 'moon'"):
        c.translate(["cat dog"], glossary={"dog": "moon"}, avoid=[["moon"]])
    assert c.translate(["cat dog"], glossary={"dog": "moon"}, avoid=[["sun"]]) == c.translate(
        ["cat dog"], constraints=[["moon"]], avoid=[["sun"]])


def test_a_term_the_vocabulary_cannot_spell_is_said_once_and_left_out(copier, capsys):
    c = tfcli.load(copier)
    got = c.translate_nbest(["cat dog", "dog egg", "fish"], glossary={"dog": "zebra", "fish": "moon"}, n=1)
    assert [hs[0].text for hs in got[:2]] == c.translate(["cat dog", "dog egg"]) and holds(got[2][0].text, "moon")
    err = capsys.readouterr().err
    assert err.count("the glossary's term 'zebra' (glossary['dog']) has a piece the target vocabulary lacks") == 1
    assert "<text>:1:" in err and got[0][0].constraints is None


def test_a_missed_constraint_is_a_warning_naming_the_line_and_the_run_counts_them(copier, tmp_path, monkeypatch,
                                                                                  capsys):
    """Where the search ends a hypothesis without a constraint (its length limit), the output still comes, with a
    warning naming file:line and the phrase, and a count at the end (a search that ignores the constraints stands
    in for one that ran out of room)."""
    import tfcli.generate.translate as translate_module
    from tfcli.generate.search import Rows

    real = translate_module.search
    monkeypatch.setattr(translate_module, "search", lambda model, src, options, rows, *a: real(
        model, src, options, Rows(rows.prefix, rows.avoid, None, rows.lines), *a))
    src, g, out = tmp_path / "in.txt", tmp_path / "g.tsv", tmp_path / "out.txt"
    src.write_text("cat dog\negg\nfish dog\n")
    g.write_text("dog\tmoon\n")
    res = cli("translate", "-m", copier, src, "--glossary", g, "-o", out)
    assert res.exit_code == 0 and out.read_text() == "cat dog\negg\nfish dog\n"
    assert f"{src}:1: the translation misses the constraint(s) 'moon'" in res.stderr
    assert f"{src}:3: the translation misses" in res.stderr and f"{src}:2:" not in res.stderr
    assert "2 of 2 line(s) with constraints miss at least one" in res.stderr
