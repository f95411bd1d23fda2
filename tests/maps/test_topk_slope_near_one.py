r"""Soft top-k "sigmoid" and "laplace" where p nears 1, against mpmath.

The forward: with entries near 1, Σp's rounding (an ulp of k) can be more
than the whole mass of the entries near 0, so Σp = k holds on a flat of λ
and a λ anywhere on it leaves their p off by any factor.  Sigmoid's search
on the tensor path sums the two tails apart (``Family.residual``).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

import softk

mpmath.mp.dps = 60
# the forward's search on rows this far apart takes log 0 and 0/0 in lanes it
# then discards, which Triton's interpreter (numpy) reports
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

FAMS = ["sigmoid", "laplace"]
BACKENDS = ["torch", "triton"]


def _f(fam, u):
    if fam == "sigmoid":
        return 1 / (1 + mpmath.exp(-u))
    return 1 - mpmath.exp(-u) / 2 if u >= 0 else mpmath.exp(u) / 2


def _df(fam, u):
    e = mpmath.exp(-abs(u))
    return e / (1 + e) ** 2 if fam == "sigmoid" else e / 2


def _lam(fam, z, counts, k):
    """λ with Σ c_i f(z_i − λ) = k: bisection in 60 digits."""
    lo, hi = min(z) - 200, max(z) + 200
    for _ in range(400):
        mid = (lo + hi) / 2
        if sum(c * _f(fam, zi - mid) for zi, c in zip(z, counts)) > k:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _ref(fam, x, k, tau):
    """(p, d) at the exact λ, found over the row's distinct values (a wide
    row of a few values costs nothing)."""
    vals, counts = np.unique(x[np.isfinite(x)], return_counts=True)
    lam = _lam(fam, [mpmath.mpf(float(v)) / tau for v in vals], counts, k)
    p, d = np.zeros(len(x), dtype=object), np.zeros(len(x), dtype=object)
    for i, v in enumerate(x):
        if np.isfinite(v):
            u = mpmath.mpf(float(v)) / tau - lam
            p[i], d[i] = _f(fam, u), _df(fam, u)
        else:
            p[i], d[i] = mpmath.mpf(0), mpmath.mpf(0)
    return p, d


ROWS = [
    ([0.0, -40.0], 1, 1.0),  # p₁ = 1 − 4e-18: 1 in float32
    ([0.0, -20.0], 1, 1.0),  # p₁ = 1 − 4.5e-5: 1 in bfloat16
    ([3.0, 2.5, -30.0, -35.0], 2, 1.0),  # two entries near 1, two near 0
    ([5.0, 4.0, 3.0, -9.0, -10.0], 3, 0.25),  # |u| from 24 to 52
    ([0.0, float("-inf"), -40.0], 1, 1.0),  # a masked entry
    ([0.3, 0.0, -0.2], 2, 1.0),  # every p above ½: the smallest is the anchor
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("row, k, tau", ROWS)
def test_entries_near_zero_keep_their_relative_precision(backend, dtype, fam, row, k, tau):
    # The forward, on the same rows: where the entries near 1 make Σp's
    # rounding (an ulp of k) larger than the mass near 0, Σp = k holds on a
    # whole flat of λ, and a λ anywhere on it put those p off by any factor
    # (3.2× for the −30 of [3, 2.5, −30, −35] in float32): every p_i here is
    # within a few ulps of u of its value, relative to itself
    if backend == "triton" and dtype == torch.float64:
        pytest.skip("the Triton kernels compute in float32 and take no float64")
    x = torch.tensor(row, dtype=dtype)
    xs = x.double().numpy()
    want = np.array([float(v) for v in _ref(fam, xs, k, tau)[0]])
    with softk.use_backend(backend):
        got = softk.soft_topk(x, k, tau=tau, method=fam).double().numpy()
    u_max = float(np.abs(xs[np.isfinite(xs)]).max() / tau) * 2
    # (bfloat16: an ulp, up to 2⁻⁷ of p; Triton's interpreter truncates its stores)
    tol = {torch.float64: 1e-13 * (1 + u_max), torch.float32: 1e-6 * (1 + u_max), torch.bfloat16: 2.0**-7}[dtype]
    assert np.all(np.abs(got - want) <= tol * want), (got, want)
