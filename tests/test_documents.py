"""Documents: a line of many sentences is translated sentence by sentence (`--split-sentences`), the translations
joined on its one output line, and no line is ever cut (a sentence past the model's max_len is translated in
windows). Checked on a hand-built copier (its output is known: the input's words) and on random translators (any
output, but a sentence's must not depend on what it is translated beside)."""

from __future__ import annotations

import json
import random
import shutil

import pytest
import torch

import tfcli
from helpers import WORDS, holds, save_copier, save_model, save_word_tokenizer, train_tiny_checkpoint
from tfcli.generate.config import TranslateConfig
from tfcli.generate.translate import translate
from tfcli.model.config import preset
from tfcli.model.transformer import build_model

VOCAB = WORDS + ["."]  # (the word tokenizer splits the stop off each sentence)


@pytest.fixture(scope="module")
def copier(tmp_path_factory):
    return save_copier(tmp_path_factory.mktemp("copier"), VOCAB)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("random")
    torch.manual_seed(7)
    v = 4 + len(VOCAB)
    model = build_model(preset("toy", src_vocab_size=v, tgt_vocab_size=v, d_model=64, d_ff=128, max_len=64)).eval()
    return save_model(d / "ckpt", model, save_word_tokenizer(d / "tok", VOCAB))


SHORT = dict(max_len_a=1.0, max_len_b=3)  # (a random model's outputs run to the length limit)


def sentence(rng: random.Random, words: int | None = None) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words or rng.randint(2, 6))) + "."


def paragraphs(seed: int, sizes: list[int]) -> list[list[str]]:
    """A paragraph of each size (sentences), each sentence random."""
    rng = random.Random(seed)
    return [[sentence(rng) for _ in range(n)] for n in sizes]


def test_a_paragraph_is_its_sentences_translated_one_by_one_and_joined(random_model):
    """Split, a paragraph's translation is exactly its sentences' own translations joined by a space (each sentence
    alone in a batch of its own), whatever the batch size or the order of the paragraphs; one line out for each
    line in, from 1 to 20 sentences."""
    t = tfcli.load(random_model)
    paras = paragraphs(1, [1, 3, 20, 7, 1, 12, 2, 16])
    texts = [" ".join(p) for p in paras]
    unique = sorted({s for p in paras for s in p})
    alone = dict(zip(unique, t.translate(unique, batch_size=1, **SHORT)))
    want = [" ".join(alone[s] for s in p) for p in paras]
    for options in (dict(batch_size=7), dict(batch_size=1)):
        assert t.translate(texts, split_sentences="always", **options, **SHORT) == want, options
    assert t.translate(texts[::-1], split_sentences="always", **SHORT)[::-1] == want
    whole = t.translate(texts, split_sentences="never", **SHORT)
    assert len(whole) == len(texts) and any(w != s for w, s in zip(whole, want))  # (the model sees other inputs)
    one = [i for i, p in enumerate(paras) if len(p) == 1]
    assert one and all(whole[i] == want[i] for i in one)  # a one-sentence line is itself, split or not


def test_a_trained_models_paragraph_is_its_sentences_translated_one_by_one_and_joined(tmp_path_factory):
    """The same for a model trained on sentences (copying, each ending with a stop), whose hypotheses end at </s>
    at different steps beside each other rather than all at the length limit: a paragraph of 1-20 sentences, split
    (by auto too: two sentences are longer than any training source), is its sentences translated alone, joined."""
    run = train_tiny_checkpoint(tmp_path_factory.mktemp("trained"), steps=150, prepared=dict(stop=True, n_words=12))
    t = tfcli.load(run)
    rng = random.Random(4)
    words = [f"w{i}" for i in range(12)]
    paras = [[" ".join(rng.choices(words, k=rng.randint(5, 8))) + " ." for _ in range(n)] for n in (1, 5, 20, 2, 11)]
    texts = [" ".join(p) for p in paras]
    unique = sorted({s for p in paras for s in p})
    alone = dict(zip(unique, t.translate(unique, batch_size=1)))
    want = [" ".join(alone[s] for s in p) for p in paras]
    assert t.translate(texts, split_sentences="always", batch_size=8) == want
    assert t.translate(texts[::-1], batch_size=3)[::-1] == want


def test_auto_splits_only_lines_longer_than_the_model_was_trained_on(random_model, copier, tmp_path):
    """auto: a line longer than 99% of the training sources (recorded in the checkpoint by training) is split, a
    shorter one is not; a checkpoint without the record splits only what its max_len would cut."""
    recorded = shutil.copytree(random_model, tmp_path / "ckpt")
    meta = json.loads((recorded / "config.json").read_text())
    meta["data"] = {"src_len": {"p99": 9, "max": 12}}
    (recorded / "config.json").write_text(json.dumps(meta))
    t = tfcli.load(recorded)
    short, long = "cat dog. egg.", "cat dog egg. fish goat hat. ice jam."  # 6 and 11 tokens with </s>
    assert t.translate([short, long], **SHORT) == [t.translate([short], split_sentences="never", **SHORT)[0],
                                                   t.translate([long], split_sentences="always", **SHORT)[0]]
    assert t.translate([long], split_sentences="never", **SHORT) != t.translate([long], **SHORT)
    c = tfcli.load(copier)  # (no record: split past its max_len of 32)
    rng = random.Random(3)
    para = " ".join(sentence(rng, 5) for _ in range(10))  # 60 tokens
    assert c.translate([para]) == [para.replace(".", " .")]
    assert c.translate([para], split_sentences="never") == [para.replace(".", " .")]  # (windows)


def test_no_line_is_cut_a_5000_token_line_translates_whole(copier, tmp_path, capsys):
    """A sentence longer than the model's max_len (the copier's 32) is translated in windows of up to 31 tokens, with a
    warning naming the file and line, whether lines are split or not: the copier gives back every word of a
    5,000-word line, and of a paragraph of such sentences with the others around them."""
    rng = random.Random(5)
    long = " ".join(rng.choice(WORDS) for _ in range(5000))
    lines = [long, sentence(rng) + " " + long + ". " + sentence(rng), sentence(rng)]
    want = [line.replace(".", " .") for line in lines]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.txt"
    cfg = TranslateConfig(device="cpu", beam_size=1, max_len_a=1.0, max_len_b=2)
    assert translate(str(copier), [str(src)], str(out), cfg) == 3
    assert out.read_text().splitlines() == want
    err = capsys.readouterr().err
    assert f"{src}:1: a sentence of 5000 tokens" in err and f"{src}:2: " in err and "windows of up to 31 tokens" in err
    c = tfcli.load(copier)
    for split in ("never", "always"):
        assert c.translate(lines, split_sentences=split, beam_size=1, max_len_a=1.0, max_len_b=2) == want, split


def test_windows_of_a_long_sentence_are_cut_between_words_after_a_clause_where_one_is_near():
    """A subword vocabulary's long sentence: each window at most `room` tokens, together the whole sentence, each
    starting a word (the windows' texts joined by spaces are the sentence), and where a comma lies in a window's
    second half, the window ends after it."""
    from tfcli.data.tokenizer import clause_end_ids, decode_batch, encode_batch, train_tokenizer, word_start_ids
    from tfcli.generate.translate import _windows

    rng = random.Random(6)
    tok = train_tokenizer("bpe", [" ".join(rng.sample(WORDS, 20)) + "," for _ in range(50)], vocab_size=80)
    starts, ends = word_start_ids(tok), clause_end_ids(tok)
    assert starts and ends and not starts & ends
    text = ", ".join(" ".join(rng.choices(WORDS, k=3)) for _ in range(100))  # a clause of three words
    ids = encode_batch(tok, [text])[0]
    assert any(i not in starts | ends for i in ids)  # (words of several pieces)
    for room in (8, 16, 31):  # (a word is 1-3 pieces: one starts in every window's second half)
        ws = _windows(ids, room, starts, ends)
        assert [t for w in ws for t in w] == ids and all(0 < len(w) <= room for w in ws)
        assert " ".join(decode_batch(tok, ws)) == text
        if room == 31:  # (a clause is at most 3 x 3 pieces and a comma: one ends in every window's second half)
            assert all(w[-1] in ends for w in ws[:-1])
    assert _windows(ids[:10], 10, starts, ends) == [ids[:10]]
    assert _windows([5] * 7, 3, set(), ends) == [[5] * 3] * 2 + [[5]]  # (no word start: cut at room)
    assert _windows([5, 6, 5, 6, 5], 2, None, {6}) == [[5, 6], [5, 6], [5]]  # (word-level: any token)


def test_scores_alignments_and_prefixes_of_a_split_line(copier):
    """The joined hypothesis: its score the sum of its sentences', the token scores one after the other, each
    n-best rank the sentences' same rank joined; word alignments offset into the whole line (the copier aligns
    each word with itself); a prefix starts the first sentence only."""
    c = tfcli.load(copier)
    sentences = ["cat dog egg.", "fish goat.", "hat ice jam kite."]
    line = " ".join(sentences)
    parts = [c.translate_nbest([s], n=2, beam_size=2, scores=True, alignment=True)[0] for s in sentences]
    joined = c.translate_nbest([line], n=2, beam_size=2, scores=True, alignment=True, split_sentences="always")[0]
    for rank in range(2):
        got, each = joined[rank], [p[rank] for p in parts]
        assert got.text == " ".join(e.text for e in each)
        assert got.score == pytest.approx(sum(e.score for e in each), abs=1e-6)
        assert got.token_scores == [x for e in each for x in e.token_scores]
    words = line.replace(".", " .").split()
    assert joined[0].alignment == [(i, i) for i in range(len(words))]
    prefixed = c.translate([line], prefixes=["cat dog egg fish"], split_sentences="always", beam_size=1)[0]
    assert prefixed == "cat dog egg fish " + " ".join(c.translate(sentences[1:], beam_size=1))
    with pytest.raises(Exception, match="split_sentences"):
        c.translate([line], split_sentences="sometimes")


def test_a_line_with_constraints_is_translated_whole_unless_past_max_len(copier):
    """A phrase to hold may belong to any sentence of its line, so a line with constraints that fits the model is
    not split: the same output whatever `split_sentences` says, the phrase in it. Past max_len the line is split
    after all (never cut), the constraints going with its first source, and every word still comes back."""
    c = tfcli.load(copier)
    line, phrase = "cat dog egg. fish hat. ice jam.", "goat"
    runs = [c.translate([line], constraints=[[phrase]], split_sentences=s, beam_size=4)[0]
            for s in ("never", "auto", "always")]
    assert runs[0] == runs[1] == runs[2] and holds(runs[0], phrase)
    assert [w for w in runs[0].split() if w != phrase] == line.replace(".", " .").split()
    rng = random.Random(8)
    others = [w for w in WORDS if w != phrase]
    long = " ".join(" ".join(rng.choices(others, k=5)) + "." for _ in range(8))  # 48 tokens: past max_len (32)
    got = c.translate([long], constraints=[[phrase]], beam_size=4)[0]
    assert holds(got, phrase) and [w for w in got.split() if w != phrase] == long.replace(".", " .").split()


def test_sentence_translations_are_joined_by_a_space_except_between_chinese_or_japanese_ones():
    from tfcli.generate.translate import join_sentences

    assert join_sentences(["A dog runs.", "", "It is fast."]) == "A dog runs. It is fast."
    assert join_sentences(["我很好。", "你呢？", "これはペンです。"]) == "我很好。你呢？これはペンです。"
    assert join_sentences(["他说：", "OK."]) == "他说： OK." and join_sentences(["Fin.", "完了。"]) == "Fin. 完了。"
    assert join_sentences(["안녕하세요.", "반갑습니다."]) == "안녕하세요. 반갑습니다."  # (Korean puts spaces)
    assert join_sentences([]) == "" and join_sentences(["", ""]) == ""


def test_alignments_of_chinese_sentences_joined_without_a_space(tmp_path):
    """Where two sentences' translations are joined without a space, the seam's two words are one word of the
    output line, and the alignments of the words after it count so (a copier of CJK "words": each aligned with
    itself)."""
    c = tfcli.load(save_copier(tmp_path, ["我", "很好", "。", "你", "呢", "？", *WORDS]))
    got = c.translate_nbest(["我 很好 。 你 呢 ？"], alignment=True, split_sentences="always", beam_size=1)[0][0]
    assert got.text == "我 很好 。你 呢 ？"  # (the copier's word-level detokeniser spaces its tokens)
    assert got.alignment == [(0, 0), (1, 1), (2, 2), (3, 2), (4, 3), (5, 4)]


def test_sampling_a_split_line_does_not_depend_on_its_company(random_model):
    """Sampled translations: each sentence of a line draws from numbers of its own (the line's index and the
    sentence's place in it), so the same line at the same index samples the same at any batch size."""
    t = tfcli.load(random_model)
    texts = [" ".join(p) for p in paragraphs(2, [1, 4, 6, 2, 5, 3, 6, 1, 2, 4, 5, 3])]
    runs = [t.translate(texts, sampling=True, seed=4, split_sentences="always", batch_size=b, **SHORT)
            for b in (1, 5, 64)]
    assert runs[0] == runs[1] == runs[2]


def test_the_splitter_finds_sentences_in_german_english_and_french():
    from tfcli.data.sentences import splitter

    assert splitter("de")("Das ist z.B. ein Test. Dr. Müller kam um 3 Uhr. Dann ging er.") == [
        "Das ist z.B. ein Test.", "Dr. Müller kam um 3 Uhr.", "Dann ging er."]
    assert splitter("en")("Mr. Smith paid $3.50. He left!  Then? Nothing") == [
        "Mr. Smith paid $3.50.", "He left!", "Then?", "Nothing"]
    assert splitter("fr")("Il pleut. Elle rit ! Il a dit « Bonjour. » Puis il est parti.") == [
        "Il pleut.", "Elle rit !", "Il a dit « Bonjour. »", "Puis il est parti."]
    assert splitter(None)("One. Two.") == ["One.", "Two."] and splitter("fra_Latn")("Oui. Non.") == ["Oui.", "Non."]
    # a language's rules whatever code names it (NLLB's, ISO 639-2/3's): English rules would split these
    french, german = "Il a vu p. ex. trois chats. Puis rien.", "Die Str. ist lang. Ende."
    assert splitter("en")(french) != splitter("fr")(french) and splitter("en")(german) != splitter("de")(german)
    for code in ("fra_Latn", "fra", "fre", "fr-CA"):
        assert splitter(code)(french) == splitter("fr")(french) == ["Il a vu p. ex. trois chats.", "Puis rien."]
    for code in ("deu_Latn", "deu", "ger", "de_AT"):
        assert splitter(code)(german) == splitter("de")(german) == ["Die Str. ist lang.", "Ende."]
    assert splitter("en")("   ") == [""]


def test_each_text_may_name_its_source_language(random_model, tmp_path):
    """src_lang one a text (JSONL's "src_lang", the API's list): each line split by its own language's rules, beside
    lines of other languages; a line without one takes --src-lang's."""
    t = tfcli.load(random_model)
    line = "Die Str. ist lang. Ende."  # German rules know "Str.", English ones end a sentence there
    alone = [" ".join(t.translate(parts, batch_size=1, **SHORT))
             for parts in (["Die Str. ist lang.", "Ende."], ["Die Str.", "ist lang.", "Ende."])]
    got = t.translate([line, line, line], src_lang=["de", "en", "de"], split_sentences="always", **SHORT)
    assert got == [alone[0], alone[1], alone[0]] and alone[0] != alone[1]
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(row) for row in ({"text": line}, {"text": line, "src_lang": "en"})) + "\n")
    cfg = TranslateConfig(device="cpu", split_sentences="always", input_format="jsonl", src_lang="deu_Latn", **SHORT)
    translate(str(random_model), [str(src)], str(tmp_path / "out.txt"), cfg)
    assert (tmp_path / "out.txt").read_text().splitlines() == alone


def test_language_codes_as_two_letter_codes():
    from tfcli.data.languages import two_letter_code

    assert [two_letter_code(c) for c in ("fr", "pt_BR", "zho_Hans", "arb_Arab", "swh_Latn", "nob", "EN", "yue_Hant",
                                         "xx")] == ["fr", "pt", "zh", "ar", "sw", "nb", "en", "yue", "xx"]


def test_the_source_language_comes_from_the_training_data_or_src_lang():
    """prepare records the language its source file or field names (train.de, train.de.gz, translation.fr); none
    for several directions or an unnamed file; translate's splitter takes --src-lang, else that one."""
    from tfcli.data.languages import named_source_language as named

    assert [named("d/train.de", None, []), named("d/train.de.gz", None, []), named(None, "translation.fr", []),
            named("train.txt", None, []), named("corpus", None, []), named("train.de", None, ["de-en"])] == [
        "de", "de", "fr", None, None, None]


def test_resumed_parts_hold_whole_paragraphs(random_model, tmp_path):
    """With --resume the file is translated in parts of --part-lines lines: a paragraph is one line, so it is
    never split across parts, and the file is what one uninterrupted run writes."""
    texts = [" ".join(p) for p in paragraphs(3, [4, 1, 6, 2, 5])]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n")
    one, parts = tmp_path / "one.txt", tmp_path / "parts.txt"
    cfg = TranslateConfig(device="cpu", split_sentences="always", part_lines=2, **SHORT)
    translate(str(random_model), [str(src)], str(one), cfg)
    translate(str(random_model), [str(src)], str(parts), cfg, resume=True)
    assert parts.read_text() == one.read_text() and len(one.read_text().splitlines()) == 5
