r"""The dense α-entmax (0 < α < 1) of :mod:`softk.compat.entmax` and its autograd rule.

p_i = [(1−α)(λ − z_i)]^{−1/(1−α)}, λ > max z by safeguarded Newton
(:func:`softk.threshold.families.entmax_dense_family`, in a frame that
keeps λ's digits as α → 1⁻); every entry of a row is in the support.
With d = p^{2−α},

.. math:: J = \mathrm{diag}(d) - d d^\top/\textstyle\sum d, \qquad
   \frac{\partial p_i}{\partial\alpha} = \frac{p_i - \tilde p_i}{(\alpha-1)^2}
      - \frac{p_i\log p_i - \tilde p_i\sum_j p_j\log p_j}{\alpha-1},\quad \tilde p = d/\textstyle\sum d,

the latter in the form of :func:`softk.threshold.entmax_alpha.dp_dalpha`,
whose terms do not cancel as α → 1.

Eager only: an old-style Function with backward and jvp, no vmap rule and no
library op (entmax's own ``entmax_bisect`` has neither).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..threshold.entmax_alpha import dp_dalpha, entmax_log_d
from ..threshold.families import entmax_dense_family
from ..threshold.rows import compute_dtype, finite_max, row_status
from ..threshold.solve import solve_probs
from .._backends.torch.threshold import vjp_from_slope


def dense_rows(x: Tensor, alpha) -> Tensor:
    """p on the last dimension (compute dtype, no autograd); α a float in (0, 1)
    or a tensor shaped x.shape[:-1] + (1,).  Row conventions as every map."""
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    finite, active, broken = row_status(xc, 1)
    s = torch.where(active, xc - finite_max(xc), 0.0)
    a = alpha.to(ct) if isinstance(alpha, Tensor) else alpha
    p, _ = solve_probs(entmax_dense_family(a), s, 1, active)
    filled = torch.where(broken, float("nan"), finite.to(ct))
    return torch.where(active, p, filled)


def _slope(p: Tensor, a) -> Tensor:
    pos = p > 0
    return torch.where(pos, torch.exp((2 - a) * torch.log(torch.where(pos, p, 1.0))), torch.where(p != p, p, 0.0))


def _dp_dalpha(p: Tensor, a: Tensor) -> Tensor:
    # the formula holds for every α (it needs only p̃ ∝ p^{2−α}); its
    # cancellation-free form keeps the digits that the two 1/(α−1)-sized
    # terms above would lose as α → 1⁻
    return dp_dalpha(p, a, entmax_log_d(p, a))


class _DenseEntmax(torch.autograd.Function):
    """Rows last; ``alpha`` a tensor shaped x.shape[:-1] + (1,) (or 0-d)."""

    @staticmethod
    def forward(ctx, x, alpha):
        p = dense_rows(x, alpha if alpha.dim() else float(alpha)).to(x.dtype)
        ctx.save_for_backward(p, alpha)
        ctx.save_for_forward(p, alpha)
        return p

    @staticmethod
    def backward(ctx, g):
        p, alpha = ctx.saved_tensors
        ct = compute_dtype(p.dtype)
        pc, gc, a = p.to(ct), g.to(ct), alpha.to(ct)
        gx = vjp_from_slope(_slope(pc, a), gc, 1.0).to(p.dtype)
        ga = None
        if ctx.needs_input_grad[1]:
            ga = (gc * _dp_dalpha(pc, a)).sum(-1, keepdim=True)
            ga = (ga.sum() if alpha.dim() == 0 else ga).to(alpha.dtype)
        return gx, ga

    @staticmethod
    def jvp(ctx, vx, va):
        p, alpha = ctx.saved_tensors
        ct = compute_dtype(p.dtype)
        pc, a = p.to(ct), alpha.to(ct)
        out = vjp_from_slope(_slope(pc, a), vx.to(ct), 1.0) if vx is not None else torch.zeros_like(pc)
        if va is not None:
            out = out + va.to(ct) * _dp_dalpha(pc, a)
        return out.to(p.dtype)


def entmax_dense(x: Tensor, alpha: Tensor) -> Tensor:
    """p on the last dimension of ``x``, in x's dtype, differentiable in x and
    α; ``alpha`` a tensor in (0, 1) shaped x.shape[:-1] + (1,) (or 0-d)."""
    return _DenseEntmax.apply(x, alpha)
