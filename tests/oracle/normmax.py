"""Independent NumPy float64 reference for α-normmax (tests only).

p = argmax_{p in simplex} <z, p> - ||p||_alpha,  z = x / tau.

Two methods, neither taken from softk's code:

* ``normmax``: the KKT form.  On the support p_i = ||p|| (z_i - mu)^(1/(alpha-1)),
  and sum p = 1 forces sum_i (z_i - mu)_+^(alpha/(alpha-1)) = 1; mu is found by
  plain bisection on that sum (run until the bracket is two adjacent floats),
  directly on the shifted row (no entmax reduction, no Newton);
* ``normmax_by_optimisation``: the definition handed to scipy's SLSQP, which
  checks the KKT form itself (to the optimiser's accuracy).

Rows follow softk's conventions: -inf entries are dropped, a row with at most
one finite entry gets 1 there, NaN or +inf makes the row NaN; alpha = 1 is the
argmax, uniform on ties.
"""

from __future__ import annotations

import numpy as np


def _bisect(g, lo, hi, target=1.0):
    """mu with g(mu) = target for a non-increasing g, g(lo) >= target >= g(hi)."""
    for _ in range(4000):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if g(mid) >= target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _conventions(row):
    """(out, z) with z the finite entries shifted by their max, or (out, None) when the row is decided."""
    row = np.asarray(row, dtype=np.float64)
    out = np.zeros_like(row)
    if np.isnan(row).any() or np.isposinf(row).any():
        return np.full_like(row, np.nan), None
    finite = np.isfinite(row)
    if finite.sum() <= 1:
        out[finite] = 1.0
        return out, None
    return out, row[finite] - row[finite].max()


def normmax_row(row, alpha):
    out, z = _conventions(row)
    if z is None:
        return out
    finite = np.isfinite(np.asarray(row, dtype=np.float64))
    if alpha == 1:
        top = (z == 0).astype(np.float64)
        out[finite] = top / top.sum()
        return out
    gamma, beta = alpha / (alpha - 1), 1 / (alpha - 1)
    # the largest entry alone gives 1 at mu = -1; every term is 0 at mu = 0
    mu = _bisect(lambda m: np.sum(np.maximum(z - m, 0.0) ** gamma), -1.0, 0.0)
    u = z - mu
    with np.errstate(divide="ignore"):
        logq = np.where(u > 0, beta * np.log(np.where(u > 0, u, 1.0)), -np.inf)
    q = np.exp(logq - logq.max())
    out[finite] = q / q.sum()
    return out


def _rows(fn, x, dim):
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    out = np.stack([fn(i, r) for i, r in enumerate(flat)]) if flat.shape[0] else flat.copy()
    return np.moveaxis(out.reshape(moved.shape), -1, dim)


def normmax(x, alpha, dim=-1, tau=1.0):
    """alpha: a number, or an array of one alpha per row (x's shape with size 1 along dim)."""
    x = np.asarray(x, dtype=np.float64)
    if np.ndim(alpha) == 0:
        return _rows(lambda i, r: normmax_row(r / tau, float(alpha)), x, dim)
    a = np.moveaxis(np.broadcast_to(alpha, x.shape[:dim % x.ndim] + (1,) + x.shape[dim % x.ndim + 1:]), dim, -1)
    a = a.reshape(-1)
    return _rows(lambda i, r: normmax_row(r / tau, float(a[i])), x, dim)


def alpha_norm(v, alpha):
    v = np.asarray(v, dtype=np.float64)
    return np.sum(v ** alpha) ** (1.0 / alpha)


def normmax_loss_row(z, y, alpha):
    """<z, p> - ||p||_alpha + ||y||_alpha - <z, y> for one row (z finite)."""
    p = normmax_row(z, alpha)
    return float(z @ p - alpha_norm(p, alpha) + alpha_norm(y, alpha) - z @ y)


def normmax_by_optimisation(z, alpha):
    """The definition, solved by SLSQP from the uniform point (small rows)."""
    from scipy.optimize import minimize

    z = np.asarray(z, dtype=np.float64)
    n = z.size

    def objective(p):
        p = np.maximum(p, 0.0)
        return -(z @ p) + np.sum(p ** alpha) ** (1.0 / alpha)

    res = minimize(objective, np.full(n, 1.0 / n), method="SLSQP", bounds=[(0.0, 1.0)] * n,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0}],
                   options={"ftol": 1e-15, "maxiter": 1000})
    return np.maximum(res.x, 0.0), res.fun
