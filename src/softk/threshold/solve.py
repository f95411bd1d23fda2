r"""The one place that finds λ with  Σ_i f(z_i − λ) = k  (last dimension).

``g(λ) = Σ_i f(z_i − λ)`` is non-increasing in λ.  Two methods:

* piecewise families (``family.knots`` and ``family.closed_form``): g changes
  formula only at the knots (e.g. λ = z_i where an entry enters the support).
  Bisection over the *sorted* knots brackets λ between two adjacent knots in
  ⌈log₂(#knots + 1)⌉ evaluations of g, all rows at once; on that bracket every
  entry stays on one piece, and the family's closed form gives λ exactly.
* smooth families (``family.bracket``): safeguarded Newton inside a bracket
  [lo, hi] with g(lo) ≥ k ≥ g(hi), falling back to bisection whenever a Newton
  step leaves the bracket.  It runs on the row shifted by its maximum
  (λ' = λ − max z, of the order of the data's spread, not of |λ|) and stops
  when Σp is k to a few ulps of k, or when the step is below the resolution
  of λ' in the working dtype (not after a fixed number of iterations).

Rows flagged inactive (masked, saturated or NaN rows, which the caller fills
itself) are ignored for convergence.

λ is carried relative to a reference entry of the row (:func:`lambda_reference`)
and :func:`solve_probs` evaluates p on the shifted row.  The fast paths that
avoid the sort on wide rows are in :mod:`.fast_paths`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .entmax_anchor import entmax_probs, needs_anchor
from .families import Family

# Newton converges in a handful of steps (at most ~40 on the hard rows of
# tests/test_newton_precision.py: ties, masks, offsets, α up to 5, sigmoid at
# scale 40); the cap only guards against a non-terminating loop on
# pathological input (bisection alone halves the bracket each step, so
# 2·(mantissa bits) steps reach the dtype's resolution).
_MAX_ITER = 2 * 64


def _g(family: Family, z: Tensor, lam: Tensor) -> Tensor:
    return family.f(z - lam).sum(-1, keepdim=True)


def bracket_by_knots(family: Family, z: Tensor, k: int) -> Tensor:
    """A point t strictly inside the knot interval that contains λ."""
    knots = family.knots(z)  # type: ignore[misc]  # called for a family with knots
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


def bracket_by_sorting(family: Family, z: Tensor, k: int) -> Tensor:
    """Like :func:`bracket_by_knots` for families with ``support_size``: one
    sort and cumulative sums give the support size ρ, and t is put between
    the ρ-th and (ρ+1)-th largest entries."""
    v = torch.sort(z, dim=-1, descending=True).values
    finite = v > float("-inf")
    top = v[..., :1]
    s = torch.where(finite, v - torch.where(finite[..., :1], top, 0.0), float("-inf"))
    rho = family.support_size(s, finite, k).clamp(min=1)  # type: ignore[misc]  # called for a family with support_size
    n = v.shape[-1]
    inside = v.gather(-1, rho - 1)
    below = v.gather(-1, rho.clamp(max=n - 1))
    return torch.where((rho < n) & (below > float("-inf")), 0.5 * (inside + below), inside - 1)


def _row_max(z: Tensor) -> Tensor:
    """Maximum of each row's finite entries; 0 for rows without one (masked
    or broken rows, which the solver ignores)."""
    m = z.amax(-1, keepdim=True)
    return torch.where(torch.isfinite(m), m, 0.0)


def newton(family: Family, z: Tensor, k: int, lo: Tensor, hi: Tensor, active: Tensor) -> Tensor:
    """Safeguarded Newton for g(λ) = k inside [lo, hi] (solved on the row
    shifted by its maximum, see :func:`_newton_shifted`)."""
    m = _row_max(z)
    return _newton_shifted(family, z - m, k, lo - m, hi - m, active) + m


def _newton_shifted(family: Family, s: Tensor, k: int, lo: Tensor, hi: Tensor, active: Tensor) -> Tensor:
    """Newton for λ' with Σ f(s − λ') = k on rows ``s`` whose maximum is 0.

    In this frame λ' is of the order of the data's spread rather than of |λ|
    (for entmax, −λ' is the largest z − λ), so a tolerance relative to λ' is
    one relative to the z − λ that make p; the caller adds the row maximum
    back, rounding once.  (A tolerance relative to |λ| leaves λ several ulps
    of λ' away from the root when |λ| is large next to the spread: offset
    scores, or wide ties where z − λ is tiny.)  Newton's function r (with
    the sign of g(λ') − k), its slope −r′ and the scale r's rounding is
    relative to are the family's ``residual`` where it has one (sigmoid: the
    log-ratio of the two tails' sums, each exact to its own ulps, where Σf's
    rounding to an ulp of k would leave the entries near 0 off by any
    factor), else Σf − k, Σf′ and k.  A row stops when
      * |r| ≤ 4·eps·scale: Σp is k to a few ulps of the scale, so every p_i
        is within that of its exact value to first order
        (|Δp_i| = f'_i |Δλ| ≤ |Δg|);
      * or the step is at most 2 ulps of λ': λ' is at its own resolution
        (rows where rounding in the sum keeps |r| above 4·eps·scale);
      * or the step lands on a bracket end already evaluated (a cycle) and
        no float lies strictly between the bracket's ends.  Where one does,
        the row bisects instead: a Newton step below the resolution of λ'
        is not a root where g is a staircase at that resolution (sigmoid at
        τ = 1e-8: z/τ ~ 1e8, whose ulp is 8, while σ goes from 0 to 1 within
        a few units of u), and the midpoint of a wide bracket may well be
        one (g = k exactly on the flat between two far-apart entries).
    """
    eps = torch.finfo(s.dtype).eps
    n = s.shape[-1]
    q = family.newton_power
    lam = lo.clone() if family.convex else 0.5 * (lo + hi)
    lo_seen = torch.zeros_like(lam, dtype=torch.bool)
    hi_seen = torch.zeros_like(lam, dtype=torch.bool)
    for _ in range(_MAX_ITER):
        u = s - lam
        if family.residual is not None:
            r, slope, scale = family.residual(u, k)
            lost = ~torch.isfinite(r)  # a tail underflowed: the sums again, in logs
            if bool(lost.any()):
                rl, sl, _ = family.residual(u, k, logspace=True)
                r, slope = torch.where(lost, rl, r), torch.where(lost, sl, slope)
            step = lam + r / slope
        else:
            gl = family.f(u).sum(-1, keepdim=True)
            r, scale = gl - k, k
            slope = family.df(u).sum(-1, keepdim=True)  # = -g'(λ) >= 0
            if q is None:
                step = lam + r / slope
            else:  # Newton on h = g^(1/q) − k^(1/q):  Δλ = q (g^(1/q) − k^(1/q)) g^(1−1/q) / slope
                step = lam + q * (gl ** (1 / q) - k ** (1 / q)) * gl ** (1 - 1 / q) / slope
        lo = torch.where(r > 0, lam, lo)
        hi = torch.where(r <= 0, lam, hi)
        lo_seen = lo_seen | (r > 0)
        hi_seen = hi_seen | (r <= 0)
        inside = (slope > 0) & (step >= lo) & (step <= hi)
        # A step past the bracket's upper end, while that end is still the
        # family's bound, goes to the bound itself: for α-entmax with α > 2
        # (g concave, so Newton overshoots from the left) the bound is the
        # root when the row is all ties, which bisection would approach only
        # one bit per step.
        to_hi = (slope > 0) & (step > hi) & ~hi_seen
        new = torch.where(inside, step, torch.where(to_hi, hi, 0.5 * (lo + hi)))
        # Landing on a bracket end already evaluated repeats that step: a
        # cycle at the resolution of g (it kept soft top-k sigmoid rows
        # alternating between two λ until the iteration cap).
        revisit = ((new == lo) & lo_seen) | ((new == hi) & hi_seen)
        # A step below 2 ulps of λ' ends a row only where |g − k| is within
        # the rounding of a sum of n terms: on an exponential tail of g (tiny
        # τ, |λ'| ~ 1e7) Newton's steps are 1 ulp of λ' while Σp is still
        # visibly off; such rows go on (or stop on a revisit).
        tiny = (torch.abs(new - lam) <= 2 * eps * torch.abs(lam)) & (torch.abs(r) <= 2 * n * eps * scale)
        converged = (torch.abs(r) <= 4 * eps * scale) | tiny | ~active
        # a revisit bisects where a float lies strictly inside the bracket
        mid = 0.5 * (lo + hi)
        bisect = revisit & (mid != lo) & (mid != hi) & ~converged
        new = torch.where(bisect, mid, new)
        done = converged | (revisit & ~bisect)
        lam = torch.where(r == 0, lam, new)
        if bool(done.all()):
            break
    return lam


def lambda_reference(z: Tensor, k: int, capped: bool) -> Tensor:
    """The entry each row's λ is carried relative to: the ⌈k⌉-th largest
    finite entry for the capped (top-k) families, the maximum otherwise; 0 on
    rows without one (rows the solver ignores).

    λ lies within O(1 + log n) of it: for the capped families
    g(z_(k)) ≥ k ≥ g(z_(k) + log(n)) (exp; the others alike), for the k = 1
    maps max z − f⁻¹(k) ≤ λ ≤ max z.  So λ' = λ − ref is of the order of the
    data's spread near the threshold, whatever the row's offset or outliers
    (the maximum alone is not: with one outlier at 1e6, λ − max ≈ −1e6 and
    float32 keeps only 1/16 of λ's fraction).
    """
    if isinstance(k, Tensor):  # one k per row: the ⌈k⌉-th largest entry of each row
        if not capped:
            ref = z.amax(-1, keepdim=True)
        else:
            # ⌈k⌉: a fractional k leaves the ⌈k⌉-th entry partly selected,
            # with λ within O(1) of it however far it lies below the ⌊k⌋-th
            # (k = 1.3 on [0, −1e20]: λ' relative to 0 would not hold the
            # 0.3 at ulp(1e20))
            v = torch.sort(z, dim=-1, descending=True).values
            ref = v.gather(-1, (torch.clamp(torch.ceil(k), 1, z.shape[-1]) - 1).long())
    elif capped and k > 1 and z.shape[-1] >= k:
        ref = torch.topk(z, k, dim=-1).values[..., k - 1 : k]
    else:
        ref = z.amax(-1, keepdim=True)
    return torch.where(torch.isfinite(ref), ref, 0.0)


def solve_relative(family: Family, z: Tensor, k: int, active: Tensor, lower=None):
    """(ref, λ') with λ = ref + λ' (see :func:`lambda_reference`); every
    method runs on the shifted row s = z − ref, so λ' is exact (piecewise
    families) or at its own resolution (Newton) whatever the row's offset.
    p = f((z − ref) − λ') is then exact; p = f(z − λ) with λ rounded to
    ulp(ref) is not, far from the origin.  ``lower`` as in :func:`solve_lambda`."""
    ref = lambda_reference(z, k, family.capped)
    s = z - ref
    if lower is not None:
        lower = lower - ref
    return ref, _solve_shifted(family, s, k, active, lower)


def solve_probs(family: Family, z: Tensor, k: int, active: Tensor, lower=None):
    """(p, λ) with p = f(z − λ), Σp = k, p evaluated on the shifted row (exact
    far from the origin; rows not ``active`` hold harmless values)."""
    ref, lam = solve_relative(family, z, k, active, lower)
    s = z - ref
    if family.name == "entmax" and needs_anchor(family.alpha):
        # λ's float grid is too coarse for α-entmax at large α and near α = 1
        return entmax_probs(family.alpha, s, lam, active), lam + ref
    p, step = settled_probs(family, s - lam, k)
    return p, lam + step + ref


SETTLE_ULPS = 8  # Σp − k, in ulps of k, past which a row takes settled_probs' step


def settled_probs(family: Family, u: Tensor, k, valid: Tensor | None = None):
    """(p, δ): p = f(u − δ) from u = z − λ, with δ one Newton step on
    Σ f(u − δ) = k for the families with f = 0 below 0 (δ = 0 for the others).

    λ comes rounded by an ulp of its own size, and every entry of the
    support moves by that rounding the same way: on a wide support far below
    the row's maximum (one entry at ½, thousands near 1e-4) Σp was off by
    n·eps·|λ| (4.4e-4 at 8192 entries in float32).  The entries near the
    support hold u exactly (u = z − λ with z near λ), so Σ f(u) − k is that
    rounding's effect to the precision of the sum, and one step removes it.
    Rows whose Σp is k to ``SETTLE_ULPS`` ulps take none, and when no row
    needs one, f′ is not evaluated.  ``valid`` (optional) marks the entries
    of u that are real (a candidate list's padding is not)."""
    none = torch.zeros_like(u[..., :1])
    if not family.zero_below:
        return family.p(u), none
    f = family.f(u)
    if valid is not None:
        f = torch.where(valid, f, 0.0)
    if family.capped:
        # the entries at the cap add 1 each: counted, not summed, so that r
        # is not rounded to an ulp of k (large budgets), which the step would
        # then spread over the few entries inside (0, 1); k − count is exact
        top = f >= 1
        rest = k - top.sum(-1, keepdim=True).to(f.dtype)
        r = torch.where(top, 0.0, f).sum(-1, keepdim=True) - rest
    else:
        rest = torch.as_tensor(k, dtype=f.dtype)
        r = f.sum(-1, keepdim=True) - rest
    # rows whose Σp is k to a few ulps already (most rows: λ's rounding
    # reaches few entries) take no step, and when none needs one, no pass
    off = torch.isfinite(r) & (r.abs() > SETTLE_ULPS * torch.finfo(f.dtype).eps * torch.clamp(rest.abs(), min=1.0))
    if not bool(off.any()):
        return (f if family.written is None else family.p(u)), none
    df = family.df(u)
    if valid is not None:
        df = torch.where(valid, df, 0.0)
    slope = df.sum(-1, keepdim=True)
    ok = off & (slope > 0) & torch.isfinite(slope)
    step = torch.where(ok, r / torch.where(ok, slope, 1.0), 0.0)
    if family.written is not None:
        return family.p(u - step), step
    # f(u − δ) to first order: δ is a few ulps of λ, so the next term,
    # δ²f″/2, is below p's own rounding, and f is not evaluated again
    # (a capped f stays at most 1: an entry just under the cap moves up by the step)
    return torch.clamp(f - step * df, min=0.0, max=1.0 if family.capped else None), step


def solve_lambda(family: Family, z: Tensor, k: int, active: Tensor, lower=None) -> Tensor:
    """λ of shape ``z.shape[:-1] + (1,)``; exact for piecewise families.

    ``lower`` (optional, −inf where unknown) is a known lower bound of λ
    (g(lower) ≥ k); Newton starts from it instead of the family's bracket.
    λ is solved relative to :func:`lambda_reference` and rounded once when
    that is added back (use :func:`solve_probs` for p itself).
    """
    ref, lam = solve_relative(family, z, k, active, lower)
    return lam + ref


def _solve_shifted(family: Family, s: Tensor, k: int, active: Tensor, lower) -> Tensor:
    """λ' on a row already shifted so that λ' = O(spread) (see above)."""
    if family.support_size is not None:
        return family.closed_form(s, k, bracket_by_sorting(family, s, k))  # type: ignore[misc]  # support_size comes with one
    if family.closed_form is not None:
        t = bracket_by_knots(family, s, k) if family.knots is not None else None
        return family.closed_form(s, k, t)  # type: ignore[arg-type]  # t is None for a family without knots (softmax)
    finite = s > float("-inf")
    lo, hi = family.bracket(s, k, finite)  # type: ignore[misc]  # a family without a closed form has a bracket
    if lower is not None:
        lo = torch.minimum(torch.maximum(lo, lower), hi)
    return _newton_shifted(family, s, k, lo, hi, active)
