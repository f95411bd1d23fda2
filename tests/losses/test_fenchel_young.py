"""Fenchel–Young losses (softk.losses) against the NumPy oracle, the entmax
package, autograd identities and the properties the maths promises."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import softk
from softk import losses

from ..oracle import maps as oracle, losses as oracle_losses

SHAPES = [(7,), (3, 9), (4, 6, 5), (1, 1), (2, 1)]
K1 = [  # (softk loss, oracle family name, alpha)
    (losses.softmax_loss, "softmax", None),
    (losses.sparsemax_loss, "sparsemax", None),
    (losses.entmax15_loss, "entmax", 1.5),
    (lambda *a, **kw: losses.entmax_loss(*a, alpha=1.3, **kw), "entmax", 1.3),
    (lambda *a, **kw: losses.entmax_loss(*a, alpha=2.5, **kw), "entmax", 2.5),
]
METHODS = ["exp", "sigmoid", "laplace", "sparse"]
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _cdim(shape):
    return 0 if len(shape) == 1 else 1


def _index_target(rng, shape):
    cdim = _cdim(shape)
    tshape = shape[:cdim] + shape[cdim + 1 :]
    return rng.integers(0, shape[cdim], size=tshape)


def _dist_target(rng, shape, sparse=True):
    y = rng.random(shape) * (rng.random(shape) < 0.5 if sparse else 1.0)
    cdim = _cdim(shape)
    y = y + (y.sum(cdim, keepdims=True) == 0) * 1.0  # no all-zero row
    return y / y.sum(cdim, keepdims=True)


def _close(out, ref, dtype, rel=0.0):
    out = out.detach().double().numpy()
    np.testing.assert_allclose(out, ref, rtol=max(rel, TOL[dtype] if dtype == torch.float32 else 0), atol=TOL[dtype])


# ------------------------------------------------------------------ the oracle
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("tau", [1.0, 0.4])
def test_k1_losses_match_oracle(rng, dtype, shape, tau):
    xn = rng.normal(size=shape) * 2
    x = torch.tensor(xn, dtype=dtype)
    t = _index_target(rng, shape)
    y = _dist_target(rng, shape)
    onehot = oracle_losses.one_hot(t, shape[_cdim(shape)], _cdim(shape))
    for fn, name, alpha in K1:
        ref_t = oracle_losses.fy_loss(name, xn, onehot, 1, tau, alpha)
        ref_y = oracle_losses.fy_loss(name, xn, y, 1, tau, alpha)
        _close(fn(x, torch.tensor(t), reduction="none", tau=tau), ref_t, dtype)
        _close(fn(x, torch.tensor(y, dtype=dtype), reduction="none", tau=tau), ref_y, dtype)
        _close(fn(x, torch.tensor(y, dtype=dtype), reduction="sum", tau=tau), ref_y.sum(), dtype)
        _close(fn(x, torch.tensor(t), tau=tau), ref_t.mean(), dtype)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", [(6,), (3, 8), (2, 5, 3)])
def test_soft_topk_loss_matches_oracle(rng, method, shape):
    xn = rng.normal(size=shape) * 2
    x = torch.tensor(xn)
    cdim, n = _cdim(shape), shape[_cdim(shape)]
    for k in sorted({1, n // 2, n - 1}):
        # a multi-hot target with k ones, and a soft point of the capped simplex
        multi = (np.argsort(np.argsort(rng.random(shape), axis=cdim), axis=cdim) < k) * 1.0
        soft = oracle.soft_topk(rng.normal(size=shape), k, cdim, 1.0, "sigmoid")
        for y in (multi, soft):
            for tau in (1.0, 0.5):
                ref = oracle_losses.fy_loss(method, xn, y, k, tau)
                out = losses.soft_topk_loss(x, torch.tensor(y), k, method, tau, reduction="none")
                _close(out, ref, torch.float64)


def test_soft_topk_loss_k1_is_softmax_and_sparsemax_loss(rng):
    x = torch.tensor(rng.normal(size=(5, 7)))
    y = torch.tensor(_dist_target(rng, (5, 7)))
    kw = dict(reduction="none")
    torch.testing.assert_close(losses.soft_topk_loss(x, y, 1, "exp", **kw), losses.softmax_loss(x, y, **kw), rtol=0, atol=1e-13)
    torch.testing.assert_close(losses.soft_topk_loss(x, y, 1, "sparse", **kw), losses.sparsemax_loss(x, y, **kw), rtol=0, atol=1e-13)


def test_softmax_loss_is_kl_to_softmax(rng):
    """Closed form: L = KL(y || softmax(x)), in float64 from scipy-free NumPy."""
    xn, y = rng.normal(size=(4, 6)) * 3, _dist_target(rng, (4, 6))
    logp = xn - np.log(np.exp(xn).sum(1, keepdims=True))
    kl = (oracle_losses._xlogx(y) - y * logp).sum(1)
    out = losses.softmax_loss(torch.tensor(xn), torch.tensor(y), reduction="none")
    np.testing.assert_allclose(out.numpy(), kl, rtol=0, atol=1e-13)


def test_large_scores_keep_relative_precision(rng):
    """mpmath reference at 50 digits: the loss is exact to a few ulps even when
    scores are in the hundreds (the row is shifted so its max is 0)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    x = rng.normal(size=(20, 30)) * 300
    t = rng.integers(0, 30, size=20)
    ref = np.array([float(mpmath.log(mpmath.fsum(mpmath.exp(mpmath.mpf(v)) for v in r)) - mpmath.mpf(r[i])) for r, i in zip(x, t)])
    out = losses.softmax_loss(torch.tensor(x), torch.tensor(t), reduction="none").numpy()
    np.testing.assert_allclose(out, ref, rtol=4e-16, atol=1e-15)


# ---------------------------------------------------------- the entmax package
def test_agrees_with_entmax_package(rng):
    entmax = pytest.importorskip("entmax")
    x = torch.tensor(rng.normal(size=(6, 9)) * 2)
    t = torch.tensor(rng.integers(0, 9, size=6))
    for ours, theirs, tol in [
        (losses.sparsemax_loss(x, t, reduction="none"), entmax.sparsemax_loss(x, t), 1e-12),
        (losses.entmax15_loss(x, t, reduction="none"), entmax.entmax15_loss(x, t), 1e-12),
        (losses.entmax_loss(x, t, alpha=1.5, reduction="none"), entmax.entmax15_loss(x, t), 1e-12),
        # entmax_bisect_loss runs a fixed number of bisection steps (n_iter)
        (losses.entmax_loss(x, t, alpha=1.7, reduction="none"), entmax.entmax_bisect_loss(x, t, 1.7, 100), 1e-10),
        (losses.entmax_loss(x, t, alpha=1.25, reduction="none"), entmax.entmax_bisect_loss(x, t, 1.25, 100), 1e-10),
    ]:
        torch.testing.assert_close(ours, theirs, rtol=0, atol=tol)


# ------------------------------------------------------------- the gradient
def _oracle_map(name, xn, k, tau, alpha=None):
    cdim = _cdim(xn.shape)
    if name == "softmax":
        return oracle.softmax(xn, cdim, tau)
    if name == "sparsemax":
        return oracle.sparsemax(xn, cdim, tau)
    if name == "entmax":
        return oracle.entmax(xn, alpha, cdim, tau)
    return oracle.soft_topk(xn, k, cdim, tau, name)


@pytest.mark.parametrize("tau", [1.0, 0.3])
def test_gradient_is_p_minus_y_over_tau(rng, tau):
    shape = (3, 7, 2)
    xn = rng.normal(size=shape) * 2
    cases = [(fn, name, alpha, 1, _dist_target(rng, shape)) for fn, name, alpha in K1]
    cases += [(fn, name, alpha, 1, oracle_losses.one_hot(_index_target(rng, shape), 7, 1)) for fn, name, alpha in K1]
    for m in METHODS:
        for k in (1, 3, 6):
            y = oracle.soft_topk(rng.normal(size=shape), k, 1, 1.0, "sigmoid")
            cases.append((lambda x, y, k=k, m=m, **kw: losses.soft_topk_loss(x, y, k, m, **kw), m, None, k, y))
    for fn, name, alpha, k, y in cases:
        x = torch.tensor(xn, requires_grad=True)
        fn(x, torch.tensor(y), reduction="sum", tau=tau).backward()
        ref = (_oracle_map(name, xn, k, tau, alpha) - y) / tau
        np.testing.assert_allclose(x.grad.numpy(), ref, rtol=0, atol=1e-11, err_msg=f"{name} k={k}")


def test_gradient_with_class_index_target_and_mean(rng):
    xn = rng.normal(size=(5, 4))
    t = np.array([0, 3, -100, 1, 3])
    x = torch.tensor(xn, requires_grad=True)
    losses.sparsemax_loss(x, torch.tensor(t)).backward()
    keep = t != -100
    ref = (oracle.sparsemax(xn) - oracle_losses.one_hot(t, 4, 1)) * keep[:, None] / keep.sum()
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=0, atol=1e-13)


def test_gradcheck_float64(rng):
    x = torch.tensor(rng.normal(size=(3, 5)), requires_grad=True)
    y = torch.tensor(_dist_target(rng, (3, 5), sparse=False))
    t = torch.tensor([1, 4, 0])
    for fn, _, _ in K1:
        assert torch.autograd.gradcheck(lambda a: fn(a, y, reduction="none", tau=0.7), (x,))
        assert torch.autograd.gradcheck(lambda a: fn(a, t, reduction="none"), (x,))
    ys = torch.tensor(oracle.soft_topk(rng.normal(size=(3, 5)), 2, 1, 1.0, "sigmoid"))
    for m in METHODS:
        assert torch.autograd.gradcheck(lambda a: losses.soft_topk_loss(a, ys, 2, m, reduction="none"), (x,))


# ------------------------------------------------------------ properties
finite_rows = st.lists(st.floats(-20, 20, allow_nan=False), min_size=1, max_size=8)


@given(row=finite_rows, data=st.data())
def test_nonnegative_and_zero_at_own_output(row, data):
    x = torch.tensor([row], dtype=torch.float64)
    n = len(row)
    for fn, name, alpha in K1:
        t = data.draw(st.integers(0, n - 1))
        assert fn(x, torch.tensor([t])).item() >= 0
        p = _oracle_map(name, x.numpy(), 1, 1.0, alpha)
        assert fn(x, torch.tensor(p)).item() >= 0
        # the map's own output as target: loss 0 (up to rounding of p's sum)
        own = {"softmax": softk.softmax, "sparsemax": softk.sparsemax}.get(name) or (
            lambda a, dim, alpha=alpha: softk.entmax(a, alpha, dim)
        )
        assert fn(x, own(x, dim=1)).item() <= 1e-12
    k = data.draw(st.integers(1, n))
    for m in METHODS:
        p = softk.soft_topk(x, k, dim=1, method=m)
        assert losses.soft_topk_loss(x, p, k, m).item() <= 1e-12
        y = torch.tensor(oracle.soft_topk(np.array([row])[:, ::-1].copy(), k, 1, 1.0, "sparse"))
        assert losses.soft_topk_loss(x, y, k, m).item() >= 0


@given(row=finite_rows, shift=st.floats(-50, 50))
def test_shift_invariance(row, shift):
    x = torch.tensor([row], dtype=torch.float64)
    t = torch.tensor([len(row) - 1])
    for fn, _, _ in K1:
        a, b = fn(x, t).item(), fn(x + shift, t).item()
        assert abs(a - b) <= 1e-9 * (1 + abs(a))


# ------------------------------------------------------------ edge cases
def test_ties_masks_and_small_rows():
    x = torch.tensor([[1.0, 1.0, 1.0, float("-inf")], [2.0, float("-inf"), float("-inf"), float("-inf")]], dtype=torch.float64)
    # ties: softmax and sparsemax both give uniform 1/3 on the finite entries
    for fn in (losses.softmax_loss, losses.sparsemax_loss, losses.entmax15_loss):
        out = fn(x, torch.tensor([0, 0]), reduction="none")
        assert out[1].item() == 0.0  # single finite entry: p = e_0 = target
        ref = oracle_losses.fy_loss({losses.softmax_loss: "softmax", losses.sparsemax_loss: "sparsemax"}.get(fn, "entmax"), x[:1].numpy(), np.eye(4)[[0]], alpha=1.5)
        np.testing.assert_allclose(out[0].item(), ref[0], rtol=0, atol=1e-13)
        # a target on a masked class is infinitely wrong
        assert fn(x, torch.tensor([3, 1]), reduction="none").tolist() == [float("inf")] * 2
    # a fully masked row cannot match any distribution
    full = torch.full((1, 3), float("-inf"), dtype=torch.float64)
    assert losses.sparsemax_loss(full, torch.tensor([1])).item() == float("inf")
    # NaN stays in its row
    out = losses.softmax_loss(torch.tensor([[0.0, float("nan")], [0.0, 1.0]]), torch.tensor([0, 1]), reduction="none")
    assert torch.isnan(out[0]) and torch.isfinite(out[1])
    y = torch.tensor([[1.0, 0, 1], [1, 1, 0]], dtype=torch.float64)
    for m in METHODS:  # sigmoid's psi reads a NaN p as 0: the row must still be NaN
        for bad in (float("nan"), float("inf")):
            x = torch.tensor([[0.0, bad, 1.0], [0, 1, 2]], dtype=torch.float64)
            out = losses.soft_topk_loss(x, y, 2, m, reduction="none")
            assert torch.isnan(out[0]) and torch.isfinite(out[1]), m


def test_size_one_and_1d_input():
    assert losses.sparsemax_loss(torch.tensor([[3.0]]), torch.tensor([0])).item() == 0.0
    x = torch.tensor([0.0, 0.0], dtype=torch.float64)
    out = losses.sparsemax_loss(x, torch.tensor(1), reduction="none")
    assert out.shape == () and out.item() == 0.25
    assert losses.softmax_loss(x, torch.tensor([0.5, 0.5])).item() == 0.0


def test_ignore_index_semantics():
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    t = torch.tensor([1, -1, 0])
    none = losses.sparsemax_loss(x, t, ignore_index=-1, reduction="none")
    assert none[1].item() == 0.0
    mean = losses.sparsemax_loss(x, t, ignore_index=-1)
    assert mean.item() == pytest.approx((none[0] + none[2]).item() / 2, abs=1e-15)
    mean.backward()
    assert x.grad[1].abs().sum().item() == 0.0
    all_ignored = losses.softmax_loss(x, torch.full((3,), -100))
    assert torch.isnan(all_ignored)  # 0 / 0, as in torch.nn.functional.cross_entropy


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_computed_in_float32(rng, dtype):
    x = torch.tensor(rng.normal(size=(4, 6)), dtype=dtype, requires_grad=True)
    y = torch.tensor(_dist_target(rng, (4, 6)), dtype=dtype)
    y = y / y.float().sum(1, keepdim=True).to(dtype)  # rows sum to 1 within half rounding
    out = losses.entmax15_loss(x, y, reduction="none")
    assert out.dtype == dtype
    x32 = x.detach().float().requires_grad_()
    ref = losses.entmax15_loss(x32, y, reduction="none")
    assert torch.equal(out, ref.to(dtype))
    out.sum().backward()
    ref.sum().backward()
    assert x.grad.dtype == dtype and torch.equal(x.grad, x32.grad.to(dtype))


# ------------------------------------------------------------ bad input
def test_errors_name_the_target():
    x = torch.zeros(2, 3)
    cases = [
        (lambda: losses.softmax_loss(x, torch.tensor([0, 3])), ValueError, "target holds class index 3"),
        (lambda: losses.softmax_loss(x, torch.tensor([0, -2])), ValueError, "target holds class index -2"),
        (lambda: losses.softmax_loss(x, torch.tensor([0, 1, 2])), ValueError, "target of class indices must have shape"),
        (lambda: losses.softmax_loss(x, torch.ones(2, 4) / 4), ValueError, "target of probabilities must have"),
        (lambda: losses.sparsemax_loss(x, torch.tensor([[1.0, 1, 0], [0, 1, 1]])), ValueError, r"target / target.sum\(dim=1, keepdim=True\)"),
        (lambda: losses.sparsemax_loss(x, torch.tensor([[1.5, -0.5, 0], [0, 1, 0]])), ValueError, "target must be >= 0"),
        (lambda: losses.sparsemax_loss(x, torch.tensor([[float("nan"), 1, 0]] * 2)), ValueError, "target must be finite"),
        (lambda: losses.sparsemax_loss(x, torch.tensor([[True, False, False]] * 2)), TypeError, "target is a bool tensor"),
        (lambda: losses.sparsemax_loss(x, [0, 1]), TypeError, "target must be a torch.Tensor"),
        (lambda: losses.sparsemax_loss(x, torch.ones(2, 3).requires_grad_() / 3), ValueError, "target requires grad"),
        (lambda: losses.sparsemax_loss(x, torch.ones(2, 3) / 3, ignore_index=0), ValueError, "ignore_index applies"),
        (lambda: losses.sparsemax_loss(x, torch.tensor([0, 1]), reduction="avg"), ValueError, "reduction must be one of"),
        (lambda: losses.sparsemax_loss(x, torch.tensor([0, 1]), tau=0), ValueError, "tau must be"),
        (lambda: losses.sparsemax_loss(x.long(), torch.tensor([0, 1])), TypeError, "input must be a floating-point"),
        (lambda: losses.entmax_loss(x, torch.tensor([0, 1]), alpha=0.5), ValueError, "alpha must be"),
        (lambda: losses.entmax_loss(x, torch.tensor([0, 1]), alpha="1.5"), TypeError, "alpha must be"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([[1.0, 1, 0]] * 2), k=1), ValueError, "rows must sum to k=1|summing to 1"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([[1.0, 1, 0]] * 2), k=3), ValueError, "rows must sum to k=3"),
        # a float k travels as a per-row tensor: the message still names its value
        (lambda: losses.soft_topk_loss(x, torch.tensor([[1.0, 1, 0]] * 2), k=2.5), ValueError, r"rows must sum to k=2\.5: every row sums to 2"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([[1.0, 1, 0]] * 2), k=torch.tensor([[1.5], [2.5]])), ValueError, "rows must sum to each row's k"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([[2.0, 0, 0]] * 2), k=2), ValueError, r"entries must lie in \[0, 1\]"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([0, 1]), k=2), TypeError, "target must be a float tensor"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([[1.0, 1, 0]] * 2), k=4), ValueError, "k must be in"),
        (lambda: losses.soft_topk_loss(x, torch.tensor([[1.0, 1, 0]] * 2), k=2, method="max"), ValueError, "method must be"),
        (lambda: losses.fenchel_young_loss(x, torch.tensor([0, 1]), softk.threshold.EXP, k=2), ValueError, "only meaningful for k = 1"),
        (lambda: losses.fenchel_young_loss(x, torch.ones(2, 3) * 2 / 3, softk.threshold.SPARSEMAX, k=2), ValueError, "k = 1 only"),
        (lambda: losses.fenchel_young_loss(x, torch.tensor([0, 1]), "sparsemax"), TypeError, "family must be"),
    ]
    for call, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            call()


def test_normalised_multi_hot_is_accepted(rng):
    """The documented fix for the refused multi-hot target works (float32 rounding)."""
    y = torch.tensor(rng.random((5, 13)) < 0.4, dtype=torch.float32)
    y[:, 0] = 1
    x = torch.randn(5, 13)
    out = losses.sparsemax_loss(x, y / y.sum(dim=1, keepdim=True), reduction="none")
    ref = oracle_losses.fy_loss("sparsemax", x.double().numpy(), (y / y.sum(1, keepdim=True)).double().numpy())
    np.testing.assert_allclose(out.double().numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss", [losses.softmax_loss, losses.sparsemax_loss, losses.cross_entropy])
def test_float32_normalised_target_cast_to_float64_is_accepted(loss):
    # The usual way a float64 model gets its labels: normalised in float32,
    # then cast.  Its rows are off by float32 rounding (here up to ~1e-7),
    # far more than float64's sqrt(eps) = 1.5e-8, yet they are distributions.
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 1000, dtype=torch.float64, generator=g)
    y32 = torch.rand(4, 1000, generator=g)
    y = (y32 / y32.sum(1, keepdim=True)).double()
    assert float((y.sum(1) - 1).abs().max()) > 1.5e-8  # the case is the one described
    value = loss(x, y, reduction="none")
    yn = y / y.sum(1, keepdim=True)  # the same target renormalised in float64
    torch.testing.assert_close(value, loss(x, yn, reduction="none"), rtol=1e-5, atol=1e-6)
    # a target that is really off (0.1 %) is still refused
    with pytest.raises(ValueError, match="row sums"):
        loss(x, y * 1.001)
