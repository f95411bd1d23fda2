r"""α-normmax on rows and its autograd rule: the op ``softk::normmax``.

The maths (the threshold form, J and ∂p/∂α) is in :mod:`softk._maps.normmax`'s
docstring; :func:`normmax_rows` computes p, and :func:`normmax_apply` is the
autograd contract (a lean eager Function for plain calls, the library op for
torch.compile and vmap), with double backward from differentiable tensor code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import lean as _lean
from ..threshold.families import entmax_by_alpha, entmax_family
from ..threshold.rows import compute_dtype, finite_max, masked_logsumexp, over_tau, row_status, shift_over_tau
from ..threshold.solve import solve_relative


# -------------------------------------------------------------------- forward
def normmax_rows(x: Tensor, alpha, tau: float) -> Tensor:
    """p on the last dimension in the compute dtype, no autograd; ``alpha`` a
    float or a tensor shaped x.shape[:-1] + (1,).  Row conventions as every map:
    -inf entries removed, a row with at most one finite entry gets 1 there, a
    NaN or +inf makes its row NaN."""
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    finite, active, broken = row_status(xc, 1)
    s = torch.where(active, shift_over_tau(xc, finite_max(xc), tau, check=False), 0.0)  # row max at 0
    if isinstance(alpha, Tensor):
        hard = alpha.to(ct) == 1
        a: Tensor | float = torch.where(hard, 2.0, alpha.to(ct))
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
    """(support mask, log p (0 off it), log ‖p‖_α; −inf on a row with no
    p > 0, formed so that its derivatives are 0, not logsumexp's NaN over
    a row of −inf)."""
    pos = p > 0
    logp = torch.log(torch.where(pos, p, 1.0))
    some = pos.any(-1, keepdim=True)
    lse = torch.where(some, masked_logsumexp(a * logp, pos), 0.0)  # (−inf/α has a NaN second derivative in α)
    log_norm = torch.where(some, lse / a, float("-inf"))
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
    gx = _jvp_x(pc, alpha.to(ct), gc, ctx.tau).to(p.dtype)  # a tensor: a float would be a guard in a compiled graph
    ga = None
    if ctx.needs_input_grad[1]:
        ga = (gc * _dp_dalpha(pc, alpha.to(ct))).sum(-1, keepdim=True).to(alpha.dtype)
    return gx, ga, None


def _jvp(ctx, vx, va, _):
    """J·vx + ∂p/∂α·vα (J is symmetric: the backward's formula)."""
    p, alpha = ctx.saved_tensors
    ct = compute_dtype(p.dtype)
    pc = p.to(ct)
    out = _jvp_x(pc, alpha.to(ct), vx.to(ct), ctx.tau) if vx is not None \
        else torch.zeros_like(pc)
    if va is not None:
        out = out + va.to(ct) * _dp_dalpha(pc, alpha.to(ct))
    return out.to(p.dtype)


# -------------------------------------------------- the library path (compile, vmap)
def _normmax_kernel(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """p along the last dimension; ``alpha`` 0-d (one α) or shaped x.shape[:-1] + (1,)."""
    return normmax_rows(x, alpha if alpha.dim() else float(alpha), tau).to(x.dtype)


def _vmap(info, in_dims, x, alpha, tau):
    x = x.movedim(in_dims[0], 0) if in_dims[0] is not None else x.expand(info.batch_size, *x.shape)
    if in_dims[1] is not None:  # a batched α becomes one α per row
        alpha = alpha.movedim(in_dims[1], 0)
        alpha = alpha.reshape(alpha.shape + (1,) * (x.dim() - alpha.dim())).expand(*x.shape[:-1], 1)
    elif alpha.dim():
        alpha = alpha.expand(*x.shape[:-1], 1)
    return normmax_op(x, alpha, tau), 0


normmax_op = None  # softk::normmax, registered on the first call that needs it (_library)


@_lean.library
def _library():
    # torch.library costs milliseconds at import: eager users never pay it
    global normmax_op
    normmax_op = torch.library.custom_op("softk::normmax", _normmax_kernel, mutates_args=())
    normmax_op.register_fake(lambda x, alpha, tau: torch.empty_like(x))
    normmax_op.register_vmap(_vmap)


class _NormmaxLibrary(torch.autograd.Function):
    generate_vmap_rule = True
    backward = staticmethod(_backward)

    @staticmethod
    def forward(x, alpha, tau):
        _library()
        return normmax_op(x, alpha, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output, inputs[1])
        ctx.save_for_forward(output, inputs[1])
        ctx.tau = inputs[2]


class _NormmaxLibraryJvp(_NormmaxLibrary):
    jvp = staticmethod(_jvp)  # Dynamo does not trace a custom jvp (as in threshold/op.py): eager only


# ------------------------------------------------------- the lean eager path
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
        return normmax_apply(over_tau(x, tau), alpha, 1.0).to(x.dtype)
    a = alpha if isinstance(alpha, Tensor) else torch.tensor(alpha, dtype=compute_dtype(x.dtype), device=x.device)
    if x.numel() == 0:
        return x * 0
    return _lean.route((x, a), _NormmaxEager.apply, lambda x, a, tau: normmax_rows(x, alpha, tau).to(x.dtype),
                       _library_apply, _library, x, a, tau)


def _library_apply(x, a, tau):
    return _lean.function(_NormmaxLibraryJvp, _NormmaxLibrary).apply(x, a, tau)
