r"""Sparse-softmax cross-entropy (Su Jianlin, "Sparse Softmax", kexue.fm 2020).

Cross-entropy restricted to the k largest scores:

.. math:: \ell(s; t) = \log \sum_{i \in \Omega_k(s)} e^{s_i} - s_t,
          \qquad s = x/\tau,\ \Omega_k(s) = \text{indices of the } k \text{ largest } s_i.

It is the cross-entropy of the sparse softmax that keeps the top k entries
(``softk.topk_softmax``-style) when t ∈ Ω_k, and it stays defined and ≥ 0
when t ∉ Ω_k, since log Σ_{Ω_k} e^{s_i} ≥ max s ≥ s_t.  Its gradient is the
softmax over Ω_k minus e_t: only the top k scores and the target are pushed.
k = C is exactly :func:`cross_entropy`; k = 1 is the hinge-like max s − s_t.

The seed's code names this class "Sparsemax" (it is not sparsemax, the
Euclidean projection; see :func:`sparsemax_loss`) and always sums over the
batch; here it has its own name and torch's reductions.  Ties at the k-th
place do not change the value (the k largest *values* are unique); the
gradient goes to the tied entries torch.topk returns.
"""

from __future__ import annotations

from torch import Tensor

from .. import _dtensor

from .._backends import dispatch
from .._ops.topk_softmax_ce import fused_topk_softmax_ce, topk_softmax_ce_rows
from .._validate import check_k
from .._backends.native.loss import BadTarget
from . import targets as tg


@_dtensor.entry("loss", "topk_softmax_cross_entropy")
def topk_softmax_cross_entropy(
    input: Tensor, target: Tensor, k: int, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0
) -> Tensor:
    r"""Su's sparse-softmax cross-entropy: :math:`\log \sum_{i \in \Omega_k(s)} e^{s_i} - s_t`.

    s = x/τ and Ω_k(s) the indices of the k largest scores: the cross-entropy
    of the softmax over the top k when the target t is among them, and still
    defined and ≥ 0 when it is not.  Its gradient is that softmax minus e_t;
    k = C is :func:`cross_entropy`.

    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: class indices, an integer tensor shaped like ``input`` without dim 1.
        k: how many of the largest scores the normaliser keeps, int in [1, C].
        ignore_index: class index whose rows give 0 and are left out of "mean".
        reduction: "mean", "sum" or "none".
        tau: temperature > 0 (s = input / tau).

    Needs only the (N, k) top values beyond the input.  A row with fewer than
    k finite scores keeps all of them; a row with no finite score, or one
    holding NaN or +inf, gives NaN, loss and gradient (as cross-entropy
    does).  On the CPU's compiled kernels (the "native" backend, eager calls)
    one pass per row finds the k-th largest score without sorting and writes
    the loss and its gradient, which the backward only scales (double
    backward recomputes through the tensor code); there ties at the k-th
    place give the gradient to the lowest-indexed tied entries.

    >>> import torch
    >>> x = torch.tensor([[3.0, 1.0, 0.0, 0.0]])
    >>> round(topk_softmax_cross_entropy(x, torch.tensor([1]), k=2).item(), 6)  # log(e^3 + e) - 1
    2.126928
    >>> topk_softmax_cross_entropy(x, torch.tensor([0]), k=1)
    tensor(0.)
    """
    tau, reduction, ignore_index = tg.check_loss_args(input, target, tau, reduction, ignore_index, accepts="index")
    if target.is_floating_point():
        raise TypeError(
            f"target must hold class indices (an integer tensor), got dtype {target.dtype}; "
            f"for distributions use softmax_loss or cross_entropy"
        )
    cdim = 0 if input.dim() == 1 else 1
    if input.shape[cdim] == 0:
        raise ValueError(f"input must have at least one class along dim {cdim}, got shape {tuple(input.shape)}")
    k = check_k(k, input.shape[cdim])
    tg.check_index_shape(input, target)
    if target.device != input.device:
        target = target.to(input.device)
    z = input if cdim == input.dim() - 1 else input.movedim(cdim, -1)
    kernel = dispatch.pick("topk_softmax_ce", input, target)
    if kernel is not None:
        try:
            return fused_topk_softmax_ce(z, target, k, tau, reduction, ignore_index, kernel.backend)
        except BadTarget:
            tg.index_target(input, target, ignore_index)  # softk's message
            raise
    tg.index_target(input, target, ignore_index)
    return topk_softmax_ce_rows(z, target, k, tau, reduction, ignore_index)
