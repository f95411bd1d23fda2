"""Independent NumPy float64 reference for budget sparsemax (tests only).

p = argmin_{0 <= p <= 1, sum p = B} ||p - z||^2 = clip(z - lam, 0, 1),  z = x / tau.

``budget_sparsemax`` walks the breakpoints of g(lam) = sum clip(z - lam, 0, 1)
(the z_i and z_i - 1, where an entry enters or leaves the linear piece): g
is linear between consecutive breakpoints, so lam is the exact linear
interpolation on the interval where g crosses B (no bisection, no Newton,
nothing from softk).  ``budget_by_qp`` hands the definition to scipy's SLSQP.

Rows follow softk's conventions: -inf entries are dropped, B = 0 gives zeros,
a row with at most B finite entries gets 1 on each, NaN or +inf makes the row NaN.
"""

from __future__ import annotations

import numpy as np


def _g(z, lam):
    return np.clip(z - lam, 0.0, 1.0).sum()


def budget_row(row, budget):
    row = np.asarray(row, dtype=np.float64)
    out = np.zeros_like(row)
    if np.isnan(row).any() or np.isposinf(row).any():
        return np.full_like(row, np.nan)
    finite = np.isfinite(row)
    if budget == 0:
        return out
    if finite.sum() <= budget:
        out[finite] = 1.0
        return out
    z = row[finite] - row[finite].max()  # shift invariant; keeps the breakpoints exact
    knots = np.unique(np.concatenate([z, z - 1.0]))  # ascending; g is non-increasing in lam
    vals = np.array([_g(z, t) for t in knots])
    # g(knots[0]) = number of entries >= B (every entry saturated or linear there)
    j = np.nonzero(vals >= budget)[0].max()
    if j + 1 == knots.size or vals[j] == budget:
        lam = knots[j]
    else:
        t0, t1, g0, g1 = knots[j], knots[j + 1], vals[j], vals[j + 1]
        slope = (t1 - t0) / (g0 - g1)
        # from the nearer end, so that a tiny B (or n - B) is not rounded away
        lam = t0 + (g0 - budget) * slope if g0 - budget <= budget - g1 else t1 - (budget - g1) * slope
    out[finite] = np.clip(z - lam, 0.0, 1.0)
    return out


def budget_sparsemax(x, budget, dim=-1, tau=1.0):
    """budget: a number, or an array of one budget per row (x's shape with size 1 along dim)."""
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    if np.ndim(budget) == 0:
        b = np.full(flat.shape[0], float(budget))
    else:
        shape = list(x.shape)
        shape[dim] = 1
        b = np.moveaxis(np.broadcast_to(budget, shape), dim, -1).reshape(-1)
    out = np.stack([budget_row(r / tau, b[i]) for i, r in enumerate(flat)]) if flat.shape[0] else flat.copy()
    return np.moveaxis(out.reshape(moved.shape), -1, dim)


def budget_by_qp(z, budget):
    """The definition, solved by SLSQP (small rows)."""
    from scipy.optimize import minimize

    z = np.asarray(z, dtype=np.float64)
    n = z.size
    res = minimize(lambda p: 0.5 * np.sum((p - z) ** 2), np.full(n, budget / n), jac=lambda p: p - z,
                   method="SLSQP", bounds=[(0.0, 1.0)] * n,
                   constraints=[{"type": "eq", "fun": lambda p: p.sum() - budget, "jac": lambda p: np.ones(n)}],
                   options={"ftol": 1e-15, "maxiter": 1000})
    return np.clip(res.x, 0.0, 1.0)
