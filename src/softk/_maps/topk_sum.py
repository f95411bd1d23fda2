r"""Smooth sum of the k largest entries, whose gradient is ``soft_topk``.

Threshold methods use the potential of :mod:`softk._ops.potential`,

.. math:: \Phi(z) = \max_{p \in C_k} \langle z, p\rangle - \Omega(p), \qquad
          \Omega(p) = \sum_i \psi(p_i),

normalised so that Ω vanishes at the vertices of the capped simplex
C_k = {0 ≤ p ≤ 1, Σp = k} (the k-hot masks): every family has ψ(0) = 0, so
Ω₀(p) = Σψ(p_i) − ψ(1)·Σp_i.  Ω₀ is convex and 0 at the vertices, hence ≤ 0 on
C_k, which gives for every τ > 0

.. math:: \text{hard top-k sum}(x) \le \tau\,\Phi_0(x/\tau)
          = \tau\,\Phi(x/\tau) + \tau\,\psi(1)\,k
          \le \text{hard top-k sum}(x) + \tau \max_{C_k}(-\Omega_0),

so τ → 0 gives the hard sum, and for "exp" at k = 1 (ψ(p) = p log p − p,
ψ(1) = −1) it is exactly τ·logsumexp(x/τ).  "grad" is
τ·log e_k(exp(x/τ)) = τ·log Σ_{|S|=k} exp(Σ_{i∈S} x_i/τ), which also lies
between the hard sum and the hard sum + τ·log C(n, k) and is τ·logsumexp at
k = 1.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._validate import check_topk_args
from .._ops.gradtopk import log_ek
from ..threshold import THRESHOLD_METHODS
from .._ops.potential import potential
from ..threshold.rows import compute_dtype, over_tau_shifted

SUM_METHODS = tuple(THRESHOLD_METHODS) + ("grad",)


def _mass(x: Tensor, k, dim: int) -> Tensor:
    """Σp = min(k, number of finite entries) along ``dim`` (keepdim), in x's
    compute dtype; ``k`` an int or per-row (dim last): constant in x."""
    count = (x.detach() > float("-inf")).sum(dim, keepdim=True).to(compute_dtype(x.dtype))
    return torch.minimum(count, k.movedim(-1, dim) if isinstance(k, torch.Tensor) else torch.tensor(float(k)))


def topk_sum(
    x: Tensor, k: int, dim: int = -1, tau: float = 1.0, method: str = "exp", keepdim: bool = False
) -> Tensor:
    r"""Smooth approximation of the sum of the k largest entries along ``dim``.

    For the threshold methods ("exp", "sigmoid", "laplace", "sparse")

    .. math:: \mathrm{topk\_sum}(x) = \tau \max_{0 \le p \le 1,\ \sum p = k}
              \Bigl(\langle x/\tau, p\rangle - \sum_i [\psi(p_i) - \psi(1)\,p_i]\Bigr)

    (the potential Φ of ``soft_topk``, whose gradient is p, plus
    :math:`\tau\psi(1)k`, so the regulariser is 0 on k-hot masks); for "grad"
    it is :math:`\tau \log \sum_{|S|=k} \exp(\sum_{i\in S} x_i/\tau)`.  In every
    case the gradient with respect to x is ``soft_topk(x, k, dim, tau, method)``,
    the value is at least the hard top-k sum and tends to it as τ → 0, and for
    "exp" and "grad" at k = 1 it is exactly :math:`\tau \operatorname{logsumexp}(x/\tau)`.

    Args:
        x: scores, any shape, floating point (half computed in float32).
        k: an int in [1, n], n = x.shape[dim], or one k per row for the
            threshold methods: a tensor broadcastable to x with size 1 along
            ``dim``, values in (0, n] (fractional allowed; no gradient in k).
        dim: the dimension reduced.
        tau: temperature > 0.
        method: "exp", "sigmoid", "laplace", "sparse" or "grad"
            ("iterative" and "weighted" are not gradients of any potential).
        keepdim: keep ``dim`` with size 1.

    Returns:
        ``x`` with ``dim`` reduced.  ``-inf`` entries are ignored; a row with
        m ≤ k finite entries gives the sum of them (gradient 1 on each); a
        NaN/+inf row gives NaN.

    References: Su Jianlin, "Smooth approximations of Top-k" (kexue.fm, 2024);
    Blondel, Martins, Niculae, "Learning with Fenchel-Young losses" (JMLR 2020).

    >>> import torch, softk
    >>> x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    >>> softk.topk_sum(x, k=2, method="sparse")
    tensor(7., dtype=torch.float64)
    >>> round(float(softk.topk_sum(x, k=1)), 6)  # log(e + e² + e³ + e⁴)
    4.44019
    >>> round(float(softk.topk_sum(x, k=2, tau=0.01)), 6)
    7.0
    """
    dim, k_rows, tau = check_topk_args(x, k, dim, tau, method, SUM_METHODS)
    if isinstance(tau, torch.Tensor) and method == "grad":
        # τ that requires grad: T(x) = c·r + τ·T₁((x − r)/τ) with autograd, T₁
        # the sum at τ = 1, r the k-th entry and c = Σp (T(x + r) = T(x) + c·r),
        # in float64, where (x − r)/τ cannot overflow for a float32 x, with τ
        # converted once (its two uses' gradients, each of the size of the
        # scores over τ, cancel: a float32 τ would add them rounded).  The
        # threshold methods' potential takes τ itself: its τ-derivative is
        # −Σ[ψ(p) − ψ(1)p], which has no such cancellation.
        xd, td = x.to(torch.float64), tau.to(torch.float64)
        z, r = over_tau_shifted(xd, td, dim, k_rows, capped=True)
        inner = topk_sum(z, k, dim, 1.0, method, keepdim=True)
        out = td * inner + r * _mass(xd, k_rows, dim)
        return (out if keepdim else out.squeeze(dim)).to(x.dtype)
    k = k_rows
    if isinstance(k, torch.Tensor) and k.requires_grad:
        # ∂/∂k would need λ itself (∂Φ/∂k = λ), which the contract does not return.
        raise ValueError("topk_sum gives no gradient to a per-row k; pass k.detach() (soft_topk does differentiate in k)")
    if method == "grad":
        return log_ek(x, k, dim, tau, keepdim)
    family = THRESHOLD_METHODS[method]
    # Half inputs: Φ and the shift in float32, one rounding at the end.
    xc = x.to(compute_dtype(x.dtype))
    out = potential(xc, family, k, dim, tau, keepdim=True)  # its regulariser is 0 on k-hot masks
    # A NaN/+inf row is NaN (⟨z, p⟩ − Σψ(p) reads a NaN p as 0 for "sigmoid").
    broken = (torch.isnan(x) | (x == float("inf"))).any(dim, keepdim=True)
    out = torch.where(broken, float("nan"), out).to(x.dtype)
    return out if keepdim else out.squeeze(dim)
