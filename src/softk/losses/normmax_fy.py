r"""The α-normmax loss and the Fenchel–Young loss of any regulariser Ω_α.

:func:`normmax_loss` is the Fenchel–Young loss of :func:`softk._maps.normmax`
(Ω_α(p) = ‖p‖_α − 1); :func:`fenchel_young_rows` serves any Ω_α given as
functions on rows (the entmax package's Tsallis losses use it too, through
:mod:`softk.compat.entmax`).  The map's own autograd supplies p, so the
Hessian is the map's Jacobian, and a tensor α gets its gradient; the
potential's autograd rule is :func:`softk._ops.potential.regularised_potential`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import _dtensor

from .._maps.normmax import check_normmax_alpha
from .._ops.normmax import normmax_apply
from .._ops.potential import regularised_potential
from .._validate import reduce
from ..threshold.rows import compute_dtype, finite_max, over_tau, shift_over_tau
from . import targets as tg

__all__ = ["normmax_loss", "fenchel_young_rows"]


def fenchel_young_rows(x: Tensor, p: Tensor, y: Tensor, omega, d_omega, alpha, tau: float = 1.0) -> Tensor:
    r"""Fenchel–Young loss per row (keepdim), classes last, for a regulariser Ω_α:

    .. math:: L = \langle z, p\rangle - \Omega_\alpha(p) + \Omega_\alpha(y) - \langle z, y\rangle \ge 0,
              \qquad \nabla_x L = (p - y)/\tau, \quad \partial_\alpha L = \partial_\alpha\Omega_\alpha(y) - \partial_\alpha\Omega_\alpha(p),

    with ``p`` the map's output (from its own autograd, so the Hessian is its
    Jacobian), ``omega(v, alpha)`` Ω_α on rows (keepdim) and ``d_omega(v, alpha)``
    its partial derivative in α (only called for a tensor α that requires grad).
    ``alpha`` is a float or a tensor shaped like the rows' first dims + (1,).
    Clamped at 0 (only rounding makes it negative); the gradient is untouched.
    Blondel, Martins & Niculae, "Learning with Fenchel–Young losses", JMLR 2020.
    """
    z = shift_over_tau(x, finite_max(x).detach(), tau, check=False)
    zy = torch.where(y != 0, z * y, 0.0).sum(-1, keepdim=True)  # 0·(−inf) is 0 (masked classes)
    loss = regularised_potential(x, p, alpha, omega, d_omega, tau) + omega(y, alpha) - zy
    return loss - torch.clamp(loss.detach(), max=0.0)  # max(L, 0) in value, L's gradient


def _alpha_norm(v: Tensor, a) -> Tensor:
    """‖v‖_α on rows (keepdim) for v >= 0, in log space (0 entries dropped)."""
    logv = torch.log(torch.where(v > 0, v, 1.0))
    return torch.exp(torch.logsumexp(torch.where(v > 0, a * logv, float("-inf")), -1, keepdim=True) / a)


def _d_alpha_norm(v: Tensor, a) -> Tensor:
    """∂‖v‖_α/∂α = ‖v‖_α (Σ_i w_i log v_i / α − log Σ_i v_i^α / α²), w = v^α/Σv^α."""
    pos = v > 0
    logv = torch.log(torch.where(pos, v, 1.0))
    av = torch.where(pos, a * logv, float("-inf"))
    lse = torch.logsumexp(av, -1, keepdim=True)
    w = torch.exp(av - lse)
    mean_log = torch.where(pos, w * logv, 0.0).sum(-1, keepdim=True)
    return torch.exp(lse / a) * (mean_log / a - lse / a**2)


@_dtensor.entry("local loss", "normmax_loss")
def normmax_loss(input: Tensor, target: Tensor, alpha=2.0, ignore_index: int = -100,
                 reduction: str = "mean", tau=1.0) -> Tensor:
    r"""Fenchel–Young loss of α-normmax: :math:`\langle z, p\rangle - \|p\|_\alpha + \|y\|_\alpha - \langle z, y\rangle`.

    p = normmax(z), z = input/τ; its gradient is (p − y)/τ and it is 0 exactly
    when normmax outputs y.  For a class index t, ‖e_t‖_α = 1.

    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: class indices (an integer tensor shaped like ``input`` without
            dim 1) or a float tensor shaped like ``input`` whose rows are
            probability distributions.
        alpha: α >= 1 as in :func:`normmax` (a tensor: one α per row,
            broadcastable to ``input`` with size 1 along dim 1; it gets
            ∂‖y‖_α/∂α − ∂‖p‖_α/∂α at fixed p, the envelope theorem).
        ignore_index: class index whose rows give 0 and are left out of "mean".
        reduction: "mean", "sum" or "none".
        tau: temperature > 0.

    >>> import torch
    >>> normmax_loss(torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([2]))
    tensor(0.)
    >>> round(normmax_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0])).item(), 4)  # 1 − ‖(½, ½)‖₂
    0.2929
    """
    tau, reduction, ignore_index = tg.check_loss_args(input, target, tau, reduction, ignore_index)
    cdim = tg.class_dim(input)
    if input.shape[cdim] == 0:
        raise ValueError(f"input must have at least one class along dim {cdim}, got shape {tuple(input.shape)}")
    if target.requires_grad:
        raise ValueError("target requires grad, but Fenchel–Young losses give no gradient to the target; "
                         "pass target.detach()")
    alpha = check_normmax_alpha(alpha, input, cdim)
    x = input.movedim(cdim, -1).to(compute_dtype(input.dtype))
    if tg.is_index_target(target):
        index, keep = tg.index_target(input, target, ignore_index)
        y = F.one_hot(index, x.shape[-1]).to(x.dtype)
    else:
        if ignore_index != -100:
            raise ValueError("ignore_index applies to class-index targets only; with a probability target, "
                             "give ignored rows zero weight yourself (reduction='none')")
        y = tg.distribution_target(input, target, 1, False).movedim(cdim, -1).to(x.dtype)
        keep = None
    if isinstance(tau, Tensor):
        x, tau = over_tau(x, tau), 1.0
    a = alpha.to(x.dtype) if isinstance(alpha, Tensor) else alpha
    p = normmax_apply(x, a, tau)
    loss = fenchel_young_rows(x, p, y, _alpha_norm, _d_alpha_norm, a, tau).squeeze(-1)
    if keep is not None:
        loss = torch.where(keep, loss, 0.0)
    return reduce(loss, keep, reduction).to(input.dtype)
