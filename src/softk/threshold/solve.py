r"""The one place that finds λ with  Σ_i f(z_i − λ) = k  (last dimension).

``g(λ) = Σ_i f(z_i − λ)`` is non-increasing in λ.  Two routes:

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

Fast paths (used by :mod:`.function` on rows of 64 entries or more):
:func:`solve_on_candidates` for the families with f = 0 below 0 and
:func:`solve_exp_pooled` for soft top-k "exp" find λ without sorting the row:
block maxima give a lower bound of λ, only the few entries above it are
solved exactly with the routes above (see BENCHMARKS.md for measurements).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .entmax_anchor import entmax_probs, needs_anchor
from .families import EXP, Family

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


def bracket_by_sorting(family: Family, z: Tensor, k: int) -> Tensor:
    """Like :func:`bracket_by_knots` for families with ``support_size``: one
    sort and cumulative sums give the support size ρ, and t is put between
    the ρ-th and (ρ+1)-th largest entries."""
    v = torch.sort(z, dim=-1, descending=True).values
    finite = v > float("-inf")
    top = v[..., :1]
    s = torch.where(finite, v - torch.where(finite[..., :1], top, 0.0), float("-inf"))
    rho = family.support_size(s, finite, k).clamp(min=1)
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
    scores, or wide ties where z − λ is tiny.)  A row stops when
      * |g(λ') − k| ≤ 4·eps·k: Σp is k to a few ulps, so every p_i is within
        that of its exact value to first order (|Δp_i| = f'_i |Δλ| ≤ |Δg|);
      * or the step is at most 2 ulps of λ': λ' is at its own resolution
        (rows where rounding in the sum keeps |g − k| above 4·eps·k);
      * or the step lands on a bracket end already evaluated (a cycle).
    """
    eps = torch.finfo(s.dtype).eps
    n = s.shape[-1]
    q = family.newton_power
    lam = lo.clone() if family.convex else 0.5 * (lo + hi)
    lo_seen = torch.zeros_like(lam, dtype=torch.bool)
    hi_seen = torch.zeros_like(lam, dtype=torch.bool)
    for _ in range(_MAX_ITER):
        u = s - lam
        gl = family.f(u).sum(-1, keepdim=True)
        r = gl - k
        slope = family.df(u).sum(-1, keepdim=True)  # = -g'(λ) >= 0
        lo = torch.where(r > 0, lam, lo)
        hi = torch.where(r <= 0, lam, hi)
        lo_seen = lo_seen | (r > 0)
        hi_seen = hi_seen | (r <= 0)
        if q is None:
            step = lam + r / slope
        else:  # Newton on h = g^(1/q) − k^(1/q):  Δλ = q (g^(1/q) − k^(1/q)) g^(1−1/q) / slope
            step = lam + q * (gl ** (1 / q) - k ** (1 / q)) * gl ** (1 - 1 / q) / slope
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
        tiny = (torch.abs(new - lam) <= 2 * eps * torch.abs(lam)) & (torch.abs(r) <= 2 * n * eps * k)
        done = (
            (torch.abs(r) <= 4 * eps * k)
            | tiny
            | revisit
            | ~active
        )
        lam = torch.where(r == 0, lam, new)
        if bool(done.all()):
            break
    return lam


def lambda_reference(z: Tensor, k: int, capped: bool) -> Tensor:
    """The entry each row's λ is carried relative to: the k-th largest finite
    entry for the capped (top-k) families, the maximum otherwise; 0 on rows
    without one (rows the solver ignores).

    λ lies within O(1 + log n) of it: for the capped families
    g(z_(k)) ≥ k ≥ g(z_(k) + log(n)) (exp; the others alike), for the k = 1
    maps max z − f⁻¹(k) ≤ λ ≤ max z.  So λ' = λ − ref is of the order of the
    data's spread near the threshold, whatever the row's offset or outliers
    (the maximum alone is not: with one outlier at 1e6, λ − max ≈ −1e6 and
    float32 keeps only 1/16 of λ's fraction).
    """
    if isinstance(k, Tensor):  # one k per row: the ⌊k⌋-th largest entry of each row
        if not capped:
            ref = z.amax(-1, keepdim=True)
        else:
            v = torch.sort(z, dim=-1, descending=True).values
            ref = v.gather(-1, (torch.clamp(torch.floor(k), 1, z.shape[-1]) - 1).long())
    elif capped and k > 1 and z.shape[-1] >= k:
        ref = torch.topk(z, k, dim=-1).values[..., k - 1 : k]
    else:
        ref = z.amax(-1, keepdim=True)
    return torch.where(torch.isfinite(ref), ref, 0.0)


def solve_relative(family: Family, z: Tensor, k: int, active: Tensor, lower=None):
    """(ref, λ') with λ = ref + λ' (see :func:`lambda_reference`); every
    route runs on the shifted row s = z − ref, so λ' is exact (piecewise
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
    return family.f(s - lam), lam + ref


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
        return family.closed_form(s, k, bracket_by_sorting(family, s, k))
    if family.closed_form is not None:
        t = bracket_by_knots(family, s, k) if family.knots is not None else None
        return family.closed_form(s, k, t)
    finite = s > float("-inf")
    lo, hi = family.bracket(s, k, finite)
    if lower is not None:
        lo = torch.minimum(torch.maximum(lo, lower), hi)
    return _newton_shifted(family, s, k, lo, hi, active)


# ------------------------------------------------------------------ fast paths
# Sorting every row costs O(n log n) and many passes; the fast paths below touch
# the full row only in a partial sort (``topk``) and in writing the output.

def _topk(z: Tensor, K: int):
    return torch.topk(z, K, dim=-1, sorted=True)


def row_status_from_top(v: Tensor, k: int):
    """(active, broken) from a row's top values sorted descending (k < width):
    topk puts NaN first, then +inf; m > k finite entries iff the (k+1)-th is finite."""
    top = v[..., :1]
    broken = torch.isnan(top) | (top == float("inf"))
    return (v[..., k : k + 1] > float("-inf")) & ~broken, broken


# Block widths of the max-pooling prefilter: wide rows get a first pass in
# blocks of 32 (one vectorised reduction), then blocks of 8 over the
# survivors; rows up to 4096 one pass in blocks of 16 (measured on the
# issue's 256x32000 and 2048x1024 cases, see BENCHMARKS.md).
_BLOCKS = (32, 8)
_BLOCKS_NARROW = (16,)
_NARROW = 4096


def _newton_lower_bound(family: Family, v: Tensor, k: int, steps: int = 3) -> Tensor:
    """A λ with Σ f(v − λ) ≥ k for an uncapped family (k = 1 maps), from a few
    Newton steps started where the top entry alone gives g ≥ k.  g is convex
    for α ≤ 2, so the iterates stay below the root; every iterate is checked
    (g ≥ k) before it is kept, which also covers α > 2."""
    finite = v > float("-inf")
    if family.bracket is not None:
        lam = family.bracket(v, k, finite)[0]
    else:  # f(c) = k: sparsemax c = k, entmax15 (c/2)^2 = k
        c = k if family.name == "sparsemax" else 2 * math.sqrt(k)
        lam = v.amax(-1, keepdim=True) - c
    lo = lam
    q = family.newton_power
    for _ in range(steps + 1):
        u = v - lam
        gl = family.f(u).sum(-1, keepdim=True)
        slope = family.df(u).sum(-1, keepdim=True)
        ok = gl >= k
        lo = torch.where(ok, torch.maximum(lo, lam), lo)
        if q is None:
            step = lam + (gl - k) / slope
        else:
            step = lam + q * (gl ** (1 / q) - k ** (1 / q)) * gl ** (1 - 1 / q) / slope
        lam = torch.where(ok & (slope > 0), step, lam)
    return lo


def _pool_and_gather(family: Family, z: Tensor, k: int, w: int, lam_lo: Tensor, broken: Tensor):
    """Tighten the lower bound λ_lo with the maxima of blocks of ``w`` and
    gather the blocks that can hold support entries.  Returns (λ_lo, broken
    rows, local column indices, gathered values with −inf in padding slots);
    ``lam_lo`` and ``broken`` are None on the first level, where the indices
    and values come back None when, on a row of at most 4096, the blocks
    would cover a third of it."""
    n = z.shape[-1]
    nb = n // w
    n0 = nb * w
    lead = z.shape[:-1]
    dev = z.device
    if w >= 32:
        bmax = z[..., :n0].reshape(*lead, nb, w).amax(-1)
    else:  # amax over a short inner dim is not vectorised; max_pool1d is (NaN propagates too)
        bmax = torch.nn.functional.max_pool1d(z[..., :n0].reshape(-1, 1, n0), w).reshape(*lead, nb)
    pooled = torch.cat([bmax, z[..., n0:]], -1) if n0 < n else bmax
    first = broken is None
    if first:  # NaN propagates through the block maxima, so broken rows show here
        top = pooled.amax(-1, keepdim=True)
        broken = torch.isnan(top) | (top == float("inf"))
        lam_lo = torch.full_like(top, float("-inf"))
    # Block maxima are entries of the row: the λ of any subset of entries is
    # a lower bound for the row's λ (g of the subset ≤ g of the row).
    sub_active = ((pooled > float("-inf")).sum(-1, keepdim=True) > k) & ~broken
    if bool(sub_active.any()):
        sub = torch.where(sub_active, pooled, 0.0)
        if family.capped:
            lam_sub = solve_lambda(family, sub, k, sub_active, lam_lo)
        else:
            # Any λ with g(λ) ≥ k will do: a few Newton steps, no sort.
            lam_sub = _newton_lower_bound(family, sub, k)
        lam_lo = torch.where(sub_active, torch.maximum(lam_lo, lam_sub), lam_lo)
    # Compact the indices of the blocks whose maximum is above λ_lo: a
    # cumulative count gives each its slot, the others go to a dropped slot.
    chosen = (bmax > lam_lo) & ~broken
    count = chosen.sum(-1, keepdim=True)
    kb = int(count.amax()) if count.numel() else 0
    if first and n <= _NARROW and 3 * kb * w > n:  # (measured slower on wide rows)
        return lam_lo, broken, None, None
    slot = torch.where(chosen, chosen.cumsum(-1) - 1, kb)
    block_idx = torch.zeros(*lead, kb + 1, dtype=torch.long, device=dev)
    block_idx.scatter_(-1, slot, torch.arange(nb, device=dev).expand_as(slot))
    cols = (block_idx[..., :kb].unsqueeze(-1) * w + torch.arange(w, device=dev)).reshape(*lead, kb * w)
    slot_ok = (torch.arange(kb, device=dev) < count).unsqueeze(-1).expand(*lead, kb, w)
    tail = torch.arange(n0, n, device=dev).expand(*lead, n - n0)
    cols = torch.cat([cols, tail], -1)
    slot_ok = torch.cat([slot_ok.reshape(*lead, kb * w), torch.ones_like(tail, dtype=torch.bool)], -1)
    return lam_lo, broken, cols, torch.where(slot_ok, z.gather(-1, cols), float("-inf"))


def _row_active(cand: Tensor, k: int, lam_lo, broken: Tensor) -> Tensor:
    """Rows with more than k finite entries (and no NaN/+inf).  A finite λ_lo
    means some pooled problem already had more than k finite entries; rows
    without one had every block with a finite entry gathered, so counting the
    gathered entries is counting the row."""
    if lam_lo is not None and bool((lam_lo > float("-inf")).all()):
        return ~broken  # skip counting: every row had a finite pooled problem
    many = (cand > float("-inf")).sum(-1, keepdim=True) > k
    if lam_lo is not None:
        many = many | (lam_lo > float("-inf"))
    return many & ~broken


def _compact(cols: Tensor, vals: Tensor, keep: Tensor):
    """Move the kept entries of each row to the front (order kept), pad with
    −inf; returns (cols, vals) of width max(#kept)."""
    count = keep.sum(-1, keepdim=True)
    width = max(int(count.amax()) if count.numel() else 0, 1)
    slot = torch.where(keep, keep.cumsum(-1) - 1, width)
    shape = (*vals.shape[:-1], width + 1)
    new_cols = torch.zeros(shape, dtype=cols.dtype, device=cols.device).scatter_(-1, slot, cols)
    new_vals = torch.full(shape, float("-inf"), dtype=vals.dtype, device=vals.device)
    new_vals.scatter_(-1, slot, torch.where(keep, vals, float("-inf")))
    return new_cols[..., :width], new_vals[..., :width]


def solve_on_candidates(family: Family, z: Tensor, k: int):
    """λ for a family with f(u) = 0 for u ≤ 0, touching the full row only once.

    1. Max-pool the row in blocks.  Block maxima are entries of the row, so
       λ_lo, the exact λ of the block maxima (plus the ragged tail), has
       Σ f(z − λ_lo) ≥ k over the whole row: λ* ≥ λ_lo.
    2. Only entries > λ_lo can be in the support, and they lie in the blocks
       whose maximum is > λ_lo: gather those blocks (few: a block enters only
       if its maximum is in the support of the pooled problem).  Repeat with
       smaller blocks on the gathered entries.
    3. Solve exactly on what is left: every other entry is ≤ λ_lo ≤ λ*,
       contributes f = 0, so this λ is the row's λ*.

    Rows whose pooled problem has ≤ k finite entries keep λ_lo = −inf (every
    block with a finite entry is gathered), so heavily masked rows stay exact.

    Returns (lam, active, broken, idx, valid): ``idx`` (..., K) are the
    gathered columns (padding slots repeat a column and are never ``valid``),
    ``valid`` marks the support; ``idx`` is None when the gathered columns
    are a large part of the row.
    """
    n = z.shape[-1]
    widths = _BLOCKS_NARROW if n <= _NARROW else _BLOCKS
    top = z.amax(-1, keepdim=True) if n < 4 * widths[0] else None
    cols, cand = None, z
    lam_lo = broken = None
    for w in widths:
        if cand.shape[-1] < 4 * w:
            break
        lam_lo, broken, local, cand = _pool_and_gather(family, cand, k, w, lam_lo, broken)
        if local is None:
            # The blocks above λ_lo would be a third of the row or more (wide
            # supports): filter the row itself by value instead.
            cols = torch.arange(n, device=z.device).expand(z.shape)
            active = _row_active(z, k, lam_lo, broken)
            cols, cand = _compact(cols, z, (z > lam_lo) & active)
            return _finish(family, z, k, cols, cand, lam_lo, broken, active)
        cols = local if cols is None else cols.gather(-1, local)
    if broken is None:
        broken = torch.isnan(top) | (top == float("inf"))
    active = _row_active(cand, k, lam_lo, broken)
    if cols is not None:
        # Entries ≤ λ_lo have f = 0 at every λ ≥ λ_lo: drop them before the
        # exact solve (g restricted to the rest still has g(λ_lo) ≥ k).
        cols, cand = _compact(cols, cand, (cand > lam_lo) & active)
    return _finish(family, z, k, cols, cand, lam_lo, broken, active)


def _finish(family, z, k, cols, cand, lam_lo, broken, active):
    """The exact solve on the surviving candidates, and the support."""
    n = z.shape[-1]
    lower = None if lam_lo is None else torch.where(active, lam_lo, float("-inf"))
    lam = solve_lambda(family, torch.where(active, cand, 0.0), k, active, lower)
    if cols is None or 2 * cols.shape[-1] > n:
        return lam, active, broken, None, None
    return lam, active, broken, cols, (cand > lam) & active


def _exp_from_sorted(v: Tensor, r: Tensor, k: int, active: Tensor):
    """λ for f(u) = min(1, e^u) given the candidates for saturation ``v``
    (sorted descending, −inf padded) and r = logsumexp of every other entry.

    With the top j candidates saturated (z ≥ λ) and the rest not,
    λ_j = logaddexp(r, lse(v_j, v_{j+1}, …)) − log(k − j); the j consistent
    with its own partition (v_{j−1} ≥ λ_j > v_j) solves Σ min(1, e^{z−λ}) = k,
    which is strictly decreasing there, so it is the λ.  Returns None when a
    row has no consistent j (rounding at ties): the caller then uses the
    general solver.
    """
    c = v.shape[-1]
    v = torch.cat([v, torch.full_like(v[..., :1], float("-inf"))], -1)
    width = min(c + 1, k)  # at most k − 1 entries are saturated
    # lse(v_j..) for every j: a reversed cumulative logsumexp.
    tail = torch.logcumsumexp(v.flip(-1), -1).flip(-1)[..., :width]
    j = torch.arange(width, device=v.device, dtype=v.dtype)
    lam_j = torch.logaddexp(r, tail) - torch.log(k - j)
    vj = v[..., :width]
    prev = torch.cat([torch.full_like(v[..., :1], float("inf")), v[..., : width - 1]], -1)
    ok = (vj < lam_j) & (prev >= lam_j)
    if not bool((ok.any(-1, keepdim=True) | ~active).all()):
        return None
    first = ok.to(torch.uint8).argmax(-1, keepdim=True)
    return lam_j.gather(-1, first)


def solve_exp_topk(z: Tensor, k: int):
    """λ for f(u) = min(1, e^u) from the top k+1 entries and one logsumexp.

    At most k−1 entries are saturated, all among the top k, so the top k are
    the candidates of :func:`_exp_from_sorted`.  Returns (lam, active, broken)
    or None (see there).
    """
    v, idx = _topk(z, k + 1)
    active, broken = row_status_from_top(v, k)
    zs = torch.where(active, z, 0.0) if not bool(active.all()) else z
    vs = torch.where(active, v[..., :k], 0.0)
    r = torch.logsumexp(zs.scatter(-1, idx[..., :k], float("-inf")), -1, keepdim=True)
    lam = _exp_from_sorted(vs, r, k, active)
    return None if lam is None else (lam, active, broken)


def solve_exp_pooled(z: Tensor, k: int):
    """λ for f(u) = min(1, e^u) without a partial sort of the row.

    The exp-λ of the block maxima is a lower bound λ_lo (a subset of the
    terms of a positive sum); saturated entries have z ≥ λ* ≥ λ_lo, so they
    are among the entries ≥ λ_lo, which lie in the blocks whose maximum is
    ≥ λ_lo.  Those few entries are sorted; every other entry enters through
    one masked logsumexp.  Returns (lam, active, broken), or None when the
    row is too narrow for enough block maxima or at unresolved ties.
    """
    n = z.shape[-1]
    w = next((w for w in (32, 16, 8) if n // w >= 4 * (k + 1)), None)
    if w is None:
        return None
    lam_lo, broken, cols, cand = _pool_and_gather(EXP, z, k, w, None, None)
    if cols is None:  # too many blocks: filter the row itself
        cols, cand = torch.arange(n, device=z.device).expand(z.shape), z
    active = _row_active(cand, k, lam_lo, broken)
    # Rows with no finite pooled problem keep λ_lo = −inf: all their blocks.
    keep = (cand >= lam_lo) & active
    cols, cand = _compact(cols, cand, keep)
    keep = cand > float("-inf")
    taken = torch.zeros(z.shape, dtype=torch.int8, device=z.device)
    taken.scatter_add_(-1, cols, keep.to(torch.int8))  # padding slots add 0
    zs = z if bool(active.all()) else torch.where(active, z, 0.0)
    r = torch.logsumexp(torch.where(taken > 0, float("-inf"), zs), -1, keepdim=True)
    v = torch.sort(torch.where(active, cand, 0.0), -1, descending=True).values
    lam = _exp_from_sorted(v, r, k, active)
    return None if lam is None else (lam, active, broken)
