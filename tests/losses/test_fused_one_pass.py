"""The fused cross-entropy's one-pass rows and gradient (the logits overwritten
with G) against torch's unfused F.cross_entropy in float64."""

import pytest
import torch
import torch.nn.functional as F

from softk.losses import fused_linear_loss
from softk.nn import FusedLinearLoss


@pytest.mark.parametrize("loss", ["cross_entropy", "softmax"])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_one_pass_equals_torch(loss, tau, reduction):
    g = torch.Generator().manual_seed(0)
    N, H, V = 30, 6, 50
    x = torch.randn(N, H, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, H, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(V, generator=g, dtype=torch.float64, requires_grad=True)
    b.data[7] = float("-inf")  # a masked class, the target of row 3: an infinite loss
    t = torch.randint(0, V, (N,), generator=g)
    t[3], t[[4, 9]] = 7, -100
    got = fused_linear_loss(x, w, t, loss, b, tau=tau, reduction=reduction, chunk_size=8)
    want = F.cross_entropy(torch.addmm(b, x, w.t()) / tau, t, reduction=reduction)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    cot = torch.linspace(0.5, 1.5, N, dtype=torch.float64) if reduction == "none" else torch.tensor(1.0, dtype=torch.float64)
    keep = torch.isfinite(want) if reduction == "none" else None
    if reduction != "none":  # row 3's infinite loss: take the gradient of the finite rows only
        t2 = t.clone()
        t2[3] = -100
        got = fused_linear_loss(x, w, t2, loss, b, tau=tau, reduction=reduction, chunk_size=8)
        want = F.cross_entropy(torch.addmm(b, x, w.t()) / tau, t2, reduction=reduction)
    else:
        got, want, cot = got[keep], want[keep], cot[keep]
    ga = torch.autograd.grad(got, (x, w, b), cot)
    gb = torch.autograd.grad(want, (x, w, b), cot)
    for a, c in zip(ga, gb):
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-12)


def test_out_of_range_target_is_refused_on_the_one_pass():
    x, w = torch.randn(3, 2, requires_grad=True), torch.randn(5, 2)
    with pytest.raises(ValueError, match="outside"):
        FusedLinearLoss(2, 5)(x, torch.tensor([0, 5, 1]))


def test_probabilities_under_the_smallest_normal_are_exact_zeros():
    # exp of a log-probability under log(tiny) is a denormal, which the CPU's exp computes slowly: the
    # one pass makes those exact zeros (p < 1.2e-38); the other classes keep float32's softmax − e_t
    tiny = torch.finfo(torch.float32).tiny
    logits = torch.tensor([0.0, -1.0, -20.0, -80.0, -83.0, -95.0, -102.0, -110.0, -300.0, 5.0], dtype=torch.float64)
    x = torch.ones(1, 1, requires_grad=True)
    w = torch.zeros(10, 1, requires_grad=True)
    b = logits.float().requires_grad_()
    t = torch.tensor([0])
    fused_linear_loss(x, w, t, "cross_entropy", b).backward()
    p = torch.softmax(logits, 0)  # float64 reference
    want = p - F.one_hot(t[0], 10).double()
    small = p < tiny
    assert small.tolist() == [False] * 4 + [True] * 5 + [False]  # log p = logit − 5.007: -83 … -300 lie under it, -80 not
    assert (b.grad[small] == 0).all()
    # a float32 log-probability near -85 carries about 85·2⁻²⁴ of absolute error: 5e-6 relative in p
    torch.testing.assert_close(b.grad[~small].double(), want[~small], rtol=1e-5, atol=0)
