r"""The autograd function shared by every threshold map, and its row handling.

Forward:  p = f(x/τ − λ) with Σ p = k along the last dimension.
Backward (implicit function theorem), with d = f'(x/τ − λ) read off the saved
output and g the incoming gradient:

.. math::  \partial L/\partial x = \bigl(d\odot g - d\,\textstyle\sum(d\odot g)/\sum d\bigr)/\tau

and 0 where Σd = 0 (every entry exactly at 0 or 1: the map is locally constant).

Row conventions, the same for every map:

* ``-inf`` entries are removed: p = 0 there and the rest is the map of the
  remaining entries;
* a row with m ≤ k finite entries (including m = 0, a fully masked row) gets
  p = 1 on its finite entries and 0 elsewhere, so Σp = min(k, m); its gradient
  is 0;
* a row holding NaN or +inf returns NaN in that row only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .families import Family
from .solve import solve_lambda


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half inputs are computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def row_status(z: Tensor, k: int):
    """(finite mask, rows to solve, broken rows) for a (..., n) tensor."""
    finite = z > float("-inf")
    broken = (torch.isnan(z) | (z == float("inf"))).any(-1, keepdim=True)
    saturated = finite.sum(-1, keepdim=True) <= k
    return finite, ~(broken | saturated), broken


def threshold_forward(family: Family, z: Tensor, k: int) -> Tensor:
    """p = f(z − λ), Σp = k, on the last dimension (no autograd)."""
    finite, active, broken = row_status(z, k)
    zs = torch.where(active, z, 0.0)  # rows filled below get harmless values
    lam = solve_lambda(family, zs, k, active)
    p = family.f(zs - lam)
    filled = torch.where(broken, float("nan"), finite.to(z.dtype))
    return torch.where(active, p, filled)


def threshold_vjp(d: Tensor, g: Tensor, tau: float) -> Tensor:
    """(d⊙g − d·Σ(d⊙g)/Σd)/τ on the last dimension, 0 where Σd = 0."""
    dg = d * g
    sd = d.sum(-1, keepdim=True)
    coef = torch.where(sd > 0, dg.sum(-1, keepdim=True) / torch.where(sd > 0, sd, 1.0), 0.0)
    return (dg - d * coef) / tau


class ThresholdFunction(torch.autograd.Function):
    """p = f(x/τ − λ) along the last dimension of ``x``; saves only p."""

    @staticmethod
    def forward(ctx, x: Tensor, family: Family, k: int, tau: float) -> Tensor:
        z = x.to(compute_dtype(x.dtype)) / tau
        out = threshold_forward(family, z, k).to(x.dtype)
        ctx.save_for_backward(out)
        ctx.family, ctx.tau = family, tau
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        ct = compute_dtype(p.dtype)
        d = ctx.family.d_from_p(p.to(ct))
        return threshold_vjp(d, g.to(ct), ctx.tau).to(p.dtype), None, None, None


def threshold_map(x: Tensor, family: Family, k: int, dim: int, tau: float) -> Tensor:
    """Launcher: move ``dim`` last, apply the map, move it back."""
    if x.numel() == 0:
        return x * 0
    out = ThresholdFunction.apply(x.movedim(dim, -1), family, k, tau)
    return out.movedim(-1, dim)
