r"""The two iterative soft-k-max constructions of the seed, kept for comparison.

Both build p in k rounds of a softmax that discounts what has already been
picked (z = x/τ):

* "iterative" (Su Jianlin 2019): shift z to be non-negative, z ← z − min z,
  then k times  p ← p + softmax((1 − p) ⊙ z).
  An entry that is fully picked (p_i = 1) has its score multiplied by 0 and
  drops to the bottom of the non-negative range.  As τ → 0 this is the hard
  top-k, and k = 1 is softmax, but Σp = k is the only constraint it keeps:
  p_i can exceed 1 (x = [0, 0, 0, 5], k = 2, τ = 0.3 gives p₄ ≈ 1.25) and it
  is not monotone (x = [3, 2, 1, 0], k = 2, τ = 0.3 gives p₂ > p₁).  The
  shift by min z makes it shift invariant; the products (1 − p)·z make it
  depend on where that minimum lies, i.e. on the spread of the scores.
* "weighted" (a Stack Exchange answer): k times
  p ← p + q,  q_i = (1 − p_i)₊ e^{z_i} / Σ_j (1 − p_j)₊ e^{z_j}
  (an entry with p ≥ 1 weighs 0).
  Flawed: once p_max ≈ 1 its weight 1 − p_max ≈ e^{z₂ − z₁} exactly offsets
  its larger score, so at k = 2 the τ → 0 limit is 1.5 / 0.5 instead of 1 / 1.
  The weights are carried as log(1 − p), not formed from p: 1 − p of a p
  within e^{−37} of 1 is 0 in float64 (e^{−17} in float32), which gave the
  hard top-k (1 / 1) where the recursion gives 1.5 / 0.5.  At exact ties
  the recursion itself is ill-conditioned: [0, δ, −40, −100] at k = 3 gives
  1.3 / 1.3 / 0.4 for δ = 0 and 1.98 / 1 / 0.02 for δ = 1e-15, so a row's
  rounding alone decides it there.

Both are plain compositions of differentiable torch operations (autograd
gives the exact gradient of the k-step recursion).  ``softk.properties()``
measures which of the seed's properties each keeps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..threshold.rows import compute_dtype, masked_logsumexp, row_status, shift_over_tau


def _rows(x: Tensor, k: int, tau: float):
    """z on the last dimension with masked entries replaced by 0 (kept out of
    every softmax below), plus the row conventions."""
    xc = x.to(compute_dtype(x.dtype))
    finite, active, broken = row_status(xc.detach(), k)
    # Both maps are shift invariant: shift by the row max before dividing by
    # τ, so z keeps the differences of x (x/τ first rounds them away at large
    # offsets or tiny τ, and overflows for |x|/τ > the dtype's range).
    top = torch.where(finite, xc.detach(), float("-inf")).amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    # (an entry whose z overflows below stays the lowest float: −inf would
    # give −inf − −inf = NaN in the shift by the row's minimum)
    z = torch.clamp(shift_over_tau(xc, top, tau, check=False), min=torch.finfo(xc.dtype).min)
    use = finite & active
    zs = torch.where(use, z, 0.0)
    filled = torch.where(broken, float("nan"), finite.to(z.dtype))
    return zs, use, active, filled


def _masked_softmax(logits: Tensor, use: Tensor) -> Tensor:
    """softmax over the entries in ``use`` (at least one per row), 0 elsewhere.
    Written out: torch.softmax's threaded kernel wakes its threads even for
    tiny rows, which costs far more than the rows when the cores are busy."""
    m = torch.where(use, logits, float("-inf")).amax(-1, keepdim=True).detach()
    e = torch.where(use, torch.exp(torch.where(use, logits, m) - m), 0.0)
    return e / e.sum(-1, keepdim=True)


def _su_iterative_last(x: Tensor, k: int, tau: float) -> Tensor:
    zs, use, active, filled = _rows(x, k, tau)
    zmin = torch.where(use, zs, float("inf")).amin(-1, keepdim=True)
    zs = torch.where(use, zs - torch.where(active, zmin, 0.0), 0.0)  # >= 0
    p = torch.zeros_like(zs)
    for _ in range(k):
        p = p + _masked_softmax((1 - p) * zs, use)
    return torch.where(active, p, filled).to(x.dtype)


def _weighted_last(x: Tensor, k: int, tau: float) -> Tensor:
    zs, use, active, filled = _rows(x, k, tau)
    n = zs.shape[-1]
    p = torch.zeros_like(zs)
    lc = torch.zeros_like(zs)  # log(1 − p), −inf once the weight is 0: carried, not formed from p
    neg = float("-inf")
    for _ in range(k):
        # log a = z + log c over the live weights; the inner wheres keep
        # masked and dead entries out of every exp and log (finite gradients)
        pos = use & (lc > neg)
        la = torch.where(pos, zs + torch.where(pos, lc, 0.0), neg)
        m = torch.where(use, la, neg).amax(-1, keepdim=True).detach()
        ls = torch.logsumexp(torch.where(pos, la - m, neg), -1, keepdim=True)  # log S − M (the largest is live)
        q = torch.where(pos, torch.exp(torch.where(pos, la, m) - m - ls), 0.0)
        # c − q = c (S − e^z)/S, with S − e^z = Σ_{j≠i} a_j − p_i e^{z_i}:
        # log Σ_{j≠i} a_j without cancelling, the largest a's as a
        # logsumexp of the others, the rest as log S + log1p(−a_i/S)
        # (a_i ≤ S/2), and then minus p_i e^{z_i} as a log1p; c − q ≤ 0
        # leaves the weight 0 for good
        top = la.detach().argmax(-1, keepdim=True) == torch.arange(n, device=zs.device)
        others = masked_logsumexp(la - m, pos & ~top)
        lr = torch.where(top, others, ls + torch.log1p(-torch.where(top | ~pos, 0.0, q)))
        lp = torch.log(torch.where(pos & (p > 0), p, 1.0))
        t = torch.where(pos & (p > 0), lp + zs - m - lr, neg)  # log(p e^{z−M}/rest)
        live = pos & (t < 0) & (lr > neg)
        ld = lr + torch.log1p(-torch.exp(torch.where(live, t, -1.0)))
        lc = torch.where(live, lc + ld - ls, neg)
        p = p + q
    return torch.where(active, p, filled).to(x.dtype)


def _launch(fn, x: Tensor, k: int, dim: int, tau: float) -> Tensor:
    if x.numel() == 0:
        return x * 0
    return fn(x.movedim(dim, -1), k, tau).movedim(-1, dim)


def su_iterative(x: Tensor, k: int, dim: int, tau: float) -> Tensor:
    """``soft_topk(method="iterative")`` (arguments already validated)."""
    return _launch(_su_iterative_last, x, k, dim, tau)


def weighted(x: Tensor, k: int, dim: int, tau: float) -> Tensor:
    """``soft_topk(method="weighted")`` (arguments already validated)."""
    return _launch(_weighted_last, x, k, dim, tau)
