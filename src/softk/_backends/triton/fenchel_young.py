"""The Triton kernel of the fused Fenchel–Young loss, in the interface every
fused loss kernel has (:mod:`softk._backends.kernels`, op "fenchel_young"):
``fenchel_young(x, target, k_rows, family, k, tau, reduction, ignore_index,
want_grad, check, ce_rows)`` on rows (classes last) -> (the reduced loss in
x's dtype, its gradient shaped like x)."""

from __future__ import annotations

import torch

from . import loss as _launcher
from .launch import constant, rows

# the kernel reads the target as it is: the caller checks it first
CHECKS_TARGET = False
# it serves torch's cross-entropy (softmax, class indices) on half inputs:
# it reads them as they are (no float32 copy of the logits) and keeps
# cross-entropy's rows when asked (ce_rows)
CROSS_ENTROPY = True


def fenchel_young(x, target, k_rows, family, k, tau, reduction, ignore_index, want_grad, check, ce_rows=False):
    """(the reduced loss in x's dtype, the gradient s·(p − y) shaped like x, or
    an empty tensor without ``want_grad``) from the Triton kernel on the rows
    of ``x``; one k for every row (``k_rows`` is None: the kernel serves no
    other), the target checked by the caller (``check`` is unused);
    ``ce_rows``: torch's cross-entropy's rows (a row with no finite score is
    NaN; see :func:`.softmax_kernels.softmax_index_loss_kernel`)."""
    n = x.shape[-1]
    x_rows = rows(x)
    if target.is_floating_point():
        rows_t, kept = target.reshape(-1, n).contiguous(), x_rows.shape[0]
        one = reduction != "mean" or kept <= 1
        scale = constant(x.device, torch.float32, 1.0) if one else torch.full((1,), 1.0 / kept, device=x.device)
    else:  # ignored rows as −1; no host sync: the count stays on the device
        keep = target != ignore_index
        rows_t, kept = torch.where(keep, target, -1).reshape(-1), keep.sum()
        # 1/#kept for the mean (inf with no kept row: the kernel writes 0 on an ignored row, never 0·inf)
        scale = kept.reciprocal().float().reshape(1) if reduction == "mean" else constant(x.device, torch.float32, 1.0)
    loss, grad = _launcher.fenchel_young_fused_rows(x_rows, rows_t, scale, family.kernel, k, tau, family.alpha_value,
                                                    want_grad=want_grad, ce_rows=ce_rows)
    if want_grad and grad.shape != x.shape:
        grad = grad.view(x.shape)
    # the reductions of softk._validate.reduce, on the same float32 rows: the
    # mean over no kept row is 0/0, NaN, as in torch
    if reduction == "none":
        out = loss.view(x.shape[:-1])
    elif reduction == "sum":
        out = loss.sum()
    else:
        out = loss.sum() / kept
    return out.to(x.dtype), grad
