r"""The potential Φ of a threshold map: a smooth "max" (k = 1) or "sum of the top k".

.. math:: \Phi(z) = \max_{p \in C_k} \langle z, p\rangle - \Omega(p)
                  = \min_\lambda \sum_i F(z_i - \lambda) + k\lambda,
          \qquad \nabla\Phi(z) = p(z),

with C_k the (capped) simplex, Ω(p) = Σψ(p_i), F' = f and ψ the conjugate of F.
It is evaluated here through the first form at the map's own output,
Φ = ⟨z, p⟩ − Σψ(p_i), which needs no λ and also covers the rows the map
fills by convention (p = 1 on the finite entries of a row with at most k of
them).  ``-inf`` entries have p = 0 and contribute nothing.

``potential(x, family, k, dim, tau)`` returns τ·Φ(x/τ) (reducing ``dim``), whose
gradient with respect to x is the map p(x/τ).  It is the building block of
``topk_sum``; the Fenchel–Young losses L(z; y) = Φ(z) + Ω(y) − ⟨z, y⟩ use
:func:`value_at` the same way.

Autograd (the envelope theorem): the value takes p as an input computed by the
map's own autograd contract (:mod:`softk._ops.op`) and declares ∂Φ/∂p = 0
(p is the maximiser), so the gradient is p and its derivative, the Hessian, is
the map's Jacobian.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._backends import dispatch
from ..threshold.families import Family
from .op import apply_rows
from ..threshold.rows import compute_dtype, finite_max


def value_at(family: Family, z: Tensor, p: Tensor) -> Tensor:
    """⟨z, p⟩ − Σψ(p) on the last dimension (keepdim), 0·(−inf) read as 0.

    ``p != 0`` (not ``p > 0``) so that a NaN row stays NaN whatever ψ does with NaN.
    """
    zp = torch.where(p != 0, z * p, 0.0)
    return zp.sum(-1, keepdim=True) - family.psi(p).sum(-1, keepdim=True)


class _PotentialValue(torch.autograd.Function):
    """τ·Φ(x/τ) on the last dimension (keepdim) given p = map(x/τ)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, p: Tensor, family: Family, tau: float) -> Tensor:
        ct = compute_dtype(x.dtype)
        z = x.to(ct)
        m = finite_max(z)
        pc = p.to(ct)
        # Φ(z + c) = Φ(z) + c·Σp: evaluate on the shifted row, add the shift once.
        out = tau * value_at(family, (z - m) / tau, pc) + m * pc.sum(-1, keepdim=True)
        return out.to(x.dtype)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
        ctx.save_for_forward(inputs[1])

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        return g * p, None, None, None


class _PotentialValueJvp(_PotentialValue):
    @staticmethod
    def jvp(ctx, vx, *_):
        (p,) = ctx.saved_tensors
        return (p * vx).sum(-1, keepdim=True)


def potential_rows(x: Tensor, family: Family, k: int, tau: float) -> Tensor:
    """τ·Φ(x/τ) on the last dimension (keepdim), arguments validated."""
    xc = x.to(compute_dtype(x.dtype))
    p = apply_rows(xc, family, k, tau, dispatch.resolve(xc, family))
    fn = _PotentialValue if torch.compiler.is_compiling() else _PotentialValueJvp
    return fn.apply(xc, p, family, tau)


def potential(x: Tensor, family: Family, k: int, dim: int, tau: float, keepdim: bool = False) -> Tensor:
    """τ·Φ(x/τ) along ``dim`` (arguments already validated by the caller)."""
    out = potential_rows(x.movedim(dim, -1), family, k, tau).movedim(-1, dim)
    return out if keepdim else out.squeeze(dim)
