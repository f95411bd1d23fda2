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
``topk_sum`` and of the Fenchel–Young losses  L(z; y) = Φ(z) + Ω(y) − ⟨z, y⟩.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .families import Family
from .function import compute_dtype, threshold_forward


def value_at(family: Family, z: Tensor, p: Tensor) -> Tensor:
    """⟨z, p⟩ − Σψ(p) on the last dimension (keepdim), 0·(−inf) read as 0.

    ``p != 0`` (not ``p > 0``) so that a NaN row stays NaN whatever ψ does with NaN.
    """
    zp = torch.where(p != 0, z * p, 0.0)
    return zp.sum(-1, keepdim=True) - family.psi(p).sum(-1, keepdim=True)


class PotentialFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, family: Family, k: int, tau: float) -> Tensor:
        ct = compute_dtype(x.dtype)
        z = x.to(ct) / tau
        p = threshold_forward(family, z, k)
        ctx.save_for_backward(p.to(x.dtype))
        return (tau * value_at(family, z, p)).to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        return g * p, None, None, None


def potential(x: Tensor, family: Family, k: int, dim: int, tau: float, keepdim: bool = False) -> Tensor:
    """τ·Φ(x/τ) along ``dim`` (arguments already validated by the caller)."""
    out = PotentialFunction.apply(x.movedim(dim, -1), family, k, tau).movedim(-1, dim)
    return out if keepdim else out.squeeze(dim)
