"""The compiled CPU kernel of Su's top-k softmax cross-entropy, in the
interface of op "topk_softmax_ce" (:mod:`softk._backends.kernels`)."""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.rows import compute_dtype
from . import loss as _launcher
from .loss import BadTarget  # noqa: F401  (what a bad target raises)


def topk_softmax_ce(z: Tensor, target: Tensor, k: int, tau: float, reduction: str, ignore_index: int,
                    want_grad: bool):
    """(the reduced loss, its gradient shaped like z or None) from the compiled
    kernel on the rows of ``z`` (classes last), in z's dtype (half inputs in
    float32); it raises :class:`BadTarget` for a class index out of range."""
    n = z.shape[-1]
    ct = compute_dtype(z.dtype)
    x = (z if z.dtype == ct else z.to(ct)).reshape(-1, n)
    t = target.reshape(-1)
    if t.dtype != torch.int64:
        t = t.long()
    out, grad = _launcher.topk_ce_rows(x if x.is_contiguous() else x.contiguous(),
                                       t if t.is_contiguous() else t.contiguous(), k, inv_tau=1.0 / tau,
                                       ignore_index=ignore_index, reduction=reduction, want_grad=want_grad)
    if reduction == "none":
        out = out.view(z.shape[:-1])
    if want_grad:
        grad = grad.view(z.shape)
    if z.dtype != ct:  # half input: computed in float32
        out, grad = out.to(z.dtype), (grad.to(z.dtype) if want_grad else None)
    return out, grad
