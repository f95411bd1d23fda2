"""soft_topk methods "iterative" (Su 2019) and "weighted" against the NumPy
reference, and the seed's measured failures, recomputed by the reference."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import softk
import softk.nn

from ..oracle import maps as oracle, topk as ref

METHODS = {"iterative": ref.iterative, "weighted": ref.weighted}
SHAPES_DIMS = [((7,), 0), ((3, 9), -1), ((4, 6, 5), 1), ((1, 1), -1)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference(rng, method, shape, dim, dtype):
    xn = rng.normal(size=shape) * 2
    x = torch.tensor(xn, dtype=dtype)
    n = shape[dim]
    tol = {torch.float64: 1e-13, torch.float32: 1e-5}[dtype]
    for k in sorted({1, max(1, n // 2), n}):
        for tau in (1.0, 0.3):
            out = softk.soft_topk(x, k, dim, tau, method)
            expect = METHODS[method](x.double().numpy(), k, dim, tau)
            np.testing.assert_allclose(out.double().numpy(), expect, rtol=0, atol=tol)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(rng, method, dtype):
    x = torch.tensor(rng.normal(size=(3, 6))).to(dtype)
    out = softk.soft_topk(x, 2, method=method)
    assert out.dtype == dtype
    expect = METHODS[method](x.double().numpy(), 2)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]  # one rounding of values up to 2
    np.testing.assert_allclose(out.double().numpy(), expect, rtol=0, atol=tol)


def test_issue_measurements_iterative():
    # τ = 0.3, x = [3, 2, 1, 0], k = 2: p₂ > p₁ (not monotone)
    x = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    p = softk.soft_topk(x, 2, tau=0.3, method="iterative")
    np.testing.assert_allclose(p.numpy(), ref.iterative(x.numpy(), 2, tau=0.3), rtol=0, atol=1e-14)
    assert round(float(p[0]), 3) == 0.967 and round(float(p[1]), 3) == 0.988
    # x = [0, 0, 0, 5], k = 2: p₄ ≈ 1 + 1/4 > 1 (the first round gives the spike
    # 1 − 3e^{-50/3}, the second sees (1 − p)·z ≈ 0 everywhere and spreads
    # ~1/4 over all four; by hand p₄ = 1.2500004, the issue's "1.249" is off)
    x = np.array([0.0, 0.0, 0.0, 5.0])
    p = softk.soft_topk(torch.tensor(x), 2, tau=0.3, method="iterative")
    np.testing.assert_allclose(p.numpy(), ref.iterative(x, 2, tau=0.3), rtol=0, atol=1e-14)
    e = 3 * np.exp(-5 / 0.3) / (1 + 3 * np.exp(-5 / 0.3))  # 1 − p₄ after round 1
    s = 5 / 0.3 * e  # the spike's score in round 2
    np.testing.assert_allclose(float(p[3]), 1 - e + np.exp(s) / (3 + np.exp(s)), rtol=0, atol=1e-15)
    assert float(p[3]) > 1.25


def test_weighted_limit_is_one_and_a_half():
    # Scores 1 apart at τ = 1/20: e^{-20} keeps 1 − p_max above rounding.
    x = torch.tensor([3.0, 2.0, 1.0, 0.0], dtype=torch.float64)
    p = softk.soft_topk(x, 2, tau=0.05, method="weighted")
    np.testing.assert_allclose(p.numpy()[:2], [1.5, 0.5], rtol=0, atol=1e-6)
    # while the iterative method does reach the 2-hot mask there
    q = softk.soft_topk(x, 2, tau=0.05, method="iterative")
    np.testing.assert_allclose(q.numpy(), [1, 1, 0, 0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_k1_is_softmax_and_sum_is_k(rng, method):
    xn = rng.normal(size=(3, 7)) * 3
    x = torch.tensor(xn)
    np.testing.assert_allclose(softk.soft_topk(x, 1, tau=0.4, method=method).numpy(), oracle.softmax(xn, -1, 0.4), atol=1e-15)
    np.testing.assert_allclose(softk.soft_topk(x, 4, method=method).sum(-1).numpy(), 4.0, rtol=0, atol=1e-13)


@pytest.mark.parametrize("method", METHODS)
def test_masks_and_degenerate_rows(method):
    inf = float("inf")
    x = torch.tensor(
        [
            [1.0, -inf, 2.0, 0.5, -inf],
            [-inf, 3.0, -inf, -inf, 1.0],
            [-inf] * 5,
            [1.0, float("nan"), 0.0, 0.0, 0.0],
        ],
        dtype=torch.float64,
        requires_grad=True,
    )
    p = softk.soft_topk(x, 2, method=method)
    expect = METHODS[method](x.detach().numpy(), 2)
    np.testing.assert_allclose(p[:3].detach().numpy(), expect[:3], rtol=0, atol=1e-14)
    assert p[0, 1] == 0 and p[1].tolist() == [0, 1, 0, 0, 1] and p[2].tolist() == [0] * 5
    assert torch.isnan(p[3]).all()
    (g,) = torch.autograd.grad(p[:3].sum() + (p[:3] ** 2).sum(), x)
    assert torch.isfinite(g[:3]).all() and (g[1:3] == 0).all() and g[0, 1] == 0


@pytest.mark.parametrize("method", METHODS)
def test_gradcheck(rng, method):
    x = torch.tensor(rng.normal(size=(2, 5)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softk.soft_topk(t, 3, tau=0.8, method=method), (x,))


def test_weighted_gradient_finite_when_an_entry_saturates():
    # τ small: p_max reaches exactly 1, its weight 1 − p is 0 (log → −inf inside)
    x = torch.tensor([40.0, 1.0, 0.0, -1.0], dtype=torch.float64, requires_grad=True)
    p = softk.soft_topk(x, 3, tau=0.5, method="weighted")
    (g,) = torch.autograd.grad((p * torch.arange(4.0, dtype=torch.float64)).sum(), x)
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("method", METHODS)
def test_module_accepts_method(method):
    m = softk.nn.SoftTopK(2, method=method)
    x = torch.tensor([[3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(m(x), softk.soft_topk(x, 2, method=method))
    assert method in repr(m)


@given(
    st.lists(st.floats(-20, 20, allow_nan=False), min_size=2, max_size=10),
    st.integers(1, 9),
    st.sampled_from([0.2, 1.0, 5.0]),
    st.sampled_from(sorted(METHODS)),
)
def test_sum_is_k_and_shift_invariant(values, k, tau, method):
    # What both schemes do promise: k rounds of a softmax add up to k, and the
    # scores enter through differences only.
    x = torch.tensor(values, dtype=torch.float64)
    k = min(k, x.numel() - 1) or 1
    p = softk.soft_topk(x, k, tau=tau, method=method)
    assert abs(float(p.sum()) - k) <= 1e-12 * k
    assert bool((p >= 0).all())
    np.testing.assert_allclose(softk.soft_topk(x - 3.5, k, tau=tau, method=method).numpy(), p.numpy(), rtol=0, atol=1e-9)


def _weighted_mp(x, k, tau):
    """The weighted recursion in mpmath, weights (1 − p)₊, with the digits
    to hold 1 − p where p is within e^−2000 of 1."""
    import mpmath as mp

    with mp.workdps(1000):
        z = [mp.mpf(float(v)) / mp.mpf(tau) for v in x]
        p = [mp.mpf(0)] * len(z)
        for _ in range(k):
            w = [max(1 - pi, 0) * mp.exp(zi) for pi, zi in zip(p, z)]
            s = mp.fsum(w)
            p = [pi + wi / s for pi, wi in zip(p, w)]
        return np.array([float(v) for v in p])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("x, k, tau", [
    ([0.0, -10.0, -100.0], 2, 1.0),
    ([0.0, -40.0, -100.0], 2, 1.0),  # 1 − p₁ = e^{−40}: 0 when formed from p
    ([0.0, -110.0, -300.0], 2, 1.0),  # e^{−110} underflows float32
    ([0.0, -800.0, -2000.0], 2, 1.0),  # and float64
    ([0.0, -1.0, -5.0], 2, 1e-3),
    ([2.0, -22.0, 21.0, 44.0, -49.0], 3, 0.3),
    ([-3.01953125, -8.9921875, -6.58203125, 13.953125, -1.1884765625, -0.5947265625, -11.7890625], 3, 0.5),
    ([5.329, -7.66, -0.414, 3.041], 3, 1.0),  # p > 1: the weight (1 − p)₊ = 0
])
def test_weighted_keeps_the_weights_of_entries_near_one(dtype, x, k, tau):
    # 1 − p of a p within e^{−37} of 1 is 0 in float64 (e^{−17} in float32):
    # the weight vanished, and [0, −40, −100] at k = 2 gave the hard [1, 1, 0]
    # where the recursion gives [1.5, 0.5, 0]; log(1 − p) is carried instead
    xt = torch.tensor(x, dtype=dtype)
    want = _weighted_mp(xt.double().tolist(), k, tau)
    got = softk.soft_topk(xt, k, tau=tau, method="weighted")
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=8 * eps)


def test_weighted_second_derivatives_and_vmap_far_out():
    # the weights' logs have finite second derivatives where 1 − p is tiny
    # (a log of it had 1/c² = inf), and the largest weight is found without
    # a data-dependent one_hot, so vmap(grad) runs
    f = lambda t: softk.soft_topk(t, 2, method="weighted")  # noqa: E731
    for row in ([0.0, -600.0, -605.0], [0.0, -20.0, -25.0]):
        x = torch.tensor(row, dtype=torch.float64, requires_grad=True)
        assert torch.autograd.gradcheck(f, (x,))
        assert torch.autograd.gradgradcheck(f, (x,))
    x = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = lambda y: (f(y) ** 2).sum()  # noqa: E731
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(g))(x), torch.stack([torch.func.grad(g)(r) for r in x]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("x, tau", [
    ([0.0, -1e4, -3e4], 1.0),
    ([0.0, -1e20, -3e20], 1.0),
    ([1.0, 0.0, -1.0], 1e-4),
    ([1.0, 0.0, -1.0], 2e-5),
    ([1.7e38, 8e37, -1e38], 1e30),
])
def test_weighted_at_gaps_past_any_exponent(dtype, x, tau):
    # the recursion's answer is [1.5, 0.5, 0] to e^{−gap}; a logsumexp's
    # filler of M − 1e4 counted as a term and floored log(1 − p) at −1e4:
    # [1.667, 0.333, 0] at gaps of 1e4 and [2, 0, 0] beyond
    got = softk.soft_topk(torch.tensor(x, dtype=dtype), 2, tau=tau, method="weighted")
    torch.testing.assert_close(got, torch.tensor([1.5, 0.5, 0.0], dtype=dtype), rtol=0,
                               atol=2 * torch.finfo(dtype).eps)
