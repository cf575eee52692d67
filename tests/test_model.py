"""The model is the Transformer: attention math, positions, causality, padding, and it learns (incremental decoding:
test_step.py)."""

import math
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tfcli.errors import ConfigError
from tfcli.model.config import preset
from tfcli.specials import BOS_ID, EOS_ID, PAD_ID
from tfcli.model.transformer import build_model
from tfcli.model.attention import MultiHeadAttention
from tfcli.model.positional import sinusoidal_table

V = 40


def seq2seq(**kw):
    return build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V, **kw)).eval()


def lm(**kw):
    return build_model(preset("lm-toy", tgt_vocab_size=V, **kw)).eval()


def reference_attention(mha: MultiHeadAttention, x, mask=None, causal=False):
    """softmax(Q K^T / sqrt(d_k) + mask) V, written out by hand."""
    B, T, d = x.shape
    q, k, v = mha.qkv_proj(x).split(d, dim=-1)
    q, k, v = (t.view(B, T, mha.n_head, mha.d_head).transpose(1, 2) for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) / math.sqrt(mha.d_head)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return mha.out_proj(y.transpose(1, 2).reshape(B, T, d))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_hand_written_reference(causal):
    mha = MultiHeadAttention(32, 4)
    x = torch.randn(3, 7, 32)
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1, ..., 5:] = False
    y, w = mha(x, mask=None if causal else mask, is_causal=causal, need_weights=True)
    ref = reference_attention(mha, x, None if causal else mask, causal)
    torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    # the weights are a distribution over keys, zero where masked
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 7))
    if causal:
        assert (w[..., torch.ones(7, 7, dtype=torch.bool).triu(1)] == 0).all()
    else:
        assert (w[1, :, :, 5:] == 0).all()


def test_sinusoidal_table_is_the_formula():
    d, n = 16, 50
    pe = sinusoidal_table(n, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_seq2seq_decoder_is_causal(norm):
    m = seq2seq(norm=norm)
    src = torch.randint(4, V, (2, 6))
    tgt = torch.randint(4, V, (2, 8))
    out = m(src, tgt)
    tgt2 = tgt.clone()
    tgt2[:, 5:] = torch.randint(4, V, (2, 3))
    out2 = m(src, tgt2)
    torch.testing.assert_close(out[:, :5], out2[:, :5])
    assert not torch.allclose(out[:, 5:], out2[:, 5:])


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rope"])
def test_lm_is_causal(positions):
    m = lm(positions=positions)
    x = torch.randint(4, V, (2, 10))
    x2 = x.clone()
    x2[:, 6:] = torch.randint(4, V, (2, 4))
    torch.testing.assert_close(m(x)[:, :6], m(x2)[:, :6])


def test_source_padding_does_not_change_outputs():
    m = seq2seq()
    src = torch.randint(4, V, (1, 6))
    tgt = torch.randint(4, V, (1, 5))
    padded_src = torch.cat([src, torch.full((1, 4), PAD_ID)], 1)
    torch.testing.assert_close(m(src, tgt), m(padded_src, tgt), atol=1e-5, rtol=1e-5)
    # batched with a longer sentence: the short one's outputs are unchanged
    other = torch.randint(4, V, (1, 10))
    batch_src = torch.cat([padded_src, other])
    batch_tgt = torch.cat([tgt, torch.randint(4, V, (1, 5))])
    torch.testing.assert_close(m(batch_src, batch_tgt)[0], m(src, tgt)[0], atol=1e-5, rtol=1e-5)


def test_target_padding_does_not_change_real_positions():
    m = seq2seq()
    src = torch.randint(4, V, (1, 6))
    tgt = torch.randint(4, V, (1, 5))
    padded = torch.cat([tgt, torch.full((1, 3), PAD_ID)], 1)
    torch.testing.assert_close(m(src, padded)[:, :5], m(src, tgt), atol=1e-5, rtol=1e-5)


def test_tied_and_shared_embeddings():
    m = seq2seq(share_embeddings=True, tie_output=True)
    assert m.encoder.embed.tok.weight is m.decoder.embed.tok.weight
    assert m.lm_head.weight is m.decoder.embed.tok.weight
    untied = seq2seq(share_embeddings=False, tie_output=False)
    assert untied.lm_head.weight is not untied.decoder.embed.tok.weight


def test_config_rejects_impossible_shapes():
    with pytest.raises(ConfigError, match="divisible"):
        preset("toy", d_model=30, n_head=4, src_vocab_size=V, tgt_vocab_size=V)
    with pytest.raises(ConfigError, match="unknown architecture"):
        preset("huge")
    with pytest.raises(ConfigError, match="joint vocabulary"):
        preset("toy", src_vocab_size=10, tgt_vocab_size=20, share_embeddings=True)


def test_presets_have_paper_shapes():
    base = preset("base", src_vocab_size=100, tgt_vocab_size=100)
    assert (base.d_model, base.n_head, base.d_ff, base.n_encoder_layers, base.n_decoder_layers) == (512, 8, 2048, 6, 6)
    small = preset("small")
    assert small.n_encoder_layers == 6 and 256 <= small.d_model <= 512


def _copy_reverse_batch(n, length, g):
    """Targets are the source reversed: needs attention across positions, not just a lookup."""
    body = torch.randint(4, V, (n, length), generator=g)
    tgt = torch.cat([torch.full((n, 1), BOS_ID), body.flip(1), torch.full((n, 1), EOS_ID)], 1)
    return body, tgt[:, :-1], tgt[:, 1:]


@pytest.mark.parametrize("norm,modern", [("pre", {}), ("post", {}), ("pre", dict(rms_norm=True, activation="swiglu")),
                                         ("post", dict(rms_norm=True, activation="relu2")),
                                         ("pre", dict(qk_norm=True, activation="geglu")),
                                         ("post", dict(n_kv_head=2, qk_norm=True))])
def test_every_parameter_learns_and_a_small_step_lowers_the_loss(norm, modern):
    """What training relies on, without depending on how far a model gets: every parameter receives a finite,
    non-zero gradient, and one small Adam step lowers the loss on the same batch (Adam's first step moves every
    weight against the sign of its gradient, so the loss falls by about lr * sum|g| to first order)."""
    torch.manual_seed(0)
    m = build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V, d_model=64, d_ff=128, norm=norm, **modern)).train()
    g = torch.Generator().manual_seed(0)
    src, tgt_in, tgt_out = _copy_reverse_batch(64, 6, g)

    def loss():
        return F.cross_entropy(m(src, tgt_in).flatten(0, 1), tgt_out.flatten())

    before = loss()
    before.backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    torch.optim.Adam(m.parameters(), lr=1e-4).step()
    with torch.no_grad():
        after = loss()
    assert after < before - 1e-4, (before.item(), after.item())




@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_the_forward_compiles_into_one_graph_for_every_shape(kind):
    """torch.compile with dynamic shapes: one graph for batches of any size and length, no graph break (a test on a
    symbolic length, or a read of a tensor's value on the host, would split it: on a GPU, more launches and a sync
    per split). The `eager` backend: only the graph capture is under test, not a compiler."""
    from torch._dynamo.utils import counters

    V = 40
    if kind == "seq2seq":
        model = build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V)).eval()
    else:
        model = build_model(preset("lm-toy", tgt_vocab_size=V, positions="rope")).eval()
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager", dynamic=True)
    g = torch.Generator().manual_seed(0)
    for B, S, T in [(4, 7, 9), (3, 12, 2), (5, 2, 16)]:  # (a size of 1 is always specialised)
        tgt = torch.randint(4, V, (B, T), generator=g)
        args = (torch.randint(4, V, (B, S), generator=g), tgt) if kind == "seq2seq" else (tgt,)
        with torch.no_grad():
            assert torch.allclose(compiled(*args), model(*args), atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"]
    torch._dynamo.reset()


@pytest.mark.parametrize("shape", [(3, 7), (64,), (2, 40)])
def test_cpu_bf16_linear_pads_rows_to_few_shapes_and_computes_the_same(monkeypatch, shape):
    """Under bf16 autocast on the CPU, Linear runs the matrix product on rows padded to a multiple of 64 (so oneDNN
    sees few distinct shapes); the real rows' outputs and every gradient are what the unpadded product gives. Off
    autocast (fp32) nothing is padded."""
    import tfcli.model.linear as linear_module
    from tfcli.model.linear import CPU_BF16_ROWS, Linear

    torch.manual_seed(0)
    lin = Linear(16, 8)
    seen = []
    real_linear = F.linear
    monkeypatch.setattr(linear_module.nn.functional, "linear", lambda x, w, b=None: (seen.append(x.shape),
                                                                                          real_linear(x, w, b))[1])
    x = torch.randn(*shape, 16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(x)
    rows = math.prod(shape)
    assert y.shape == (*shape, 8) and y.dtype == torch.bfloat16
    assert seen[-1][0] % CPU_BF16_ROWS == 0 and seen[-1][0] - rows < CPU_BF16_ROWS
    y.float().square().sum().backward()
    grads = [t.grad.clone() for t in (x, lin.weight, lin.bias)]
    for t in (x, lin.weight, lin.bias):
        t.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = real_linear(x, lin.weight, lin.bias)
    ref.float().square().sum().backward()
    torch.testing.assert_close(y, ref, atol=0, rtol=0.01)
    for g, t in zip(grads, (x, lin.weight, lin.bias)):
        torch.testing.assert_close(g, t.grad, atol=1e-2, rtol=0.02)
    seen.clear()
    assert lin(x).shape == (*shape, 8) and seen == [x.shape]  # fp32: as nn.Linear


def test_rms_norm_and_the_ffn_activations_are_their_formulas():
    """RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g; FFNs: relu2 = w2(relu(w1 x)^2), swiglu = w2(silu(w1 x) * w3 x),
    geglu = w2(gelu(w1 x) * w3 x), written out here with the weights of the model's own layers."""
    from tfcli.model.layers import FeedForward
    from tfcli.model.norm import RMSNorm

    torch.manual_seed(0)
    x = torch.randn(3, 5, 16)
    norm = RMSNorm(16, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
        want = x / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-5).float() * norm.weight
        torch.testing.assert_close(norm(x), want, atol=1e-5, rtol=1e-5)
        # a bf16 input (q and k under autocast) with fp32 gains: the fp32 result rounded once to bf16, no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            half = norm(x.bfloat16())
        assert half.dtype == torch.bfloat16
        assert torch.equal(half, norm(x.bfloat16().float()).bfloat16())
    gates = {"relu2": lambda a, b: F.relu(a) ** 2, "swiglu": lambda a, b: a * torch.sigmoid(a) * b,
             "geglu": lambda a, b: 0.5 * a * (1 + torch.erf(a / math.sqrt(2))) * b}
    for act, gate in gates.items():
        ffn = FeedForward(preset("toy", src_vocab_size=V, tgt_vocab_size=V, d_model=16, d_ff=24, activation=act))
        assert (ffn.w3 is not None) == (act != "relu2")
        with torch.no_grad():
            a = x @ ffn.w1.weight.T + ffn.w1.bias
            b = x @ ffn.w3.weight.T + ffn.w3.bias if ffn.w3 is not None else None
            want = gate(a, b) @ ffn.w2.weight.T + ffn.w2.bias
            torch.testing.assert_close(ffn(x), want, atol=1e-5, rtol=1e-5)


def test_the_modern_options_default_to_the_2017_model():
    """rms_norm and the activation default to LayerNorm and ReLU: a default model's parameters are today's."""
    cfg = preset("toy", src_vocab_size=V, tgt_vocab_size=V)
    assert cfg.rms_norm is False and cfg.activation == "relu"
    names = set(build_model(cfg).state_dict())
    assert not any(".w3." in n for n in names)
    assert {n for n in names if "norm" in n and n.endswith(".bias")}  # LayerNorms have a bias
    modern = set(build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V, rms_norm=True, activation="swiglu")).state_dict())
    assert not {n for n in modern if "norm" in n and n.endswith(".bias")} and any(".w3." in n for n in modern)


def test_zero_init_residual_starts_each_block_as_the_identity():
    """With zero_init_residual the attention-out and FFN-out weights start at zero (biases are zero anyway): a
    pre-norm LM's output is then the final norm of its embeddings, whatever the rest of its weights."""
    cfg = preset("lm-toy", tgt_vocab_size=V, zero_init_residual=True, positions="learned")
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    zeroed = [n for n, p in model.named_parameters() if n.endswith(("out_proj.weight", "w2.weight"))]
    assert zeroed and all(not model.get_parameter(n).any() for n in zeroed)
    ids = torch.randint(4, V, (2, 6))
    with torch.no_grad():
        parts = model.parts()
        h = parts.decoder.norm(parts.decoder.embed(ids, torch.arange(6), 6))
        torch.testing.assert_close(model(ids), parts.lm_head(h))
    # the zeroed projections get gradients at once; the weights inside each block from the second step on
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(2):
        opt.zero_grad()
        F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        if step == 0:
            assert all(model.get_parameter(n).grad.abs().sum() > 0 for n in zeroed)
            opt.step()
    for name, p in model.named_parameters():
        if "pos" not in name:  # positions past the batch's length get none
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_qk_norm_is_rms_norm_of_each_heads_queries_and_keys():
    """softmax(n_q(q) n_k(k)^T / sqrt(d_head)) v with n(.) = . / rms(.) * g over each head's d_head, then W^O."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, qk_norm_eps=1e-5).eval()
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.randn(4))
        attn.k_norm.weight.copy_(torch.randn(4))
        x = torch.randn(2, 5, 16)
        q, k, v = (t.view(2, 5, 4, 4).transpose(1, 2) for t in attn.qkv_proj(x).split(16, dim=-1))

        def rms(t, g):
            return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * g

        q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
        y = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
        want = attn.out_proj(y.transpose(1, 2).reshape(2, 5, 16))
        torch.testing.assert_close(attn(x)[0], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cross", [False, True])
def test_grouped_query_attention_shares_each_key_value_head_among_its_query_heads(cross):
    """n_head 4, n_kv_head 2: query head i attends with key/value head i // 2,
    softmax(q_i k_(i//2)^T / sqrt(d_head)) v_(i//2), then W^O; the fused projection is [q (16); k (8); v (8)]."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, cross=cross, n_kv_head=2).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with torch.no_grad():
        if cross:
            q = attn.q_proj(x)
            k, v = attn.kv_proj(memory).split(8, dim=-1)
        else:
            q, k, v = attn.qkv_proj(x).split([16, 8, 8], dim=-1)
        heads = []
        for i in range(4):
            qi, ki, vi = q[..., 4 * i : 4 * i + 4], k[..., 4 * (i // 2) : 4 * (i // 2) + 4], v[..., 4 * (i // 2) : 4 * (i // 2) + 4]
            heads.append(torch.softmax(qi @ ki.transpose(-1, -2) / 2.0, dim=-1) @ vi)
        want = attn.out_proj(torch.cat(heads, dim=-1))
        got = attn(x, memory=memory if cross else None)[0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_n_kv_head_sizes_the_key_value_projections_and_must_divide_n_head():
    """n_kv_head = n_head is plain multi-head attention, the same parameters as leaving it unset; other values
    narrow k and v only; one that does not divide n_head is refused by name."""
    shapes = {n: {k: tuple(p.shape) for k, p in build_model(preset("toy", src_vocab_size=V, tgt_vocab_size=V,
                                                                         n_kv_head=n)).named_parameters()}
              for n in (None, 4, 1)}
    assert shapes[None] == shapes[4]
    assert shapes[1]["decoder.layers.0.self_attn.qkv_proj.weight"] == (32 + 2 * 8, 32)
    assert shapes[1]["decoder.layers.0.cross_attn.kv_proj.weight"] == (2 * 8, 32)
    for bad in (3, 0, 8):
        with pytest.raises(ConfigError, match="n_kv_head"):
            preset("toy", n_kv_head=bad)


def test_the_presets_table_in_the_training_docs_is_the_presets():
    """docs/training.md's table of presets (shapes and parameter counts) is computed from PRESETS, row by row."""
    import re
    from pathlib import Path

    from tfcli.model.config import PRESETS
    from tfcli.model.transformer import count_parameters

    text = (Path(__file__).resolve().parents[1] / "docs" / "training.md").read_text(encoding="utf-8")
    rows = {m.group(1): m.group(2).split(" | ") for m in re.finditer(r"^\| `([\w-]+)` \| (.*) \|$", text, re.M)}
    assert set(rows) == set(PRESETS)
    for name, (kind, layers, d_model, ffn, heads, params, bare, _) in rows.items():
        cfg = preset(name, src_vocab_size=8000, tgt_vocab_size=8000)
        model = build_model(cfg)
        embeddings = sum(p.numel() for n, p in model.named_parameters() if ".embed." in f".{n}")
        total = count_parameters(model)
        want_layers = f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers}" if cfg.kind == "seq2seq" else f"{cfg.n_decoder_layers}"
        assert (kind == "encoder-decoder") == (cfg.kind == "seq2seq"), name
        assert [layers, d_model, ffn, heads] == [want_layers, str(cfg.d_model), str(cfg.d_ff), str(cfg.n_head)], name
        assert [params, bare] == [f"{total / 1e6:.2f}M", f"{(total - embeddings) / 1e6:.2f}M"], name


@pytest.mark.parametrize("kind", ["seq2seq", "lm"])
def test_a_tied_output_layer_keeps_the_embeddings_initialisation(kind):
    """init_weights draws the embeddings from N(0, d^-1/2) and the linear layers Xavier-uniform (|w| at most
    sqrt(6 / (fan_in + fan_out))); the output layer tied to the embedding table is that table, initialised as an
    embedding (the tie is made after the drawing), so values past the Xavier bound are there."""
    torch.manual_seed(0)
    vocab = dict(src_vocab_size=2000, tgt_vocab_size=2000) if kind == "seq2seq" else dict(tgt_vocab_size=2000)
    tied = build_model(preset("toy", kind=kind, tie_output=True, **vocab))
    untied = build_model(preset("toy", kind=kind, tie_output=False, **vocab))
    d = tied.cfg.d_model
    bound = math.sqrt(6 / (2000 + d))
    assert tied.lm_head.weight is tied.decoder.embed.tok.weight
    w, w_untied = tied.lm_head.weight.detach(), untied.lm_head.weight.detach()
    assert float(w.abs().max()) > 1.5 * bound
    assert float(w.std()) == pytest.approx(d**-0.5, rel=0.05)
    assert float(w_untied.abs().max()) <= bound


@pytest.mark.parametrize("mapped", [False, True], ids=["read", "mapped"])
@pytest.mark.parametrize("kind", ["tied-shared-fairseq", "untied-sinusoidal", "lm-rope"])
def test_a_loaded_checkpoint_is_the_saved_model_with_its_ties(kind, mapped, tmp_path):
    """checkpoint.load builds the model without drawing its weights and takes the file's tensors (read, or mapped):
    every parameter and buffer equals the saved model's, a tied output layer and shared embeddings stay one
    parameter (training the loaded model moves them together), and the position tables that are not saved are
    computed. Loading draws nothing from the random stream. A mapped model written to leaves its file as it was,
    and saves (a copy of each tensor: they share the file's memory) the same names, tensors and metadata as the
    model it equals (not the same bytes: safetensors writes its metadata map in no fixed order)."""
    from helpers import WORDS, save_model, save_word_tokenizer
    from tfcli import checkpoint
    from tfcli.specials import SPECIAL_TOKENS

    v = len(SPECIAL_TOKENS) + len(WORDS)
    torch.manual_seed(0)
    if kind == "lm-rope":
        cfg = preset("toy", kind="lm", tgt_vocab_size=v, d_model=64, d_ff=128, max_len=32, positions="rope")
    else:
        tied = kind.startswith("tied")
        cfg = preset("toy", src_vocab_size=v, tgt_vocab_size=v, d_model=64, d_ff=128, max_len=32,
                     share_embeddings=tied, tie_output=tied, positions="fairseq" if tied else "sinusoidal")
    model = build_model(cfg).eval()
    ckpt = save_model(tmp_path / "ckpt", model, save_word_tokenizer(tmp_path / "tok", WORDS))
    rng = torch.get_rng_state()
    loaded, meta = checkpoint.load(ckpt, mapped=mapped)
    assert torch.equal(torch.get_rng_state(), rng)
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert all(torch.equal(a, b) for a, b in zip(model.buffers(), loaded.buffers()))
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in loaded.named_parameters()]
    assert all(p.requires_grad and not p.is_meta for p in loaded.parameters())
    if kind.startswith("tied"):
        assert loaded.lm_head.weight is loaded.decoder.embed.tok.weight is loaded.encoder.embed.tok.weight
    weights = ckpt / "model.safetensors"
    before = weights.read_bytes()
    again = checkpoint.save(tmp_path / "again", loaded, {k: v for k, v in meta.items() if k != "dir"},
                            {"src": ckpt / "tokenizer.src.json", "tgt": ckpt / "tokenizer.tgt.json"}
                            if cfg.kind == "seq2seq" else {"tgt": ckpt / "tokenizer.tgt.json"})
    assert _safetensors_content(again / "model.safetensors") == _safetensors_content(weights)
    with torch.no_grad():
        for p in loaded.parameters():
            p.add_(1.0)
    assert weights.read_bytes() == before
    assert all(torch.equal(p, q + 1.0) for p, q in zip(loaded.parameters(), model.parameters()))


def _safetensors_content(path) -> tuple[dict, dict]:
    """(metadata, {name: (dtype, shape, bytes)}) of a safetensors file."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        return f.metadata(), {k: (t.dtype, tuple(t.shape), t.numpy().tobytes()) for k, t in tensors.items()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pages given back through Linux's madvise")
def test_pages_of_a_mapped_checkpoint_are_given_back_and_written_ones_kept(tmp_path):
    """`checkpoint.paged`: on exit the pages of a mapped checkpoint's tensor leave the process (/proc/self/pagemap:
    not present) and are read again from the file when touched; a page this process wrote to is its own, and keeps
    what was written."""
    import mmap

    from safetensors.torch import save_file

    from tfcli import checkpoint

    w = torch.arange(64 * mmap.PAGESIZE // 4, dtype=torch.float32).view(64, -1)
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    t = checkpoint.read_weights(tmp_path / "w.safetensors")["w"]
    per_page = mmap.PAGESIZE // 4

    def present() -> np.ndarray:  # of each whole page of t
        first = -(-t.data_ptr() // mmap.PAGESIZE)
        n = (t.data_ptr() + t.numel() * 4) // mmap.PAGESIZE - first
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first * 8)
            return (np.frombuffer(f.read(n * 8), dtype=np.uint64) >> np.uint64(63)).astype(bool)

    with checkpoint.paged(t):
        assert present().all() and torch.equal(t, w)
    assert not present().any()
    assert torch.equal(t, w)  # read again
    t.view(-1)[10 * per_page + 5] = -1.0  # a page of its own now
    with checkpoint.paged(t):
        pass
    assert present().sum() == 1 and t.view(-1)[10 * per_page + 5] == -1.0
    want = w.clone()
    want.view(-1)[10 * per_page + 5] = -1.0
    assert torch.equal(t, want)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pages read through Linux's pagemap")
def test_rows_of_a_large_mapped_table_are_read_from_the_file(tmp_path, monkeypatch):
    """`checkpoint.rows_reader` on a mapped table of at least READ_ROWS_MIN bytes: F.embedding's rows, read from the
    file (none of the table's pages enter the process); an id out of range is an IndexError. A table this process
    wrote to, or a smaller one, is looked up in memory (the write seen)."""
    import mmap

    from safetensors.torch import save_file

    from tfcli import checkpoint

    w = torch.randn(256, mmap.PAGESIZE // 4)  # a page a row
    save_file({"w": w}, str(tmp_path / "w.safetensors"))
    t = checkpoint.read_weights(tmp_path / "w.safetensors")["w"]

    def present() -> np.ndarray:  # of each page of t
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(t.data_ptr() // mmap.PAGESIZE * 8)
            return (np.frombuffer(f.read(len(t) * 8), dtype=np.uint64) >> np.uint64(63)).astype(bool)

    monkeypatch.setattr(checkpoint, "READ_ROWS_MIN", t.numel() * 4)
    rows = checkpoint.rows_reader(t)
    ids = torch.tensor([[3, 200, 3], [0, 255, 17]])
    assert torch.equal(rows(ids), torch.nn.functional.embedding(ids, w)) and rows(ids[:, :0]).shape == (2, 0, len(w[0]))
    assert not present().any()
    with pytest.raises(IndexError):
        rows(torch.tensor([256]))
    t[7, 5] = 1.0  # a page of this process's own
    assert checkpoint.rows_reader(t)(torch.tensor([7]))[0, 5] == 1.0
    monkeypatch.setattr(checkpoint, "READ_ROWS_MIN", t.numel() * 4 + 1)
    assert torch.equal(checkpoint.rows_reader(t)(ids), torch.nn.functional.embedding(ids, t))
    assert present()[[3, 200, 0, 255, 17]].all()
