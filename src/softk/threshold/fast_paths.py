r"""The fast paths of the PyTorch solver: λ without sorting the row.

:func:`solve_on_candidates` for the families with f = 0 below 0 and
:func:`solve_exp_pooled` / :func:`solve_exp_topk` for soft top-k "exp" find λ
touching the full row only in block maxima (or a partial sort) and in writing
the output: block maxima give a lower bound of λ, and only the few entries
above it are solved exactly with the solvers of :mod:`.solve` (see
BENCHMARKS.md for measurements).  :mod:`softk._backends.torch.threshold` uses them on rows of 64
entries or more.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .families import EXP, Family
from .solve import solve_lambda

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
# survivors; rows up to 4096 one pass in blocks of 16 (the faster choice on
# 256x32000 and 2048x1024 rows in BENCHMARKS.md).
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


def _pool_and_gather(family: Family, z: Tensor, k: int, w: int, lam_lo: Tensor | None, broken: Tensor | None):
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
    assert lam_lo is not None and broken is not None  # set just now, or given by the level before
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
    if first and n <= _NARROW and 3 * kb * w > n:  # (slower on wide rows: BENCHMARKS.md)
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
        assert top is not None  # no level ran: the row is narrow
        broken = torch.isnan(top) | (top == float("inf"))
    active = _row_active(cand, k, lam_lo, broken)
    if cols is not None:
        assert lam_lo is not None  # a level ran
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
