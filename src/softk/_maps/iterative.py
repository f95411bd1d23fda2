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
  The weights c = 1 − p are carried as such, not formed from p: 1 − p of a
  p within e^{−37} of 1 is 0 in float64 (e^{−17} in float32), which gave
  the hard top-k (1 / 1) where the recursion gives 1.5 / 0.5.

Both are plain compositions of differentiable torch operations (autograd
gives the exact gradient of the k-step recursion).  ``softk.properties()``
measures which of the seed's properties each keeps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..threshold.rows import compute_dtype, row_status


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
    z = torch.clamp((xc - top) / tau, min=torch.finfo(xc.dtype).min)
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
    p = torch.zeros_like(zs)
    c = torch.ones_like(zs)  # 1 − p, carried to its own relative precision
    for _ in range(k):
        # a = c e^z over the weights c > 0, scaled by e^−M (M the largest
        # log a); the inner wheres keep the log's argument positive and the
        # masked entries out, so gradients stay finite
        pos = use & (c > 0)
        la = torch.where(pos, zs + torch.log(torch.where(pos, c, 1.0)), float("-inf"))
        m = torch.where(use, la, float("-inf")).amax(-1, keepdim=True).detach()
        a = torch.where(pos, torch.exp(torch.where(pos, la, m) - m), 0.0)
        s = a.sum(-1, keepdim=True)
        q = a / s
        # c − q = c (S − e^z)/S, with S − e^z = Σ_{j≠i} a_j − p_i e^{z_i}
        # (scaled as a): the leave-one-out sum of the largest a summed
        # without it, where S − a_i would cancel (the others' a_i ≤ S/2)
        top = torch.nn.functional.one_hot(a.detach().argmax(-1), a.shape[-1]).to(torch.bool)
        rest = torch.where(top, torch.where(top, 0.0, a).sum(-1, keepdim=True), s - a)
        # (e^{z−M} is large only where c is tiny; capped below the overflow)
        ez = torch.exp(torch.clamp(torch.where(pos, zs, m) - m, max=math.log(torch.finfo(zs.dtype).max) - 1))
        c = torch.where(pos, c * (rest - p * ez) / s, c)
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
