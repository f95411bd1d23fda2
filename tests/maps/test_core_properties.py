"""Property tests (hypothesis) for what the maths promises."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import softk

from ..oracle import maps as oracle

METHODS = ["exp", "sigmoid", "laplace", "sparse"]

rows = st.integers(2, 12).flatmap(
    lambda n: arrays(np.float64, n, elements=st.floats(-20, 20, allow_nan=False, width=64))
)


def _k_for(n, data):
    return data.draw(st.integers(1, n))


@pytest.mark.parametrize("method", METHODS)
@given(x=rows, data=st.data(), tau=st.sampled_from([0.1, 1.0, 3.0]))
def test_sum_is_k_and_range(method, x, data, tau):
    k = _k_for(x.size, data)
    p = softk.soft_topk(torch.tensor(x), k, tau=tau, method=method)
    assert abs(p.sum().item() - k) <= 1e-9 * k
    assert bool((p >= 0).all()) and bool((p <= 1).all())


@given(x=rows, tau=st.sampled_from([0.1, 1.0, 3.0]), alpha=st.sampled_from([1.0, 1.3, 1.5, 2.0, 3.0]))
def test_k1_maps_on_simplex(x, tau, alpha):
    xt = torch.tensor(x)
    for p in (softk.softmax(xt, tau=tau), softk.sparsemax(xt, tau=tau), softk.entmax(xt, alpha, tau=tau)):
        assert abs(p.sum().item() - 1) <= 1e-12
        assert bool((p >= 0).all())


@pytest.mark.parametrize("method", METHODS)
@given(x=rows, data=st.data(), shift=st.floats(-50, 50))
def test_shift_invariant(method, x, data, shift):
    k = _k_for(x.size, data)
    a = softk.soft_topk(torch.tensor(x), k, method=method)
    b = softk.soft_topk(torch.tensor(x + shift), k, method=method)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", METHODS)
@given(x=rows, data=st.data(), bump=st.floats(0.01, 5.0))
def test_monotone_in_own_score(method, x, data, bump):
    """Raising x_i never lowers p_i, and never raises any other p_j."""
    k = _k_for(x.size, data)
    i = data.draw(st.integers(0, x.size - 1))
    y = x.copy()
    y[i] += bump
    a = softk.soft_topk(torch.tensor(x), k, method=method)
    b = softk.soft_topk(torch.tensor(y), k, method=method)
    assert b[i] >= a[i] - 1e-12
    others = np.arange(x.size) != i
    assert bool((b[others] <= a[others] + 1e-12).all())


@pytest.mark.parametrize("method", METHODS)
@given(x=rows, data=st.data())
def test_order_preserving(method, x, data):
    k = _k_for(x.size, data)
    p = softk.soft_topk(torch.tensor(x), k, method=method).numpy()
    order = np.argsort(x)
    assert bool((np.diff(p[order]) >= -1e-12).all())


@pytest.mark.parametrize("method", METHODS)
@given(x=rows, data=st.data())
def test_tau_to_zero_is_hard_topk(method, x, data):
    k = _k_for(x.size, data)
    s = np.sort(x)[::-1]
    if k < x.size:
        assume(s[k - 1] - s[k] > 1e-3)  # ties at the k-th place make the hard top-k ambiguous
    p = softk.soft_topk(torch.tensor(x), k, tau=1e-6, method=method).numpy()
    hard = np.zeros_like(x)
    hard[np.argsort(-x, kind="stable")[:k]] = 1
    np.testing.assert_allclose(p, hard, atol=1e-6)


@given(x=rows)
def test_k1_reductions(x):
    xt = torch.tensor(x)
    sm = softk.softmax(xt)
    torch.testing.assert_close(softk.soft_topk(xt, 1, method="exp"), sm, rtol=0, atol=1e-14)
    torch.testing.assert_close(softk.soft_topk(xt, 1, method="sparse"), softk.sparsemax(xt), rtol=0, atol=1e-14)
    torch.testing.assert_close(softk.entmax(xt, 2.0), softk.sparsemax(xt), rtol=0, atol=0)
    torch.testing.assert_close(softk.entmax(xt, 1.0), sm, rtol=0, atol=0)
    # the generic-α Newton path next to the closed forms
    torch.testing.assert_close(softk.entmax(xt, 2.0 - 1e-12), softk.sparsemax(xt), rtol=0, atol=1e-9)
    torch.testing.assert_close(softk.entmax(xt, torch.tensor(1.5, dtype=torch.float64)), softk.entmax15(xt), rtol=0, atol=1e-12)
    torch.testing.assert_close(softk.entmax(xt, torch.tensor(1.0, dtype=torch.float64)), sm, rtol=0, atol=1e-14)


def test_laplace_at_k1_is_not_softmax():
    """Su's post suggests the Laplace f gives softmax at k = 1; it does not in general."""
    x = torch.tensor([0.0, 0.0, 0.0, 5.0], dtype=torch.float64)
    lap = softk.soft_topk(x, 1, method="laplace")
    ref = oracle.soft_topk(x.numpy(), 1, method="laplace")
    np.testing.assert_allclose(lap.numpy(), ref, atol=1e-14)
    # softmax puts 0.9802 on the 5; Laplace puts 0.9289 on it (upper branch 1 − e^{λ−5}/2).
    assert abs(lap[3].item() - softk.softmax(x)[3].item()) > 0.05
    # ... and where it does agree: when every entry is on the lower branch (p < 1/2),
    # f = e^u / 2 is softmax up to the constant in λ.
    y = torch.tensor([0.0, 0.1, 0.2, 0.3], dtype=torch.float64)
    torch.testing.assert_close(softk.soft_topk(y, 1, method="laplace"), softk.softmax(y), rtol=0, atol=1e-14)


@given(x=rows, c=st.floats(0.1, 10))
def test_temperature_is_scaling(x, c):
    xt = torch.tensor(x)
    torch.testing.assert_close(softk.sparsemax(xt, tau=c), softk.sparsemax(xt / c), rtol=0, atol=1e-12)
    torch.testing.assert_close(softk.soft_topk(xt, 1, tau=c, method="laplace"),
                               softk.soft_topk(xt / c, 1, method="laplace"), rtol=0, atol=1e-12)
