"""Pictures: attention weights straight from the model (distributions, causal, no weight on padding, batching changes
nothing), valid PNGs, a self-contained HTML page, and training curves from metrics logs (errors name file:line)."""

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from helpers import train_tiny_checkpoint, word_tokenizer
from tfcli import checkpoint
from tfcli.cli import app
from tfcli.config import to_dict
from tfcli.data.batching import pad, source_ids
from tfcli.errors import TfcliError
from tfcli.model.config import preset
from tfcli.specials import BOS_ID
from tfcli.model.transformer import build_model
from tfcli.viz.attention import (
    AttentionSample,
    collect,
    lm_attention,
    render_html,
    render_png,
    seq2seq_attention,
    token_labels,
    write_attention,
)
from tfcli.viz.plot import load_runs, panels_with_data, plot_runs, print_summary, read_metrics, sparkline

WORDS = "show me the money please now give take red blue green cat dog".split()
SHORT, LONG = "show me", "give the red cat to the blue dog please now"
runner = CliRunner()


def tfcli(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def make_checkpoint(tmp_path: Path, kind: str) -> Path:
    """An untrained tiny model with a word-level tokenizer: enough for the maths of attention weights."""
    tok = word_tokenizer(WORDS)
    tok_file = tmp_path / "tok.json"
    tok.save(str(tok_file))
    V = tok.get_vocab_size()
    if kind == "seq2seq":
        cfg = preset("toy", src_vocab_size=V, tgt_vocab_size=V)
        files = {"src": tok_file, "tgt": tok_file}
    else:
        cfg = preset("lm-toy", tgt_vocab_size=V)
        files = {"tgt": tok_file}
    torch.manual_seed(0)
    return checkpoint.save(tmp_path / f"ckpt-{kind}", build_model(cfg), {"model": to_dict(cfg), "step": 7}, files)


@pytest.fixture
def s2s(tmp_path):
    return make_checkpoint(tmp_path, "seq2seq")


@pytest.fixture
def lm(tmp_path):
    return make_checkpoint(tmp_path, "lm")


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def assert_picture(path: Path, min_px: int = 300):
    """A decodable PNG of a sensible size, not a blank canvas (what the picture shows is checked by
    test_picture_shows_the_weights_it_was_given)."""
    import matplotlib.image

    assert is_png(path)
    img = matplotlib.image.imread(str(path))
    assert img.shape[0] >= min_px and img.shape[1] >= min_px
    assert img[..., :3].std() > 0.05


def runs_of(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a 1-D boolean array."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], flags.astype(np.int8), [0]])))
    return list(zip(edges[::2], edges[1::2]))


def assert_distributions(w: np.ndarray):
    """Each query row of each head is a probability distribution over the keys."""
    assert (w >= 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


# --- attention weights ------------------------------------------------------------------------------------------


def test_seq2seq_weights_are_distributions_and_decoder_self_attention_is_causal(s2s):
    model, meta = checkpoint.load(s2s)
    samples = collect(model, meta, [SHORT, LONG], targets=["me show", "now please dog blue the to cat red the give"])
    H, L = model.cfg.n_head, model.cfg.n_decoder_layers
    for s, text in zip(samples, [SHORT, LONG]):
        S = len(text.split()) + 1  # + </s>
        T = len(s.tokens["tgt"])
        assert s.tokens["src"][-1] == "</s>" and s.tokens["tgt"][0] == "<s>"
        assert s.next_tokens[-1] == "</s>"  # the last target row predicts the end
        assert set(s.maps) == {"encoder", "self", "cross"}
        for kind, shape in {"encoder": (H, S, S), "self": (H, T, T), "cross": (H, T, S)}.items():
            assert len(s.maps[kind]) == L
            for w in s.maps[kind]:
                assert w.shape == shape
                assert_distributions(w)
        for w in s.maps["self"]:
            assert (w[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()  # nothing after the query
            assert (w[:, np.arange(T), np.arange(T)] > 0).all()  # but the query itself


def test_padding_gets_no_weight_and_batching_changes_nothing(s2s):
    """A short and a long sentence in one batch: the short one's pad columns get exactly 0 and its weights equal
    those of running it alone."""
    model, meta = checkpoint.load(s2s)
    tok = word_tokenizer(WORDS)
    short, long_ = (source_ids(tok.encode(t).ids) for t in (SHORT, LONG))
    tgt_short, tgt_long = [BOS_ID] + tok.encode("me show").ids, [BOS_ID] + tok.encode(LONG).ids
    batched = seq2seq_attention(model, pad([short, long_]), pad([tgt_short, tgt_long]))
    alone = seq2seq_attention(model, pad([short]), pad([tgt_short]))
    S, T = len(short), len(tgt_short)
    assert batched["encoder"][0].shape[-1] > S  # there is padding
    for kind in ("encoder", "cross"):
        for w_b, w_a in zip(batched[kind], alone[kind]):
            rows = S if kind == "encoder" else T
            assert (w_b[0, :, :rows, S:] == 0).all()  # no weight on pad keys
            torch.testing.assert_close(w_b[0, :, :rows, :S], w_a[0], atol=1e-5, rtol=1e-4)
    for w_b, w_a in zip(batched["self"], alone["self"]):
        torch.testing.assert_close(w_b[0, :, :T, :T], w_a[0], atol=1e-5, rtol=1e-4)
    # and collect() (which batches) gives the short sentence the same weights as collecting it alone
    both = collect(model, meta, [SHORT, LONG], targets=["me show", LONG])[0]
    one = collect(model, meta, [SHORT], targets=["me show"])[0]
    for kind in both.maps:
        for a, b in zip(both.maps[kind], one.maps[kind]):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_collecting_weights_does_not_change_the_forward(s2s, lm):
    """Asking for weights only observes: the logits are the same as decoding without them."""
    model, _ = checkpoint.load(s2s)
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[BOS_ID, 8, 9]])
    attn = {"encoder": [], "self": [], "cross": []}
    with torch.inference_mode():
        memory, mask = model.encode(src, attn_out=attn)
        observed = model.decode(tgt, memory, mask, attn_out=attn)
        torch.testing.assert_close(observed, model(src, tgt))
    lm_model, _ = checkpoint.load(lm)
    ids = torch.tensor([[2, 5, 6, 7]])
    with torch.inference_mode():
        attn = {"self": [], "cross": []}
        torch.testing.assert_close(lm_model(ids, attn_out=attn), lm_model(ids))
    assert len(attn["self"]) == lm_model.cfg.n_decoder_layers and attn["cross"] == []


def test_greedy_target_is_used_when_none_is_given(s2s):
    """Without a target the drawing shows `tfcli translate --greedy`'s translation: the same length rule and
    options, from the one place their defaults live (TranslateConfig)."""
    import tfcli

    model, meta = checkpoint.load(s2s)
    s = collect(model, meta, [LONG])[0]
    greedy = tfcli.load(str(s2s)).translate([LONG], beam_size=1, raw=True)[0].split()
    assert s.tokens["tgt"] == ["<s>"] + greedy


def test_lm_self_attention_is_causal_and_covers_the_continuation(lm):
    model, meta = checkpoint.load(lm)
    plain = collect(model, meta, ["show me the money"])[0]
    assert plain.tokens["tgt"] == ["</s>", "show", "me", "the", "money"]  # a line starts after </s>
    assert plain.target_text is None
    cont = collect(model, meta, ["show me the money"], generate=4)[0]
    assert cont.tokens["tgt"][:5] == plain.tokens["tgt"] and 5 < len(cont.tokens["tgt"]) <= 9
    T = len(cont.tokens["tgt"])
    assert list(cont.maps) == ["self"] and len(cont.maps["self"]) == model.cfg.n_decoder_layers
    for w in cont.maps["self"]:
        assert w.shape == (model.cfg.n_head, T, T)
        assert_distributions(w)
        assert (w[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0).all()
    # the prompt's rows do not depend on what follows (causality), so they match the prompt-only forward
    for a, b in zip(plain.maps["self"], cont.maps["self"]):
        np.testing.assert_allclose(b[:, :5, :5], a, atol=1e-5)
    ids = torch.tensor([[2, 5, 6]])
    assert lm_attention(model, ids)["self"][0].shape == (1, model.cfg.n_head, 3, 3)


def test_wrong_options_for_the_model_kind_are_clear(s2s, lm):
    model, meta = checkpoint.load(s2s)
    with pytest.raises(TfcliError, match="--generate is for language models"):
        collect(model, meta, [SHORT], generate=3)
    with pytest.raises(TfcliError, match="2 --target sentences for 1 source"):
        collect(model, meta, [SHORT], targets=["a", "b"])
    lm_model, lm_meta = checkpoint.load(lm)
    with pytest.raises(TfcliError, match="--target is for translation models"):
        collect(lm_model, lm_meta, [SHORT], targets=["x"])
    with pytest.raises(TfcliError, match="--kind cross"):
        write_attention(lm, [SHORT], "unused", kinds=["cross"])
    with pytest.raises(TfcliError, match="--layers: '3' is outside 1-2"):
        write_attention(s2s, [SHORT], "unused", layers="3")


def test_byte_level_tokens_are_shown_as_text():
    from tfcli.data.tokenizer import train_tokenizer

    tok = train_tokenizer("bytelevel", ["the café is open", "the cat"] * 20, 300)
    labels = token_labels(tok, tok.encode("the café", add_special_tokens=False).ids)
    assert "".join(labels) == "the▁café"  # not "theĠcafÃ©"


# --- pictures ---------------------------------------------------------------------------------------------------


def test_png_per_kind(s2s, tmp_path):
    written = write_attention(s2s, [LONG], tmp_path, targets=["now please"], layers="1", html_page=False)
    assert [p.name for p in written] == [f"sentence1-{k}.png" for k in ("encoder-self", "decoder-self", "cross")]
    for p in written:
        assert_picture(p, min_px=200)


@pytest.mark.parametrize("cell", [(0, 0), (2, 3), (3, 1)])
def test_picture_shows_the_weights_it_was_given(cell, tmp_path):
    """A hand-made map, weight 1 in one cell and 0 elsewhere: the picture's first panel is dark (viridis at 0)
    except for one bright cell (viridis at 1), in the row of that query and the column of that key."""
    import matplotlib
    import matplotlib.image

    nq, nk = 4, 5
    w = np.zeros((1, nq, nk), dtype=np.float32)
    w[0][cell] = 1.0
    sample = AttentionSample("a b c d", {"src": list("abcde"), "tgt": list("vxyz")}, {"cross": [w]})
    render_png(sample, "cross", tmp_path / "p.png")
    img = (matplotlib.image.imread(str(tmp_path / "p.png"))[..., :3] * 255).round()
    viridis = matplotlib.colormaps["viridis"]

    def near(value):
        return (np.abs(img - np.array(viridis(value)[:3]) * 255).max(-1) <= 12)

    dark, bright = near(0.0), near(1.0)
    panel = runs_of((dark | bright).any(0))[0]  # the first panel: head 1 (then the mean of heads, the colour bar)
    cols = slice(*panel)
    top, bottom = runs_of((dark | bright)[:, cols].any(1))[0]
    ys, xs = np.nonzero(bright[top:bottom, cols])
    assert len(ys) > 0.5 * (bottom - top) * (panel[1] - panel[0]) / (nq * nk)  # one whole cell is bright
    row = int(ys.mean() * nq / (bottom - top))
    col = int(xs.mean() * nk / (panel[1] - panel[0]))
    assert (row, col) == cell
    assert dark[top:bottom, cols].sum() > 0.8 * (nq * nk - 1) / (nq * nk) * (bottom - top) * (panel[1] - panel[0])


def test_html_page_is_self_contained_and_holds_the_weights(s2s, tmp_path):
    out = tmp_path / "pics"
    written = write_attention(s2s, [SHORT, LONG], out, targets=["me show", "now please"], png=False)
    assert written == [out / "attention.html"]
    page = (out / "attention.html").read_text(encoding="utf-8")
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.I)  # no external scripts
    assert not re.search(r"<link\b|@import|https://", page, re.I)  # no stylesheets or fonts from the web
    assert set(re.findall(r"http://[^\"' ]+", page)) == {"http://www.w3.org/2000/svg"}  # the SVG namespace only
    for word in (SHORT + " " + LONG).split():
        assert word in page
    # the inline data is exactly the model's weights (rounded), heads then their mean
    blob = re.search(r'<script type="application/json" id="attention-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(blob)
    model, meta = checkpoint.load(s2s)
    sample = collect(model, meta, [SHORT, LONG], targets=["me show", "now please"])[1]
    cross = data["sentences"][1]["kinds"]["cross"]
    assert data["sentences"][1]["tokens"]["src"] == sample.tokens["src"]
    w = sample.maps["cross"][1]
    np.testing.assert_allclose(np.array(cross["layers"][1][:-1]), w, atol=1e-4)
    np.testing.assert_allclose(np.array(cross["layers"][1][-1]), w.mean(0), atol=1e-4)


def test_html_survives_tokens_that_look_like_markup(s2s, tmp_path):
    model, meta = checkpoint.load(s2s)
    sample = collect(model, meta, [SHORT], targets=["me"])[0]
    sample.tokens["src"][0] = "</script><b>x</b>&amp;"
    sample.text = "<i>raw</i>"
    render_html([sample], tmp_path / "a.html", "t")
    page = (tmp_path / "a.html").read_text(encoding="utf-8")
    assert page.count("</script>") == 2  # the data block and the code block, nothing injected
    assert "<i>raw</i>" not in page and "<b>x</b>" not in page


def test_layer_selection_and_lm_picture(lm, tmp_path):
    written = write_attention(lm, ["show me the money now"], tmp_path / "lm", generate=3, layers="2", html_page=False)
    assert [p.name for p in written] == ["sentence1-self.png"]
    assert_picture(written[0], min_px=200)


def test_missing_matplotlib_says_what_to_install(s2s, tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib` now raises ImportError
    model, meta = checkpoint.load(s2s)
    sample = collect(model, meta, [SHORT], targets=["me"])[0]
    with pytest.raises(TfcliError, match=r"needs matplotlib: pip install 'tfcli\[plot\]'"):
        render_png(sample, "cross", tmp_path / "x.png")
    # attention writes what it can without matplotlib: the HTML page, with a note; no PNGs, no empty directory
    r = tfcli("attention", "-m", s2s, SHORT, "-o", tmp_path / "o")
    assert r.exit_code == 0 and "warning: no matplotlib: writing the HTML page only" in r.stderr
    assert "pip install 'tfcli[plot]'" in r.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["attention.html"]
    r = tfcli("attention", "-m", s2s, SHORT, "-o", tmp_path / "png-only", "--no-html")
    assert r.exit_code == 1 and "pip install 'tfcli[plot]'" in r.stderr and not (tmp_path / "png-only").exists()
    r = tfcli("attention", "-m", s2s, SHORT, "-o", tmp_path / "o2", "--no-png")
    assert r.exit_code == 0 and (tmp_path / "o2" / "attention.html").exists() and "warning" not in r.stderr
    run = write_metrics(tmp_path / "run", steps=3)
    r = tfcli("plot", run, "-o", tmp_path / "c.png")
    assert r.exit_code == 1 and "tfcli plot needs matplotlib: pip install 'tfcli[plot]'" in r.stderr
    r = tfcli("plot", run, "--terminal")
    assert r.exit_code == 0 and "train loss" in r.stdout


def test_attention_cli_reads_sentences_from_a_file_or_stdin(s2s, tmp_path):
    f = tmp_path / "in.txt"
    f.write_text(f"{SHORT}\n{LONG}\n", encoding="utf-8")
    r = tfcli("attention", "-m", s2s, "-i", f, "-o", tmp_path / "a", "--kind", "cross", "--no-png")
    assert r.exit_code == 0, r.output
    page = (tmp_path / "a" / "attention.html").read_text(encoding="utf-8")
    assert f'"text":"{SHORT}"' in page and f'"text":"{LONG}"' in page and '"encoder"' not in page
    r = tfcli("attention", "-m", s2s, "-o", tmp_path / "b", "--no-png", input=f"{SHORT}\n")
    assert r.exit_code == 0, r.output
    assert "show" in (tmp_path / "b" / "attention.html").read_text(encoding="utf-8")
    r = tfcli("attention", "-m", tmp_path / "nope", SHORT)
    assert r.exit_code == 1 and "nope" in r.stderr and "Traceback" not in r.output


# --- training curves --------------------------------------------------------------------------------------------


def write_metrics(run: Path, steps: int = 20, bleu: bool = True, every: int = 5) -> Path:
    """A synthetic metrics log in the schema `tfcli train` writes."""
    run.mkdir(parents=True, exist_ok=True)
    lines = []
    for s in range(1, steps + 1):
        loss = 2 + 6 * math.exp(-s / 5)
        lines.append(dict(step=s * 10, epoch=1, time=s * 1.5, split="train", loss=loss, nll=loss - 0.1,
                          ppl=math.exp(loss - 0.1), lr=1e-3 * min(1, s / 4), src_tokens_per_s=900.0,
                          tgt_tokens_per_s=1000.0 + s, padding_fraction=0.1, grad_norm=1 / s))
        if s % every == 0:
            valid = dict(step=s * 10, epoch=1, time=s * 1.5, split="valid", loss=loss + 0.2, nll=loss + 0.2,
                         ppl=math.exp(loss + 0.2), best=True)
            if bleu:
                valid["bleu"] = 3.0 * s
            lines.append(valid)
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return run


def test_plot_two_runs_translation_and_lm(tmp_path):
    a = write_metrics(tmp_path / "mt", steps=20)
    b = write_metrics(tmp_path / "lm", steps=12, bleu=False)
    runs = load_runs([a, b / "metrics.jsonl"])  # a run directory or the file itself
    assert [r.name for r in runs] == ["mt", "lm"]
    steps, bleu = runs[0].series("valid", "bleu")
    assert steps.tolist() == [50, 100, 150, 200] and bleu.tolist() == [15.0, 30.0, 45.0, 60.0]
    assert len(runs[1].series("valid", "bleu")[0]) == 0
    titles = [p.title for p in panels_with_data(runs)]
    assert titles == ["loss", "perplexity", "BLEU (valid)", "learning rate", "target tokens/s", "gradient norm"]
    assert "BLEU (valid)" not in [p.title for p in panels_with_data(runs[1:])]  # an LM has no BLEU panel
    plot_runs(runs, tmp_path / "both.png")
    assert_picture(tmp_path / "both.png")


def test_plot_cli_png_and_terminal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, b = write_metrics(tmp_path / "x" / "run"), write_metrics(tmp_path / "y" / "run", bleu=False)
    r = tfcli("plot", a, b, "--terminal")
    assert r.exit_code == 0, r.output
    assert "x/run" in r.stdout and "y/run" in r.stdout  # equal names get their parent to tell them apart
    assert "valid bleu" in r.stdout and "▁" in r.stdout
    assert not (tmp_path / "curves.png").exists()  # --terminal alone draws no picture
    r = tfcli("plot", a, b)
    assert r.exit_code == 0 and "wrote curves.png" in r.stderr
    assert_picture(tmp_path / "curves.png")


def test_terminal_summary_values(tmp_path):
    from rich.console import Console

    run = load_runs([write_metrics(tmp_path / "r", steps=10)])
    console = Console(record=True, width=140)
    print_summary(run, console)
    text = console.export_text()
    row = next(line for line in text.splitlines() if line.strip().startswith("valid bleu"))
    assert row.split()[2:6] == ["50-100", "15", "30", "30"]  # steps, first, last, best (max)
    assert sparkline(np.array([1.0, 2.0, 3.0])) == "▁▅█"
    assert sparkline(np.arange(100.0), width=10) == "▁▂▃▃▄▅▆▆▇█"  # bucket means 4.5, 14.5, .., 94.5
    assert sparkline(np.array([2.0, 2.0])) == "▁▁"


@pytest.mark.parametrize(
    "content, where, message",
    [
        ('{"step": 1, "split": "train"}\n{"step": 2, "spl\n{"step": 3, "split": "valid"}\n', 2, "not valid JSON"),
        ('{"step": 1, "split": "train", "loss": "high"}\n', 1, "'loss' is not a number"),
        ('{"split": "train", "loss": 1.0}\n', 1, "non-integer 'step'"),
        ('{"step": 1, "loss": 1.0}\n', 1, "missing 'split'"),
        ('[1, 2]\n', 1, "a JSON object per line"),
    ],
)
def test_corrupt_metrics_log_names_file_and_line(tmp_path, content, where, message):
    path = tmp_path / "run" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TfcliError) as e:
        read_metrics(path.parent)
    assert str(e.value).startswith(f"{path}:{where}: ") and message in str(e.value)
    r = tfcli("plot", path.parent, "-o", tmp_path / "x.png")
    assert r.exit_code == 1 and f"{path}:{where}:" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_or_empty_metrics_log(tmp_path):
    (tmp_path / "empty-run").mkdir()
    with pytest.raises(TfcliError, match=r"empty-run/metrics.jsonl: no metrics log"):
        read_metrics(tmp_path / "empty-run")
    with pytest.raises(TfcliError, match="no such run directory"):
        read_metrics(tmp_path / "absent")
    (tmp_path / "empty-run" / "metrics.jsonl").write_text("")
    with pytest.raises(TfcliError, match="the metrics log is empty"):
        read_metrics(tmp_path / "empty-run")


def test_line_being_written_by_a_running_training_is_skipped(tmp_path):
    """A last line without its newline is one the trainer is still writing: ignored, not an error."""
    run = write_metrics(tmp_path / "r", steps=3)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 40, "split": "tra')
    assert [r["step"] for r in read_metrics(run)] == [10, 20, 30]


@pytest.mark.slow
def test_real_training_run_plots_and_shows_attention(tmp_path):
    """The metrics log `tfcli train` really writes plots, and its checkpoint draws."""
    run = train_tiny_checkpoint(tmp_path, kind="parallel", task="reverse", steps=60)
    r = tfcli("plot", run, "-o", tmp_path / "curves.png", "--terminal")
    assert r.exit_code == 0, r.output
    assert "train loss" in r.stdout and "valid bleu" in r.stdout
    assert_picture(tmp_path / "curves.png")
    r = tfcli("attention", "-m", run, "w1 w2 w3 w4", "-o", tmp_path / "att")
    assert r.exit_code == 0, r.output
    assert_picture(tmp_path / "att" / "sentence1-cross.png")
