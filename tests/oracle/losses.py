"""Independent NumPy float64 references for the losses (tests only).

Written from the definitions, not from softk's code.  The Fenchel–Young loss
is evaluated through the *other* form of the potential,

    Phi(z) = min_lam  sum_i F(z_i - lam) + k lam      (F' = f),

at the oracle's bisection lambda (tests/oracle.py), plus Omega(y) = sum psi(y_i)
with psi the convex conjugate of F derived by hand below; softk evaluates
Phi = <z, p> - Omega(p) instead.  Layout: classes on axis 1 (axis 0 for 1-D).
"""

from __future__ import annotations

import numpy as np

from . import maps as oracle


def _xlogx(p):
    p = np.asarray(p, dtype=np.float64)
    return np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)


def _entmax_F(alpha):
    def F(u):  # integral of [(a-1)u]_+^(1/(a-1))
        return np.maximum((alpha - 1) * u, 0.0) ** (alpha / (alpha - 1)) / alpha

    return F


def _entmax_psi(alpha):
    return lambda p: p**alpha / (alpha * (alpha - 1))


# name -> (f, F, psi, capped)
FAMILIES = {
    "softmax": (np.exp, np.exp, lambda p: _xlogx(p) - p, False),
    "sparsemax": (oracle._f_relu, lambda u: 0.5 * np.maximum(u, 0) ** 2, lambda p: 0.5 * p * p, False),
    "exp": (oracle._f_exp, lambda u: np.where(u <= 0, np.exp(np.minimum(u, 0)), 1 + u), lambda p: _xlogx(p) - p, True),
    "sigmoid": (oracle._f_sigmoid, lambda u: np.logaddexp(0.0, u), lambda p: _xlogx(p) + _xlogx(1 - p), True),
    # Laplace: F = e^u/2 (u < 0), u + e^-u/2 (u >= 0); its conjugate is
    # p log 2p - p below 1/2 and (1-p) log 2(1-p) - (1-p) above.
    "laplace": (
        oracle._f_laplace,
        lambda u: np.where(u < 0, 0.5 * np.exp(np.minimum(u, 0)), u + 0.5 * np.exp(-np.maximum(u, 0))),
        lambda p: np.where(p < 0.5, 0.5 * _xlogx(2 * p) - p, 0.5 * _xlogx(2 * (1 - p)) - (1 - p)),
        True,
    ),
    "sparse": (
        oracle._f_sparse,
        lambda u: np.where(u > 1, u - 0.5, 0.5 * np.clip(u, 0, None) ** 2),
        lambda p: 0.5 * p * p,
        True,
    ),
}


def family(name, alpha=None):
    if name == "entmax":
        return oracle._f_entmax(alpha), _entmax_F(alpha), _entmax_psi(alpha), False
    return FAMILIES[name]


def fy_row(name, z, y, k=1, alpha=None):
    """FY loss of one row z (1-D, may hold -inf) against a dense target y."""
    f, F, psi, _ = family(name, alpha)
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if np.isnan(z).any() or np.isposinf(z).any():
        return np.nan
    fin = np.isfinite(z)
    if (y[~fin] > 0).any():
        return np.inf
    zf, yf = z[fin], y[fin]
    if fin.sum() <= k:  # p = 1 on every finite entry
        p = np.ones_like(zf)
        phi = (zf * p).sum() - psi(p).sum()
    else:
        lam = oracle.solve_lambda(f, zf, k)
        phi = F(zf - lam).sum() + k * lam
    return phi + psi(yf).sum() - (zf * yf).sum()


def _rows(a, axis):
    moved = np.moveaxis(np.asarray(a, dtype=np.float64), axis, -1)
    return moved.reshape(-1, moved.shape[-1]), moved.shape[:-1]


def one_hot(target, n, axis):
    t = np.asarray(target)
    eye = np.eye(n)[np.clip(t, 0, n - 1)]
    return np.moveaxis(eye, -1, axis)


def fy_loss(name, x, y, k=1, tau=1.0, alpha=None, keep=None, reduction="none"):
    """Per-row FY loss of x/tau (classes on axis 1, or 0 for 1-D) against dense y."""
    axis = 0 if np.ndim(x) == 1 else 1
    xr, shape = _rows(np.asarray(x) / tau, axis)
    yr, _ = _rows(y, axis)
    out = np.array([fy_row(name, a, b, k, alpha) for a, b in zip(xr, yr)]).reshape(shape)
    return _reduce(out, keep, reduction)


def _reduce(out, keep, reduction):
    if keep is not None:
        out = np.where(keep, out, 0.0)
    if reduction == "none":
        return out
    if reduction == "sum":
        return out.sum()
    return out.sum() / (np.sum(keep) if keep is not None else out.size)


def cross_entropy(x, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, tau=1.0):
    """torch's documented cross_entropy formula, class-index or probability targets."""
    x = np.asarray(x, dtype=np.float64) / tau
    axis = 0 if x.ndim == 1 else 1
    n = x.shape[axis]
    m = np.max(x, axis=axis, keepdims=True)
    logp = x - (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True)))
    w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64)
    wshape = [1] * x.ndim
    wshape[axis] = n
    wb = w.reshape(wshape)
    t = np.asarray(target)
    if np.issubdtype(t.dtype, np.floating):
        q = (1 - label_smoothing) * t + label_smoothing / n
        out = -(wb * q * logp).sum(axis=axis)
        return _reduce(out, None, reduction)
    keep = t != ignore_index
    tt = np.where(keep, t, 0)
    lp_t = np.take_along_axis(logp, np.expand_dims(tt, axis), axis).squeeze(axis)
    w_t = np.where(keep, w[tt], 0.0)
    nll = -w_t * lp_t
    smooth = np.where(keep, -(wb * logp).sum(axis=axis), 0.0)
    out = (1 - label_smoothing) * nll + label_smoothing / n * smooth
    if reduction == "none":
        return out
    if reduction == "sum":
        return out.sum()
    return out.sum() / w_t.sum()


def topk_softmax_ce(x, target, k, ignore_index=-100, reduction="mean", tau=1.0):
    """Su's sparse-softmax CE: log sum_{i in top-k} e^{s_i} - s_t, from a full sort."""
    s = np.asarray(x, dtype=np.float64) / tau
    axis = 0 if s.ndim == 1 else 1
    top = -np.sort(-s, axis=axis)
    top = np.take(top, np.arange(k), axis=axis)
    m = top.max(axis=axis, keepdims=True)
    lse = (m + np.log(np.exp(top - m).sum(axis=axis, keepdims=True))).squeeze(axis)
    t = np.asarray(target)
    keep = t != ignore_index
    tt = np.where(keep, t, 0)
    s_t = np.take_along_axis(s, np.expand_dims(tt, axis), axis).squeeze(axis)
    return _reduce(lse - s_t, keep, reduction)
