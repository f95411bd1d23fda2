"""Independent NumPy float64 oracle for every map (tests only).

Written from the definitions, not from softk's code: each map is
p_i = f(z_i - lam) with sum p = k, and lam is found by plain bisection on
g(lam) = sum f(z - lam), run until the bracket is two adjacent floats.  Rows
follow the documented conventions: -inf entries are dropped, rows with at most
k finite entries get 1 on each of them, a NaN or +inf makes the row NaN.
"""

from __future__ import annotations

import numpy as np


def _f_exp(u):
    return np.exp(np.minimum(u, 0.0))


def _f_sigmoid(u):
    return 0.5 * (1.0 + np.tanh(0.5 * u))  # an expression torch.sigmoid does not use


def _f_laplace(u):
    return np.where(u >= 0, 1.0 - 0.5 * np.exp(-np.abs(u)), 0.5 * np.exp(-np.abs(u)))


def _f_sparse(u):
    return np.minimum(np.maximum(u, 0.0), 1.0)


def _f_relu(u):
    return np.maximum(u, 0.0)


def _f_entmax(alpha):
    def f(u):
        s = np.maximum((alpha - 1.0) * u, 0.0)
        with np.errstate(over="ignore"):  # inf while the bracket is widened is fine
            return s ** (1.0 / (alpha - 1.0))

    return f


F_BY_METHOD = {"exp": _f_exp, "sigmoid": _f_sigmoid, "laplace": _f_laplace, "sparse": _f_sparse}


def solve_lambda(f, z, k):
    """Bisection for sum f(z - lam) = k on a 1-D array of finite z, ending at
    the upper end of the points with g >= k: where terms underflow (entries
    1e33 apart), g is exactly k on a whole interval below the root, and only
    its upper end is the root's value."""
    g = lambda lam: f(z - lam).sum()  # noqa: E731
    lo, hi = z.min() - 1.0, z.max() + 1.0
    step = 1.0
    while g(lo) < k:
        step *= 2
        lo = z.min() - step
    step = 1.0
    while g(hi) >= k:
        step *= 2
        hi = z.max() + step
    for _ in range(4000):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if g(mid) >= k:
            lo = mid
        else:
            hi = mid
    return lo


def _row_map(f, row, k, closed_form=None):
    row = np.asarray(row, dtype=np.float64)
    out = np.zeros_like(row)
    if np.isnan(row).any() or np.isposinf(row).any():
        return np.full_like(row, np.nan)
    finite = np.isfinite(row)
    if finite.sum() <= k:
        out[finite] = 1.0
        return out
    z = row[finite]
    lam = closed_form(z) if closed_form else solve_lambda(f, z, k)
    out[finite] = f(z - lam)
    return out


def _apply(fn, x, dim):
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    out = np.stack([fn(r) for r in flat]) if flat.shape[0] else flat.copy()
    return np.moveaxis(out.reshape(moved.shape), -1, dim)


def _lse(z):
    m = z.max()
    return m + np.log(np.exp(z - m).sum())


def soft_topk(x, k, dim=-1, tau=1.0, method="exp"):
    f = F_BY_METHOD[method]
    return _apply(lambda r: _row_map(f, r / tau, k), x, dim)


def softmax(x, dim=-1, tau=1.0):
    return _apply(lambda r: _row_map(np.exp, r / tau, 1, closed_form=_lse), x, dim)


def sparsemax(x, dim=-1, tau=1.0):
    return _apply(lambda r: _row_map(_f_relu, r / tau, 1), x, dim)


def entmax(x, alpha, dim=-1, tau=1.0):
    if alpha == 1.0:
        return softmax(x, dim, tau)
    return _apply(lambda r: _row_map(_f_entmax(alpha), r / tau, 1), x, dim)


def numerical_jacobian(fn, row, eps=1e-6):
    """Central-difference Jacobian of a 1-D oracle map (independent of any backward)."""
    row = np.asarray(row, dtype=np.float64)
    cols = []
    for j in range(row.size):
        e = np.zeros_like(row)
        e[j] = eps
        cols.append((fn(row + e) - fn(row - e)) / (2 * eps))
    return np.stack(cols, axis=1)
