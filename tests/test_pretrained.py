"""Published OPUS-MT models imported exactly: `transformers.MarianMTModel` built from the real `config.json` of each
family in ../shared/models (random weights: the real ones cannot be downloaded here), saved with safetensors beside
the real tokenizer files; `tfcli import` then tfcli's search must give the token ids that transformers' `generate`
gives, greedy and beam 4 (length penalty 0), at batch 16 and 1, on Multi30k sentences."""

from __future__ import annotations

import json

import shutil
from pathlib import Path

import pytest
import torch

from tfcli.interop.hf_import import import_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT.parent / "shared" / "models"
CAP = 12  # output tokens; a random model rarely ends, so every hypothesis is cut here, as transformers cuts it
FAMILIES = {
    # name: (directory, layers kept of each stack (every layer is imported by the same rule), the target-language tag)
    "classic": ("opus-mt-en-mg", 2, None),
    "tc-big": ("opus-mt-tc-big-en-pt", 1, "por"),
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(transformers model, its MarianTokenizer, the imported checkpoint, the target-language tag, the sources)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sentencepiece")
    name, layers, tag = FAMILIES[request.param]
    real = MODELS / name
    data = ROOT.parent / "shared" / "data" / "multi30k" / "test2016.en"
    if not real.is_dir() or not data.is_file():
        pytest.skip(f"{real} or {data} not present")
    d = tmp_path_factory.mktemp(request.param) / "hf"
    d.mkdir()
    for f in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        shutil.copy(real / f, d / f)
    cfg = transformers.MarianConfig.from_pretrained(real)
    cfg.encoder_layers = cfg.decoder_layers = layers  # the real widths and vocabulary, fewer layers for the time
    torch.manual_seed(0)
    hf = transformers.MarianMTModel(cfg).eval()
    with torch.no_grad():  # weights larger than the init's, so that each sentence gets its own output
        for n, p in hf.named_parameters():
            if p.dim() == 2 and "embed_positions" not in n:  # (the sinusoidal table is computed, not learned)
                p.normal_(0, 0.1)
            elif n.endswith("bias"):
                p.normal_(0, 0.1)
        hf.final_logits_bias.normal_(0, 0.5)
    hf.save_pretrained(d)
    import_model(d, d.parent / "ckpt")
    assert json.loads((d.parent / "ckpt" / "config.json").read_text())["data"] == {"trained_on": "sentences"}
    tok = transformers.MarianTokenizer.from_pretrained(d)
    lines = data.read_text(encoding="utf-8").splitlines()[:16]
    return hf, tok, d.parent / "ckpt", tag, lines


def _theirs(hf, tok, lines, tag, beam, **rules):
    """transformers' outputs as token strings, the decoder start and </s> left out. With `rules`, <pad> is banned as
    tfcli bans it (the hub's Marian configs do so by bad_words_ids): a penalty below 1 favours the decoder's start,
    which is <pad>."""
    if rules:
        rules = dict(rules, bad_words_ids=[[hf.config.pad_token_id]])
    enc = tok([f">>{tag}<< {line}" if tag else line for line in lines], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**enc, num_beams=beam, max_new_tokens=CAP, length_penalty=0.0, early_stopping=True,
                          do_sample=False, forced_eos_token_id=None, **rules)
    ends = (hf.config.eos_token_id, hf.config.pad_token_id)
    return [tok.convert_ids_to_tokens([i for i in row.tolist()[1:] if i not in ends]) for row in out]


def test_imported_models_translate_as_transformers_generates(family):
    from tfcli.api import load

    hf, tok, ckpt, tag, lines = family
    ours = load(str(ckpt))
    opts = dict(len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True, **({"tgt_lang": tag} if tag else {}))
    for beam in (1, 4):
        theirs = _theirs(hf, tok, lines, tag, beam)
        assert len({tuple(t) for t in theirs}) > 8  # the sentences' outputs differ: the source matters
        assert [t.split() for t in ours.translate(lines, beam_size=beam, batch_size=16, **opts)] == theirs
        for line, want in zip(lines[:2], theirs):  # batch 1, against transformers' batch 1
            assert _theirs(hf, tok, [line], tag, beam)[0] == want
            assert ours.translate([line], beam_size=beam, batch_size=1, **opts)[0].split() == want


@pytest.mark.parametrize("rules", [dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=1),
                                   dict(repetition_penalty=1.5), dict(repetition_penalty=0.7, no_repeat_ngram_size=3)])
def test_repetition_rules_are_transformers(family, rules):
    """`--no-repeat-ngram-size` and `--repetition-penalty` as transformers' `generate` applies them: greedy on the
    logits, beam search on the log-probs it sums; at batch 16 and alone."""
    from tfcli.api import load

    hf, tok, ckpt, tag, lines = family
    ours = load(str(ckpt))
    opts = dict(len_penalty=0, max_len_a=0, max_len_b=CAP, raw=True, **({"tgt_lang": tag} if tag else {}))
    for beam in (1, 4):
        theirs = _theirs(hf, tok, lines, tag, beam, **rules)
        assert theirs != _theirs(hf, tok, lines, tag, beam)  # (the rule changes some outputs: it is tested)
        assert [t.split() for t in ours.translate(lines, beam_size=beam, batch_size=16, **opts, **rules)] == theirs
        assert ours.translate(lines[:1], beam_size=beam, batch_size=1, **opts, **rules)[0].split() == theirs[0]


def test_imported_tokenizers_cut_sources_as_marian_tokenizer(family):
    from tfcli import checkpoint, checkpoint_meta

    hf, tok, ckpt, tag, lines = family
    src = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "src")
    for line in lines + ["  a dog   runs  ", "ﬁne ＡＢＣ qué ™"]:
        want = tok.convert_ids_to_tokens(tok(line).input_ids[:-1])  # MarianTokenizer appends </s>; tfcli's batching does
        assert [src.id_to_token(i) for i in src.encode(line, add_special_tokens=False).ids] == want, line



@pytest.fixture(scope="module")
def ct2_export(family, tmp_path_factory):
    """(the CTranslate2 translator of the imported model, each source line as tfcli's pieces, with the tag first)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tfcli import checkpoint, checkpoint_meta
    from tfcli.interop.exporter import export

    _, _, ckpt, tag, lines = family
    out = tmp_path_factory.mktemp("ct2") / "ct2"
    export(ckpt, "ctranslate2", out)
    src = checkpoint.tokenizer(checkpoint_meta.read_meta(ckpt), "src")
    pieces = [([f">>{tag}<<"] if tag else []) + [src.id_to_token(i) for i in src.encode(line, add_special_tokens=False).ids]
              for line in lines]
    return ctranslate2.Translator(str(out)), pieces


def test_the_ctranslate2_export_of_an_imported_model_translates_as_transformers(family, ct2_export):
    hf, tok, _, tag, lines = family
    translator, pieces = ct2_export
    for beam in (1, 4):
        res = translator.translate_batch(pieces, beam_size=beam, length_penalty=0, max_decoding_length=CAP)
        assert [r.hypotheses[0] for r in res] == _theirs(hf, tok, lines, tag, beam)


def test_ctranslate2s_attention_is_the_one_tfcli_aligns_with(family, ct2_export):
    """CTranslate2's return_attention gives the cross-attention `tfcli translate --alignment` reads: the default
    alignment layer (the penultimate), every head averaged."""
    from tfcli import checkpoint
    from tfcli.generate.alignment import default_layer
    from tfcli.specials import BOS_ID, EOS_ID

    _, _, ckpt, _, _ = family
    translator, pieces = ct2_export
    model, meta = checkpoint.load(ckpt)
    src_tok, tgt_tok = checkpoint.tokenizer(meta, "src"), checkpoint.tokenizer(meta, "tgt")
    layer = default_layer(model.cfg.n_decoder_layers)
    res = translator.translate_batch(pieces[:4], beam_size=1, max_decoding_length=CAP, return_attention=True)
    for p, r in zip(pieces, res):
        src = torch.tensor([[src_tok.token_to_id(t) for t in p] + [EOS_ID]])
        tgt = torch.tensor([[BOS_ID] + [tgt_tok.token_to_id(t) for t in r.hypotheses[0]]])
        attn = {"encoder": [], "self": [], "cross": []}
        with torch.no_grad():
            memory, mask = model.encode(src, attn_out=attn)
            model.decode(tgt[:, :-1], memory, mask, attn_out=attn)
        ours = attn["cross"][layer - 1].float().mean(1)[0, :, :-1]  # (CTranslate2 leaves out the source's </s>)
        theirs = torch.tensor(r.attention[0])
        assert theirs.shape == ours.shape
        assert torch.allclose(theirs, ours, atol=1e-4)


def test_the_transformers_export_of_an_imported_model_generates_as_the_original(family, tmp_path):
    """Exported back out (tfcli's vocabulary order, its own tokenizer.json), the model generates what the
    original transformers model does."""
    transformers = pytest.importorskip("transformers")
    from tfcli import checkpoint, checkpoint_meta
    from tfcli.interop.exporter import export
    from tfcli.specials import EOS_ID, PAD_ID

    hf, tok, ckpt, tag, lines = family
    export(ckpt, "hf", tmp_path / "hf")
    back = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    meta = checkpoint_meta.read_meta(ckpt)
    src, tgt = checkpoint.tokenizer(meta, "src"), checkpoint.tokenizer(meta, "tgt")
    lead = [src.token_to_id(f">>{tag}<<")] if tag else []
    ids = [lead + src.encode(line, add_special_tokens=False).ids + [EOS_ID] for line in lines[:4]]
    width = max(map(len, ids))
    batch = torch.tensor([row + [PAD_ID] * (width - len(row)) for row in ids])
    with torch.no_grad():  # beam 4 (greedy: the tfcli and CTranslate2 tests)
        out = back.generate(input_ids=batch, attention_mask=(batch != PAD_ID).long(), num_beams=4, max_new_tokens=CAP,
                            length_penalty=0.0, early_stopping=True, do_sample=False)
    ours = [[tgt.id_to_token(i) for i in row.tolist()[1:] if i not in (EOS_ID, PAD_ID)] for row in out]
    assert ours == _theirs(hf, tok, lines[:4], tag, 4)
