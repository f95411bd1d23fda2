r"""α-entmax with α a tensor (per row, learnable): gradients for x *and* α.

With β = 1/(α−1) and p_i = [(α−1)(z_i−λ)]_+^β, differentiating Σp = 1 at fixed
z gives (Peters et al. 2019, §3.2; the same expression as the entmax package's
``EntmaxBisectFunction``):

.. math::  \frac{\partial p_i}{\partial\alpha} =
   \frac{p_i - \tilde p_i}{(\alpha-1)^2} - \frac{p_i\log p_i - \tilde p_i\sum_j p_j\log p_j}{\alpha-1},
   \qquad \tilde p_i = \frac{p_i^{2-\alpha}}{\sum_j p_j^{2-\alpha}}.

At α = 1 exactly (softmax) both terms are 0/0; their limit, from a second-order
expansion in α−1, is  ∂p_i/∂α = p_i (Σ_j p_j log²p_j − log²p_i) / 2.

The autograd contract is the one of :mod:`.op`: a custom op
``softk::entmax_alpha`` (fake kernel, vmap rule) for the forward, the backward
as differentiable tensor code (so double backward works), and forward mode
from the same derivatives (J_x is symmetric; ∂p/∂α is the vector above).  It
runs on the PyTorch path on every device (the kernels take one α per call).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _lean
from .families import entmax_family
from .rows import compute_dtype, row_status
from .torch_path import vjp_from_log_slope
from .entmax_anchor import entmax_probs, needs_anchor
from .fast_paths import solve_on_candidates
from .solve import solve_probs


def _entmax_log_d(p: Tensor, a: Tensor) -> Tensor:
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


def _kernel(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    return entmax_rows(x, alpha, tau).to(x.dtype)


def _entmax_alpha(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """p of α-entmax along the last dimension, α shaped x.shape[:-1] + (1,)."""
    return _kernel(x, alpha, tau)


entmax_alpha_op = None  # softk::entmax_alpha, defined by _library()


@_lean.library
def _library():
    global entmax_alpha_op
    entmax_alpha_op = _lean.custom_op("softk::entmax_alpha", _entmax_alpha)


def _dp_dalpha(p: Tensor, a: Tensor, logd: Tensor) -> Tensor:
    """∂p/∂α (module docstring), from the output p, α and log d (d = f′ through p)."""
    logp = torch.log(torch.where(p > 0, p, 1.0))
    plogp = p * logp
    am1 = torch.where(a == 1, 1.0, a - 1)
    lse = torch.logsumexp(logd, -1, keepdim=True)
    skew = torch.where(torch.isfinite(lse), torch.exp(logd - torch.where(torch.isfinite(lse), lse, 0.0)), 0.0)
    general = (p - skew) / am1**2 - (plogp - skew * plogp.sum(-1, keepdim=True)) / am1
    limit = 0.5 * p * ((plogp * logp).sum(-1, keepdim=True) - logp**2)
    return torch.where(a == 1, limit, general)


class EntmaxAlphaFunction(torch.autograd.Function):
    """x: (..., n), alpha: (..., 1) (already broadcast and checked), both along the last dim."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
        return entmax_alpha_op(x, alpha, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, alpha, tau = inputs
        ctx.save_for_backward(output, alpha)
        ctx.save_for_forward(output, alpha)
        ctx.tau = tau

    @staticmethod
    def backward(ctx, g: Tensor):
        out, alpha = ctx.saved_tensors
        ct = compute_dtype(out.dtype)
        p, a, g = out.to(ct), alpha.to(ct), g.to(ct)
        logd = _entmax_log_d(p, a)
        gx = vjp_from_log_slope(logd, g, ctx.tau).to(out.dtype)
        ga = None
        if ctx.needs_input_grad[1]:
            ga = (g * _dp_dalpha(p, a, logd)).sum(-1, keepdim=True).to(alpha.dtype)
        return gx, ga, None


class EntmaxAlphaFunctionJvp(EntmaxAlphaFunction):
    @staticmethod
    def jvp(ctx, vx, va, _):
        out, alpha = ctx.saved_tensors
        ct = compute_dtype(out.dtype)
        p, a = out.to(ct), alpha.to(ct)
        logd = _entmax_log_d(p, a)
        t = vjp_from_log_slope(logd, vx.to(ct), ctx.tau) if vx is not None else torch.zeros_like(p)
        if va is not None:
            t = t + va.to(ct) * _dp_dalpha(p, a, logd)
        return t.to(out.dtype)


_ROUTES = _lean.Routes(EntmaxAlphaFunctionJvp, _kernel, lambda x, alpha, _: (x, alpha),
                       compiled=EntmaxAlphaFunction, register=_library)


def entmax_alpha(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """The contract on rows (dim last), α shaped x.shape[:-1] + (1,)."""
    return _ROUTES.apply(x, alpha, tau)
