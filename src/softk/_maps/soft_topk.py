r"""Smooth top-k: maps whose outputs sum to k and tend to the k-hot mask.

``soft_topk`` is the differentiable relaxation of the k-hot indicator of the k
largest entries.  Its threshold methods (Su Jianlin 2024, "ThreTopK") are
p_i = f(x_i/τ − λ) with λ chosen so that Σp = k, for

=========  =====================================  =====================================
method     f(u)                                   notes
=========  =====================================  =====================================
"exp"      min(1, e^u)                            k = 1 is exactly softmax
"sigmoid"  σ(u)                                   never exactly 0 or 1
"laplace"  1 − e^{−u}/2 (u ≥ 0), e^u/2 (u < 0)    the Laplace CDF (LapSum 2025);
                                                  k = 1 is *not* softmax in general
"sparse"   clip(u, 0, 1)                          Euclidean projection onto the capped
                                                  simplex; exact 0s and 1s; k = 1 is
                                                  sparsemax
=========  =====================================  =====================================

and three more constructions:

=============  ===============================================================
"grad"         GradTopK: p = ∇ log e_k(exp(x/τ)), the k-subset marginals
               (:mod:`softk._ops.gradtopk`); 0 < p < 1, k = 1 is softmax
"iterative"    Su 2019: k rounds of p += softmax((1 − p) ⊙ z), z ≥ 0
               (:mod:`softk._maps.iterative`); p can exceed 1, not monotone
"weighted"     k rounds of p += softmax of z weighted by 1 − p; flawed (its
               τ → 0 limit is not the top-k), kept for comparison
=============  ===============================================================

``softk.properties(method)`` measures which properties of a smooth top-k
(Σp = k, 0 ≤ p ≤ 1, monotone, shift invariant, the hard top-k as τ → 0,
softmax at k = 1) each method has.
"""

from __future__ import annotations

from torch import Tensor

from .. import _dtensor

from .._validate import check_topk_args
from .._ops.gradtopk import gradtopk
from .iterative import su_iterative, weighted
from ..threshold import THRESHOLD_METHODS
from .._ops.op import threshold_map
from ..threshold.rows import over_tau


def _threshold(family):
    return lambda x, k, dim, tau: threshold_map(x, family, k, dim, tau)


# method name -> launcher(x, k, dim, tau) taking validated arguments.
_REGISTRY = {name: _threshold(family) for name, family in THRESHOLD_METHODS.items()}
_REGISTRY.update(grad=gradtopk, iterative=su_iterative, weighted=weighted)

METHODS = tuple(_REGISTRY)


@_dtensor.entry("map", "soft_topk")
def soft_topk(x: Tensor, k: int | float | Tensor, dim: int = -1, tau: float = 1.0, method: str = "exp") -> Tensor:
    r"""Smooth top-k mask: p with Σp = k along ``dim``, 0 ≤ p ≤ 1 for every
    method except "iterative" and "weighted" (whose entries can exceed 1).

    For the threshold methods,

    .. math:: p = \arg\max_{0\le p\le 1,\ \sum p = k} \langle x/\tau, p\rangle - \sum_i \psi(p_i),
              \qquad p_i = f(x_i/\tau - \lambda),

    with ψ the convex conjugate of ∫f (see :mod:`softk.threshold.families`).
    λ is exact for "exp", "laplace" and "sparse" (closed form on the active
    set) and found by safeguarded Newton to the dtype's precision for "sigmoid".
    As τ → 0 the threshold methods, "grad" and "iterative" tend to the hard
    top-k multi-hot (on rows without ties at the k-th place); "weighted" does
    not (its limit is not the top-k: it is kept for comparison only).  "grad"
    is the gradient of :math:`\log \sum_{|S|=k} \exp(\sum_{i\in S} x_i/\tau)`,
    computed by a log-space recurrence with an explicit Hessian–vector-product
    backward (first derivatives only).

    Args:
        x: scores, any shape, floating point (half computed in float32).
        k: how many entries to select, an int in [1, n] with n = x.shape[dim]
            (a whole float such as 3.0 counts as its int); or, for the
            threshold methods, a budget in (0, n]: a fractional float (2.5,
            the same for every row) or one budget per row, a tensor
            broadcastable to ``x`` with size 1 along ``dim`` whose values lie
            in (0, n] (Σp = k still holds; a floating k that requires grad
            gets :math:`\partial p/\partial k = d/\sum_i d_i`).  A fractional or per-row k runs on the
            PyTorch path on every device.
        dim: the dimension to select along.
        tau: temperature > 0.
        method: one of "exp", "sigmoid", "laplace", "sparse", "grad",
            "iterative", "weighted".

    Returns:
        ``p`` shaped like ``x``.  ``-inf`` entries get 0 and are otherwise
        ignored; a row with at most k finite entries gets 1 on each of them
        (so Σp = number of finite entries < k there) and a zero gradient; a
        NaN or +inf stays in its row (that row is NaN).

    Reference: Su Jianlin, "Softmax后传：寻找Top-K的光滑近似" (the sequel to softmax:
    smooth approximations of Top-k), kexue.fm/archives/10373, 2024 — the
    threshold construction ("ThreTopK") and GradTopK.

    >>> import torch, softk
    >>> softk.soft_topk(torch.tensor([1.0, 2.0, 3.0, 4.0]), k=2)
    tensor([0.0900, 0.2447, 0.6652, 1.0000])
    >>> softk.soft_topk(torch.tensor([1.0, 2.0, 3.0, 4.0]), k=2, method="sparse")
    tensor([0., 0., 1., 1.])
    >>> softk.soft_topk(torch.tensor([0.0, 0.0, 0.0]), k=2, method="grad")
    tensor([0.6667, 0.6667, 0.6667])
    >>> softk.soft_topk(torch.tensor([1.0, 2.0, 3.0, 4.0]), k=2.5, method="sparse")
    tensor([0.0000, 0.5000, 1.0000, 1.0000])
    """
    dim, k, tau = check_topk_args(x, k, dim, tau, method, METHODS)
    if isinstance(tau, Tensor):  # τ that requires grad: x/τ with autograd, the map at τ = 1
        return _REGISTRY[method](over_tau(x, tau, dim, k, capped=True), k, dim, 1.0).to(x.dtype)
    return _REGISTRY[method](x, k, dim, tau)
