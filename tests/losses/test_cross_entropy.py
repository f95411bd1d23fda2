"""cross_entropy (torch's semantics), Su's top-k softmax CE and the margin bound,
against torch, the NumPy oracle (tests/oracle_losses.py) and the bound's algebra."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from softk import losses

from ..oracle import maps as oracle, losses as oracle_losses

SHAPES = [(5,), (4, 6), (3, 5, 2), (2, 4, 2, 3), (1, 1)]


def _cdim(shape):
    return 0 if len(shape) == 1 else 1


def _targets(rng, shape, ignore=True):
    cdim = _cdim(shape)
    t = rng.integers(0, shape[cdim], size=shape[:cdim] + shape[cdim + 1 :])
    if ignore and t.size > 1:
        t.reshape(-1)[0] = -100
    return t


# ----------------------------------------------------------- cross_entropy
@pytest.mark.parametrize("shape", SHAPES)
def test_cross_entropy_equals_torch_every_argument_combination(rng, shape):
    xn = rng.normal(size=shape) * 3
    x = torch.tensor(xn)
    n = shape[_cdim(shape)]
    t = torch.tensor(_targets(rng, shape))
    w = torch.tensor(rng.random(n) + 0.1)
    for weight, red, ls, tau in itertools.product([None, w], ["mean", "sum", "none"], [0.0, 0.2], [1.0, 0.5]):
        ours = losses.cross_entropy(x, t, weight=weight, reduction=red, label_smoothing=ls, tau=tau)
        ref = F.cross_entropy(x / tau, t, weight=weight, reduction=red, label_smoothing=ls)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)
        if not (t == -100).all():
            on = oracle_losses.cross_entropy(xn, t.numpy(), None if weight is None else w.numpy(), -100, red, ls, tau)
            np.testing.assert_allclose(ours.numpy(), on, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_cross_entropy_probability_targets(rng, shape):
    xn = rng.normal(size=shape) * 3
    cdim = _cdim(shape)
    y = rng.random(shape)
    y /= y.sum(cdim, keepdims=True)
    w = rng.random(shape[cdim]) + 0.1
    for weight, red, ls in itertools.product([None, w], ["mean", "sum", "none"], [0.0, 0.3]):
        tw = None if weight is None else torch.tensor(weight)
        ours = losses.cross_entropy(torch.tensor(xn), torch.tensor(y), weight=tw, reduction=red, label_smoothing=ls)
        ref = F.cross_entropy(torch.tensor(xn), torch.tensor(y), weight=tw, reduction=red, label_smoothing=ls)
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-10)
        np.testing.assert_allclose(ours.numpy(), oracle_losses.cross_entropy(xn, y, weight, -100, red, ls), rtol=0, atol=1e-12)


def test_cross_entropy_gradient_and_temperature(rng):
    xn = rng.normal(size=(4, 5))
    t = np.array([0, 4, 2, 2])
    for tau in (1.0, 0.25, 3.0):
        x = torch.tensor(xn, requires_grad=True)
        losses.cross_entropy(x, torch.tensor(t), reduction="sum", tau=tau).backward()
        ref = (oracle.softmax(xn, -1, tau) - np.eye(5)[t]) / tau
        np.testing.assert_allclose(x.grad.numpy(), ref, rtol=0, atol=1e-14)
    x = torch.tensor(xn, requires_grad=True)
    w = torch.tensor(rng.random(5))
    assert torch.autograd.gradcheck(lambda a: losses.cross_entropy(a, torch.tensor(t), weight=w, label_smoothing=0.1, tau=0.7), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cross_entropy_low_precision(rng, dtype):
    x = torch.tensor(rng.normal(size=(6, 7)), dtype=dtype, requires_grad=True)
    t = torch.tensor(rng.integers(0, 7, size=6))
    out = losses.cross_entropy(x, t, label_smoothing=0.1)
    assert out.dtype == dtype
    x32 = x.detach().float().requires_grad_()
    ref = F.cross_entropy(x32, t, label_smoothing=0.1)
    assert torch.equal(out, ref.to(dtype))  # computed in float32, rounded once
    out.backward()
    ref.backward()
    assert x.grad.dtype == dtype and torch.equal(x.grad, x32.grad.to(dtype))


def test_cross_entropy_edges_follow_torch():
    inf = float("inf")
    x = torch.tensor([[-inf, -inf, -inf], [0.0, -inf, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    t = torch.tensor([0, 1, 2])
    out = losses.cross_entropy(x, t, reduction="none")
    assert torch.isnan(out[0]) and out[1].item() == inf  # as torch: no distribution / masked target
    torch.testing.assert_close(out, F.cross_entropy(x, t, reduction="none"), equal_nan=True)
    assert losses.cross_entropy(x, torch.tensor([-100, -100, 2]), reduction="none")[0].item() == 0.0
    assert torch.isnan(losses.cross_entropy(x[2:], torch.tensor([-100])))  # mean over no rows
    assert losses.cross_entropy(torch.tensor([[5.0]]), torch.tensor([0])).item() == 0.0


def test_cross_entropy_bad_arguments():
    x = torch.zeros(2, 3)
    cases = [
        (lambda: losses.cross_entropy(x, torch.tensor([0, 3])), ValueError, "target holds class index 3"),
        (lambda: losses.cross_entropy(x, torch.tensor([[0, 1]])), ValueError, "target of class indices must have shape"),
        (lambda: losses.cross_entropy(x, torch.ones(2, 3)), ValueError, "target row sums"),
        (lambda: losses.cross_entropy(x, -torch.ones(2, 3)), ValueError, "target must be >= 0"),
        (lambda: losses.cross_entropy(x, torch.ones(2, 3) / 3, ignore_index=1), ValueError, "ignore_index applies"),
        (lambda: losses.cross_entropy(x, torch.tensor([0, 1]), weight=torch.ones(4)), ValueError, r"weight must be .* shape \(3,\)"),
        (lambda: losses.cross_entropy(x, torch.tensor([0, 1]), weight=[1, 1, 1]), TypeError, "weight must be"),
        (lambda: losses.cross_entropy(x, torch.tensor([0, 1]), label_smoothing=1.5), ValueError, "label_smoothing must be in"),
        (lambda: losses.cross_entropy(x, torch.tensor([0, 1]), reduction="batchmean"), ValueError, "reduction must be"),
        (lambda: losses.cross_entropy(x, torch.tensor([0, 1]), ignore_index=1.0), TypeError, "ignore_index must be an int"),
        (lambda: losses.cross_entropy(x, torch.tensor([0, 1]), tau=-1), ValueError, "tau must be"),
        (lambda: losses.cross_entropy(torch.zeros(2, 0), torch.tensor([0, 0])), ValueError, "at least one class"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()


# ------------------------------------------------- Su's top-k softmax CE
@pytest.mark.parametrize("shape", SHAPES)
def test_topk_softmax_ce_matches_oracle(rng, shape):
    xn = rng.normal(size=shape) * 2
    x = torch.tensor(xn)
    t = _targets(rng, shape)
    n = shape[_cdim(shape)]
    for k, red, tau in itertools.product(sorted({1, max(1, n // 2), n}), ["mean", "sum", "none"], [1.0, 0.5]):
        out = losses.topk_softmax_cross_entropy(x, torch.tensor(t), k, reduction=red, tau=tau)
        if (t == -100).all() and red == "mean":
            assert torch.isnan(out)
            continue
        ref = oracle_losses.topk_softmax_ce(xn, t, k, reduction=red, tau=tau)
        np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("route", ["torch", "compile", "create_graph"])
@pytest.mark.parametrize("offset", [1e4, 1e6])
def test_topk_softmax_ce_far_from_the_origin_on_every_route(rng, route, offset):
    # the tensor code formed lse(top) − z_t, two terms of the row's size:
    # 1.0 where the loss is 0.974 at an offset of 1e6 in float32
    import softk

    x = torch.tensor(offset + np.round(rng.normal(size=(5, 9)) * 16) / 16, dtype=torch.float32)  # exact in float32
    x[0, :4] = torch.tensor([offset + 0.5, offset, offset - 3, offset - 9])
    x[0, 4:] = offset - 20
    t = torch.tensor(rng.integers(0, 9, size=5))
    t[0] = 1
    xd = x.double().numpy()
    for tau in (1.0, 0.3):
        want = oracle_losses.topk_softmax_ce(xd, t.numpy(), 3, -100, "none", tau)
        xt = x.clone().requires_grad_()
        def f(v):
            return losses.topk_softmax_cross_entropy(v, t, 3, reduction="none", tau=tau)
        if route == "torch":
            with softk.use_backend("torch"):
                got = f(xt)
        elif route == "compile":
            got = torch.compile(f, backend="aot_eager", fullgraph=True)(xt)
        else:  # the gradient formed with create_graph differentiates the tensor code
            (grad,) = torch.autograd.grad(f(xt).sum(), xt, create_graph=True)
            s = xd / tau
            top = np.argsort(-s, 1)[:, :3]
            e = np.exp(np.take_along_axis(s, top, 1) - np.take_along_axis(s, top, 1).max(1, keepdims=True))
            ref = np.zeros_like(s)
            np.put_along_axis(ref, top, e / e.sum(1, keepdims=True), 1)
            ref[np.arange(5), t.numpy()] -= 1
            np.testing.assert_allclose(grad.detach().double().numpy(), ref / tau, rtol=0, atol=4e-6 / tau)
            continue
        np.testing.assert_allclose(got.detach().double().numpy(), want, rtol=4e-6, atol=4e-6)


def test_topk_softmax_ce_k_equal_c_is_cross_entropy(rng):
    x = torch.tensor(rng.normal(size=(3, 6, 4)))
    t = torch.tensor(_targets(rng, (3, 6, 4)))
    for red in ("mean", "sum", "none"):
        torch.testing.assert_close(
            losses.topk_softmax_cross_entropy(x, t, 6, reduction=red, tau=0.5),
            F.cross_entropy(x / 0.5, t, reduction=red), rtol=0, atol=1e-12,
        )


def test_topk_softmax_ce_gradient_is_topk_softmax_minus_onehot(rng):
    xn = rng.normal(size=(5, 8))
    t = np.array([0, 7, 3, 3, 1])
    k = 3
    x = torch.tensor(xn, requires_grad=True)
    losses.topk_softmax_cross_entropy(x, torch.tensor(t), k, reduction="sum").backward()
    ref = np.zeros_like(xn)
    for i, row in enumerate(xn):
        top = np.argsort(-row)[:k]
        e = np.exp(row[top] - row[top].max())
        ref[i, top] = e / e.sum()
        ref[i, t[i]] -= 1
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=0, atol=1e-14)


@given(row=st.lists(st.floats(-30, 30, allow_nan=False), min_size=1, max_size=8), data=st.data())
def test_topk_softmax_ce_nonnegative_and_monotone_in_k(row, data):
    x = torch.tensor([row], dtype=torch.float64)
    n = len(row)
    t = torch.tensor([data.draw(st.integers(0, n - 1))])
    vals = [losses.topk_softmax_cross_entropy(x, t, k).item() for k in range(1, n + 1)]
    assert all(v >= 0 for v in vals)
    assert all(b >= a for a, b in zip(vals, vals[1:]))  # the normaliser only gains terms


def test_topk_softmax_ce_bad_arguments():
    x = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="target must hold class indices"):
        losses.topk_softmax_cross_entropy(x, torch.ones(2, 3) / 3, 2)
    with pytest.raises(ValueError, match="k must be in"):
        losses.topk_softmax_cross_entropy(x, torch.tensor([0, 1]), 4)
    with pytest.raises(ValueError, match="target holds class index 5"):
        losses.topk_softmax_cross_entropy(x, torch.tensor([0, 5]), 2)


# ---------------------------------------------------------- margin bound
@pytest.mark.parametrize("n", [2, 3, 10, 1000])
@pytest.mark.parametrize("eps", [1e-4, 0.01, 0.5])
def test_margin_bound_is_attained_and_tight(n, eps):
    m = losses.cross_entropy_margin(n, eps)
    assert losses.cross_entropy_floor(n, m) == pytest.approx(eps, rel=1e-12)
    # attained: target at m, all others at 0
    x = torch.zeros(1, n, dtype=torch.float64)
    x[0, 0] = m
    assert F.cross_entropy(x, torch.tensor([0])).item() == pytest.approx(eps, rel=1e-10)


@given(row=st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=10), data=st.data())
def test_margin_bound_holds_for_any_scores(row, data):
    t = data.draw(st.integers(0, len(row) - 1))
    # cross-entropy as log1p(sum_{i != t} e^{s_i - s_t}): accurate even when tiny
    r = np.asarray(row)
    ce = math.log1p(np.exp(np.delete(r, t) - r[t]).sum())
    floor = losses.cross_entropy_floor(len(row), max(row) - min(row))
    assert ce >= floor * (1 - 1e-13)
    assert max(row) - min(row) >= losses.cross_entropy_margin(len(row), ce) - 1e-9


@pytest.mark.parametrize("n", [2, 10, 10**6])
@pytest.mark.parametrize("eps, margin", [(50.0, -700.0), (1000.0, -1000.0), (1e5, 800.0)])
def test_margin_and_floor_far_out_do_not_overflow(n, eps, margin):
    # e^ε and e^{−margin} overflow a double here; the values do not
    import mpmath

    mpmath.mp.dps = 50
    want_m = mpmath.log(n - 1) - mpmath.log(mpmath.expm1(eps))
    want_f = mpmath.log1p((n - 1) * mpmath.exp(-mpmath.mpf(margin)))
    assert losses.cross_entropy_margin(n, eps) == pytest.approx(float(want_m), rel=1e-14)
    assert losses.cross_entropy_floor(n, margin) == pytest.approx(float(want_f), rel=1e-14, abs=1e-300)


def test_margin_bad_arguments():
    with pytest.raises(ValueError, match="num_classes must be >= 2"):
        losses.cross_entropy_margin(1, 0.1)
    with pytest.raises(ValueError, match="loss must be a finite number > 0"):
        losses.cross_entropy_margin(3, 0.0)
    with pytest.raises(TypeError, match="num_classes must be an int"):
        losses.cross_entropy_margin(3.0, 0.1)
    assert losses.cross_entropy_margin(4, math.log(4)) == pytest.approx(0.0, abs=1e-15)
