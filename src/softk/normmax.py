r"""α-normmax: the argmax regularised by the α-norm, exactly.

.. math:: p = \arg\max_{p\in\Delta} \langle z, p\rangle - \|p\|_\alpha, \qquad z = x/\tau,\ \alpha \ge 1

(Santos, Niculae, McNamee & Martins, "Sparse and Structured Hopfield
Networks", ICML 2024; the entmax package's ``normmax_bisect``).  Sparse like
sparsemax; α = 2 puts more mass on the runner-up than sparsemax does, a large
α spreads it nearly evenly over the support, α → 1 is the argmax.

**Threshold form.**  On the support S the KKT conditions read
z_i − ‖p‖_α^{1−α} p_i^{α−1} = μ, so p_i = ‖p‖_α (z_i − μ)_+^β with β = 1/(α−1).
Writing q_i = (z_i − μ)_+^β, Σp = 1 gives p = q/Σq, and ‖p‖_α = ‖q‖_α/Σq
then forces ‖q‖_α = 1:

.. math:: \sum_i (z_i - \mu)_+^{\gamma} = 1, \quad \gamma = \frac{\alpha}{\alpha-1},
          \qquad p_i = \frac{(z_i-\mu)_+^{\beta}}{\sum_j (z_j-\mu)_+^{\beta}}.

The threshold equation is α'-entmax's with α' = 2 − 1/α ∈ (1, 2) on the rows
scaled by γ (f(u) = [(α'−1)u]_+^γ and (α'−1)(γ z − λ) = z − μ), so μ comes from
softk's own solver: the closed form of entmax15 at α = 2 (α' = 1.5), safeguarded
Newton otherwise.  p itself is *not* a threshold map Σf(z − μ) = 1 (the
normalisation by Σq), hence this module with its own autograd rather than a
:class:`~softk.threshold.Family`.

**Derivatives** (implicit differentiation of the two equations; all from p):

.. math:: J = \beta\,\|p\|_\alpha^{\alpha-1}\,(I - p\mathbf 1^\top)\,\mathrm{diag}(p^{2-\alpha})\,(I - \mathbf 1 p^\top),

symmetric (so forward mode is the same formula), 0 off the support; with
ℓ_i = log(p_i/‖p‖_α) and r_i = e^{αℓ_i} (Σr = 1),
∂p_i/∂α = p_i (w_i − Σ_j p_j w_j), w_i = −βℓ_i + (β‖p‖_α/α)(Σ_j r_jℓ_j) e^{(1−α)ℓ_i}.
Both are differentiable tensor code, so double backward is exact.

α = 1 is the argmax (uniform on tied maxima, zero gradient), the α → 1⁺ limit.  μ is at the dtype's
precision; p's relative error is about β·eps (α near 1 magnifies the rounding of z − μ).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _lean
from ._validate import check_dim, check_input, check_tau, per_row, require, unwrapped
from .losses import targets as tg
from .threshold.families import entmax_by_alpha, entmax_family
from .threshold.rows import compute_dtype, finite_max, row_status
from .threshold.solve import solve_relative

__all__ = ["normmax", "normmax_loss", "fenchel_young_rows"]


# ------------------------------------------------------------------ arguments
def check_normmax_alpha(alpha, x, dim: int):
    """α: a finite float >= 1, or a floating tensor >= 1 broadcastable to ``x``
    with size 1 along ``dim`` (returned per row, ``dim`` moved last)."""
    msg = "alpha must be finite and >= 1 (1 is the argmax, 2 the default; normmax is defined by the alpha-norm)"
    if isinstance(alpha, Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"alpha must be a float or a floating-point tensor, got dtype {alpha.dtype}")
        a = unwrapped(alpha.detach())
        bad = ~torch.isfinite(a) | (a < 1)
        require(~bad, lambda: f"{msg}, got {a[bad].flatten()[0].item()}")
        return per_row(alpha, x, dim, "alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a float >= 1 or a tensor, got {type(alpha).__name__}")
    if not (alpha >= 1 and math.isfinite(alpha)):
        raise ValueError(f"{msg}, got {alpha}")
    return float(alpha)


# -------------------------------------------------------------------- forward
def normmax_rows(x: Tensor, alpha, tau: float) -> Tensor:
    """p on the last dimension in the compute dtype, no autograd; ``alpha`` a
    float or a tensor shaped x.shape[:-1] + (1,).  Row conventions as every map:
    -inf entries removed, a row with at most one finite entry gets 1 there, a
    NaN or +inf makes its row NaN."""
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    finite, active, broken = row_status(xc, 1)
    s = torch.where(active, (xc - finite_max(xc)) / tau, 0.0)  # row max at 0
    if isinstance(alpha, Tensor):
        hard = alpha.to(ct) == 1
        a = torch.where(hard, 2.0, alpha.to(ct))
        family = entmax_family(2 - 1 / a)
    else:
        hard = alpha == 1
        a = 2.0 if hard else alpha
        family = entmax_by_alpha(2 - 1 / a)
    gamma, beta = a / (a - 1), 1 / (a - 1)
    # Σ (s − μ)_+^γ = 1 is α'-entmax's equation on γ·s: λ = γμ (row max 0, so λ is relative to it).
    _, lam = solve_relative(family, s * gamma, 1, active)
    u = s - lam / gamma
    logq = torch.where(u > 0, beta * torch.log(torch.where(u > 0, u, 1.0)), float("-inf"))
    p = torch.exp(logq - torch.logsumexp(logq, -1, keepdim=True))
    if bool(torch.as_tensor(hard).any()):  # α = 1: the argmax, uniform on ties
        top = ((s == 0) & finite).to(ct)
        p = torch.where(torch.as_tensor(hard, device=p.device), top / top.sum(-1, keepdim=True), p)
    filled = torch.where(broken, float("nan"), finite.to(ct))
    return torch.where(active, p, filled)


# ---------------------------------------------------------------- derivatives
def _log_parts(p: Tensor, a):
    """(support mask, log p (0 off it), log ‖p‖_α)."""
    pos = p > 0
    logp = torch.log(torch.where(pos, p, 1.0))
    log_norm = torch.logsumexp(torch.where(pos, a * logp, float("-inf")), -1, keepdim=True) / a
    return pos, logp, log_norm


def _jvp_x(p: Tensor, a, v: Tensor, tau) -> Tensor:
    """J v (= Jᵀv) from the output: D⊙(v − p·v) − p Σ D⊙(v − p·v), D = β‖p‖^{α−1} p^{2−α}."""
    hard = a == 1
    a = torch.where(hard, 2.0, a) if isinstance(a, Tensor) else (2.0 if hard else a)
    pos, logp, log_norm = _log_parts(p, a)
    d = torch.where(pos, torch.exp(logp + (a - 1) * (log_norm - logp)) / (a - 1), 0.0)
    t = d * (v - (p * v).sum(-1, keepdim=True))
    out = t - p * t.sum(-1, keepdim=True)
    out = torch.where(hard, 0.0, out) if isinstance(hard, Tensor) else (out * 0 if hard else out)
    return out if isinstance(tau, float) and tau == 1.0 else out / tau


def _dp_dalpha(p: Tensor, a: Tensor) -> Tensor:
    """∂p/∂α (module docstring), 0 on α = 1 rows (the argmax is constant in α)."""
    hard = a == 1
    a = torch.where(hard, 2.0, a)
    pos, logp, log_norm = _log_parts(p, a)
    ell = torch.where(pos, logp - log_norm, 0.0)
    r = torch.where(pos, torch.exp(a * ell), 0.0)
    beta = 1 / (a - 1)
    skew = torch.where(pos, torch.exp(logp + (1 - a) * ell), 0.0)  # p_i e^{(1−α)ℓ_i}
    pw = -beta * p * ell + beta * torch.exp(log_norm) / a * (r * ell).sum(-1, keepdim=True) * skew
    return torch.where(hard, 0.0, pw - p * pw.sum(-1, keepdim=True))


def _backward(ctx, g):
    """∂L/∂x and ∂L/∂α from the saved output (differentiable tensor code: double backward)."""
    p, alpha = ctx.saved_tensors
    ct = compute_dtype(p.dtype)
    pc, gc = p.to(ct), g.to(ct)
    gx = _jvp_x(pc, alpha.to(ct) if alpha.dim() else float(alpha), gc, ctx.tau).to(p.dtype)
    ga = None
    if ctx.needs_input_grad[1]:
        ga = (gc * _dp_dalpha(pc, alpha.to(ct))).sum(-1, keepdim=True).to(alpha.dtype)
    return gx, ga, None


def _jvp(ctx, vx, va, _):
    """J·vx + ∂p/∂α·vα (J is symmetric: the backward's formula)."""
    p, alpha = ctx.saved_tensors
    ct = compute_dtype(p.dtype)
    pc = p.to(ct)
    out = _jvp_x(pc, alpha.to(ct) if alpha.dim() else float(alpha), vx.to(ct), ctx.tau) if vx is not None \
        else torch.zeros_like(pc)
    if va is not None:
        out = out + va.to(ct) * _dp_dalpha(pc, alpha.to(ct))
    return out.to(p.dtype)


# -------------------------------------------------- the library route (compile, vmap)
@torch.library.custom_op("softk::normmax", mutates_args=())
def normmax_op(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """p along the last dimension; ``alpha`` 0-d (one α) or shaped x.shape[:-1] + (1,)."""
    return normmax_rows(x, alpha if alpha.dim() else float(alpha), tau).to(x.dtype)


@normmax_op.register_fake
def _(x, alpha, tau):
    return torch.empty_like(x)


def _vmap(info, in_dims, x, alpha, tau):
    x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x.expand(info.batch_size, *x.shape)
    if in_dims[1] is not None:  # a batched α becomes one α per row
        alpha = alpha.movedim(in_dims[1], 0)
        alpha = alpha.reshape(alpha.shape + (1,) * (x.dim() - alpha.dim())).expand(*x.shape[:-1], 1)
    elif alpha.dim():
        alpha = alpha.expand(*x.shape[:-1], 1)
    return normmax_op(x, alpha, tau), 0


normmax_op.register_vmap(_vmap)


class _NormmaxLibrary(torch.autograd.Function):
    generate_vmap_rule = True
    backward = staticmethod(_backward)

    @staticmethod
    def forward(x, alpha, tau):
        return normmax_op(x, alpha, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output, inputs[1])
        ctx.save_for_forward(output, inputs[1])
        ctx.tau = inputs[2]


class _NormmaxLibraryJvp(_NormmaxLibrary):
    jvp = staticmethod(_jvp)  # Dynamo does not trace a custom jvp (as in threshold/op.py): eager only


# ------------------------------------------------------- the lean eager route
class _NormmaxEager(torch.autograd.Function):
    backward, jvp = staticmethod(_backward), staticmethod(_jvp)

    @staticmethod
    def forward(ctx, x, alpha, tau):
        p = normmax_rows(x, alpha if alpha.dim() else float(alpha), tau).to(x.dtype)
        ctx.save_for_backward(p, alpha)
        ctx.save_for_forward(p, alpha)
        ctx.tau = tau
        return p


def normmax_apply(x: Tensor, alpha, tau) -> Tensor:
    """The autograd contract on rows (dim last); ``alpha`` checked (a float,
    or a tensor shaped x.shape[:-1] + (1,)), ``tau`` a float or a 0-d tensor."""
    if isinstance(tau, Tensor):  # a learnable τ: x/τ with autograd, the map at τ = 1
        x, tau = x / tau.to(x.dtype), 1.0
    a = alpha if isinstance(alpha, Tensor) else torch.tensor(alpha, dtype=compute_dtype(x.dtype), device=x.device)
    if x.numel() == 0:
        return x * 0
    if _lean.eager(x, a):
        if not (_lean.tracked(x) or _lean.tracked(a)):
            return normmax_rows(x, alpha, tau).to(x.dtype)
        return _NormmaxEager.apply(x, a, tau)
    fn = _NormmaxLibrary if torch.compiler.is_compiling() else _NormmaxLibraryJvp
    return fn.apply(x, a, tau)


def normmax(x: Tensor, alpha=2.0, dim: int = -1, tau=1.0) -> Tensor:
    r"""α-normmax: :math:`\arg\max_{p\in\Delta}\ \langle x/\tau, p\rangle - \|p\|_\alpha`, exactly.

    p_i = (z_i − μ)_+^{1/(α−1)} / Σ_j (z_j − μ)_+^{1/(α−1)} with μ such that
    Σ_i (z_i − μ)_+^{α/(α−1)} = 1 (module docstring); sparse, with exact zeros.

    Args:
        x: scores, any shape, floating point (half computed in float32).
        alpha: α >= 1, finite: a float, or a floating tensor broadcastable to
            ``x`` with size 1 along ``dim`` (one α per row), which receives a
            gradient if it requires one.  α = 1 is the argmax (uniform on
            ties), α = 2 (default) uses entmax15's closed form for μ.
        dim: the dimension that sums to 1.
        tau: temperature > 0 (a float, or a one-element tensor that may require grad).

    Returns:
        p shaped like ``x``: -inf entries get 0, a fully masked row gives zeros,
        a row with one finite entry gives 1 there (all with zero gradient), a
        NaN or +inf makes its row NaN.

    Reference: Santos, Niculae, McNamee & Martins, "Sparse and Structured
    Hopfield Networks", ICML 2024.

    >>> import torch
    >>> normmax(torch.tensor([-2.0, 0.0, 0.5]))
    tensor([0.0000, 0.3110, 0.6890])
    >>> normmax(torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]), alpha=1000.0)
    tensor([0.0000, 0.0000, 0.3330, 0.3334, 0.3336])
    """
    check_input(x)
    dim = check_dim(x, dim)
    tau = check_tau(tau, allow_grad=True)
    alpha = check_normmax_alpha(alpha, x, dim)
    return normmax_apply(x.movedim(dim, -1), alpha, tau).movedim(-1, dim)


# ------------------------------------------------------------------ the loss
class _Potential(torch.autograd.Function):
    """Φ_α(z) = ⟨z, p⟩ − Ω_α(p) per row (keepdim), z = (x − max)/τ, given p = the
    map's output.  p maximises ⟨z, p⟩ − Ω_α(p) (the envelope theorem), so
    ∇_x Φ = p/τ and ∂_α Φ = −∂_α Ω_α(p) at fixed p; both are written in the saved
    p (which carries the map's own graph), so second derivatives in x and α are exact."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, p, alpha, omega, d_omega, tau):
        z = (x - finite_max(x)) / tau  # Φ(z + c) = Φ(z) + c: the shift keeps z·p's rounding small
        return torch.where(p != 0, z * p, 0.0).sum(-1, keepdim=True) - omega(p, alpha)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, p, alpha, _, d_omega, tau = inputs
        a = alpha if isinstance(alpha, Tensor) else None
        ctx.save_for_backward(p, a)
        ctx.save_for_forward(p, a)
        ctx.d_omega, ctx.tau = d_omega, tau

    @staticmethod
    def backward(ctx, g):
        p, alpha = ctx.saved_tensors
        ga = None
        if ctx.needs_input_grad[2]:
            ga = -g * ctx.d_omega(p, alpha)
        return g * p / ctx.tau, None, ga, None, None, None


class _PotentialJvp(_Potential):
    # Dynamo does not trace a Function with a custom jvp (as in threshold/op.py).
    @staticmethod
    def jvp(ctx, vx, vp, va, *_):
        p, alpha = ctx.saved_tensors
        out = (p * vx).sum(-1, keepdim=True) / ctx.tau if vx is not None else torch.zeros_like(p[..., :1])
        return out if va is None else out - va * ctx.d_omega(p, alpha)


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
    z = (x - finite_max(x).detach()) / tau
    zy = torch.where(y != 0, z * y, 0.0).sum(-1, keepdim=True)  # 0·(−inf) is 0 (masked classes)
    fn = _Potential if torch.compiler.is_compiling() else _PotentialJvp
    loss = fn.apply(x, p, alpha, omega, d_omega, tau) + omega(y, alpha) - zy
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
        x, tau = x / tau.to(x.dtype), 1.0
    a = alpha.to(x.dtype) if isinstance(alpha, Tensor) else alpha
    p = normmax_apply(x, a, tau)
    loss = fenchel_young_rows(x, p, y, _alpha_norm, _d_alpha_norm, a, tau).squeeze(-1)
    if keep is not None:
        loss = torch.where(keep, loss, 0.0)
    return tg.reduce(loss, keep, reduction).to(input.dtype)
