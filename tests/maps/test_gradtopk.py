"""GradTopK (soft_topk(method="grad")): exactness against mpmath and subset
enumeration, stability where the seed's recursion breaks, the explicit HVP
backward against finite differences.  Every test runs once per algorithm (the
sequential scan and the tree, forced through softk._ops.gradtopk.ALGORITHM); the algorithms'
own tests are in tests/maps/test_gradtopk_tree.py."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import softk

from ..oracle import topk as ref


@pytest.fixture(autouse=True, scope="module", params=["scan", "tree"])
def algorithm(request):
    # module scope: the hypothesis test below may not take a function-scoped fixture
    from softk._ops import gradtopk

    saved, gradtopk.ALGORITHM = gradtopk.ALGORITHM, request.param
    yield request.param
    gradtopk.ALGORITHM = saved


def _grad(x, k, tau=1.0, dim=-1):
    return softk.soft_topk(x, k, dim=dim, tau=tau, method="grad")


# ------------------------------------------------------------------ exactness


@pytest.mark.parametrize("n,k", [(1, 1), (2, 1), (5, 2), (6, 3), (7, 6), (8, 4)])
def test_matches_subset_enumeration(rng, n, k):
    x = rng.normal(size=(3, n)) * 2
    out = _grad(torch.tensor(x), k, tau=0.7).numpy()
    for r in range(3):
        expect = ref.gradtopk_brute(x[r], k, 0.7) if n > k else np.ones(n)
        np.testing.assert_allclose(out[r], expect, rtol=0, atol=1e-13)


def test_float64_within_1e9_of_mpmath_at_large_scale(rng):
    # The accuracy case: n = 100, k = 50, x ~ N(0, 1)·30.
    x = rng.normal(size=(2, 100)) * 30
    out = _grad(torch.tensor(x), 50).numpy()
    np.testing.assert_allclose(out, ref.gradtopk(x, 50), rtol=0, atol=1e-9)


def test_float32_accumulates_in_float64(rng):
    # n = 200, k = 40, x ~ N(0, 1)·50: a float32 recurrence drifts to ~1e-2 here.
    x32 = torch.tensor(rng.normal(size=(2, 200)) * 50, dtype=torch.float32)
    out = _grad(x32, 40)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    np.testing.assert_allclose(out.double().sum(-1).numpy(), 40.0, rtol=0, atol=1e-3)
    expect = ref.gradtopk(x32.double().numpy(), 40)
    np.testing.assert_allclose(out.double().numpy(), expect, rtol=0, atol=1e-3)


@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 6), -1), ((4, 5, 3), 1), ((5, 2, 3), 0)])
def test_any_shape_and_dim_against_mpmath(rng, shape, dim):
    x = rng.normal(size=shape) * 3
    n = shape[dim]
    for k in sorted({1, max(1, n // 2), n}):
        out = _grad(torch.tensor(x), k, tau=0.5, dim=dim).numpy()
        np.testing.assert_allclose(out, ref.gradtopk(x, k, dim, 0.5), rtol=0, atol=1e-12)


def test_k1_is_softmax(rng):
    x = torch.tensor(rng.normal(size=(4, 9)) * 5)
    torch.testing.assert_close(_grad(x, 1, tau=0.3), softk.softmax(x, tau=0.3), rtol=0, atol=1e-14)


def test_small_tau_gives_hard_topk(rng):
    x = torch.tensor(np.stack([rng.permutation(10) for _ in range(3)]), dtype=torch.float64)
    for k in (1, 3, 9):
        out = _grad(x, k, tau=0.01)
        torch.testing.assert_close(out, softk.hard_topk(x, k), rtol=0, atol=1e-40)


# ---------------------------------------------------------- row conventions


def test_masks_ties_and_degenerate_rows():
    inf = float("inf")
    x = torch.tensor(
        [
            [1.0, -inf, 2.0, 0.5, -inf],  # masked entries are dropped
            [-inf, -inf, 3.0, -inf, 1.0],  # m = k finite: p = 1 there
            [-inf] * 5,  # fully masked
            [2.0, 2.0, 2.0, 2.0, 2.0],  # ties: every subset equally likely
            [1.0, float("nan"), 0.0, 0.0, 0.0],  # NaN row
            [1.0, inf, 0.0, 0.0, 0.0],  # +inf row
        ],
        dtype=torch.float64,
    )
    out = _grad(x, 2)
    np.testing.assert_allclose(out[0, [0, 2, 3]].numpy(), ref.gradtopk_brute([1.0, 2.0, 0.5], 2), atol=1e-14)
    assert out[0, 1] == 0 and out[0, 4] == 0
    assert out[1].tolist() == [0.0, 0.0, 1.0, 0.0, 1.0]
    assert out[2].tolist() == [0.0] * 5
    torch.testing.assert_close(out[3], torch.full((5,), 0.4, dtype=torch.float64), rtol=0, atol=1e-15)
    assert torch.isnan(out[4]).all() and torch.isnan(out[5]).all()


def test_empty_and_size_one():
    assert _grad(torch.zeros(0, 4), 2).shape == (0, 4)
    assert _grad(torch.tensor([3.0]), 1).tolist() == [1.0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_dtypes(rng, dtype):
    x = torch.tensor(rng.normal(size=(3, 8)) * 2).to(dtype)
    out = _grad(x, 3)
    assert out.dtype == dtype
    expect = ref.gradtopk(x.double().numpy(), 3)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 1e-6}[dtype]
    np.testing.assert_allclose(out.double().numpy(), expect, rtol=0, atol=tol)


# --------------------------------------------------------------- gradients


@pytest.mark.parametrize("k,tau", [(1, 1.0), (2, 0.5), (4, 2.0), (5, 1.0)])
def test_gradcheck(rng, k, tau):
    x = torch.tensor(rng.normal(size=(2, 6)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _grad(t, k, tau), (x,))


def test_gradcheck_with_masks_and_other_dim(rng):
    x = torch.tensor(rng.normal(size=(5, 3)))
    x[1, 0] = x[3, 2] = float("-inf")
    x[:, 1] = float("-inf")
    x[4, 1] = 0.3  # column 1 has a single finite entry, k = 2: saturated row
    x.requires_grad_()
    out = _grad(x, 2, dim=0)
    g = torch.tensor(rng.normal(size=(5, 3)))
    (gx,) = torch.autograd.grad(out, x, g)
    assert torch.isfinite(gx).all()
    assert (gx[:, 1] == 0).all()  # saturated row: zero gradient
    assert gx[1, 0] == 0 and gx[3, 2] == 0  # masked entries: zero gradient
    # the finite part of each active column against gradcheck
    for col, rows in ((0, [0, 2, 3, 4]), (2, [0, 1, 2, 4])):
        xc = x.detach()[rows, col].clone().requires_grad_()
        assert torch.autograd.gradcheck(lambda t: _grad(t, 2), (xc,))
        (gc,) = torch.autograd.grad(_grad(xc, 2), xc, g[rows, col])
        torch.testing.assert_close(gx[rows, col], gc, rtol=0, atol=1e-14)


def test_backward_at_large_scale_is_finite_and_matches_differences(rng):
    # The HVP at n = 100, k = 50, x ~ N(0,1)·30 against central differences of
    # the mpmath marginals along the direction g.
    x = rng.normal(size=100) * 30
    g = rng.normal(size=100)
    xt = torch.tensor(x, requires_grad=True)
    (hg,) = torch.autograd.grad(_grad(xt, 50), xt, torch.tensor(g))
    eps = 1e-5
    plus = ref.gradtopk(x + eps * g, 50)
    minus = ref.gradtopk(x - eps * g, 50)
    np.testing.assert_allclose(hg.numpy(), (plus - minus) / (2 * eps), rtol=0, atol=1e-8)


def test_float32_backward_at_scale_is_finite_and_close(rng):
    # float32 input at n = 200, k = 40, x ~ N(0, 1)·50: the HVP is accumulated
    # in float64 too; compare with the float64 computation of the same input.
    x32 = torch.tensor(rng.normal(size=(2, 200)) * 50, dtype=torch.float32, requires_grad=True)
    g = torch.tensor(rng.normal(size=(2, 200)), dtype=torch.float32)
    (gx,) = torch.autograd.grad(_grad(x32, 40), x32, g)
    x64 = x32.detach().double().requires_grad_()
    (gx64,) = torch.autograd.grad(_grad(x64, 40), x64, g.double())
    assert gx.dtype == torch.float32 and torch.isfinite(gx).all()
    np.testing.assert_allclose(gx.double().numpy(), gx64.numpy(), rtol=1e-5, atol=1e-6)


def test_gradient_sums_to_zero_and_is_symmetric(rng):
    # H is symmetric with H·1 = 0 (Σp = k for every x).
    x = torch.tensor(rng.normal(size=7) * 2, requires_grad=True)
    jac = torch.autograd.functional.jacobian(lambda t: _grad(t, 3), x)
    torch.testing.assert_close(jac, jac.T, rtol=0, atol=1e-14)
    torch.testing.assert_close(jac.sum(0), torch.zeros(7, dtype=torch.float64), rtol=0, atol=1e-14)


# ------------------------------------------------------- property tests


@given(
    st.lists(st.floats(-40, 40, allow_nan=False), min_size=2, max_size=12),
    st.integers(1, 11),
    st.sampled_from([0.1, 1.0, 10.0]),
)
def test_properties_hold(values, k, tau):
    x = torch.tensor(values, dtype=torch.float64)
    k = min(k, x.numel())
    p = _grad(x, k, tau)
    assert abs(float(p.sum()) - k) <= 1e-9 * k
    assert bool(((p >= 0) & (p <= 1 + 1e-12)).all())
    # monotone: larger score, no smaller probability
    order = torch.argsort(x, descending=True)
    xs, ps = x[order], p[order]
    strict = xs[:-1] > xs[1:]
    assert bool((ps[:-1][strict] >= ps[1:][strict] - 1e-12).all())
    # shift invariance
    torch.testing.assert_close(_grad(x + 7.25, k, tau), p, rtol=0, atol=1e-10)


# ------------------------------------------- the seed's recursion (regression)


def _seed_log_ek(z, k):
    """A reconstruction of the seed's GradTopK: log e_k by Newton's identities
    k·e_k = Σ_{i=1..k} (−1)^{i−1} e_{k−i} P_i (P_i = Σ w^i) evaluated in log
    space, the alternating sum as log(pos − neg); gradient by autograd."""

    def logsubexp(a, b):
        return a + torch.log1p(-torch.exp(b - a))

    logp = [None] + [torch.logsumexp(i * z, -1) for i in range(1, k + 1)]
    loge = [torch.zeros(z.shape[:-1], dtype=z.dtype)]
    for m in range(1, k + 1):
        pos = torch.logsumexp(torch.stack([loge[m - i] + logp[i] for i in range(1, m + 1, 2)]), 0)
        neg = [loge[m - i] + logp[i] for i in range(2, m + 1, 2)]
        val = logsubexp(pos, torch.logsumexp(torch.stack(neg), 0)) if neg else pos
        loge.append(val - math.log(m))
    return loge[k]


@pytest.mark.parametrize("scale,k", [(10.0, 10), (1.0, 50)])
def test_seed_recursion_fails_where_softk_does_not(rng, scale, k):
    x = torch.tensor(rng.normal(size=(6, 100)) * scale, requires_grad=True)
    (seed_p,) = torch.autograd.grad(_seed_log_ek(x, k).sum(), x)
    expect = ref.gradtopk(x.detach().numpy(), k)
    # The subtraction breaks every row: NaN, or off by more than 1e-3.
    err = np.abs(seed_p.numpy() - expect).max(-1)
    assert bool(np.all(np.isnan(err) | (err > 1e-3))), err
    assert np.isnan(err).sum() >= 3  # mostly NaN outright
    out = _grad(x.detach(), k).numpy()
    np.testing.assert_allclose(out, expect, rtol=0, atol=1e-12)
    # and the seed's recursion is right where it does not cancel: tiny rows
    small = torch.tensor(rng.normal(size=(2, 5)), requires_grad=True)
    (p_small,) = torch.autograd.grad(_seed_log_ek(small, 2).sum(), small)
    torch.testing.assert_close(p_small, _grad(small.detach(), 2), rtol=0, atol=1e-12)


# ---------------------------------------------------------------- errors


def test_errors_name_the_parameter():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="k"):
        _grad(x, 5)
    with pytest.raises(ValueError, match="tau"):
        _grad(x, 2, tau=0.0)
    with pytest.raises(TypeError, match="x"):
        softk.soft_topk(torch.arange(4), 2, method="grad")
    with pytest.raises(ValueError, match="method"):
        softk.soft_topk(x, 2, method="gradtopk")


def test_row_chunks_give_the_same_result(rng, monkeypatch):
    # Large batches run in chunks of rows (bounded table memory): force tiny
    # chunks and compare with one chunk, forward and backward.
    from softk._ops import gradtopk

    x = torch.tensor(rng.normal(size=(5, 9)) * 3, requires_grad=True)
    g = torch.tensor(rng.normal(size=(5, 9)))
    (one,) = torch.autograd.grad(_grad(x, 3), x, g)
    p_one = _grad(x.detach(), 3)
    s_one = softk.topk_sum(x.detach(), 3, method="grad")
    monkeypatch.setattr(gradtopk, "_TABLE_BUDGET", 2 * 10 * 4 * 2)  # 2 rows per chunk
    (many,) = torch.autograd.grad(_grad(x, 3), x, g)
    assert torch.equal(one, many) and torch.equal(p_one, _grad(x.detach(), 3))
    assert torch.equal(s_one, softk.topk_sum(x.detach(), 3, method="grad"))
