"""Markup, placeholders and file formats (tfcli/formats/): tags and placeholders put back by word alignment, each
format's structure kept, checked with the parsers users' tools use, on real files (tests/data/formats/README.md)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tfcli.cli import app
from tfcli.formats import files, markup
from tfcli.formats.placeholders import pattern

DATA = Path(__file__).parent / "data" / "formats"
TAGGED = (DATA / "salesforce-ende-dev.xml.en").read_text().splitlines()


def cli(*args, **kw):
    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def structure(text: str, ordered: bool = False):
    """The element tree's shape: names and children, recursively (`ordered`: the children in order, as the
    localization-xml-mt scorer compares them; else as a multiset, since a translation may reorder siblings)."""
    def shape(e):
        children = [shape(c) for c in e]
        return (e.tag, children if ordered else sorted(children))
    return shape(ET.fromstring(f"<ROOT>{text}</ROOT>"))


def untagged(text: str) -> str:
    """The text with its tags removed, unescaped (a tag spaced on both sides leaves one space)."""
    return markup.unescape(re.sub(r" (<[^>]+> )+|<[^>]+>", lambda m: " " if m.group(1) else "", text))


@pytest.mark.parametrize("seed", range(6))
def test_tags_come_back_well_formed_around_any_alignment(seed):
    """Whatever the alignment (random here, including words aligned to nothing), the output parses as XML, has
    the source's elements with the same nesting and order, and with its tags removed is exactly the translation."""
    rng = random.Random(seed)
    for line in TAGGED:
        m = markup.read_xml(line)
        n = len(m.plain.split())
        target = " ".join(f"w{j}" for j in range(rng.randint(0, n + 3)))
        words = len(target.split())
        pairs = [(rng.randrange(n), j) for j in range(words) if rng.random() < 0.8]
        out = m.render(target, pairs)
        assert structure(out, ordered=True) == structure(line, ordered=True), (line, out)
        assert untagged(out) == target


def test_the_identity_alignment_gives_the_source_back():
    for line in TAGGED:
        m = markup.read_xml(line)
        n = len(m.plain.split())
        assert m.render(m.plain, [(i, i) for i in range(n)]) == line
    m = markup.read_xml("Click <a href=\"x\">continue</a>. \"<i>quoted</i>\"")
    assert m.render("Weiter. \"zitiert\"", [(0, 0), (1, 0), (2, 1)]) == "<a href=\"x\">Weiter</a>. \"<i>zitiert</i>\""


def test_the_aligners_words_are_found_in_the_plain_text():
    """The source words the aligner saw (a tokenizer's decoding: unknown characters, words split or joined) are
    mapped onto the plain text's words: equal words as words, the stretches between them by their characters."""
    plain = "If you don’t have a forecast, click Add a Forecast Type".split()
    seen = "If you don<unk>t have a fore cast, click Add a Forecast Type".split()
    assert markup._word_map(seen, plain) == [0, 1, 2, 3, 4, 5, 5, 6, 7, 8, 9, 10]
    assert markup._word_map("a b".split(), "ab".split()) == [0, 0]
    assert markup._word_map("x a extra b".split(), "a b".split()) == [0, 0, 0, 1]
    m = markup.read_xml("If you don’t have <b>a forecast</b>, click")
    aligned = [(i, i) for i in range(len(seen[:8]))]
    assert m.render("If you don’t have a fore cast, click", aligned, seen[:8]) == (
        "If you don’t have <b>a fore cast</b>, click")


def test_reordered_words_take_their_tags_with_them():
    m = markup.read_xml("Click <b>Save</b> now")
    assert m.render("jetzt Speichern klicken", [(0, 2), (1, 1), (2, 0)]) == "jetzt <b>Speichern</b> klicken"
    m = markup.read_xml("<b>bold</b> and <i>italic</i>")  # (siblings keep their order: the second gives way)
    assert m.render("kursiv und fett", [(0, 2), (1, 1), (2, 0)]) == "kursiv und <b>fett</b><i></i>"


def test_html_fragments_keep_void_and_untranslated_elements():
    m = markup.read_html('Run <code>ls -l</code> then<br>press <span class="notranslate">OK</span> &amp; go')
    assert m.plain == "Run then press & go"
    n = len(m.plain.split())
    out = m.render(m.plain, [(i, i) for i in range(n)])
    assert out == 'Run <code>ls -l</code> then <br>press <span class="notranslate">OK</span> &amp; go'
    assert markup.read_html("a <p>b").render("x y", [(0, 0), (1, 1)]) == "x <p>y"  # (left open, as written)
    with pytest.raises(markup.MarkupError) as e:
        markup.read_xml("a <b>x</i>")
    assert e.value.column == 9


@pytest.mark.parametrize("text, found", [
    ("Delete %d files from %s?", ["%d", "%s"]),
    ("Hello %(name)s, you have %1$d new {count} messages", ["%(name)s", "%1$d", "{count}"]),
    ("{count, plural, one {# file} other {# files}} left", ["{count, plural, one {# file} other {# files}}"]),
    ("This value should be of type {{ type }}.", ["{{ type }}"]),
    ("Write to help@example.org or see https://example.org/a?b=c.", ["help@example.org", "https://example.org/a?b=c"]),
    ("[b]bold[/b] and [url=http://x.org]link[/url]", ["[b]", "[/b]", "[url=http://x.org]", "[/url]"]),
    ("100% sure, 50 % off", []),
    # printf directives a letter follows at once (format strings as programs write them), Python's %r; a percent
    # sign after a number is text
    ("ETA: %dm %ds, last epoch %.1fs", ["%d", "%d", "%.1f"]),
    ("%d file%s deleted: %r", ["%d", "%s", "%r"]),
    ("50%off today, 100%sure", []),
])
def test_placeholders_are_found_and_come_back_exactly_as_often(text, found):
    p = pattern(True)
    assert [m.group() for m in p.finditer(text)] == found
    m = markup.read_text(text, p)
    rng = random.Random(0)
    n = len(m.plain.split())
    target = " ".join(f"w{j}" for j in range(n))
    out = m.render(target, [(rng.randrange(max(n, 1)), j) for j in range(n)])
    for f in found:
        assert out.count(f) == text.count(f), out
    for f in sorted(found, key=len, reverse=True):
        out = out.replace(f, " ")
    assert " ".join(out.split()) == target


def test_protect_takes_the_users_patterns():
    p = pattern(False, [r"ACME-\d+"])
    assert markup.read_text("see ACME-42 now", p).plain == "see now"
    with pytest.raises(Exception, match="--protect"):
        pattern(False, ["("])


def test_xml_lines_through_the_copier(copier, tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("cat <b>dog</b> egg\n<i>moon <b>sun</b></i> tree\ncat %d dog {name}\n<br/>\n\n")
    res = cli("translate", "-m", copier, src, "--input-format", "xml")
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines() == ["cat <b>dog</b> egg", "<i>moon <b>sun</b></i> tree", "cat %d dog {name}",
                                       "<br/>", ""]
    bad = tmp_path / "bad.txt"
    bad.write_text("cat <b>dog</b>\ncat <b>dog</i>\n")
    out = tmp_path / "out.txt"
    res = cli("translate", "-m", copier, bad, "--input-format", "xml", "-o", out)
    assert res.exit_code == 1 and f"{bad}:2: not well-formed XML (mismatched tag) at column 13" in res.output
    assert not out.exists()


def test_markup_leaves_the_translation_as_without_tags(random_checkpoint, tmp_path):
    """Exactness: the output with its tags removed is the translation of the source with its tags removed."""
    from helpers import WORDS

    rng = random.Random(1)
    tagged, plain = [], []
    for _ in range(12):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 9))]
        a = rng.randrange(len(words))
        b = rng.randrange(a, len(words))
        words[a] = "<b>" + words[a]
        words[b] = words[b] + "</b>"
        tagged.append(" ".join(words))
        plain.append(untagged(" ".join(words)))
    (tmp_path / "tagged.txt").write_text("\n".join(tagged) + "\n")
    (tmp_path / "plain.txt").write_text("\n".join(plain) + "\n")
    res = cli("translate", "-m", random_checkpoint, tmp_path / "tagged.txt", "--input-format", "xml")
    ref = cli("translate", "-m", random_checkpoint, tmp_path / "plain.txt")
    assert res.exit_code == 0 and ref.exit_code == 0, res.output
    outs = res.stdout.splitlines()
    assert [untagged(o) for o in outs] == ref.stdout.splitlines()
    assert all(structure(o, ordered=True) == structure(t, ordered=True) for o, t in zip(outs, tagged))


def test_html_attributes_that_are_text_are_translated_on_their_own(random_checkpoint):
    """alt, title, placeholder and aria-label values are translated as sentences of their own (the same output as
    translating them alone), put back in their tags; the rest of the line as without them."""
    import html

    import tfcli

    t = tfcli.load(str(random_checkpoint), device="cpu")
    lines = ['cat <img alt="dog egg" src="x.png"> moon', '<a href="u" title="tree sun" aria-label="pig">rat</a> queen']
    out = t.translate(lines, input_format="html")
    alone = t.translate(["dog egg", "tree sun", "pig", "cat moon", "rat queen"])
    alt = re.search(r'alt="([^"]*)"', out[0]).group(1)
    assert html.unescape(alt) == alone[0] and 'src="x.png"' in out[0]
    title, label = re.search(r'title="([^"]*)" aria-label="([^"]*)"', out[1]).groups()
    assert (html.unescape(title), html.unescape(label)) == (alone[1], alone[2]) and 'href="u"' in out[1]
    assert [untagged(o) for o in out] == alone[3:]


def translate_file(model, name, tmp_path, *flags):
    out = tmp_path / ("out-" + name)
    res = cli("translate", "-m", model, DATA / name, "-o", out, *flags)
    assert res.exit_code == 0, res.output
    return out.read_text()


def test_po_fills_msgstr_marks_fuzzy_and_passes_msgfmt(copier, tmp_path):
    import polib

    text = translate_file(copier, "djangojs.po", tmp_path)
    po = polib.pofile(text)
    entries = [e for e in po if e.msgid]
    assert all(e.msgstr and "fuzzy" in e.flags for e in entries)
    assert po.find("Available %s").msgstr.endswith("%s") and "perl-format" in po.find("Available %s").flags
    assert text.startswith("# SOME DESCRIPTIVE TITLE.") and "#: contrib/admin/media/js/calendar.js:24" in text
    if shutil.which("msgfmt"):
        subprocess.run(["msgfmt", "--check-format", "-o", "/dev/null", tmp_path / "out-djangojs.po"], check=True)
    broken = tmp_path / "broken.po"
    broken.write_text((DATA / "djangojs.po").read_text().replace('msgid "Add"', 'msgid "Add'))
    res = cli("translate", "-m", copier, broken, "-o", tmp_path / "x.po")
    assert res.exit_code == 1 and f"{broken}:28: not a PO line" in res.output and not (tmp_path / "x.po").exists()


def test_xliff_writes_targets_and_keeps_existing_ones(copier, tmp_path):
    from lxml import etree

    ns = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
    kept = translate_file(copier, "validators.en.xlf", tmp_path)
    assert kept == (DATA / "validators.en.xlf").read_text()  # (every unit has its target: nothing changes)
    new = etree.fromstring(translate_file(copier, "validators.en.xlf", tmp_path, "--overwrite").encode())
    targets = new.findall(".//x:target", ns)
    assert len(targets) == 3 and all(t.get("state") == "needs-review-translation" for t in targets)
    assert "{{ size }}" in targets[2].text and targets[2].text.count("{{ suffix }}") == 2
    ng = etree.fromstring(translate_file(copier, "messages.xlf", tmp_path).encode())
    target = ng.find(".//x:target", ns)
    assert [c.get("id") for c in target] == ["INTERPOLATION"]
    assert ng.find(".//x:context-group", ns) is not None


def test_xliff_2_inherits_translate_and_changes_only_the_targets(copier, tmp_path):
    """The OASIS test suite's everything-core.xlf: a file marked translate="no" whose group says yes again, units
    with targets, inline <pc>/<ph> with attributes and namespaces in scope. Only the three segments without a
    target are translated; the rest of the document is written as it was, byte for byte."""
    import difflib

    from lxml import etree

    source = (DATA / "everything-core.xlf").read_text()
    out = translate_file(copier, "everything-core.xlf", tmp_path)
    added = [line[1:].strip() for line in difflib.ndiff(source.splitlines(), out.splitlines()) if line[0] == "+"]
    removed = [line[1:].strip() for line in difflib.ndiff(source.splitlines(), out.splitlines()) if line[0] == "-"]
    assert removed == ['<segment id="1">', '<segment id="1">', '<segment id="s1">']
    assert [a for a in added if a.startswith("<segment")] == [
        '<segment id="1" state="translated">', '<segment id="1" state="translated">',
        '<segment id="s1" state="translated">']
    ns = {"x": "urn:oasis:names:tc:xliff:document:2.0"}
    doc = etree.fromstring(out.encode())
    targets = doc.findall(".//x:target", ns)
    assert [t.getparent().getparent().get("id") for t in targets] == ["tu1", "tu1", "tu3", "tu3end", "tu2"]
    inline = targets[-1]
    assert [(c.tag.split("}")[1], c.get("id"), c.get("dataRef") or c.get("dataRefStart")) for c in inline] == [
        ("pc", "1", "d1"), ("ph", "2", "d3")]
    assert out.split("\n")[1] == source.split("\n")[1]  # (the root's attributes in their order)


def test_xliff_and_po_name_the_target_language_where_known(tmp_path, capsys):
    """A document given targets gets the target language where its format names one and it is missing:
    XLIFF 2's trgLang (a warning where the language is not known), 1.2's target-language, PO's Language."""
    source = (DATA / "everything-core.xlf").read_text().replace(' trgLang="fr"', "", 1)
    doc = files.read("xliff", "e.xlf", source, tgt_lang="de")
    out = doc.write([s.text for s in doc.segments])
    assert 'srcLang="en" xmlns:my="myNamespace" xmlns:fs="urn:oasis:names:tc:xliff:fs:2.0" my:attr="value1" ' \
           'trgLang="de">' in out.split("\n")[1]
    doc = files.read("xliff", "e.xlf", source)
    doc.write([s.text for s in doc.segments])
    assert "e.xlf: XLIFF 2 wants trgLang" in capsys.readouterr().err
    v12 = (DATA / "messages.xlf").read_text()
    doc = files.read("xliff", "m.xlf", v12, tgt_lang="de")
    assert 'target-language="de"' in doc.write([s.text for s in doc.segments])
    po = files.read("po", "m.po", (DATA / "messages.ru.po").read_text(), tgt_lang="ru")
    assert '"Language: ru\\n"' in po.write([s.text for s in po.segments])


def test_po_plural_forms_follow_the_headers_nplurals(copier, tmp_path):
    """Babel's ru_RU test catalogue (nplurals=3): the plural entry gets its three forms, form 0 from the msgid,
    the others from msgid_plural, all fuzzy, and msgfmt accepts the plural count."""
    import polib

    text = translate_file(copier, "messages.ru.po", tmp_path)
    po = polib.pofile(text)
    entry = po.find("foobar")
    assert sorted(entry.msgstr_plural) == [0, 1, 2] and all(entry.msgstr_plural.values())
    assert entry.msgstr_plural[1] == entry.msgstr_plural[2] and "fuzzy" in entry.flags
    assert po.find("bar").msgstr and "#. This will be a translator coment," in text
    if shutil.which("msgfmt"):
        subprocess.run(["msgfmt", "--check", "-o", "/dev/null", tmp_path / "out-messages.ru.po"], check=True)


def test_subtitles_keep_cues_times_and_numbers(copier, tmp_path):
    import srt
    import webvtt

    src = list(srt.parse((DATA / "styles2.srt").read_text()))
    out = list(srt.parse(translate_file(copier, "styles2.srt", tmp_path)))
    assert [(s.index, s.start, s.end) for s in out] == [(s.index, s.start, s.end) for s in src]
    assert all(s.content.startswith("<font color=") and s.content.endswith("</font>") for s in out)
    text = translate_file(copier, "sample.vtt", tmp_path)
    vtt, source = webvtt.from_string(text), webvtt.from_string((DATA / "sample.vtt").read_text())
    assert [(c.start, c.end) for c in vtt.captions] == [(c.start, c.end) for c in source.captions]
    assert all(c.raw_text.strip() for c in vtt.captions)  # (raw: .text drops what looks like a tag, <unk>)
    bad = tmp_path / "bad.srt"
    bad.write_text((DATA / "styles2.srt").read_text().replace("00:00:32,439", "00:00:3x,439"))
    res = cli("translate", "-m", copier, bad, "-o", tmp_path / "x.srt")
    assert res.exit_code == 1 and f"{bad}:10: a cue time that does not parse" in res.output


def test_a_sentence_across_cues_is_one_segment_and_its_words_go_back_to_its_cues(tmp_path):
    """sample.vtt's second sentence runs over three cues: read as one segment (the cues' lines joined), and with a
    model that copies it word for word (the identity alignment) each cue gets back its own words."""
    import webvtt

    from helpers import copy_model, save_model, save_word_tokenizer

    source = (DATA / "sample.vtt").read_text()
    doc = files.read("vtt", "sample.vtt", source)
    assert len(doc.segments) == 2
    assert doc.segments[1].text.startswith("So in order") and doc.segments[1].text.endswith("my test account.")
    words = lambda t: re.findall(r"\w+|[^\w\s]+", t)  # noqa: E731  (the word tokenizer's pieces)
    vocab = sorted({w for seg in doc.segments for w in words(seg.text)})
    model = save_model(tmp_path / "copier", copy_model(n_words=len(vocab), max_len=64),
                       save_word_tokenizer(tmp_path / "tok", vocab))
    out = webvtt.from_string(translate_file(model, "sample.vtt", tmp_path))
    cues = webvtt.from_string(source).captions
    assert [words(c.raw_text) for c in out.captions] == [words(c.raw_text) for c in cues]


def test_an_html_page_keeps_everything_but_its_text(copier, tmp_path):
    source = (DATA / "404.html").read_text()
    out = translate_file(copier, "404.html", tmp_path)
    style = re.search(r"<style>.*</style>", source, re.DOTALL).group()
    assert style in out and out.startswith("<!doctype html>\n<html lang=\"en\">") and out.endswith("-->\n")
    assert "Not Found" not in out and "<title>" in out and "</h1>" in out
    skeleton = lambda t: re.sub(r">[^<]*<", "><", t)  # noqa: E731
    assert skeleton(out) == skeleton(source)


def test_markdown_keeps_code_links_and_blocks(copier, tmp_path):
    from markdown_it import MarkdownIt

    source = (DATA / "markdown-it-py.md").read_text()
    out = translate_file(copier, "markdown-it-py.md", tmp_path)
    assert "```bash\nconda install -c conda-forge markdown-it-py\n```" in out
    assert "(http://spec.commonmark.org/)" in out and "<https://markdown-it-py.readthedocs.io>" in out
    kinds = lambda t: [tok.type for tok in MarkdownIt("commonmark").parse(t) if tok.type != "inline"]  # noqa: E731
    assert kinds(out) == kinds(source)
    # links keep the form they were written in: a reference keeps its label (a shortcut [text] gets its label,
    # as its text is translated); the badges (images in links, no word) are left as written
    assert "][md-plugins]" in out and "][md-performance]" in out and out.count("][markdown-it]") == 3
    badges = source.split("\n\n")[1]
    assert badges.startswith("[![Github-CI][github-ci]][github-link]\n") and badges in out
    links = lambda t: [(tok.attrs.get("href"), tok.attrs.get("src")) for block in MarkdownIt("commonmark").parse(t)  # noqa: E731
                       for tok in block.children or () if tok.type in ("link_open", "image")]
    assert links(out) == links(source)


def test_markdown_keeps_front_matter_and_tables(copier, tmp_path):
    """A docs page with YAML front matter and a table of <kbd> keys and links: the front matter as written, the
    table's cells translated with the table's structure, its keys (<kbd>) and link targets kept."""
    from markdown_it import MarkdownIt

    source = (DATA / "keyboard-shortcuts.md").read_text()
    out = translate_file(copier, "keyboard-shortcuts.md", tmp_path)
    front = source[: source.index("---\n## About")] + "---\n"
    assert out.startswith(front)
    parse = lambda t: MarkdownIt("commonmark").enable("table").parse(t[len(front):])  # noqa: E731
    assert [tok.type for tok in parse(out)] == [tok.type for tok in parse(source)]
    assert sum(tok.type == "td_open" for tok in parse(out)) == 14
    assert re.findall(r"<kbd>.</kbd>", out) == re.findall(r"<kbd>.</kbd>", source)
    assert re.findall(r"\]\(([^)]*)\)", out) == re.findall(r"\]\(([^)]*)\)", source)
    assert "Activates the file finder" not in out
    # (an element's attributes read as the HTML readers read them: a class list that holds notranslate)
    inline = files.read("markdown", "x.md", 'Press <span class="key notranslate">Ctrl</span> or <b>Esc</b>.\n')
    assert inline.segments[0].extra["markup"].plain == "Press or Esc."


def test_json_keeps_keys_and_structure(copier, tmp_path):
    source = json.loads((DATA / "package.nls.json").read_text())
    text = translate_file(copier, "package.nls.json", tmp_path)
    out = json.loads(text)
    assert list(out) == list(source) and text.startswith('{\n\t"displayName": ')
    assert "<br>" in out["markdown.preview.breaks.desc"]
    res = cli("translate", "-m", copier, DATA / "translation.json", "-o", tmp_path / "x.json")
    assert res.exit_code == 1 and "translation.json:4: not valid JSON" in res.output
    assert not (tmp_path / "x.json").exists()


def test_formats_are_chosen_by_extension_and_refuse_line_options(copier, tmp_path):
    assert [files.choose("auto", p) for p in ["a.po", "b.HTML", "c.md", "d.xlf", "-", "e.txt", "f.srt.gz"]] == [
        "po", "html-page", "markdown", "xliff", "text", "text", "srt"]
    assert files.choose("text", "a.po") == "text"
    res = cli("translate", "-m", copier, DATA / "djangojs.po", "--nbest", "2")
    assert res.exit_code == 1 and "--nbest/--scores/--alignment/--jsonl is for line formats" in res.output
    res = cli("translate", "-m", copier, DATA / "djangojs.po", DATA / "sample.vtt")
    assert res.exit_code == 1 and "different formats" in res.output
    res = cli("translate", "-m", copier, DATA / "djangojs.po", "-o", DATA / "djangojs.po")
    assert res.exit_code != 0


def test_the_api_translates_markup_and_files(copier, tmp_path):
    import tfcli

    translator = tfcli.load(str(copier), device="cpu")
    assert translator.translate(["cat <b>dog</b> egg", "a &amp; b"], input_format="xml")[0] == "cat <b>dog</b> egg"
    assert translator.translate(["cat dog"], protect=["dog"]) == ["cat dog"]
    out = tmp_path / "de.po"
    assert translator.translate_file(DATA / "djangojs.po", out) == 6  # (six messages)
    assert 'msgstr "<unk> %s"' in out.read_text()
    with pytest.raises(Exception, match="translate_file"):
        translator.translate(["x"], input_format="po")


def test_a_file_format_never_gets_an_empty_translation_of_a_source_with_text(tmp_path):
    """A model that would end every output at once (</s> its best first token) still gives every PO, JSON and SRT
    entry with text a translation: in a file format no output ends before its first token; plain lines keep the
    model's choice (an empty line)."""
    import polib
    import torch

    from helpers import WORDS, copy_model, save_model, save_word_tokenizer
    from tfcli.specials import EOS_ID

    model = copy_model(n_words=len(WORDS), max_len=32)
    V, P = 4 + len(WORDS), 32
    with torch.no_grad():
        model.decoder.layers[0].ffn.w2.bias[V + P + EOS_ID] = 5.0  # </s> first by 24 logits, at every position
    stopper = save_model(tmp_path / "stopper", model, save_word_tokenizer(tmp_path / "tok", WORDS))
    res = cli("translate", "-m", stopper, "--input-format", "text", "--split-sentences", "never",
              input="apple bird\n")
    assert res.exit_code == 0 and res.output.startswith("\n") and "are empty" in res.output  # (its own choice)
    po = polib.pofile(translate_file(stopper, "djangojs.po", tmp_path))
    assert all(e.msgstr.strip() for e in po if e.msgid and not e.msgid_plural)
    out = json.loads(translate_file(stopper, "package.nls.json", tmp_path))
    leaves = []
    walk = [out]
    while walk:
        x = walk.pop()
        walk += list(x.values()) if isinstance(x, dict) else x if isinstance(x, list) else []
        leaves += [x] if isinstance(x, str) else []
    assert leaves and all(v.strip() for v in leaves)
    srt = translate_file(stopper, "styles2.srt", tmp_path)
    assert "\n\n\n" not in srt.replace("\r\n", "\n")


def test_html_lines_refuse_a_whole_page_naming_the_page_reader(copier, tmp_path):
    """--input-format html reads fragments a line each; a whole page given to it (its <!DOCTYPE html> or <html>
    line) would have its <style> rules translated line by line: refused naming the line and the page reader,
    nothing written. The same page with --input-format html-page translates."""
    page = (DATA / "404.html").read_text(encoding="utf-8")
    assert page.lstrip().lower().startswith(("<!doctype html", "<html"))
    src = tmp_path / "page.txt"
    src.write_text(page, encoding="utf-8")
    res = cli("translate", "-m", copier, "--input-format", "html", src, "-o", tmp_path / "out.txt")
    assert res.exit_code == 1 and f"{src}:1:" in res.output and "--input-format html-page" in res.output
    assert not (tmp_path / "out.txt").exists()
    res = cli("translate", "-m", copier, "--input-format", "html-page", src, "-o", tmp_path / "out.html")
    assert res.exit_code == 0, res.output


def test_po_refuses_a_msgid_without_its_msgstr(copier, tmp_path):
    """A msgid with no msgstr (polib folds it into the next entry, which then vanishes from the output with exit 0)
    is refused naming its line, as the other syntax errors are; nothing is written."""
    lines = (DATA / "djangojs.po").read_text(encoding="utf-8").split("\n")
    k = next(i for i, line in enumerate(lines) if line.startswith("msgid ") and line != 'msgid ""')
    assert lines[k + 1].startswith("msgstr")
    broken = tmp_path / "broken.po"
    broken.write_text("\n".join(lines[: k + 1] + lines[k + 2:]), encoding="utf-8")
    res = cli("translate", "-m", copier, broken, "-o", tmp_path / "x.po")
    assert res.exit_code == 1 and f"{broken}:{k + 1}: a msgid without its msgstr" in res.output
    assert not (tmp_path / "x.po").exists()


def test_po_plural_forms_come_from_the_target_language_or_gettexts_default(copier, tmp_path):
    """A template without a real Plural-Forms header (none: Babel's messages.pot; xgettext's placeholder
    nplurals=INTEGER, which msgfmt rejects) gets the catalogue language's rule and as many forms; with no known
    language, gettext's default (two forms, said in a warning). msgfmt --check passes on every one written."""
    import polib

    res = cli("translate", "-m", copier, DATA / "messages.pot", "-o", tmp_path / "out.po")
    assert res.exit_code == 0 and "gettext's default" in res.output
    po = polib.pofile(str(tmp_path / "out.po"))
    assert po.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert sorted(po.find("foobar").msgstr_plural) == [0, 1]
    written = [tmp_path / "out.po"]
    template = (DATA / "messages.pot").read_text(encoding="utf-8")
    for lang, n in (("pl", 3), ("fr", 2), ("ja", 1), ("ar", 6)):
        src = tmp_path / f"{lang}.pot"
        src.write_text(template.replace('"Language: Non existent language\\n"\n', f'"Language: {lang}\\n"\n'
                                        '"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\\n"\n'), encoding="utf-8")
        res = cli("translate", "-m", copier, src, "-o", tmp_path / f"{lang}.po")
        assert res.exit_code == 0 and "gettext's default" not in res.output, res.output
        po = polib.pofile(str(tmp_path / f"{lang}.po"))
        assert po.metadata["Plural-Forms"].startswith(f"nplurals={n};")
        assert sorted(po.find("foobar").msgstr_plural) == list(range(n))
        written.append(tmp_path / f"{lang}.po")
    if shutil.which("msgfmt"):
        for path in written:
            subprocess.run(["msgfmt", "--check", "--check-format", "-o", "/dev/null", path], check=True)


def test_a_file_with_crlf_line_ends_comes_back_with_crlf(copier, tmp_path):
    """styles2.srt as Windows tools write it (CRLF line ends): the output has CRLF line ends too, and is otherwise
    what the LF file gives; a PO catalogue likewise."""
    for name in ("styles2.srt", "djangojs.po", "sample.vtt"):
        lf = translate_file(copier, name, tmp_path)
        crlf = tmp_path / ("crlf-" + name)
        crlf.write_bytes((DATA / name).read_bytes().replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))
        res = cli("translate", "-m", copier, crlf, "-o", tmp_path / "out.crlf")
        assert res.exit_code == 0, res.output
        out = (tmp_path / "out.crlf").read_bytes()
        assert b"\r\n" in out and out.count(b"\n") == out.count(b"\r\n")
        assert out.replace(b"\r\n", b"\n") == lf.encode()


@pytest.mark.parametrize("name", ["sample.vtt", "styles2.srt"])
def test_a_timing_line_right_after_a_cue_begins_the_next_cue(copier, tmp_path, name):
    """A cue whose text runs straight into the next cue's timing line (no blank line between: WebVTT's parser, and
    SRT players, read a new cue there) keeps both cues: the same segments and output as with the blank line."""
    source = (DATA / name).read_text(encoding="utf-8")
    first, second, rest = source.split("\n\n", 2)
    joined = f"{first}\n\n{second}\n{rest}"  # (the second blank line of the file left out)
    fmt = name.rsplit(".", 1)[1]
    assert [r.text for r in files.read(fmt, name, joined).segments] == \
        [r.text for r in files.read(fmt, name, source).segments]
    src = tmp_path / ("joined-" + name)
    src.write_text(joined, encoding="utf-8")
    res = cli("translate", "-m", copier, src, "-o", tmp_path / ("out-joined-" + name))
    assert res.exit_code == 0, res.output
    first, second, rest = translate_file(copier, name, tmp_path).split("\n\n", 2)
    assert (tmp_path / ("out-joined-" + name)).read_text() == f"{first}\n\n{second}\n{rest}"


def test_numbered_tags_are_elements_kept_around_their_words(copier, tmp_path):
    """react-i18next's <1>...</1> (its razzle-ssr example's catalogue): read as elements, not text the model would
    drop; every value comes back with the same numbered tags, paired, in order; keys untouched."""
    out = json.loads(translate_file(copier, "razzle-translations.json", tmp_path))
    src = json.loads((DATA / "razzle-translations.json").read_text(encoding="utf-8"))
    assert list(out) == list(src)
    key = next(k for k in src if "<1>" in k)
    tags = lambda s: re.findall(r"</?\d+/?>", s)  # noqa: E731
    assert tags(out[key]) == tags(src[key]) == ["<1>", "</1>", "<3>", "</3>"]
    m = markup.read_tags(src[key])
    assert "<" not in m.plain and "src/App.js" in m.plain


@pytest.mark.parametrize("name", ["w3c-voices.vtt", "youtube_dl.vtt"])
def test_webvtt_voices_and_inline_timestamps_stay_in_their_cues(tmp_path, name):
    """The WebVTT spec's voices example (<v Roger Bingham> at every cue's start, a sentence across two cues) and a
    YouTube export (inline timestamps <00:05:04.199>, <c> spans, a timing line with no blank line before it), with a
    model that copies word for word: webvtt-py reads the same cues, times, voices (at each cue's start) and each
    cue's inline timestamps."""
    import webvtt

    from helpers import copy_model, save_model, save_word_tokenizer

    source = (DATA / name).read_text(encoding="utf-8")
    doc = files.read("vtt", name, source)
    words = lambda t: re.findall(r"\w+|[^\w\s]+", t)  # noqa: E731
    vocab = sorted({w for seg in doc.segments for w in words(seg.text)})
    model = save_model(tmp_path / "copier", copy_model(n_words=len(vocab), max_len=min(64, 2 * (4 + len(vocab)))),
                       save_word_tokenizer(tmp_path / "tok", vocab))
    out = webvtt.from_string(translate_file(model, name, tmp_path)).captions
    src = webvtt.from_string(source).captions
    assert [(c.start, c.end, c.voice) for c in out] == [(c.start, c.end, c.voice) for c in src]
    stamps = lambda c: re.findall(r"<[\d:.]+>", c.raw_text)  # noqa: E731
    assert [stamps(c) for c in out] == [stamps(c) for c in src]
    assert all(c.raw_text.startswith(f"<v {c.voice}>") for c in out if c.voice)
    assert all(re.sub(r"<[^>]*>", "", c.raw_text).strip() for c in out)
    # whatever the words' order and alignment (here: reversed, no tags), each voice stays at its cue's start
    reordered = webvtt.from_string(doc.write([" ".join(reversed(r.text.split())) for r in doc.segments])).captions
    assert [c.voice for c in reordered] == [c.voice for c in src]


@pytest.mark.parametrize("name", ["sample.vtt", "w3c-voices.vtt", "youtube_dl.vtt"])
def test_no_cue_with_text_comes_back_empty_whatever_the_alignment(name):
    """Whatever a model aligns (here: random alignments, translations of random length, a word a cue at least),
    every cue whose source has words gets words back, its neighbours' tags and timestamps whole; a cue cut from a
    neighbour inside an element opens it again (`<i>a b</i>` -> `<i>a</i>` and `<i>b</i>`)."""
    import random

    import webvtt

    rng = random.Random(0)
    source = (DATA / name).read_text(encoding="utf-8")
    doc = files.read("vtt", name, source)
    src = webvtt.from_string(source).captions
    for _ in range(100):
        outs = []
        for r in doc.segments:
            m = r.extra["markup"]
            n_src = len(m.plain.split())
            n_cues = sum(1 for node in m.root.walk() if node.open.startswith("<tfcli-cue"))
            n_tgt = rng.randint(n_cues, 2 * n_src + 1)
            alignment = [(rng.randrange(n_src), rng.randrange(n_tgt)) for _ in range(rng.randint(0, n_src + n_tgt))]
            outs.append(m.render(" ".join(f"w{i}" for i in range(n_tgt)), alignment))
        out = webvtt.from_string(doc.write(outs)).captions
        assert len(out) == len(src)
        for c, s in zip(out, src):
            text = lambda cue: re.sub(r"<[^>]*>", "", cue.raw_text).strip()  # noqa: E731
            assert text(c) or not text(s), (s.raw_text, c.raw_text)
    assert files._split_cue("<i>a b</i> c") == ("<i>a</i>", "<i>b</i> c")
    assert files._split_cue("<c.yellow>a <00:00:01.000>b</c>") == ("<c.yellow>a</c>", "<c.yellow><00:00:01.000>b</c>")


def _outside_msgstr(text: str) -> list[str]:
    """A PO file's lines but its msgstr blocks, with the fuzzy flag left out: what a translation must keep."""
    out, in_msgstr = [], False
    for line in text.split("\n"):
        if line.startswith("msgstr"):
            in_msgstr = True
            continue
        if in_msgstr and line.startswith('"'):
            continue
        in_msgstr = False
        if line.strip() == "#, fuzzy":
            continue
        if line.startswith("#,"):
            line = re.sub(r",\s*fuzzy\b", "", line)
        out.append(line)
    return out


@pytest.mark.parametrize("name", ["django.de.po", "djangojs.po", "messages.ru.po"])
def test_po_keeps_every_byte_outside_the_msgstrs_it_writes(copier, tmp_path, name):
    """A catalogue comes back byte for byte where nothing is translated (polib's writer re-wrapped strings and
    comments), and with --overwrite only its msgstr lines and fuzzy flags differ."""
    source = (DATA / name).read_text(encoding="utf-8")
    if name == "django.de.po":  # (every entry has its translation: nothing to do)
        assert translate_file(copier, name, tmp_path) == source
    out = translate_file(copier, name, tmp_path, "--overwrite")
    assert out != source and _outside_msgstr(out) == _outside_msgstr(source)


def _outside_targets(text: str) -> str:
    """An XLIFF document without its targets (and the whitespace before each), state attributes and target
    languages: what a translation must keep byte for byte."""
    text = re.sub(r"\s*<(\w+:)?target\b[^>]*?(/>|>.*?</(\w+:)?target>)", "", text, flags=re.DOTALL)
    return re.sub(r'\s(state|trgLang|target-language)="[^"]*"', "", text)


@pytest.mark.parametrize("name", ["validators.en.xlf", "everything-core.xlf", "messages.xlf", "withCDataSections.xlf"])
def test_xliff_keeps_every_byte_outside_the_targets_it_writes(copier, tmp_path, name):
    """Targets are written into the document's own text (a new one after its source, indented as the source),
    never by re-serialising the tree (lxml rewrote &apos;, line breaks in attribute values, CDATA): with nothing
    to translate the file comes back byte for byte; with --overwrite only targets and state attributes differ."""
    source = (DATA / name).read_text(encoding="utf-8")
    if name in ("validators.en.xlf", "withCDataSections.xlf"):  # (every unit has a target)
        assert translate_file(copier, name, tmp_path) == source
    out = translate_file(copier, name, tmp_path, "--overwrite")
    assert out != source and _outside_targets(out) == _outside_targets(source)


def _markdown_structure(text: str) -> list:
    """markdown-it-py's token stream of a Markdown text apart from its words: every block and inline token's type,
    tag and markup, code spans and fences whole, link targets (references resolved), images; text, line breaks and
    a paragraph's line count left out."""
    from markdown_it import MarkdownIt

    out = []
    for tok in MarkdownIt("commonmark").enable("table").parse(text):
        for t in [tok] + list(tok.children or []):
            if t.type in ("text", "softbreak", "hardbreak", "inline"):
                continue
            keep = t.content if t.type in ("code_inline", "fence", "code_block", "html_inline", "html_block") else ""
            out.append((t.type, t.tag, t.markup, keep, t.attrs.get("href"), t.attrs.get("src")))
    return out


@pytest.mark.parametrize("name", ["hugo-imaging.md", "keyboard-shortcuts.md", "markdown-it-py.md"])
def test_markdown_structure_is_the_sources_apart_from_the_words(tmp_path, name):
    """Hugo's documentation page (code-toggle shortcodes holding TOML, an inline shortcode, a [!note] alert,
    collapsed references after other brackets), GitHub docs and markdown-it-py's README: markdown-it-py reads
    the output as the source, code spans, link targets and images included, apart from the words; the TOML inside
    shortcodes and the alert's marker line come back as written."""
    from helpers import copy_model, save_model, save_word_tokenizer

    source = (DATA / name).read_text(encoding="utf-8")
    plain = [r.extra["markup"].plain for r in files.read("markdown", name, source).segments]
    vocab = sorted({w for text in plain for w in re.findall(r"\w+|[^\w\s]+", text)})  # (the word tokenizer's)
    longest = max(len(re.findall(r"\w+|[^\w\s]+", text)) for text in plain) + 2
    model = save_model(tmp_path / "copier", copy_model(n_words=max(len(vocab), longest), max_len=2 * longest),
                       save_word_tokenizer(tmp_path / "tok", vocab + [f"x{i}" for i in range(longest - len(vocab))]))
    out = translate_file(model, name, tmp_path, "--split-sentences", "never")
    assert _markdown_structure(out) == _markdown_structure(source)
    if name == "hugo-imaging.md":
        for block in re.findall(r"\{\{< code-toggle file=hugo >\}\}\n.*?\{\{< /code-toggle >\}\}", source, re.DOTALL):
            assert block in out
        assert "\n> [!note]\n> " in out and "{{< new-in 0.153.5 />}}" in out


def test_a_code_span_inside_a_word_goes_back_inside_its_translation():
    """Hugo's "(`string`)": the code span sits inside the word "()"; it goes back inside that word's translation
    where the translation keeps the punctuation before it, else just before it (never into the next word)."""
    doc = files.read("markdown", "a.md", "Returns (`string`) the format.\n")
    m = doc.segments[0].extra["markup"]
    assert m.plain == "Returns () the format."
    aligned = [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert m.render("Gibt zurück () das Format.", aligned) == "Gibt zurück (`string`) das Format."
    assert m.render("Gibt zurück [] das Format.", aligned) == "Gibt zurück `string`[] das Format."
    assert doc.write(["Gibt zurück (`string`) das Format."]) == "Gibt zurück (`string`) das Format.\n"


def _icu_shape(message: str):
    """An ICU message's structure as pyicumessageformat reads it, apart from its words: each argument's name and
    type, each plural/select's case keys (with their bodies' shapes), `#`, and the inline elements (XLIFF's <x/>,
    numbered tags) in order."""
    from pyicumessageformat import Parser

    tags = re.findall(r"<[^>]*>", message)
    parsed = Parser({"allow_tags": False}).parse(re.sub(r"<[^>]*>", "", message))

    def shape(node):
        if isinstance(node, str):
            return None
        if isinstance(node, list):
            return [s for s in map(shape, node) if s is not None]
        return (node.get("name"), node.get("type"), node.get("hash", False),
                {k: shape(v) for k, v in (node.get("options") or {}).items()})

    return shape(parsed), tags


def test_icu_messages_keep_their_structure_and_their_cases_are_translated(tmp_path):
    """ICU MessageFormat (Angular's XLIFF example: plural and nested select, <x/> inside a case; react-i18next's
    ICU catalogue: `#`, numbered tags inside cases, a plural inside a tag; a lingui PO catalogue, whose msgids are
    ICU messages): every translated message parses as
    ICU with the same arguments, types, case keys, `#` and inline elements as its source; the case texts are what
    is translated (the model sees no ICU syntax)."""
    from helpers import copy_model, save_model, save_word_tokenizer

    for name, fmt in (("angular-messages.fr.xlf", "xliff"), ("react-icu.json", "json"), ("lingui-nextjs.en.po", "po")):
        source = (DATA / name).read_text(encoding="utf-8")
        doc = files.read(fmt, name, source, overwrite=True)
        texts = [r.text for r in doc.segments]
        assert texts and not any(re.search(r"\b(plural|select)\s*,", re.sub(r"<[^>]*>", "", t)) for t in texts)
        plain = [re.sub(r"<[^>]*>|\{[^{}]*\}", " ", t) for t in texts]
        vocab = sorted({w for t in plain for w in re.findall(r"\w+|[^\w\s]+", t)})
        longest = max(len(re.findall(r"\w+|[^\w\s]+", t)) for t in plain) + 2
        n = max(len(vocab), longest)
        (tmp_path / name).mkdir()
        model = save_model(tmp_path / name / "copier", copy_model(n_words=n, max_len=2 * longest),
                           save_word_tokenizer(tmp_path / name / "tok", vocab + [f"x{i}" for i in range(n - len(vocab))]))
        out = translate_file(model, name, tmp_path, "--overwrite")
        if fmt == "json":
            pairs = list(zip(json.loads(source).values(), json.loads(out).values()))
        elif fmt == "po":
            import polib

            pairs = [(e.msgid, e.msgstr) for e in polib.pofile(out) if e.msgid]
            if shutil.which("msgfmt"):
                (tmp_path / name / "out.po").write_text(out, encoding="utf-8")
                subprocess.run(["msgfmt", "--check", "--check-format", "-o", "/dev/null", tmp_path / name / "out.po"],
                               check=True)
        else:
            ns = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
            units = ET.fromstring(out.encode()).iter("{urn:oasis:names:tc:xliff:document:1.2}trans-unit")
            inner = lambda e: (e.text or "") + "".join(ET.tostring(c, encoding="unicode") for c in e)  # noqa: E731
            pairs = [(inner(u.find("x:source", ns)), inner(u.find("x:target", ns))) for u in units]
        icu = [(s, t) for s, t in pairs if re.search(r"\b(plural|select)\s*,", re.sub(r"<[^>]*>", "", s))]
        assert len(icu) >= (1 if fmt == "po" else 3)
        for s, t in icu:
            assert _icu_shape(t) == _icu_shape(s), (s, t)


def _copied(doc) -> list[str]:
    """What a model that copies its source word for word gives each segment, through the markup stage: the
    segment's plain text with its markup put back by the identity alignment."""
    from tfcli.formats.placeholders import pattern as placeholders

    outs = []
    for r in doc.segments:
        m = r.extra.get("markup")
        if not isinstance(m, markup.Markup):
            m = markup.READERS[m or "text"](r.text, placeholders(True), frozenset())
        words = m.plain.split()
        outs.append(m.render(m.plain, [(i, i) for i in range(len(words))], words))
    return outs


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.iterdir() if p.name != "README.md"
                                        and files.choose("auto", str(p)) in files.FILE_FORMATS
                                        and p.name != "translation.json"))  # (not JSON: a comment in it)
def test_a_file_copied_word_for_word_comes_back_byte_for_byte(name):
    """The round trip of every format on every real file: read, each segment "translated" by a copying model (its
    words, its markup put back), written. Markdown, HTML pages, JSON and subtitles come back byte for byte, CRLF
    too; PO and XLIFF byte for byte outside the msgstrs and targets they fill (their entries are all translated
    here)."""
    source = (DATA / name).read_text(encoding="utf-8")
    fmt = files.choose("auto", name)
    for text in (source, source.replace("\n", "\r\n")):
        doc = files.read(fmt, name, text.replace("\r\n", "\n"), overwrite=True)
        out = doc.write(_copied(doc))
        if "\r\n" in text:
            out = out.replace("\n", "\r\n")
        if fmt == "po":
            assert _outside_msgstr(out.replace("\r\n", "\n")) == _outside_msgstr(source)
        elif fmt == "xliff":
            assert _outside_targets(out.replace("\r\n", "\n")) == _outside_targets(source)
        else:
            assert out == text
