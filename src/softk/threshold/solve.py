r"""The one place that finds λ with  Σ_i f(z_i − λ) = k  (last dimension).

``g(λ) = Σ_i f(z_i − λ)`` is non-increasing in λ.  Two routes:

* piecewise families (``family.knots`` and ``family.closed_form``): g changes
  formula only at the knots (e.g. λ = z_i where an entry enters the support).
  Bisection over the *sorted* knots brackets λ between two adjacent knots in
  ⌈log₂(#knots + 1)⌉ evaluations of g, all rows at once; on that bracket every
  entry stays on one piece, and the family's closed form gives λ exactly.
* smooth families (``family.bracket``): safeguarded Newton inside a bracket
  [lo, hi] with g(lo) ≥ k ≥ g(hi), falling back to bisection whenever a Newton
  step leaves the bracket, stopping when the step is below a few ulps of λ in
  the working dtype (not after a fixed number of iterations).

Rows flagged inactive (masked, saturated or NaN rows, which the caller fills
itself) are ignored for convergence.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .families import Family

# Newton converges in a handful of steps; the cap only guards against a
# non-terminating loop on pathological input (bisection alone halves the bracket
# each step, so 2·(mantissa bits) steps reach the dtype's resolution).
_MAX_ITER = 2 * 64


def _g(family: Family, z: Tensor, lam: Tensor) -> Tensor:
    return family.f(z - lam).sum(-1, keepdim=True)


def bracket_by_knots(family: Family, z: Tensor, k: int) -> Tensor:
    """A point t strictly inside the knot interval that contains λ."""
    knots = family.knots(z)
    # Masked entries have -inf knots, where g is undefined (-inf - -inf); any
    # extra point is harmless to the bisection, so move them onto a finite knot.
    top = knots.amax(-1, keepdim=True)
    knots = torch.where(knots > float("-inf"), knots, top)
    knots = torch.sort(knots, dim=-1).values
    nk = knots.shape[-1]
    # Invariant: g(knots[lo]) >= k > g(knots[hi]), with knots[-1] = -inf, knots[nk] = +inf.
    lo = torch.full_like(top, -1, dtype=torch.long)
    hi = torch.full_like(top, nk, dtype=torch.long)
    for _ in range(math.ceil(math.log2(nk + 1))):
        mid = (lo + hi) // 2
        t = knots.gather(-1, mid.clamp(0, nk - 1))
        ge = _g(family, z, t) >= k
        open_ = hi - lo > 1
        lo = torch.where(open_ & ge, mid, lo)
        hi = torch.where(open_ & ~ge, mid, hi)
    t_lo = knots.gather(-1, lo.clamp(0, nk - 1))
    t_hi = knots.gather(-1, hi.clamp(0, nk - 1))
    return torch.where(lo < 0, t_hi - 1, torch.where(hi >= nk, t_lo + 1, 0.5 * (t_lo + t_hi)))


def newton(family: Family, z: Tensor, k: int, lo: Tensor, hi: Tensor, active: Tensor) -> Tensor:
    """Safeguarded Newton for g(λ) = k inside [lo, hi]."""
    eps = torch.finfo(z.dtype).eps
    lam = lo.clone() if family.convex else 0.5 * (lo + hi)
    for _ in range(_MAX_ITER):
        u = z - lam
        r = family.f(u).sum(-1, keepdim=True) - k
        slope = family.df(u).sum(-1, keepdim=True)  # = -g'(λ) >= 0
        lo = torch.where(r > 0, lam, lo)
        hi = torch.where(r <= 0, lam, hi)
        step = lam + r / slope
        inside = (slope > 0) & (step >= lo) & (step <= hi)
        new = torch.where(inside, step, 0.5 * (lo + hi))
        done = (torch.abs(new - lam) <= 4 * eps * (1 + torch.abs(lam))) | (r == 0) | ~active
        lam = torch.where(r == 0, lam, new)
        if bool(done.all()):
            break
    return lam


def solve_lambda(family: Family, z: Tensor, k: int, active: Tensor) -> Tensor:
    """λ of shape ``z.shape[:-1] + (1,)``; exact for piecewise families."""
    if family.closed_form is not None:
        t = bracket_by_knots(family, z, k) if family.knots is not None else None
        return family.closed_form(z, k, t)
    finite = z > float("-inf")
    lo, hi = family.bracket(z, k, finite)
    return newton(family, z, k, lo, hi, active)


# ------------------------------------------------------------------ fast paths
# Sorting every row costs O(n log n) and many passes; the fast paths below touch
# the full row only in a partial sort (``topk``) and in writing the output.

_K0 = 32  # first guess for the support size; a second round fixes rows it misses


def _topk(z: Tensor, K: int):
    return torch.topk(z, K, dim=-1, sorted=True)


def row_status_from_top(v: Tensor, k: int):
    """(active, broken) from a row's top values sorted descending (k < width):
    topk puts NaN first, then +inf; m > k finite entries iff the (k+1)-th is finite."""
    top = v[..., :1]
    broken = torch.isnan(top) | (top == float("inf"))
    return (v[..., k : k + 1] > float("-inf")) & ~broken, broken


def solve_on_candidates(family: Family, z: Tensor, k: int):
    """λ for a family with f(u) = 0 for u ≤ 0, from the top entries only.

    If λ_K solves Σ f(v − λ) = k over the K largest entries v, then g(λ_K) ≥ k,
    so λ* ≥ λ_K; when the (K+1)-th largest is ≤ λ_K no other entry reaches the
    support and λ* = λ_K.  Rows where that fails get a second round with K =
    #{z > λ_K} + 1, which is guaranteed to hold the support.

    Returns (lam, active, broken, idx, valid): ``idx`` are column indices of
    the candidates (..., K) and ``valid`` marks those in the support, or
    ``idx = None`` when the candidates cover a large part of the row.
    """
    n = z.shape[-1]
    K = min(n, max(_K0, k + 2))
    while True:
        v, idx = _topk(z, K)
        active, broken = row_status_from_top(v, k)
        vs = torch.where(active, v, 0.0)
        solve_on = vs if K == n else vs[..., :-1]
        lam = solve_lambda(family, solve_on, k, active)
        if K == n:
            break
        missed = (v[..., -1:] > lam) & active
        if not bool(missed.any()):
            break
        count = (torch.where(missed, z, float("-inf")) > lam).sum(-1).amax()
        K = min(n, max(2 * K, int(count) + 2))
    if 4 * K > n:
        return lam, active, broken, None, None
    valid = (v > lam) & active
    return lam, active, broken, idx, valid


def solve_exp_topk(z: Tensor, k: int):
    """λ for f(u) = min(1, e^u) from the top k+1 entries and one logsumexp.

    At most k−1 entries are saturated (z ≥ λ), all among the top k; every other
    entry is unsaturated.  With j saturated and R = logsumexp of the entries
    outside the top k,  λ_j = logaddexp(R, lse(v_j..v_{k−1})) − log(k − j); the
    j consistent with its own partition (v_{j−1} ≥ λ_j > v_j) is the solution.
    Returns (lam, active, broken) or None when a row has no consistent j
    (rounding at ties), so that the caller uses the general solver.
    """
    v, idx = _topk(z, k + 1)
    active, broken = row_status_from_top(v, k)
    zs = torch.where(active, z, 0.0) if not bool(active.all()) else z
    vs = torch.where(active, v[..., :k], 0.0)
    rest = zs.scatter(-1, idx[..., :k], float("-inf"))
    r = torch.logsumexp(rest, -1, keepdim=True)
    # lse(v_j..v_{k-1}) for every j: a reversed cumulative logsumexp.
    tail = torch.logcumsumexp(vs.flip(-1), -1).flip(-1)
    j = torch.arange(k, device=z.device, dtype=z.dtype)
    lam_j = torch.logaddexp(r, tail) - torch.log(k - j)
    prev = torch.cat([torch.full_like(vs[..., :1], float("inf")), vs[..., :-1]], -1)
    ok = (vs < lam_j) & (prev >= lam_j)
    found = ok.any(-1, keepdim=True) | ~active
    if not bool(found.all()):
        return None
    first = ok.to(torch.uint8).argmax(-1, keepdim=True)
    return lam_j.gather(-1, first), active, broken
