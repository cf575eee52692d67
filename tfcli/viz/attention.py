"""Attention weights from the real forward pass, drawn as heatmaps (PNG) and as an interactive HTML page.

The weights come from the model's own attention: passing `attn_out` makes every layer hand back the softmax weights
of the very `scaled_dot_product_attention` call that produced its output (tfcli.model.attention), masks included.
A translation model runs once, teacher-forced, on the source and a target (given, or its own greedy translation),
exactly as in training; a language model runs once on </s> + the prompt (in its training stream a line starts after
</s>), plus, optionally, its greedy continuation.

Kinds of attention, and the tokens on each axis (query rows × key columns):
    encoder   encoder self-attention      source × source
    self      decoder self-attention      target × target   (causal: nothing above the diagonal)
    cross     encoder-decoder attention   target × source
Target rows are the decoder inputs <s> y_1 .. y_m; row t is the position that predicts y_{t+1} (the last one </s>).
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from tfcli import checkpoint

from tfcli import checkpoint_meta
from tfcli.data.batching import pad, source_ids
from tfcli.data.languages import Languages
from tfcli.data.tokenizer import decode_batch, encode_batch
from tfcli.errors import TfcliError
from tfcli.generate.config import GenerateConfig, TranslateConfig
from tfcli.generate.lm import START_ID, generate_ids
from tfcli.generate.search import Rows, SearchOptions, greedy_decode
from tfcli.io import atomic_write_text, refuse_overwriting_inputs
from tfcli.viz.mpl import have_matplotlib
from tfcli.specials import BOS_ID, EOS_ID

MAX_SENTENCES = 16  # pictures are for looking at a few sentences, not for a corpus


@dataclass(frozen=True)
class Kind:
    q: str  # token side of the query rows: "src" or "tgt"
    k: str  # token side of the key columns
    title: str
    causal: bool  # keys after the query are masked by construction


KINDS = {
    "encoder": Kind("src", "src", "encoder self-attention", False),
    "self": Kind("tgt", "tgt", "decoder self-attention", True),
    "cross": Kind("tgt", "src", "cross-attention (target × source)", False),
}
AXIS_NAMES = {"src": "source", "tgt": "decoder input", "lm": "token"}


@dataclass
class AttentionSample:
    """The attention of one input: its tokens per side and, per kind, one (n_head, T_q, T_k) array per layer."""

    text: str
    tokens: dict[str, list[str]]
    maps: dict[str, list[np.ndarray]]
    target_text: str | None = None
    next_tokens: list[str | None] = field(default_factory=list)  # what each target row predicts
    prefix: int = 0  # a prefix LM's prompt length: its tokens see each other both ways

    def kind_title(self, kind: str, lm: bool) -> str:
        if lm and kind == "self":
            return "self-attention (the prompt both ways, then causal)" if self.prefix else "self-attention (causal)"
        return KINDS[kind].title


# --- weights from the model -------------------------------------------------------------------------------------


@torch.inference_mode()
def seq2seq_attention(model, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """One teacher-forced forward; per kind, one (B, n_head, T_q, T_k) tensor per layer (padding not cropped)."""
    attn: dict[str, list[torch.Tensor]] = {"encoder": [], "self": [], "cross": []}
    memory, mem_mask = model.encode(src, attn_out=attn)
    model.decode(tgt_in, memory, mem_mask, attn_out=attn)
    return attn


@torch.inference_mode()
def lm_attention(model, ids: torch.Tensor, prefix: torch.Tensor | None = None) -> dict[str, list[torch.Tensor]]:
    """One forward of a decoder-only LM over ids (B, T) (`prefix` (B,): its prompt lengths, seen both ways by a
    prefix LM); {"self": [(B, n_head, T, T) per layer]}."""
    attn: dict[str, list[torch.Tensor]] = {"self": [], "cross": []}
    model(ids, attn_out=attn, prefix=prefix)
    return {"self": attn["self"]}


def collect(
    model,
    meta: dict,
    texts: Sequence[str],
    targets: Sequence[str] | None = None,
    generate: int = 0,
    tgt_lang: str | None = None,
    src_lang: str | None = None,
) -> list[AttentionSample]:
    """Attention of `model` on each text: a source sentence (translation) or a prompt (language model);
    `tgt_lang`: a multilingual model's target language (its tag first in each source, as translate puts it; an
    imported M2M-100 or NLLB model's token forced first in the target, and `src_lang`'s first in the source)."""
    if not texts:
        raise TfcliError("no input sentences: give them as arguments or with --input FILE")
    if len(texts) > MAX_SENTENCES:
        raise TfcliError(f"attention pictures are for a few sentences; got {len(texts)}, at most {MAX_SENTENCES}")
    if model.cfg.kind == "seq2seq":
        if generate:
            raise TfcliError(
                "--generate is for language models; a translation model's target is --target or its greedy translation"
            )
        return _collect_seq2seq(model, meta, texts, targets, tgt_lang, src_lang)
    if (meta.get("data") or {}).get("kind") == "parallel":  # a decoder-only translator trained here
        if generate:
            raise TfcliError("--generate is for language models; a translator's target is --target or its greedy "
                             "translation")
        return _collect_translator(model, meta, texts, targets, tgt_lang)
    if tgt_lang or src_lang:
        raise TfcliError(f"{'--tgt-lang' if tgt_lang else '--src-lang'} is for multilingual translation models")
    if targets:
        raise TfcliError(
            "--target is for translation models; a language model attends over its prompt (--generate N continues it)"
        )
    return _collect_lm(model, meta, texts, generate)


def _collect_seq2seq(model, meta, texts, targets, tgt_lang, src_lang) -> list[AttentionSample]:
    cfg = model.cfg
    device = next(model.parameters()).device
    src_tok, tgt_tok = checkpoint_tokenizer(meta, "src"), checkpoint_tokenizer(meta, "tgt")
    languages = Languages(src_tok, meta)
    if src_lang and languages.kind != "tokens":
        raise TfcliError("--src-lang names the source language token of an imported M2M-100 or NLLB model; this "
                         "model has none")
    languages.check(src_lang, tgt_lang)
    lead = languages.lead(src_lang, tgt_lang, "--src-lang" if languages.kind == "tokens" else "--tgt-lang")
    forced = languages.forced(tgt_lang, "--tgt-lang")  # (shown first in the target, as the model sees it)
    src_seqs = [source_ids(([lead] if lead is not None else []) + ids, cfg.max_len)
                for ids in encode_batch(src_tok, texts)]
    src = pad(src_seqs).to(device)
    if targets is None:
        prefix = torch.tensor([forced] * len(texts), device=device) if forced else None
        options = SearchOptions.from_config(TranslateConfig(beam_size=1))  # (`translate --greedy`'s translation)
        tgt_seqs = [h.tokens for h in greedy_decode(model, src, options, Rows(prefix=prefix))]
    else:
        if len(targets) != len(texts):
            raise TfcliError(
                f"got {len(targets)} --target sentences for {len(texts)} source sentences; give one per source"
            )
        tgt_seqs = [(forced + ids)[: cfg.max_len - 1] for ids in encode_batch(tgt_tok, targets)]
    # The whole batch in one forward, as in decoding: the source is right-padded, so this also shows (and the tests
    # check) that padding gets no attention.
    tgt_in = pad([[BOS_ID] + t for t in tgt_seqs]).to(device)
    attn = seq2seq_attention(model, src, tgt_in)
    samples = []
    for i, text in enumerate(texts):
        S, T = len(src_seqs[i]), len(tgt_seqs[i]) + 1
        crop = {"encoder": (S, S), "self": (T, T), "cross": (T, S)}
        maps = {kind: [_numpy(w[i, :, : crop[kind][0], : crop[kind][1]]) for w in attn[kind]] for kind in crop}
        tgt_labels = token_labels(tgt_tok, [BOS_ID] + tgt_seqs[i] + [EOS_ID])
        samples.append(
            AttentionSample(
                text=text,
                tokens={"src": token_labels(src_tok, src_seqs[i]), "tgt": tgt_labels[:-1]},
                maps=maps,
                target_text=decode_batch(tgt_tok, [tgt_seqs[i]])[0],
                next_tokens=tgt_labels[1:],
            )
        )
    return samples


def _collect_translator(model, meta, texts, targets, tgt_lang) -> list[AttentionSample]:
    """A decoder-only translator's self-attention over its prompt (as translate writes it) and its greedy
    translation or the given target, one sentence at a time."""
    from tfcli.data.languages import language_tags
    from tfcli.generate.prompting import Prompter

    cfg = model.cfg
    device = next(model.parameters()).device
    tok = checkpoint_tokenizer(meta, "tgt")
    prompter = Prompter.of(meta, None, [START_ID], language_tags(tok, checkpoint_meta.tokenizer_path(meta, "tgt")))
    if targets is not None and len(targets) != len(texts):
        raise TfcliError(f"got {len(targets)} --target sentences for {len(texts)} source sentences; give one per source")
    samples = []
    for i, text in enumerate(texts):
        _, start, end = prompter.prompt(text, None, tgt_lang)
        prompt = [*start, *encode_batch(tok, [text])[0], *end]
        if len(prompt) >= cfg.max_len:
            raise TfcliError(f"prompt is {len(prompt)} tokens, and the model's context holds {cfg.max_len}")
        if targets is None:
            options = SearchOptions.from_config(TranslateConfig(beam_size=1))  # (`translate --greedy`'s)
            src = torch.tensor([prompt], device=device)
            out = greedy_decode(model, src, options, Rows(sources=torch.tensor([len(prompt) - len(start) - len(end)],
                                                                                device=device)))[0].tokens
        else:
            out = encode_batch(tok, [targets[i]])[0]
        ids = (prompt + out)[: cfg.max_len]
        attn = lm_attention(model, torch.tensor([ids], device=device), torch.tensor([len(prompt)], device=device))
        labels = token_labels(tok, ids)
        samples.append(AttentionSample(text=text, tokens={"tgt": labels},
                                       maps={"self": [_numpy(w[0]) for w in attn["self"]]},
                                       target_text=decode_batch(tok, [out])[0], next_tokens=labels[1:] + [None],
                                       prefix=len(prompt) if cfg.prefix_attention else 0))
    return samples


def _collect_lm(model, meta, texts, generate: int) -> list[AttentionSample]:
    cfg = model.cfg
    device = next(model.parameters()).device
    tok = checkpoint_tokenizer(meta, "tgt")
    samples = []
    for text in texts:  # one at a time: no left padding, so each picture is exactly the prompt's own forward
        ids = [START_ID] + encode_batch(tok, [text])[0]  # a line starts after </s>, as in training and lm-generate
        if len(ids) > cfg.max_len:
            raise TfcliError(f"prompt is {len(ids)} tokens, longer than the model's max_len ({cfg.max_len})")
        continuation = []
        if generate and len(ids) < cfg.max_len:
            continuation = generate_ids(model, [ids], GenerateConfig(max_new_tokens=generate, greedy=True))[0]
        ids = ids + continuation
        attn = lm_attention(model, torch.tensor([ids], device=device))
        labels = token_labels(tok, ids)
        samples.append(
            AttentionSample(
                text=text,
                tokens={"tgt": labels},
                maps={"self": [_numpy(w[0]) for w in attn["self"]]},
                target_text=decode_batch(tok, [continuation])[0] if continuation else None,
                next_tokens=labels[1:] + [None],
            )
        )
    return samples


def _numpy(w: torch.Tensor) -> np.ndarray:
    return w.detach().float().cpu().numpy()


# --- tokens -----------------------------------------------------------------------------------------------------


def checkpoint_tokenizer(meta: dict, side: str):
    return checkpoint.tokenizer(meta, side)


def token_labels(tok, ids: Sequence[int]) -> list[str]:
    """Readable token strings: the vocabulary entry, with byte-level BPE's byte alphabet turned back into text."""
    labels = [tok.id_to_token(i) or f"<{i}>" for i in ids]
    if (json.loads(tok.to_str()).get("decoder") or {}).get("type") == "ByteLevel":
        labels = [_from_byte_alphabet(t) for t in labels]
    # white space made visible (character-level and byte-level tokens contain it)
    visible = str.maketrans({" ": "▁", "\n": "↵", "\t": "⇥", "\r": "␍"})
    return [t.translate(visible) or "∅" for t in labels]


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet (printable characters stand for themselves, the rest are shifted past 255)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in printable]
    chars = {chr(b): b for b in printable}
    chars.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return chars


def _from_byte_alphabet(token: str) -> str:
    alphabet = _byte_alphabet()
    if not all(c in alphabet for c in token):
        return token  # a special token such as <s>
    return bytes(alphabet[c] for c in token).decode("utf-8", errors="replace")


# --- PNG --------------------------------------------------------------------------------------------------------


def render_png(
    sample: AttentionSample,
    kind: str,
    path: os.PathLike | str,
    layers: Sequence[int] | None = None,
    title: str | None = None,
) -> None:
    """A grid: one row per layer, one column per head plus the mean of the heads; tokens on both axes."""
    from tfcli.viz.mpl import new_figure, save_png

    spec = KINDS[kind]
    q_tok, k_tok = sample.tokens[spec.q], sample.tokens[spec.k]
    lm = "src" not in sample.tokens
    axis_name = lambda side: AXIS_NAMES["lm" if lm else side]  # noqa: E731
    maps = sample.maps[kind]
    layers = list(range(len(maps))) if layers is None else list(layers)
    n_head = maps[0].shape[0]
    rows, cols = len(layers), n_head + 1

    # Sizes in inches, from the token count: every token gets a label row/column tall enough for its font.
    n = max(len(q_tok), len(k_tok))
    fs = 10 if n <= 12 else 9 if n <= 20 else 8 if n <= 32 else 7 if n <= 50 else 6 if n <= 80 else 5
    per_token = fs * 1.5 / 72
    label = max(len(t) for t in q_tok + k_tok) * fs * 0.6 / 72 + 0.2
    title_w = len(f"layer {len(maps)}, mean of heads") * (fs + 1) * 0.58 / 72 + 0.2
    panel_w = max(len(k_tok) * per_token + label + 0.15, title_w)
    panel_h = len(q_tok) * per_token + label + 0.35
    width, height = cols * panel_w + 1.0, rows * panel_h + 0.6
    fig = new_figure("tfcli attention", figsize=(width, height), layout="constrained")
    import matplotlib

    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    axes = fig.subplots(rows, cols, squeeze=False)
    hidden = np.triu(np.ones((len(q_tok), len(k_tok)), dtype=bool), 1) if spec.causal else None
    if hidden is not None:
        hidden[: sample.prefix, : sample.prefix] = False
    image = None
    for r, layer in enumerate(layers):
        heads = maps[layer]
        panels = [(heads[h], f"layer {layer + 1}, head {h + 1}") for h in range(n_head)]
        panels.append((heads.mean(0), f"layer {layer + 1}, mean of heads"))
        for c, (w, panel_title) in enumerate(panels):
            ax = axes[r][c]
            data = np.ma.masked_array(w, mask=hidden) if hidden is not None else w
            image = ax.imshow(data, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
            ax.set_title(panel_title, fontsize=fs + 1)
            ax.set_xticks(range(len(k_tok)), k_tok, rotation=90, fontsize=fs)
            ax.set_yticks(range(len(q_tok)), q_tok, fontsize=fs)
            ax.tick_params(length=0)
            if r == rows - 1:
                ax.set_xlabel(f"{axis_name(spec.k)} (key)", fontsize=fs)
            if c == 0:
                ax.set_ylabel(f"{axis_name(spec.q)} (query)", fontsize=fs)
    bar = fig.colorbar(image, ax=axes, shrink=min(1.0, 4.0 / height + 0.3), aspect=30, pad=0.01)
    bar.set_label("attention weight" + (" (grey: masked, causal)" if spec.causal else ""), fontsize=fs + 1)
    bar.ax.tick_params(labelsize=fs)
    fig.suptitle(title or sample.kind_title(kind, lm), fontsize=fs + 4)
    # Keep huge grids (deep models, long sentences) within a sane pixel size; fonts scale with the dots.
    dpi = min(100.0, 9000.0 / max(width, height))
    save_png(fig, path, dpi=dpi)


# --- HTML -------------------------------------------------------------------------------------------------------


def render_html(samples: Sequence[AttentionSample], path: os.PathLike | str, title: str, model_info: str = "") -> None:
    """One self-contained page (data and script inline, nothing fetched): pick sentence, kind, layer and head."""
    lm = "src" not in samples[0].tokens
    data = {
        "lm": lm,
        "sentences": [
            {
                "text": s.text,
                "target": s.target_text,
                "tokens": s.tokens,
                "next": s.next_tokens,
                "kinds": {
                    kind: {
                        "title": s.kind_title(kind, lm),
                        "q": KINDS[kind].q,
                        "k": KINDS[kind].k,
                        "causal": KINDS[kind].causal,
                        "prefix": s.prefix if kind == "self" else 0,
                        # per layer: the heads, then their mean; 4 decimals keep the page small
                        "layers": [np.round(np.concatenate([w, w.mean(0, keepdims=True)]), 4).tolist() for w in maps],
                    }
                    for kind, maps in s.maps.items()
                },
            }
            for s in samples
        ],
    }
    # JSON inside <script>: escape <, > and & so no token (e.g. "</s>" or "</script>") can end the element.
    blob = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    blob = blob.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    template = resources.files("tfcli.viz").joinpath("attention.html").read_text(encoding="utf-8")
    page = (
        template.replace("%TITLE%", html.escape(title))
        .replace("%INFO%", html.escape(model_info))
        .replace("%DATA%", blob)
    )
    atomic_write_text(path, page)


# --- the command ------------------------------------------------------------------------------------------------


def parse_layers(spec: str | None, n_layers: int) -> list[int] | None:
    """'1,3' or '2-4' (1-based, as in the pictures) -> 0-based layer indices; None = all."""
    if not spec:
        return None
    out: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi or lo)
        except ValueError:
            raise TfcliError(f"--layers: '{part}' is not a layer number or range like 2-4") from None
        if not 1 <= first <= last <= n_layers:
            raise TfcliError(f"--layers: '{part}' is outside 1-{n_layers} (the model has {n_layers} layers)")
        out.extend(range(first - 1, last))
    return sorted(set(out))


def write_attention(
    ckpt: os.PathLike | str,
    texts: Sequence[str],
    out_dir: os.PathLike | str,
    targets: Sequence[str] | None = None,
    generate: int = 0,
    kinds: Sequence[str] | None = None,
    layers: str | None = None,
    png: bool = True,
    html_page: bool = True,
    device: str = "auto",
    sources: Sequence[os.PathLike | str] = (),
    tgt_lang: str | None = None,
    src_lang: str | None = None,
) -> list[Path]:
    """Load a checkpoint, collect attention for `texts`, write PNGs and/or the HTML page into out_dir. `sources`:
    files the texts were read from (never written over). Without matplotlib only the HTML page is written."""
    from tfcli.console import warn
    from tfcli.device import resolve_device

    if png and not have_matplotlib():
        if not html_page:
            raise TfcliError("the PNGs need matplotlib: pip install 'tfcli[plot]' (or drop --no-html for the HTML page)")
        warn("no matplotlib: writing the HTML page only (pip install 'tfcli[plot]' for the PNGs)")
        png = False
    model, meta = checkpoint.load(ckpt, resolve_device(device), mapped=True)
    lm = model.cfg.kind == "lm"
    available = ["self"] if lm else ["encoder", "self", "cross"]
    kinds = list(kinds) if kinds else available
    for kind in kinds:
        if kind not in available:
            what = "language" if lm else "translation"
            raise TfcliError(f"--kind {kind}: this {what} model has {', '.join(available)}")
    n_layers = {"encoder": model.cfg.n_encoder_layers}
    picked = {k: parse_layers(layers, n_layers.get(k, model.cfg.n_decoder_layers)) for k in kinds}
    samples = collect(model, meta, texts, targets, generate, tgt_lang, src_lang)
    for s in samples:
        s.maps = {k: s.maps[k] for k in kinds}

    out = Path(out_dir)
    file_names = {"encoder": "encoder-self", "self": "self" if lm else "decoder-self", "cross": "cross"}
    pngs = {(i, kind): out / f"sentence{i}-{file_names[kind]}.png"
            for i in range(1, len(samples) + 1) for kind in kinds} if png else {}
    page = out / "attention.html"
    refuse_overwriting_inputs([*pngs.values(), page if html_page else None],
                              [*checkpoint_meta.input_paths(ckpt), *sources], "choose another -o")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TfcliError(f"{out}: cannot create the output directory ({e.strerror or e})") from None
    written: list[Path] = []
    if png:
        for i, s in enumerate(samples, 1):
            for kind in kinds:
                path = pngs[i, kind]
                title = f"{s.kind_title(kind, lm)}: \u201c{_short(s.text)}\u201d"
                if s.target_text is not None and kind != "encoder":
                    title += f" \u2192 \u201c{_short(s.target_text)}\u201d"
                render_png(s, kind, path, picked[kind], title)
                written.append(path)
    if html_page:
        path = page
        cfg = model.cfg
        info = (
            f"{Path(meta['dir']).name}: {'language model' if lm else 'translation model'}, "
            f"{cfg.n_decoder_layers if lm else f'{cfg.n_encoder_layers}+{cfg.n_decoder_layers}'} layers, "
            f"{cfg.n_head} heads, d_model {cfg.d_model}"
            + (f", step {meta['step']}" if "step" in meta else "")
        )
        render_html(samples, path, "tfcli attention", info)
        written.append(path)
    return written


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
