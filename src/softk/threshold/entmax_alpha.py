r"""α-entmax with α a tensor (per row, learnable): gradients for x *and* α.

With β = 1/(α−1) and p_i = [(α−1)(z_i−λ)]_+^β, differentiating Σp = 1 at fixed
z gives (Peters et al. 2019, §3.2; the same expression as the entmax package's
``EntmaxBisectFunction``):

.. math::  \frac{\partial p_i}{\partial\alpha} =
   \frac{p_i - \tilde p_i}{(\alpha-1)^2} - \frac{p_i\log p_i - \tilde p_i\sum_j p_j\log p_j}{\alpha-1},
   \qquad \tilde p_i = \frac{p_i^{2-\alpha}}{\sum_j p_j^{2-\alpha}}.

At α = 1 exactly (softmax) both terms are 0/0; their limit, from a second-order
expansion in α−1, is  ∂p_i/∂α = p_i (Σ_j p_j log²p_j − log²p_i) / 2.

This module is the mathematics: p (:func:`entmax_rows`), log f′ through p
(:func:`entmax_log_d`) and ∂p/∂α (:func:`dp_dalpha`).  Its autograd rule and
the custom op ``softk::entmax_alpha`` are :mod:`softk._ops.entmax_alpha`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .families import entmax_family
from .rows import compute_dtype, row_status
from .entmax_anchor import entmax_probs, needs_anchor
from .fast_paths import solve_on_candidates
from .solve import solve_probs


def entmax_log_d(p: Tensor, a: Tensor) -> Tensor:
    # log f'(u) through p: (2 − α) log p on the support, −inf off it.  Kept in
    # log space: p^(2−α) overflows for small p at large α.
    logp = torch.log(torch.where(p > 0, p, 1.0))
    return torch.where(p > 0, (2 - a) * logp, float("-inf"))


def entmax_rows(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """p of α-entmax on the last dimension (no autograd), one α per row.

    The row is shifted by its finite maximum before dividing by τ (entmax is
    shift invariant; x/τ first rounds the differences away at large offsets
    or tiny τ), and p comes from :func:`softk.threshold.solve.solve_probs`
    (exact for every α > 1, softmax at α = 1).  Row conventions as every map.
    """
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    a = alpha.to(ct)
    finite, active, broken = row_status(xc, 1)
    top = torch.where(finite, xc, float("-inf")).amax(-1, keepdim=True)
    s = torch.where(active, (xc - torch.where(active, top, 0.0)) / tau, 0.0)
    soft = a == 1
    family = entmax_family(torch.where(soft, 2.0, a))
    if s.shape[-1] >= 64:
        # λ from the pooled fast path (no sort of the row), then p refined on its support
        lam, _, _, idx, valid = solve_on_candidates(family, s, 1)
        if needs_anchor(family.alpha):
            p = entmax_probs(family.alpha, s, lam, active)
        elif idx is not None:  # p = 0 off the gathered candidates: evaluate only those
            vals = torch.where(valid, family.f(s.gather(-1, idx) - lam), 0.0)
            p = torch.zeros_like(s).scatter_add_(-1, idx, vals)
        else:
            p = family.f(s - lam)
    else:
        p, _ = solve_probs(family, s, 1, active)
    if bool(soft.any()):
        p = torch.where(soft, torch.softmax(s, -1), p)
    filled = torch.where(broken, float("nan"), finite.to(ct))
    return torch.where(active, p, filled)


def dp_dalpha(p: Tensor, a: Tensor, logd: Tensor) -> Tensor:
    """∂p/∂α (the module docstring's formula and its α = 1 limit), from the output p, α and log d (d = f′ through p)."""
    logp = torch.log(torch.where(p > 0, p, 1.0))
    plogp = p * logp
    am1 = torch.where(a == 1, 1.0, a - 1)
    lse = torch.logsumexp(logd, -1, keepdim=True)
    skew = torch.where(torch.isfinite(lse), torch.exp(logd - torch.where(torch.isfinite(lse), lse, 0.0)), 0.0)
    general = (p - skew) / am1**2 - (plogp - skew * plogp.sum(-1, keepdim=True)) / am1
    limit = 0.5 * p * ((plogp * logp).sum(-1, keepdim=True) - logp**2)
    return torch.where(a == 1, limit, general)
