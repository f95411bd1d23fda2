r"""Fenchel–Young loss of smooth top-k, for multi-label and top-k targets.

For ``p = soft_topk(x, k, method, tau)`` on the capped simplex
C_k = {0 ≤ p ≤ 1, Σp = k} with regulariser Ω(p) = Σψ(p_i),

.. math:: L(x; y) = \Phi_k(x/\tau) + \Omega(y) - \langle x/\tau, y\rangle \ge 0,
          \qquad \nabla_x L = (p - y)/\tau,

zero exactly when soft_topk outputs y.  Φ_k is the smooth sum of the k largest
scores, so for a multi-hot y with k ones L is a smooth "sum of the top k minus
the sum of the labelled k" (for method "sparse" and large margins, exactly 0).
"""

from __future__ import annotations

from torch import Tensor

from .. import _dtensor

from .._validate import check_choice, check_input
from ..threshold.families import THRESHOLD_METHODS
from .fenchel_young import fenchel_young_loss
from .targets import check_target_tensor


@_dtensor.entry("loss", "soft_topk_loss")
def soft_topk_loss(input: Tensor, target: Tensor, k: int, method: str = "exp", tau: float = 1.0, reduction: str = "mean") -> Tensor:
    r"""Fenchel–Young loss of :func:`softk.soft_topk`, for multi-label and top-k targets.

    .. math:: L(x; y) = \Phi_k(x/\tau) + \Omega(y) - \langle x/\tau, y\rangle \ge 0,
              \qquad \nabla_x L = (p - y)/\tau,

    with p = soft_topk(x, k, method, tau), Ω(p) = Σψ(p_i) its regulariser and
    Φ_k the smooth sum of the k largest scores: zero exactly when soft_topk
    outputs y.

    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: float tensor shaped like ``input`` whose rows along dim 1 lie in
            the capped simplex: entries in [0, 1] summing to k (a multi-hot
            label with exactly k ones, or any soft top-k target).
        k: int in [1, C], or one k per row (a tensor broadcastable to
            ``input`` with size 1 along dim 1): multi-hot rows with a varying
            number of labels take ``k = target.sum(1, keepdim=True)``.
        method: "exp", "sigmoid", "laplace" or "sparse" (as in ``soft_topk``).
        tau: temperature > 0; the loss is evaluated at ``input / tau``.
        reduction: "mean" (over rows), "sum" or "none".

    With k = 1 and method "exp" this is :func:`softmax_loss`; with "sparse",
    :func:`sparsemax_loss`.  Method "exp" with an int k, or one integral k
    per row (multi-hot labels), takes the fused loss kernel on the CPU's
    compiled kernels (on Triton every method with an int k); the other
    methods, and a k per row that is not integral or needs a gradient, take
    the unfused path (:func:`softk.losses.fenchel_young_loss`).

    >>> import torch
    >>> x = torch.tensor([[3.0, 0.0, 2.0, -1.0]])
    >>> soft_topk_loss(x, torch.tensor([[1.0, 0.0, 1.0, 0.0]]), k=2, method="sparse")
    tensor(0.)
    >>> soft_topk_loss(x, torch.tensor([[0.0, 1.0, 1.0, 0.0]]), k=2, method="sparse")
    tensor(3.)
    """
    check_input(input, "input")
    check_target_tensor(target, input=input, accepts="distribution", k=k)
    if not target.is_floating_point():
        raise TypeError(
            f"target must be a float tensor shaped like input whose rows sum to k (e.g. a "
            f"multi-hot label with k ones), got dtype {target.dtype}"
        )
    check_choice(method, tuple(THRESHOLD_METHODS), "method")
    return fenchel_young_loss(input, target, THRESHOLD_METHODS[method], k, reduction=reduction, tau=tau)
