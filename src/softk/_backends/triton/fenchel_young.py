"""The Triton kernel of the fused Fenchel–Young loss, in the interface every
fused loss kernel has (:mod:`softk._backends.kernels`, op "fenchel_young"):
``fenchel_young(x, target, k_rows, family, k, tau, reduction, ignore_index,
want_grad, check)`` on rows (classes last) -> (the reduced loss in x's
dtype, its gradient shaped like x)."""

from __future__ import annotations

import torch

from ..._validate import mean_of, mean_scale
from . import loss as _launcher

# the kernel reads the target as it is: the caller checks it first
CHECKS_TARGET = False


def fenchel_young(x, target, k_rows, family, k, tau, reduction, ignore_index, want_grad, check):
    """(the reduced loss in x's dtype, the gradient s·(p − y) shaped like x, or
    an empty tensor without ``want_grad``) from the Triton kernel on the rows
    of ``x``; one k for every row (``k_rows`` is None: the kernel serves no
    other), the target checked by the caller (``check`` is unused)."""
    n = x.shape[-1]
    dense = target.is_floating_point()
    rows_t = target.reshape(-1, n) if dense else torch.where(target != ignore_index, target, -1).reshape(-1)
    rows_t = rows_t.contiguous()
    kept = rows_t.shape[0]
    if not dense:  # no host sync: the count stays on the device
        kept = (rows_t >= 0).sum().float()
    scale = torch.ones(1, dtype=torch.float32, device=x.device)
    if reduction == "mean":  # 1/#kept, 0 with no kept row (the mean's zero gradients)
        scale = mean_scale(scale, torch.as_tensor(kept, dtype=torch.float32, device=x.device))
    loss, grad = _launcher.fenchel_young_fused_rows(x.reshape(-1, n).contiguous(), rows_t, scale, family.kernel, k, tau,
                                          family.alpha_value, want_grad=want_grad)
    if want_grad:
        grad = grad.view(x.shape)
    # the reductions of softk._validate.reduce, on the same float32 rows
    if reduction == "none":
        out = loss.view(x.shape[:-1])
    else:
        out = loss.sum() if reduction == "sum" else mean_of(loss.sum(), kept)
    return out.to(x.dtype), grad
