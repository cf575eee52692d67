"""The CPU dropout: Bernoulli(1 - p) masks scaled by 1 / (1 - p), drawn from torch's generator."""

import pytest
import torch

from tfcli.model.dropout import Dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_mask_keeps_one_minus_p_and_scales(p):
    torch.manual_seed(0)
    n = 1_000_000
    m = keep_mask(torch.Size([n]), p, torch.float32, torch.device("cpu"))
    kept = m != 0
    # binomial: std of the kept fraction is sqrt(p (1 - p) / n) < 5e-4
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=2.5e-3)
    assert torch.all(m[kept] == 1 / (1 - p))
    assert m.mean().item() == pytest.approx(1.0, abs=3e-3)  # E[mask] = 1: no change in expectation
    # neighbours are independent: P(both kept) = (1 - p)^2
    both = (kept[0::2] & kept[1::2]).float().mean().item()
    assert both == pytest.approx((1 - p) ** 2, abs=3e-3)


def test_module_train_eval_gradient_and_determinism():
    drop = Dropout(0.25)
    x = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(1)
    y = drop(x)
    torch.manual_seed(1)
    assert torch.equal(drop(x), y)  # the global generator decides: seeding reproduces it
    assert not torch.equal(drop(x), y)  # and the next call draws anew
    y.sum().backward()
    mask = y.detach() / x.detach()
    torch.testing.assert_close(x.grad, mask)  # d(x * mask)/dx = mask
    drop.eval()
    assert drop(x) is x
    assert Dropout(0.0).train()(x) is x
    assert Dropout(0.1).state_dict() == torch.nn.Dropout(0.1).state_dict() == {}
