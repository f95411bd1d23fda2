"""Independent references for the rest of the Top-k family (tests only).

NumPy float64 for the hard selections, the iterative schemes and the threshold
top-k sums; mpmath (high precision, linear space, where nothing cancels) for
GradTopK.  Written from the definitions, never from softk's code.  Row
conventions as in tests/oracle.py.
"""

from __future__ import annotations

import itertools

import mpmath
import numpy as np

from . import maps as oracle

# ------------------------------------------------------------ hard selections


def _row_hard(row, k):
    row = np.asarray(row, dtype=np.float64)
    if np.isnan(row).any() or np.isposinf(row).any():
        return np.full_like(row, np.nan)
    finite = np.flatnonzero(np.isfinite(row))
    # Stable descending order: among equal scores the lower index first.
    order = finite[np.argsort(-row[finite], kind="stable")]
    out = np.zeros_like(row)
    out[order[:k]] = 1.0
    return out


def hard_topk(x, k, dim=-1):
    return oracle._apply(lambda r: _row_hard(r, k), x, dim)


def _row_topk_softmax(row, k, tau):
    mask = _row_hard(row, k)
    if np.isnan(mask).any():
        return mask
    out = np.zeros_like(mask)
    sel = mask > 0
    if sel.any():
        z = np.asarray(row, dtype=np.float64)[sel] / tau
        e = np.exp(z - z.max())
        out[sel] = e / e.sum()
    return out


def topk_softmax(x, k, dim=-1, tau=1.0):
    return oracle._apply(lambda r: _row_topk_softmax(r, k, tau), x, dim)


# --------------------------------------------------------- iterative schemes


def _softmax_over(logits, use):
    out = np.zeros_like(logits)
    m = logits[use].max()
    e = np.exp(logits[use] - m)
    out[use] = e / e.sum()
    return out


def _row_iterative(row, k, tau, weighted):
    row = np.asarray(row, dtype=np.float64)
    if np.isnan(row).any() or np.isposinf(row).any():
        return np.full_like(row, np.nan)
    use = np.isfinite(row)
    if use.sum() <= k:
        return use.astype(np.float64)
    z = np.where(use, row / tau, 0.0)
    p = np.zeros_like(z)
    if not weighted:
        z = np.where(use, z - z[use].min(), 0.0)
        for _ in range(k):
            p = p + _softmax_over((1.0 - p) * z, use)
    else:
        for _ in range(k):
            w = 1.0 - p
            ok = use & (w > 0)
            p = p + _softmax_over(z + np.log(np.where(ok, w, 1.0)), ok)
    return p


def iterative(x, k, dim=-1, tau=1.0):
    return oracle._apply(lambda r: _row_iterative(r, k, tau, False), x, dim)


def weighted(x, k, dim=-1, tau=1.0):
    return oracle._apply(lambda r: _row_iterative(r, k, tau, True), x, dim)


# --------------------------------------------------------------- GradTopK


def _esp_tables(w, k):
    """Linear-space e_j of prefixes, j = 0..k, in mpmath (all terms >= 0)."""
    n = len(w)
    table = [[mpmath.mpf(1)] + [mpmath.mpf(0)] * k]
    for i in range(n):
        prev = table[-1]
        table.append([prev[0]] + [prev[j] + w[i] * prev[j - 1] for j in range(1, k + 1)])
    return table


def gradtopk_row_mp(row, k, tau=1.0, dps=60):
    """(marginals as mpf list, log e_k as mpf) of a finite row with n > k."""
    with mpmath.workdps(dps):
        w = [mpmath.exp(mpmath.mpf(float(v)) / mpmath.mpf(tau)) for v in row]
        n = len(w)
        pre = _esp_tables(w, k)
        suf = _esp_tables(w[::-1], k)[::-1]  # suf[i][j] = e_j(w[i:])
        ek = pre[n][k]
        p = []
        for i in range(n):
            loo = mpmath.fsum(pre[i][a] * suf[i + 1][k - 1 - a] for a in range(k))
            p.append(w[i] * loo / ek)
        return p, mpmath.log(ek)


def gradtopk(x, k, dim=-1, tau=1.0):
    """float64 array of the GradTopK marginals, with the row conventions."""

    def row_fn(row):
        row = np.asarray(row, dtype=np.float64)
        if np.isnan(row).any() or np.isposinf(row).any():
            return np.full_like(row, np.nan)
        finite = np.isfinite(row)
        out = np.zeros_like(row)
        if finite.sum() <= k:
            out[finite] = 1.0
            return out
        p, _ = gradtopk_row_mp(row[finite], k, tau)
        out[finite] = [float(v) for v in p]
        return out

    return oracle._apply(row_fn, x, dim)


def gradtopk_brute(row, k, tau=1.0):
    """Marginals by enumerating every k-subset (tiny rows; the definition)."""
    row = np.asarray(row, dtype=np.float64) / tau
    n = row.size
    weights, total, marg = [], 0.0, np.zeros(n)
    for subset in itertools.combinations(range(n), k):
        wt = np.exp(row[list(subset)].sum() - row.max() * k)
        total += wt
        marg[list(subset)] += wt
    return marg / total


# ------------------------------------------------------------ top-k sums

# F (F' = f, F(−inf) = 0) and ψ(1) of each threshold family, from the maths.
_F = {
    "exp": lambda u: np.where(u <= 0, np.exp(np.minimum(u, 0.0)), 1.0 + u),
    "sigmoid": lambda u: np.logaddexp(0.0, u),
    "laplace": lambda u: np.where(u >= 0, u + 0.5 * np.exp(-np.abs(u)), 0.5 * np.exp(-np.abs(u))),
    "sparse": lambda u: np.where(u >= 1, u - 0.5, 0.5 * np.maximum(u, 0.0) ** 2),
}
_PSI1 = {"exp": -1.0, "sigmoid": 0.0, "laplace": 0.0, "sparse": 0.5}


def _row_topk_sum(row, k, tau, method):
    row = np.asarray(row, dtype=np.float64)
    if np.isnan(row).any() or np.isposinf(row).any():
        return np.nan
    finite = np.isfinite(row)
    if finite.sum() <= k:
        return row[finite].sum()
    z = row[finite] / tau
    if method == "grad":
        _, log_ek = gradtopk_row_mp(row[finite], k, tau)
        return tau * float(log_ek)
    # Dual form: Φ = min_λ Σ F(z − λ) + kλ, at the oracle's λ.
    lam = oracle.solve_lambda(oracle.F_BY_METHOD[method], z, k)
    phi = _F[method](z - lam).sum() + k * lam
    return tau * (phi + _PSI1[method] * k)


def topk_sum(x, k, dim=-1, tau=1.0, method="exp"):
    x = np.asarray(x, dtype=np.float64)
    moved = np.moveaxis(x, dim, -1)
    flat = moved.reshape(-1, moved.shape[-1])
    out = np.array([_row_topk_sum(r, k, tau, method) for r in flat])
    return out.reshape(moved.shape[:-1])


def hard_topk_sum(x, k):
    """Sum of the k largest entries of each row (last dim)."""
    return -np.sort(-np.asarray(x, dtype=np.float64), axis=-1)[..., :k].sum(-1)
