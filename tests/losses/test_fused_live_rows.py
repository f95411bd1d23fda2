"""The fused sparsemax and 1.5-entmax losses on the CPU form each chunk's rows
and the gradient's live columns from the support (softk.losses._fy_live):
values and gradients against the entmax package's losses in float64 on the
materialised logits, with τ, ignored rows, row weights from the reduction,
far-from-origin logits and float32."""

import entmax
import pytest
import torch


from softk.losses import fused_linear_loss
from softk.losses._registry import LOSSES

REF = {"sparsemax": entmax.sparsemax_loss, "entmax15": entmax.entmax15_loss}


@pytest.fixture
def live_calls(monkeypatch):
    calls = []
    for loss in REF:
        real = LOSSES[loss].live_in_place

        def spy(o, real=real):
            f = real(o)
            return lambda z, t, w: calls.append(z.shape[0]) or f(z, t, w)

        monkeypatch.setitem(LOSSES, loss, LOSSES[loss]._replace(live_in_place=spy))
    return calls


def reference(x, w, b, y, loss, tau, reduction):
    keep = y != -100
    rows = torch.zeros(len(y), dtype=torch.float64)
    rows[keep] = REF[loss]((x.double() @ w.double().t() + b.double())[keep] / tau, y[keep])
    return {"none": rows, "sum": rows.sum(), "mean": rows.sum() / keep.sum()}[reduction]


@pytest.mark.parametrize("loss", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("tau", [1.0, 0.7])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("offset", [0.0, 1e4])
def test_live_rows_match_the_entmax_package(live_calls, loss, tau, reduction, offset):
    g = torch.Generator().manual_seed(1)
    V, H, N = 200, 8, 23
    w = torch.randn(V, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (N,), generator=g)
    x = w[y] * 2 + torch.randn(N, H, generator=g, dtype=torch.float64)  # supports of a few classes
    y[[4, 9]] = -100
    b = torch.randn(V, generator=g, dtype=torch.float64) * 0.1 + offset  # logits around the offset
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = fused_linear_loss(leaves[0], leaves[1], y, loss, leaves[2], reduction=reduction, tau=tau, chunk_size=5)
    refs = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = reference(*refs, y, loss, tau, reduction)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=torch.float64).reshape(out.shape)
    for a, e in zip(torch.autograd.grad(out, leaves, go), torch.autograd.grad(ref, refs, go)):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-10)
    # every chunk took the support's form, in the forward or (for "none", whose
    # row weights are the backward's) in the backward: the 21 kept rows in chunks of 5
    assert live_calls == [5, 5, 5, 5, 1]


@pytest.mark.parametrize("loss", ["sparsemax", "entmax15"])
def test_live_rows_in_float32(live_calls, loss):
    # float32 products and maps against float64 on the same inputs: to float32's
    # rounding of logits of size ~10
    g = torch.Generator().manual_seed(2)
    V, H, N = 300, 16, 12
    w = torch.randn(V, H, generator=g, dtype=torch.float64)
    y = torch.randint(0, V, (N,), generator=g)
    x = w[y] + torch.randn(N, H, generator=g, dtype=torch.float64) * 0.5
    leaves = [x.float().requires_grad_(), w.float().requires_grad_()]
    out = fused_linear_loss(*leaves, y, loss, reduction="sum", chunk_size=4)
    assert live_calls
    refs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
    ref = reference(refs[0], refs[1], torch.zeros(V, dtype=torch.float64), y, loss, 1.0, "sum")
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for a, e in zip(torch.autograd.grad(out, leaves), torch.autograd.grad(ref, refs)):
        torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4)


def test_ignored_rows_get_no_gradient(live_calls):
    w = torch.randn(50, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([3, 7, -100, -100, -100, 1])
    out = fused_linear_loss(x, w, y, "sparsemax", reduction="sum", chunk_size=3)
    out.backward()
    assert live_calls == [3]  # the ignored rows leave before the products
    assert (x.grad[2:5] == 0).all() and x.grad[0].abs().sum() > 0
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    keep = y != -100
    entmax.sparsemax_loss((ref_x @ ref_w.t())[keep], y[keep]).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(w.grad, ref_w.grad, rtol=1e-12, atol=1e-12)
