r"""The potential Φ of a threshold map: a smooth "max" (k = 1) or "sum of the top k".

.. math:: \Phi(z) = \max_{p \in C_k} \langle z, p\rangle - \Omega(p)
                  = \min_\lambda \sum_i F(z_i - \lambda) + k\lambda,
          \qquad \nabla\Phi(z) = p(z),

with C_k the (capped) simplex, Ω(p) = Σψ(p_i), F' = f and ψ the conjugate of F.
It is evaluated here through the first form at the map's own output,
Φ = ⟨z, p⟩ − Σψ(p_i), which needs no λ and also covers the rows the map
fills by convention (p = 1 on the finite entries of a row with at most k of
them).  ``-inf`` entries have p = 0 and contribute nothing.

``potential(x, family, k, dim, tau)`` returns τ·Φ(x/τ) + τψ(1)·Σp (reducing
``dim``; the regulariser Σ[ψ(p_i) − ψ(1)p_i] is 0 on k-hot masks), whose
gradient with respect to x is the map p(x/τ).  It is ``topk_sum``'s value
for the threshold methods; the Fenchel–Young losses L(z; y) = Φ(z) + Ω(y) − ⟨z, y⟩ use
:func:`value_at` the same way.

:func:`regularised_potential` is the same value for a regulariser Ω_α given
as functions on rows (normmax's ‖p‖_α − 1, the entmax package's Tsallis
Ω_α with α < 1), whose tensor α gets −∂Ω_α(p)/∂α.

Autograd (the envelope theorem): the value takes p as an input computed by the
map's own autograd contract (:mod:`softk._ops.op`) and declares ∂Φ/∂p = 0
(p is the maximiser), so the gradient is p and its derivative, the Hessian, is
the map's Jacobian.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import lean as _lean
from .._backends import dispatch
from ..threshold.families import Family
from .op import apply_rows, threshold_map
from ..threshold.rows import compute_dtype, finite_max, overflow_scale, shift_over_tau


def value_at(family: Family, z: Tensor, p: Tensor) -> Tensor:
    """⟨z, p⟩ − Σψ(p) on the last dimension (keepdim), 0·(−inf) read as 0.

    ``p != 0`` (not ``p > 0``) so that a NaN row stays NaN whatever ψ does with NaN.
    """
    zp = torch.where(p != 0, z * p, 0.0)
    return zp.sum(-1, keepdim=True) - family.psi(p).sum(-1, keepdim=True)


def _shifted_value(z, m, pc, s, omega, tau, c):
    """c·(m·Σp + ⟨z − m, p⟩ − τΩ(p)), each term scaled by c first."""
    z, m = z * c, m * c
    return m * s + torch.where(pc != 0, (z - m) * pc, 0.0).sum(-1, keepdim=True) - (tau * c) * omega


def _psi_at_one(family: Family) -> float:
    """ψ(1), a number (under torch.compile run for real, not traced: a float
    read from a tensor inside an autograd.Function is an unbacked symbol
    that Dynamo cannot return)."""
    return float(family.psi(torch.tensor(1.0, dtype=torch.float64)))


# marked as torch.compiler.assume_constant_result marks it, without the
# import of torch._dynamo that calling it would cost every eager user
_psi_at_one._dynamo_marked_constant = True  # type: ignore[attr-defined]


def _omega(family: Family, p: Tensor) -> Tensor:
    """Σ[ψ(p_i) − ψ(1)p_i] on rows (keepdim): the regulariser, 0 on k-hot masks."""
    return (family.psi(p) - _psi_at_one(family) * p).sum(-1, keepdim=True)


class _PotentialValue(torch.autograd.Function):
    """τ·Φ(x/τ) + τψ(1)·Σp on the last dimension (keepdim) given p = map(x/τ).

    ``tau`` is a float, or a 0-d tensor (a learnable τ, with p computed by
    the map with that τ): then its derivative is Φ(z) − ⟨z, p⟩ + ψ(1)Σp =
    −Σ[ψ(p) − ψ(1)p], in the saved p, so that neither (x/τ)/τ nor the
    cancellation of two terms of size x/τ enters it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, p: Tensor, family: Family, tau: float, k) -> Tensor:
        ct = compute_dtype(x.dtype)
        z = x.to(ct)
        m = finite_max(z)
        pc = p.to(ct)
        # Φ(z + c) = Φ(z) + c·Σp: evaluate on the shifted row, add the shift
        # once, times Σp as it is exactly, min(k, the finite entries) (the
        # sum of p's rounding, times m, overflows at m near the float max).
        # τ·⟨(x − m)/τ, p⟩ is formed as ⟨x − m, p⟩: (x − m)/τ may overflow
        # where its product with p does not.
        s = torch.clamp((z > float("-inf")).sum(-1, keepdim=True).to(ct), max=k)
        omega = _omega(family, pc)
        out = _shifted_value(z, m, pc, s, omega, tau, 1.0)
        # Near the float max a term overflows where the value does not (x − m
        # for entries of both signs, m·Σp, their sum): there every term is
        # scaled by a power of 2 that keeps them all finite (exact), and the
        # value scaled back, inf only where it overflows itself
        c = overflow_scale(z.shape[-1])
        safe = _shifted_value(z, m, pc, s, omega, tau, c) / c
        return torch.where(torch.isfinite(out) | ~torch.isfinite(m), out, safe).to(x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])
        ctx.family, tau = inputs[2], inputs[3]
        ctx.tau_dtype = tau.dtype if isinstance(tau, Tensor) else None

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        gt = None
        if ctx.tau_dtype is not None and ctx.needs_input_grad[3]:
            gt = -(g * _omega(ctx.family, p)).sum().to(ctx.tau_dtype)
        return g * p, None, None, gt, None


class _PotentialValueJvp(_PotentialValue):
    @staticmethod
    def jvp(ctx, vx, vp, vf, vt, vk):
        (p,) = ctx.saved_tensors
        out = (p * vx).sum(-1, keepdim=True)
        if vt is not None:
            out = out - vt.to(p.dtype) * _omega(ctx.family, p)
        return out


def potential_rows(x: Tensor, family: Family, k: int, tau) -> Tensor:
    """τ·Φ(x/τ) + τψ(1)·Σp on the last dimension (keepdim), arguments
    validated; ``tau`` a float or a learnable 0-d tensor."""
    xc = x.to(compute_dtype(x.dtype))
    if isinstance(tau, Tensor):
        p = threshold_map(xc, family, k, -1, tau)
    else:
        p = apply_rows(xc, family, k, tau, dispatch.pick("threshold", xc, family).backend)  # type: ignore[union-attr]
    return _lean.function(_PotentialValueJvp, _PotentialValue).apply(xc, p, family, tau, k)


def potential(x: Tensor, family: Family, k: int, dim: int, tau: float, keepdim: bool = False) -> Tensor:
    """τ·Φ(x/τ) + τψ(1)·Σp along ``dim`` (arguments already validated by the caller)."""
    out = potential_rows(x.movedim(dim, -1), family, k, tau).movedim(-1, dim)
    return out if keepdim else out.squeeze(dim)


# ------------------------------------------- the potential of a regulariser Ω_α
class _RegularisedPotential(torch.autograd.Function):
    """Φ_α(z) = ⟨z, p⟩ − Ω_α(p) per row (keepdim), z = (x − max)/τ, given p = the
    map's output.  p maximises ⟨z, p⟩ − Ω_α(p) (the envelope theorem), so
    ∇_x Φ = p/τ and ∂_α Φ = −∂_α Ω_α(p) at fixed p; both are written in the saved
    p (which carries the map's own graph), so second derivatives in x and α are exact."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, p, alpha, omega, d_omega, tau):
        z = shift_over_tau(x, finite_max(x), tau, check=False)  # Φ(z + c) = Φ(z) + c: the shift keeps z·p's rounding small
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


class _RegularisedPotentialJvp(_RegularisedPotential):
    # Dynamo does not trace a Function with a custom jvp (as in _ops/op.py).
    @staticmethod
    def jvp(ctx, vx, vp, va, *_):
        p, alpha = ctx.saved_tensors
        out = (p * vx).sum(-1, keepdim=True) / ctx.tau if vx is not None else torch.zeros_like(p[..., :1])
        return out if va is None else out - va * ctx.d_omega(p, alpha)


def regularised_potential(x: Tensor, p: Tensor, alpha, omega, d_omega, tau: float) -> Tensor:
    """Φ_α(z) = ⟨z, p⟩ − Ω_α(p) per row (keepdim), z = (x − max)/τ, given p =
    the map's output, ``omega(v, alpha)`` Ω_α on rows (keepdim) and
    ``d_omega(v, alpha)`` its partial derivative in α; ∇_x Φ = p/τ and
    ∂_α Φ = −∂_α Ω_α(p) (see :class:`_RegularisedPotential`)."""
    return _lean.function(_RegularisedPotentialJvp, _RegularisedPotential).apply(x, p, alpha, omega, d_omega, tau)
