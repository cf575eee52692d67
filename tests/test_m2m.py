"""M2M-100 and NLLB-200 (`model_type: m2m_100`) imported exactly: a transformers M2M100ForConditionalGeneration of
the published models' widths (d_model 1024, 16 heads, FFN 4096, ReLU, scaled embeddings, pre-norm with the stacks'
final LayerNorms, fairseq's positions; one layer a stack for the test's time; random weights), with each family's
tokenizer files made from a SentencePiece BPE model trained here on Multi30k (the published ones cannot be
downloaded here): M2M-100's sentencepiece.bpe.model + vocab.json, NLLB's tokenizer.json. `tfcli import` then
`translate --src-lang --tgt-lang` must give the ids of transformers' `generate` with the target language forced
first, greedy and beam 4 (length penalty 0), at batch 16 and 1; the CTranslate2 export the same again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers import m2m_tokenizer_files, spm_bpe
from tfcli.interop.hf_import import import_model

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
CAP = 12  # output tokens, the forced language token among them (transformers counts it in max_new_tokens too)
# family: (source language, target language) as the family's tokenizer names them
FAMILIES = {"m2m100": ("en", "fr"), "nllb": ("eng_Latn", "fra_Latn")}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(transformers model, its tokenizer, the imported checkpoint, (source, target language), the sources)."""
    transformers = pytest.importorskip("transformers")
    if not DATA.is_dir():
        pytest.skip(f"{DATA} not present")
    base = tmp_path_factory.mktemp(request.param)
    d = base / "hf"
    d.mkdir()
    tok = m2m_tokenizer_files(request.param, d, spm_bpe(base, DATA))
    # (M2M100Tokenizer's len() leaves out the language tokens and madeup words numbered after vocab.json)
    V = tok.encoder_size + len(tok.lang_code_to_id) + tok.num_madeup_words if request.param == "m2m100" else len(tok)
    cfg = transformers.M2M100Config(
        vocab_size=V, d_model=1024, encoder_layers=1, decoder_layers=1, encoder_attention_heads=16,
        decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, activation_function="relu",
        scale_embedding=True, max_position_embeddings=1024, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2,
    )
    torch.manual_seed(0)
    hf = transformers.M2M100ForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # weights larger than the init's, so that each sentence gets its own output (the
        for n, p in hf.named_parameters():  # embeddings small: tied and scaled, they would have it repeat its input)
            if p.dim() == 2 or n.endswith("bias"):
                p.normal_(0, 0.02 if n == "model.shared.weight" else 0.1)
    hf.save_pretrained(d)
    import_model(d, base / "ckpt")
    lines = (DATA / "test2016.en").read_text(encoding="utf-8").splitlines()[:16]
    return hf, tok, base / "ckpt", FAMILIES[request.param], lines


def _source_ids(tok, lines, src):
    tok.src_lang = src
    return tok(lines, return_tensors="pt", padding=True)


def _theirs(hf, tok, lines, langs, beam):
    """transformers' outputs as token strings, the decoder start, the forced language token and </s> left out."""
    src, tgt = langs
    enc = _source_ids(tok, lines, src)
    with torch.no_grad():
        out = hf.generate(**enc, num_beams=beam, max_new_tokens=CAP, length_penalty=0.0, early_stopping=True,
                          do_sample=False, forced_bos_token_id=tok.convert_tokens_to_ids(_token(tok, tgt)))
    assert (out[:, 1] == tok.convert_tokens_to_ids(_token(tok, tgt))).all()
    ends = (hf.config.eos_token_id, hf.config.pad_token_id)
    return [tok.convert_ids_to_tokens([i for i in row.tolist()[2:] if i not in ends]) for row in out]


def _token(tok, lang: str) -> str:
    return f"__{lang}__" if isinstance(tok, __import__("transformers").M2M100Tokenizer) else lang


def test_imported_m2m_models_translate_as_transformers_generates(family):
    from tfcli.api import load

    hf, tok, ckpt, (src, tgt), lines = family
    ours = load(str(ckpt))
    opts = dict(len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True, src_lang=src, tgt_lang=tgt)
    for beam in (1, 4):
        theirs = _theirs(hf, tok, lines, (src, tgt), beam)
        assert len({tuple(t) for t in theirs}) > 8  # the sentences' outputs differ: the source matters
        assert [t.split() for t in ours.translate(lines, beam_size=beam, batch_size=16, **opts)] == theirs
        for line, want in zip(lines[:2], theirs):  # batch 1, against transformers' batch 1
            assert _theirs(hf, tok, [line], (src, tgt), beam)[0] == want
            assert ours.translate([line], beam_size=beam, batch_size=1, **opts)[0].split() == want


def test_imported_m2m_tokenizers_cut_sources_as_transformers(family):
    """The source ids: the source language's token, the pieces, </s>, as the family's tokenizer makes them."""
    from tfcli import checkpoint, checkpoint_meta

    hf, tok, ckpt, (src, _), lines = family
    ours = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "src")
    for line in lines + ["  a dog   runs  ", "ﬁne ＡＢＣ qué ™"]:
        want = tok.convert_ids_to_tokens(_source_ids(tok, [line], src).input_ids[0].tolist())
        assert want[0] == _token(tok, src) and want[-1] == "</s>"
        assert [ours.id_to_token(i) for i in ours.encode(line, add_special_tokens=False).ids] == want[1:-1], line


def test_a_language_the_model_lacks_is_refused_by_name(family):
    from tfcli.api import load
    from tfcli.errors import ConfigError

    _, _, ckpt, (src, tgt), lines = family
    ours = load(str(ckpt))
    with pytest.raises(ConfigError, match="no target language 'xx'"):
        ours.translate(lines[:1], src_lang=src, tgt_lang="xx")
    with pytest.raises(ConfigError, match="needs its source language"):
        ours.translate(lines[:1], tgt_lang=tgt)


def test_the_ctranslate2_export_of_an_imported_m2m_model_translates_as_transformers(family, tmp_path):
    """CTranslate2, given the source language's token first and the target's as the target prefix (as its own
    M2M-100 converter's users do), gives transformers' outputs."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tfcli import checkpoint, checkpoint_meta
    from tfcli.interop.exporter import export

    hf, tok, ckpt, (src, tgt), lines = family
    export(ckpt, "ctranslate2", tmp_path / "ct2")
    ours = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "src")
    pieces = [[_token(tok, src)] + [ours.id_to_token(i) for i in ours.encode(line, add_special_tokens=False).ids]
              for line in lines]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"))
    for beam in (1, 4):
        res = translator.translate_batch(pieces, target_prefix=[[_token(tok, tgt)]] * len(pieces), beam_size=beam,
                                         length_penalty=0, max_decoding_length=CAP)
        assert [r.hypotheses[0][1:] for r in res] == _theirs(hf, tok, lines, (src, tgt), beam)


def test_the_command_line_translates_an_imported_m2m_model_with_its_languages(family, tmp_path):
    """`tfcli translate -m IMPORTED --src-lang --tgt-lang`: the API's translations, one line each; a language the
    model lacks is one line and status 1, nothing written."""
    from typer.testing import CliRunner

    from tfcli.api import load
    from tfcli.cli import app

    _, _, ckpt, (src, tgt), lines = family
    (tmp_path / "in.txt").write_text("\n".join(lines[:6]) + "\n", encoding="utf-8")
    base = ["translate", "-m", str(ckpt), str(tmp_path / "in.txt"), "--src-lang", src, "--beam-size", "4",
            "--alpha", "0", "--max-len-a", "0", "--max-len-b", str(CAP), "--raw"]
    done = CliRunner().invoke(app, [*base, "--tgt-lang", tgt, "-o", str(tmp_path / "out.txt")])
    assert done.exit_code == 0, done.output
    want = load(str(ckpt)).translate(lines[:6], beam_size=4, len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True,
                                     src_lang=src, tgt_lang=tgt)
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == want
    bad = CliRunner().invoke(app, [*base, "--tgt-lang", "xx", "-o", str(tmp_path / "bad.txt")])
    assert bad.exit_code == 1 and "no target language 'xx'" in bad.output and not (tmp_path / "bad.txt").exists()
    # JSONL: each line its own target language, and some their own source language
    other = {"fr": "de", "fra_Latn": "deu_Latn"}[tgt]
    langs, srcs = [tgt, other, tgt, other, other, tgt], [src, src, other, src, other, src]
    rows = [json.dumps({"text": t, "tgt_lang": lang} | ({"src_lang": s} if s != src else {}))
            for t, lang, s in zip(lines[:6], langs, srcs)]
    (tmp_path / "in.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    jsonl = [*base[:3], str(tmp_path / "in.jsonl"), *base[4:], "--input-format", "jsonl", "-o", str(tmp_path / "j.txt")]
    assert CliRunner().invoke(app, jsonl).exit_code == 0
    ours = load(str(ckpt))
    want = ours.translate(lines[:6], beam_size=4, len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True, src_lang=srcs,
                          tgt_lang=langs)
    assert (tmp_path / "j.txt").read_text(encoding="utf-8").splitlines() == want
    each = ours.translate(lines[:6], beam_size=4, len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True, src_lang=srcs,
                          tgt_lang=langs, batch_size=1)
    assert want == each  # (a line's languages are its own beside lines of others)
    plain = ours.translate(lines[1:3], beam_size=4, len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True, src_lang=src,
                           tgt_lang=tgt)
    assert want[1] != plain[0] and want[2] != plain[1]  # (another target language; another source token)
    # eval --translate takes the languages too
    (tmp_path / "ref.txt").write_text("\n".join(lines[:6]) + "\n", encoding="utf-8")
    scored = CliRunner().invoke(app, ["eval", "-m", str(ckpt), "--translate", str(tmp_path / "in.txt"), "-r",
                                      str(tmp_path / "ref.txt"), "--src-lang", src, "--tgt-lang", tgt, "--greedy",
                                      "--max-len-a", "0", "--max-len-b", str(CAP)])
    assert scored.exit_code == 0 and "BLEU" in scored.output, scored.output


def test_the_transformers_export_of_an_imported_m2m_model_is_the_original(family, tmp_path):
    """Exported back out, the model is M2M100 in the original's vocabulary layout (fairseq's <s>, <pad>, </s>,
    <unk> at 0-3, the decoder starting from </s>): the same weights, and its tokenizer.json gives the original's
    ids; it generates what the original does."""
    transformers = pytest.importorskip("transformers")
    from tfcli.interop.exporter import export

    hf, tok, ckpt, (src, tgt), lines = family
    export(ckpt, "hf", tmp_path / "hf")
    back = transformers.M2M100ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    assert back.config.decoder_start_token_id == 2 and back.config.pad_token_id == 1
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(ours) == set(theirs) and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    exported = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "hf" / "tokenizer.json"))
    for line in lines[:4]:
        want = _source_ids(tok, [line], src).input_ids[0].tolist()
        lang = exported.convert_tokens_to_ids(_token(tok, src))
        assert [lang, *exported(line).input_ids] == want  # (its post-processor appends </s>, as tfcli does)
    enc = _source_ids(tok, lines[:4], src)
    with torch.no_grad():
        out = back.generate(**enc, num_beams=4, max_new_tokens=CAP, length_penalty=0.0, early_stopping=True,
                            do_sample=False, forced_bos_token_id=tok.convert_tokens_to_ids(_token(tok, tgt)))
    ends = (2, 1)
    assert [tok.convert_ids_to_tokens([i for i in r.tolist()[2:] if i not in ends]) for r in out] == \
        _theirs(hf, tok, lines[:4], (src, tgt), 4)


def test_constraints_follow_the_forced_language_token(family):
    """Terminology constraints on an imported M2M model: its target language's token first (forced, left out),
    then every phrase in the output as whole words (SentencePiece pieces: none continues a phrase's last word)."""
    from tfcli.api import load

    _, _, ckpt, (src, tgt), lines = family
    ours = load(str(ckpt))
    cons = [["dog"], ["green shirt", "two"], [], ["street"]]
    got = ours.translate(lines[:4], src_lang=src, tgt_lang=tgt, constraints=cons, beam_size=4, max_len_b=CAP)
    for out, phrases in zip(got, cons):
        words = " ".join(w.strip(".,!?;:") for w in out.split())
        assert all(f" {p} " in f" {words} " for p in phrases), (out, phrases)
    plain = ours.translate(lines[2:3], src_lang=src, tgt_lang=tgt, beam_size=4, max_len_b=CAP)
    assert got[2] == plain[0]


def test_attention_pictures_of_an_imported_m2m_model_see_its_language_tokens(family):
    """`tfcli attention --src-lang --tgt-lang` on an imported M2M-100/NLLB model: the source starts with the source
    language's token, the target with the decoder start and the target language's token, then translate's greedy
    output (up to the shorter length limit); without --src-lang it is one line naming the flag."""
    from tfcli import checkpoint
    from tfcli.api import load
    from tfcli.errors import TfcliError
    from tfcli.viz.attention import collect

    _, tok, ckpt, (src, tgt), lines = family
    model, meta = checkpoint.load(ckpt, torch.device("cpu"))
    samples = collect(model, meta, lines[:2], tgt_lang=tgt, src_lang=src)
    want = load(str(ckpt)).translate(lines[:2], beam_size=1, raw=True, src_lang=src, tgt_lang=tgt)
    for s, w in zip(samples, want):
        assert s.tokens["src"][0] == _token(tok, src) and s.tokens["tgt"][1] == _token(tok, tgt)
        got = s.tokens["tgt"][2:]  # (the random model never ends: both stop at their length limits)
        assert got and got == w.split()[: len(got)]
    given = collect(model, meta, lines[:1], targets=["a b"], tgt_lang=tgt, src_lang=src)[0]
    assert given.tokens["tgt"][1] == _token(tok, tgt)
    with pytest.raises(TfcliError, match="--src-lang"):
        collect(model, meta, lines[:1], tgt_lang=tgt)


def test_auto_splits_an_imported_models_lines_of_several_sentences(family):
    """An imported model is recorded as trained on sentences: auto translates a line of three sentences as the three
    alone, joined (never: as one source, another output), and a line of one sentence as it is."""
    from tfcli.api import load

    _, _, ckpt, (src, tgt), lines = family
    assert json.loads((ckpt / "config.json").read_text())["data"] == {"trained_on": "sentences"}
    ours = load(str(ckpt))
    opts = dict(beam_size=1, max_len_a=0, max_len_b=CAP, raw=True, src_lang=src, tgt_lang=tgt)
    three = [line for line in lines if line.endswith(".")][:3]
    alone = ours.translate(three, **opts)
    assert ours.translate([" ".join(three), lines[5]], **opts) == [
        " ".join(alone), ours.translate([lines[5]], split_sentences="never", **opts)[0]]
    assert ours.translate([" ".join(three)], split_sentences="never", **opts) != [" ".join(alone)]

