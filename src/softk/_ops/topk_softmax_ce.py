r"""Su's top-k softmax cross-entropy: its tensor code and the autograd rule
of the compiled CPU kernel (:func:`softk._backends.native.loss.topk_ce_rows`).

:func:`topk_softmax_ce_rows` is the loss as differentiable tensor code on
rows (classes last); :func:`fused_topk_softmax_ce` runs the kernel, which
writes the loss and its gradient in one pass, under an old-style
Function whose backward only scales the saved gradient (double backward
differentiates the tensor code).  The kernel has no library op: it serves
plain eager calls only (:mod:`softk._backends.kernels`, op
"topk_softmax_ce"), and :func:`softk.losses.topk_softmax_cross_entropy`
takes the tensor code for every other call.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import lean as _lean
from .._backends import kernels
from .._validate import reduce
from ..threshold.rows import broken_rows, compute_dtype, finite_max, shift_over_tau


def lse_minus_target(top: Tensor, zt: Tensor) -> Tensor:
    """log Σ_{top} e^{z} − z_t per row, (..., k) and (..., 1) → (...), as
    logsumexp(top − z_t): lse(top) − z_t cancels two terms of the row's
    size (an offset of 1e6 in float32 left 1.0 where the loss is 0.974).  A
    masked target (z_t = −inf) keeps lse(top) − z_t = inf, where top − z_t
    would meet −inf − −inf = NaN."""
    fin = torch.isfinite(zt)
    return torch.where(fin, torch.logsumexp(top - torch.where(fin, zt, 0.0), -1, keepdim=True),
                       torch.logsumexp(top, -1, keepdim=True) - zt).squeeze(-1)


def topk_softmax_ce_rows(z: Tensor, target: Tensor, k: int, tau: float, reduction: str, ignore_index: int) -> Tensor:
    """The loss as differentiable tensor code on rows (classes last)."""
    keep = target != ignore_index
    index = torch.where(keep, target, 0).long()
    zc = z.to(compute_dtype(z.dtype))
    # shifted by the row max before dividing by τ (x/τ first rounds every
    # entry to ulp(x/τ)), and the loss formed without cancelling (lse_minus_target)
    zc = shift_over_tau(zc, finite_max(zc).detach(), tau, check=False)
    # an ignored row's scores are left out (zeros): one with no finite score
    # (a padding row masked with −inf) would send logsumexp's NaN into the gradient
    zc = torch.where(keep.unsqueeze(-1), zc, 0.0)
    top = torch.topk(zc, k, dim=-1, sorted=False).values
    loss = lse_minus_target(top, zc.gather(-1, index.unsqueeze(-1)))
    # a kept row holding NaN or +inf, or no finite score, is NaN, loss and
    # gradient on every entry (the row convention, and the native kernel's),
    # where topk's gradient would reach only the top k: a term of value NaN
    # there with slope NaN, and 0 with slope 0 elsewhere
    broken = broken_rows(zc) | ~(zc > float("-inf")).any(-1, keepdim=True)
    loss = loss + (torch.where(broken, zc, 0.0) * torch.where(broken, float("nan"), 0.0)).sum(-1)
    loss = torch.where(keep, loss, 0.0)
    return reduce(loss, keep, reduction).to(z.dtype)


def _kernel(z, target, k, tau, reduction, ignore_index, want_grad, backend):
    return kernels.get("topk_softmax_ce", backend).impl.topk_softmax_ce(z, target, k, tau, reduction, ignore_index,
                                                                        want_grad)


class _FusedTopkCE(torch.autograd.Function):
    """The compiled kernel's loss, its saved gradient scaled by the backward
    (old style: eager calls only, see :mod:`softk._ops.lean`)."""

    @staticmethod
    def forward(ctx, z, target, k, tau, reduction, ignore_index, backend):
        out, grad = _kernel(z, target, k, tau, reduction, ignore_index, True, backend)
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
            (grad,) = torch.autograd.grad(topk_softmax_ce_rows(z, target, *ctx.args), z, g, create_graph=True)
            return grad, None, None, None, None, None, None
        if reduction != "none" and float(g) == 1.0:
            return grad, None, None, None, None, None, None  # the saved gradient is the answer
        dx = grad * (g.unsqueeze(-1) if reduction == "none" else g)
        return dx.to(z.dtype), None, None, None, None, None, None

    @staticmethod
    def jvp(ctx, vz, *_):
        (grad,) = ctx.saved_tensors
        ct = compute_dtype(grad.dtype)
        t = grad.to(ct) * vz.to(ct)
        return (t.sum(-1) if ctx.args[2] == "none" else t.sum()).to(grad.dtype)


def fused_topk_softmax_ce(z: Tensor, target: Tensor, k: int, tau: float, reduction: str, ignore_index: int,
                          backend: str) -> Tensor:
    """The reduced loss from the kernel on ``backend`` (rows of ``z``,
    classes last; a plain eager call, which the kernel's ``serves`` asked),
    under :class:`_FusedTopkCE` when autograd can see the result; it raises
    :class:`softk._backends.native.loss.BadTarget` for a bad target."""
    if _lean.tracked(z):
        return _FusedTopkCE.apply(z, target, k, tau, reduction, ignore_index, backend)
    return _kernel(z, target, k, tau, reduction, ignore_index, False, backend)[0]
