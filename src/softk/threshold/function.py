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

from .. import _backend, native

from .families import EXP, Family
from .solve import solve_exp_pooled, solve_exp_topk, solve_lambda, solve_on_candidates


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half inputs are computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def row_status(z: Tensor, k: int):
    """(finite mask, rows to solve, broken rows) for a (..., n) tensor."""
    finite = z > float("-inf")
    broken = (torch.isnan(z) | (z == float("inf"))).any(-1, keepdim=True)
    saturated = finite.sum(-1, keepdim=True) <= k
    return finite, ~(broken | saturated), broken


# Rows narrower than this go through the general solver: a partial sort saves
# nothing there and the general path is the one the fast paths are checked against.
_FAST_MIN_WIDTH = 64


def _fill_rows(z: Tensor, p: Tensor, active: Tensor, broken: Tensor) -> Tensor:
    """Apply the row conventions to rows that were not solved."""
    if bool(active.all()):
        return p
    filled = torch.where(broken, float("nan"), (z > float("-inf")).to(z.dtype))
    return torch.where(active, p, filled)


def _use_native(family: Family, t: Tensor) -> bool:
    """The compiled CPU kernels run ``family`` on ``t`` (see :mod:`softk.native`)."""
    return (
        t.dtype in (torch.float32, torch.float64)
        and t.shape[-1] > 0
        and native.family_id(family) is not None
        and _backend.resolve(t) == "native"
    )


def threshold_forward_support(family: Family, z: Tensor, k: int):
    """(p, support) with p = f(z − λ), Σp = k, on the last dimension (no autograd).

    ``support`` is ``(idx, valid)`` when p is known to vanish off the columns
    ``idx`` (..., K) outside the entries marked ``valid``; the backward then
    touches only those columns.  It is None on the general path.
    """
    n = z.shape[-1]
    if _use_native(family, z):
        return native.forward(family, z, k), None
    if family.zero_below and n >= _FAST_MIN_WIDTH and k + 2 <= n:
        lam, active, broken, idx, valid = solve_on_candidates(family, z, k)
        if idx is not None:
            # f(z − λ) = 0 off the candidates: write only the candidates.
            vals = torch.where(valid, family.f(z.gather(-1, idx) - lam), 0.0)
            p = torch.zeros_like(z).scatter_add_(-1, idx, vals)  # padding slots add 0
            return _fill_rows(z, p, active, broken), (idx, valid)
        zs = z if bool(active.all()) else torch.where(active, z, 0.0)
        return _fill_rows(z, family.f(zs - lam), active, broken), None
    if family is EXP and n >= _FAST_MIN_WIDTH and 4 * (k + 1) <= n:
        found = solve_exp_pooled(z, k) or solve_exp_topk(z, k)
        if found is not None:
            lam, active, broken = found
            zs = z if bool(active.all()) else torch.where(active, z, 0.0)
            return _fill_rows(z, family.f(zs - lam), active, broken), None
    finite, active, broken = row_status(z, k)
    zs = torch.where(active, z, 0.0)  # rows filled below get harmless values
    lam = solve_lambda(family, zs, k, active)
    p = family.f(zs - lam)
    filled = torch.where(broken, float("nan"), finite.to(z.dtype))
    return torch.where(active, p, filled), None


def threshold_forward(family: Family, z: Tensor, k: int) -> Tensor:
    """p = f(z − λ), Σp = k, on the last dimension (no autograd)."""
    return threshold_forward_support(family, z, k)[0]


def threshold_vjp(d: Tensor, g: Tensor, tau: float) -> Tensor:
    """d⊙(g − Σ(d⊙g)/Σd)/τ on the last dimension, 0 where Σd = 0."""
    sd = d.sum(-1, keepdim=True)
    # Σ d⊙g as a batched dot product: one pass and no n-sized temporary.
    sdg = (d.unsqueeze(-2) @ g.unsqueeze(-1)).squeeze(-1)
    coef = torch.where(sd > 0, sdg / torch.where(sd > 0, sd, 1.0), 0.0)
    out = (g - coef).mul_(d)
    return out if tau == 1.0 else out.div_(tau)


class ThresholdFunction(torch.autograd.Function):
    """p = f(x/τ − λ) along the last dimension of ``x``; saves p (and, for the
    sparse families, the support's column indices)."""

    @staticmethod
    def forward(ctx, x: Tensor, family: Family, k: int, tau: float) -> Tensor:
        z = x.to(compute_dtype(x.dtype))
        if tau != 1.0:
            z = z / tau
        p, support = threshold_forward_support(family, z, k)
        out = p.to(x.dtype)
        ctx.family, ctx.tau, ctx.sparse = family, tau, support is not None
        # The backward runs where the forward ran, whatever the backend is then.
        ctx.native = _use_native(family, z)
        ctx.save_for_backward(out, *(support or ()))
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        out = ctx.saved_tensors[0]
        ct = compute_dtype(out.dtype)
        if ctx.native:
            return native.backward(ctx.family, out.to(ct), g.to(ct), ctx.tau).to(out.dtype), None, None, None
        if ctx.sparse:
            # d = 0 off the support: the vjp lives on the saved columns only.
            idx, valid = ctx.saved_tensors[1:]
            d = torch.where(valid, ctx.family.d_from_p(out.gather(-1, idx).to(ct)), 0.0)
            vals = threshold_vjp(d, g.gather(-1, idx).to(ct), ctx.tau)
            grad = torch.zeros(out.shape, dtype=ct, device=out.device).scatter_add_(-1, idx, vals)
            return grad.to(out.dtype), None, None, None
        d = ctx.family.d_from_p(out.to(ct))
        return threshold_vjp(d, g.to(ct), ctx.tau).to(out.dtype), None, None, None


def threshold_map(x: Tensor, family: Family, k: int, dim: int, tau: float) -> Tensor:
    """Launcher: move ``dim`` last, apply the map, move it back.

    Under the "triton" backend (see :mod:`softk._backend`) the Triton kernels
    run instead, except for float64 input (they compute in float32)."""
    if x.numel() == 0:
        return x * 0
    if x.dtype != torch.float64 and _backend.resolve(x) == "triton":
        from ..triton import triton_threshold_map

        alpha = family.alpha if family.alpha is not None else 1.5
        return triton_threshold_map(x, family.name, k, dim, tau, alpha)
    out = ThresholdFunction.apply(x.movedim(dim, -1), family, k, tau)
    return out.movedim(-1, dim)
