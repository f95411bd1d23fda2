"""mpmath references for the threshold maps on the *rounded* input.

The float input row x (float32 or float64 values, read exactly as binary
numbers) and τ (a Python float, exact) define z = x/τ exactly; λ with
Σ f(z_i − λ) = k is found by safeguarded Newton at ``PREC`` bits, so the
answer is the exact map of the float input, rounded once to float64 at the
end (the search for the maps' p stops as soon as that rounding is decided).  Independent of softk: it shares no code with the package.

Row conventions as the package: −inf entries are dropped (p = 0), a row with
m ≤ k finite entries gets p = 1 on them.
"""

from __future__ import annotations

import numpy as np
import mpmath as mp

PREC = 400  # bits: z spans up to ~1e24 (1e16 / 1e-8) and p must be right to 2^-60


def _fam(name, alpha=None):
    """(f, f') in mpmath for one family; k-th root bracket widening is generic."""
    one, half = mp.mpf(1), mp.mpf("0.5")
    if name == "exp":
        return (lambda u: one if u >= 0 else mp.exp(u)), (lambda u: 0 if u >= 0 else mp.exp(u))
    if name == "softmax":
        return mp.exp, mp.exp
    if name == "sigmoid":
        def f(u):
            return 1 / (1 + mp.exp(-u))
        return f, (lambda u: f(u) * f(-u))
    if name == "laplace":
        return (lambda u: 1 - half * mp.exp(-u) if u >= 0 else half * mp.exp(u)), (lambda u: half * mp.exp(-abs(u)))
    if name == "sparse":
        return (lambda u: min(one, max(u, 0))), (lambda u: 1 if 0 < u < 1 else 0)
    if name == "sparsemax":
        return (lambda u: max(u, 0)), (lambda u: 1 if u > 0 else 0)
    if name == "entmax15":
        name, alpha = "entmax", 1.5
    if name == "entmax":
        a = mp.mpf(alpha) - 1
        b = 1 / a
        return (lambda u: (a * u) ** b if u > 0 else 0), (lambda u: (a * u) ** (b - 1) if u > 0 else 0)
    raise ValueError(name)


def _root(f, df, z, k, settled=None):
    """λ with Σ f(z_i − λ) = k, to PREC − 40 bits, or as soon as ``settled(lo,
    hi)`` says the bracket [lo, hi] is narrow enough for the caller."""
    g = lambda lam: mp.fsum(f(v - lam) for v in z)  # noqa: E731
    zs = sorted(z, reverse=True)
    c = zs[min(k, len(zs)) - 1]
    lo, hi, w = c - 1, c + 1, mp.mpf(1)
    while g(lo) < k:
        w *= 4
        lo = c - w
    w = mp.mpf(1)
    while g(hi) > k:
        w *= 4
        hi = c + w
    lam = (lo + hi) / 2
    tol = mp.mpf(2) ** (-(PREC - 40)) * (1 + abs(c))
    near = mp.mpf(2) ** -40 * (1 + abs(c))  # below this width, ask settled()
    width = hi - lo
    for _ in range(8 * PREC):
        r = g(lam) - k
        if r == 0:
            return lam
        if r > 0:
            lo = lam
        else:
            hi = lam
        if hi - lo <= tol or settled is not None and hi - lo <= near and settled(lo, hi):
            return (lo + hi) / 2
        d = mp.fsum(df(v - lam) for v in z)
        step = lam + r / d if d > 0 else None
        # Newton while it at least halves the bracket every step (a power
        # 1/(α−1) = 1e4 makes plain Newton crawl), bisection otherwise
        slow = hi - lo > width / 2
        width = hi - lo
        lam = step if step is not None and lo < step < hi and not slow else (lo + hi) / 2
    raise AssertionError("oracle_mp: no convergence")


def threshold_row(name, row, k, tau=1.0, alpha=None):
    """p (float64) of one row; ``name`` one of exp, sigmoid, laplace, sparse,
    softmax (p = k·softmax), sparsemax, entmax15, entmax (with ``alpha``)."""
    row = np.asarray(row, dtype=np.float64)
    out = np.zeros_like(row)
    fin = np.isfinite(row)
    if fin.sum() <= k:
        out[fin] = 1.0
        return out
    f, df = _fam(name, alpha)
    with mp.workprec(PREC):
        out[fin] = probabilities(f, df, [mp.mpf(float(v)) / mp.mpf(tau) for v in row[fin]], k)
    return out


def probabilities(f, df, z, k):
    """The float64 roundings of f(z_i − λ) at the root λ of Σ f(z_i − λ) = k
    (z in mpmath numbers, at the caller's working precision)."""

    def settled(lo, hi):
        # f is nondecreasing, so f(z − λ) at the root λ ∈ [lo, hi] lies
        # between its values at hi and lo: where those round to the same
        # float64, so does the exact answer, and bisecting on changes nothing
        return all(float(f(v - lo)) == float(f(v - hi)) for v in z)

    lam = _root(f, df, z, k, settled)
    return [float(f(v - lam)) for v in z]


def topk_sum_row(name, row, k, tau=1.0):
    """τ·(Σ F(z − λ) + kλ) + τ·ψ(1)·k (the package's normalisation), float64."""
    row = np.asarray(row, dtype=np.float64)
    fin = np.isfinite(row)
    if fin.sum() <= k:
        return float(row[fin].sum())
    f, df = _fam(name)
    with mp.workprec(PREC):
        T = mp.mpf(tau)
        z = [mp.mpf(float(v)) / T for v in row[fin]]
        lam = _root(f, df, z, k)
        half = mp.mpf("0.5")
        if name == "exp":
            F, psi1 = (lambda u: mp.exp(u) if u <= 0 else 1 + u), -1
        elif name == "sigmoid":
            F, psi1 = (lambda u: mp.log1p(mp.exp(u)) if u < 0 else u + mp.log1p(mp.exp(-u))), 0
        elif name == "laplace":
            F, psi1 = (lambda u: u + half * mp.exp(-u) if u >= 0 else half * mp.exp(u)), 0
        else:  # sparse
            F, psi1 = (lambda u: u - half if u >= 1 else half * max(u, 0) ** 2), half
        return float(T * (mp.fsum(F(v - lam) for v in z) + k * lam) + T * psi1 * k)


def _F_psi(name, alpha=None):
    """(F with F' = f, ψ = F*) in mpmath, the package's normalisation."""
    half = mp.mpf("0.5")

    def xlogx(p):
        return p * mp.log(p) if p > 0 else mp.mpf(0)

    if name in ("exp", "softmax"):
        F = (lambda u: mp.exp(u) if u <= 0 else 1 + u) if name == "exp" else mp.exp
        return F, lambda p: xlogx(p) - p
    if name == "sigmoid":
        return (lambda u: mp.log1p(mp.exp(u)) if u < 0 else u + mp.log1p(mp.exp(-u))), (lambda p: xlogx(p) + xlogx(1 - p))
    if name == "laplace":
        def psi(p):
            q = p if p < half else 1 - p
            return xlogx(2 * q) / 2 - q
        return (lambda u: u + half * mp.exp(-u) if u >= 0 else half * mp.exp(u)), psi
    if name in ("sparse", "sparsemax"):
        F = (lambda u: u - half if u >= 1 else half * max(u, 0) ** 2) if name == "sparse" else (lambda u: half * max(u, 0) ** 2)
        return F, lambda p: half * p * p
    if name == "entmax15":
        name, alpha = "entmax", 1.5
    a = mp.mpf(alpha) - 1
    A = mp.mpf(alpha)
    return (lambda u: (a * u) ** (1 / a + 1) / A if u > 0 else 0), (lambda p: p**A / (A * a) if p > 0 else 0)


def fy_row(name, row, y, k=1, tau=1.0, alpha=None):
    """Fenchel–Young loss Φ(z) + Ω(y) − <z, y> of z = row/τ (finite row with
    more than k entries) against the target y, as float64."""
    f, df = _fam(name, alpha)
    F, psi = _F_psi(name, alpha)
    with mp.workprec(PREC):
        T = mp.mpf(tau)
        z = [mp.mpf(float(v)) / T for v in np.asarray(row, dtype=np.float64)]
        yy = [mp.mpf(float(v)) for v in np.asarray(y, dtype=np.float64)]
        lam = _root(f, df, z, k)
        phi = mp.fsum(F(v - lam) for v in z) + k * lam
        return float(phi + mp.fsum(psi(v) for v in yy) - mp.fsum(a * b for a, b in zip(z, yy)))
