"""train.optimizer muon (tfcli/train/optim.py): Newton-Schulz orthogonalisation, which parameters Muon takes, and
its AdamW half against torch's AdamW. Exact resume with Muon: tests/test_train.py."""

from __future__ import annotations

import pytest
import torch

from tfcli.model.config import preset
from tfcli.model.transformer import build_model
from tfcli.train.optim import MuonAdamW, muon_parameters, newton_schulz


@pytest.mark.parametrize("shape", [(16, 16), (48, 16), (16, 40)])
def test_newton_schulz_flattens_the_singular_values_and_keeps_the_singular_vectors(shape):
    """NS5(U S V^T) = U S' V^T with every S' near 1 (the quintic's fixed band is about [0.7, 1.2])."""
    torch.manual_seed(0)
    g = torch.randn(*shape, dtype=torch.float64).float()
    x = newton_schulz(g)
    u, s, vt = torch.linalg.svd(g, full_matrices=False)
    s_new = torch.linalg.svdvals(x)
    assert x.shape == g.shape
    assert s_new.min() > 0.6 and s_new.max() < 1.25
    # the same singular vectors: U^T X V is diagonal (up to the small rounding)
    inner = u.T @ x @ vt.T
    off = inner - torch.diag(torch.diagonal(inner))
    assert off.abs().max() < 1e-3
    assert (torch.diagonal(inner) > 0).all()


def test_muon_takes_the_layers_matrices_and_leaves_the_rest_to_adamw():
    model = build_model(preset("toy", src_vocab_size=12, tgt_vocab_size=12, tie_output=False, activation="swiglu"))
    muon = muon_parameters(model)
    names = {name for name, p in model.named_parameters() if id(p) in muon}
    assert names and all(".layers." in f".{n}" and n.endswith("weight") for n in names)
    assert any("w3" in n for n in names) and any("qkv_proj" in n for n in names)
    others = {name for name, p in model.named_parameters() if id(p) not in muon}
    assert {"lm_head.weight"} <= others and any("embed.tok" in n for n in others)
    assert not any(n.endswith("bias") or "norm" in n for n in names)


def test_the_adamw_half_is_torchs_adamw():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(6, 5), torch.nn.Linear(6, 5)
    b.load_state_dict(a.state_dict())
    ours = MuonAdamW([{"params": a.parameters(), "weight_decay": 0.1}], lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
    ref = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    for _ in range(5):
        x = torch.randn(4, 6)
        for m, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            m(x).square().sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_a_muon_step_is_the_orthogonalised_nesterov_momentum():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(8, 4))
    opt = MuonAdamW([{"params": [w], "muon": True, "lr_scale": 2.0}], lr=0.01, momentum=0.9)
    before = w.detach().clone()
    g1, g2 = torch.randn(8, 4), torch.randn(8, 4)
    w.grad = g1.clone()
    opt.step()
    want = before - 0.01 * 2.0 * 2 ** 0.5 * newton_schulz(g1 + 0.9 * g1)  # m = g1; u = g1 + mu m; sqrt(8/4)
    torch.testing.assert_close(w.detach(), want, atol=1e-6, rtol=1e-6)
    w.grad = g2.clone()
    opt.step()
    m = 0.9 * g1 + g2
    want = want - 0.01 * 2.0 * 2 ** 0.5 * newton_schulz(g2 + 0.9 * m)
    torch.testing.assert_close(w.detach(), want, atol=1e-6, rtol=1e-6)


def test_a_fused_projection_is_orthogonalised_one_projection_at_a_time():
    """[q; k; v] (self-attention) and [k; v] (cross-attention) are each one weight; Muon updates each projection's
    rows as it would the unfused matrix: NS5 of its own block, scaled by its own shape."""
    cfg = preset("toy", src_vocab_size=12, tgt_vocab_size=12, n_kv_head=1)
    model = build_model(cfg)
    blocks = muon_parameters(model)
    by_name = {name: blocks[id(p)] for name, p in model.named_parameters() if id(p) in blocks}
    d, d_kv = cfg.d_model, cfg.d_head  # one key/value head
    assert by_name["encoder.layers.0.self_attn.qkv_proj.weight"] == (d, d_kv, d_kv)
    assert by_name["decoder.layers.0.cross_attn.kv_proj.weight"] == (d_kv, d_kv)
    assert by_name["decoder.layers.0.cross_attn.q_proj.weight"] == (d,)
    assert by_name["encoder.layers.0.ffn.w1.weight"] == (cfg.d_ff,)

    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(12, 4))
    opt = MuonAdamW([{"params": [w], "muon": True, "weight_decay": 0.1}], lr=0.01, momentum=0.9,
                    blocks={id(w): (4, 8)})
    before, g = w.detach().clone(), torch.randn(12, 4)
    w.grad = g.clone()
    opt.step()
    u = g + 0.9 * g
    for rows, got, old, u_i in zip((4, 8), w.detach().split((4, 8)), before.split((4, 8)), u.split((4, 8))):
        lr = 0.01 * max(1.0, rows / 4) ** 0.5
        torch.testing.assert_close(got, old * (1 - lr * 0.1) - lr * newton_schulz(u_i), atol=1e-6, rtol=1e-6)
