"""Every map against the independent NumPy float64 oracle (tests/oracle.py)."""

import numpy as np
import pytest
import torch

import softk

from ..oracle import maps as oracle

# Every test here runs on both CPU paths: the PyTorch one and the compiled kernels.
pytestmark = pytest.mark.usefixtures("each_cpu_backend")

METHODS = ["exp", "sigmoid", "laplace", "sparse"]
SHAPES_DIMS = [((7,), 0), ((3, 9), -1), ((4, 6, 5), 1), ((2, 5, 3), 0), ((1, 1), -1)]


def _x(rng, shape, scale=2.0):
    return rng.normal(size=shape) * scale


def _check(out, ref, dtype):
    out = out.detach().double().numpy()
    tol = {torch.float64: 1e-12, torch.float32: 2e-6}[dtype]
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("tau", [1.0, 0.3, 4.0])
def test_k1_maps(rng, dtype, shape, dim, tau):
    xn = _x(rng, shape)
    x = torch.tensor(xn, dtype=dtype)
    _check(softk.softmax(x, dim, tau), oracle.softmax(xn, dim, tau), dtype)
    _check(softk.sparsemax(x, dim, tau), oracle.sparsemax(xn, dim, tau), dtype)
    _check(softk.entmax15(x, dim, tau), oracle.entmax(xn, 1.5, dim, tau), dtype)
    for alpha in (1.0, 1.2, 1.5, 1.7, 2.0, 2.6):
        _check(softk.entmax(x, alpha, dim, tau), oracle.entmax(xn, alpha, dim, tau), dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
def test_soft_topk(rng, dtype, method, shape, dim):
    xn = _x(rng, shape)
    x = torch.tensor(xn, dtype=dtype)
    n = shape[dim]
    for k in sorted({1, max(1, n // 2), n}):
        for tau in (1.0, 0.25):
            ref = oracle.soft_topk(xn, k, dim, tau, method)
            _check(softk.soft_topk(x, k, dim, tau, method), ref, dtype)


@pytest.mark.parametrize("method", METHODS)
def test_soft_topk_wide_rows_and_large_scale(rng, method):
    xn = _x(rng, (3, 300), scale=30.0)
    x = torch.tensor(xn)
    for k in (1, 17, 150, 299):
        ref = oracle.soft_topk(xn, k, -1, 1.0, method)
        _check(softk.soft_topk(x, k, method=method), ref, torch.float64)


def test_logsumexp_is_tau_log_sum_exp(rng):
    xn = _x(rng, (4, 6))
    for tau in (1.0, 0.1, 5.0):
        m = (xn / tau).max(-1, keepdims=True)
        ref = tau * (m[:, 0] + np.log(np.exp(xn / tau - m).sum(-1)))
        out = softk.logsumexp(torch.tensor(xn), -1, tau)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-14, atol=0)
    assert softk.logsumexp(torch.tensor(xn), 0, keepdim=True).shape == (1, 6)


def test_log_softmax_matches_log_of_oracle(rng):
    xn = _x(rng, (3, 5))
    out = softk.log_softmax(torch.tensor(xn), 0, 0.5).numpy()
    np.testing.assert_allclose(out, np.log(oracle.softmax(xn, 0, 0.5)), rtol=0, atol=1e-13)


@pytest.mark.parametrize("method", ["exp", "laplace", "sparse"])
def test_exact_methods_agree_with_newton(rng, method):
    """Cross-algorithm agreement: the closed form on the knot bracket and a
    safeguarded Newton solve of the same family give the same λ."""
    from softk.threshold import THRESHOLD_METHODS
    from softk.threshold.solve import bracket_by_knots, newton, solve_lambda

    fam = THRESHOLD_METHODS[method]
    z = torch.tensor(_x(rng, (6, 40)))
    for k in (1, 5, 20):
        exact = solve_lambda(fam, z, k, torch.ones(6, 1, dtype=torch.bool))
        t = bracket_by_knots(fam, z, k)
        lo = torch.full_like(t, -1e3)
        hi = torch.full_like(t, 1e3)
        it = newton(fam, z, k, lo, hi, torch.ones(6, 1, dtype=torch.bool))
        sums = fam.f(z - exact).sum(-1)
        torch.testing.assert_close(sums, torch.full_like(sums, float(k)), rtol=0, atol=1e-12)
        # piecewise-flat g (sparse at a vertex) makes λ non-unique: compare p.
        torch.testing.assert_close(fam.f(z - it), fam.f(z - exact), rtol=0, atol=1e-10)
