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

import torch
from torch import Tensor
from torch.autograd import forward_ad

from .._backends import registry as _backend
from .._ops import lean as _lean
from .._validate import check_k
from .._backends.native.loss import BadTarget
from ..threshold.rows import compute_dtype
from . import targets as tg


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
    k finite scores keeps all of them; a row with no finite score gives NaN
    (as cross-entropy does).  On the CPU's compiled kernels (the "native"
    backend, eager calls) one pass per row finds the k-th largest score
    without sorting and writes the loss and its gradient, which the backward
    only scales (double backward recomputes through the tensor code below);
    there a row holding NaN or +inf is NaN, loss and gradient, and ties at
    the k-th place give the gradient to the lowest-indexed tied entries.

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
    if input.numel() and _lean.eager(input, target) and _backend.resolve(input) == "native":
        try:
            if _lean.tracked(input):
                return _FusedTopkCE.apply(z, target, k, tau, reduction, ignore_index)
            return _native(z, target, k, tau, reduction, ignore_index, False)[0]
        except BadTarget:
            tg.index_target(input, target, ignore_index)  # softk's message
            raise
    tg.index_target(input, target, ignore_index)
    return _reference(z, target, k, tau, reduction, ignore_index)


def _reference(z: Tensor, target: Tensor, k: int, tau: float, reduction: str, ignore_index: int) -> Tensor:
    """The loss as differentiable tensor code on rows (classes last)."""
    keep = target != ignore_index
    index = torch.where(keep, target, 0).long()
    zc = z.to(compute_dtype(z.dtype))
    if tau != 1.0:
        zc = zc / tau
    top = torch.topk(zc, k, dim=-1, sorted=False).values
    loss = torch.logsumexp(top, -1) - zc.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    loss = torch.where(keep, loss, 0.0)
    return tg.reduce(loss, keep, reduction).to(z.dtype)


def _native(z: Tensor, target: Tensor, k: int, tau: float, reduction: str, ignore_index: int, want_grad: bool):
    """(loss, gradient of the reduced loss) from the compiled kernel, in z's dtype."""
    from .._backends.native.loss import topk_ce_rows

    n = z.shape[-1]
    ct = compute_dtype(z.dtype)
    x = (z if z.dtype == ct else z.to(ct)).reshape(-1, n)
    t = target.reshape(-1)
    if t.dtype != torch.int64:
        t = t.long()
    out, grad = topk_ce_rows(x if x.is_contiguous() else x.contiguous(), t if t.is_contiguous() else t.contiguous(),
                             k, inv_tau=1.0 / tau, ignore_index=ignore_index, reduction=reduction,
                             want_grad=want_grad)
    if reduction == "none":
        out = out.view(z.shape[:-1])
    if want_grad:
        grad = grad.view(z.shape)
    if z.dtype != ct:  # half input: computed in float32
        out, grad = out.to(z.dtype), grad.to(z.dtype)
    return out, grad


class _FusedTopkCE(torch.autograd.Function):
    """The compiled kernel's loss, its saved gradient scaled by the backward
    (old style: eager calls only, see :mod:`softk._ops.lean`)."""

    @staticmethod
    def forward(ctx, z, target, k, tau, reduction, ignore_index):
        out, grad = _native(z, target, k, tau, reduction, ignore_index, True)
        ctx.save_for_backward(z, target, grad)
        if forward_ad._current_level >= 0:
            ctx.save_for_forward(grad)
        ctx.args = k, tau, reduction, ignore_index
        return out

    @staticmethod
    def backward(ctx, g):
        z, target, grad = ctx.saved_tensors
        reduction = ctx.args[2]
        if torch.is_grad_enabled():
            # create_graph: the gradient of the tensor code, itself differentiable
            (grad,) = torch.autograd.grad(_reference(z, target, *ctx.args), z, g, create_graph=True)
            return grad, None, None, None, None, None
        if reduction != "none" and float(g) == 1.0:
            return grad, None, None, None, None, None  # the saved gradient is the answer
        dx = grad * (g.unsqueeze(-1) if reduction == "none" else g)
        return dx.to(z.dtype), None, None, None, None, None

    @staticmethod
    def jvp(ctx, vz, *_):
        (grad,) = ctx.saved_tensors
        ct = compute_dtype(grad.dtype)
        t = grad.to(ct) * vz.to(ct)
        return (t.sum(-1) if ctx.args[2] == "none" else t.sum()).to(grad.dtype)
