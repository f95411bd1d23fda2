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
