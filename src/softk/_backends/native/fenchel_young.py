"""The compiled CPU kernel of the fused Fenchel–Young loss, in the interface
every fused loss kernel has (:mod:`softk._backends.kernels`, op
"fenchel_young"): ``fenchel_young(x, target, k_rows, family, k, tau,
reduction, ignore_index, want_grad, check, ce_rows)`` on rows (classes last)
-> (the reduced loss in x's dtype, its gradient shaped like x)."""

from __future__ import annotations

import torch

from ..._validate import sum_tolerance
from ...threshold.rows import scaled_rows
from . import loss as _launcher
from .loss import BadTarget  # noqa: F401  (what a bad target raises)

_NO_GRAD = torch.empty(0)  # the gradient output when none is wanted

# the kernel checks the target's values in its pass (check=True) and raises BadTarget
CHECKS_TARGET = True
# torch's cross-entropy keeps torch's own kernel on the CPU (this one would
# convert half inputs to float32 as that path does, and has no ce_rows)
CROSS_ENTROPY = False


def fenchel_young(x, target, k_rows, family, k, tau, reduction, ignore_index, want_grad, check, ce_rows=False):
    """(the reduced loss in x's dtype, the gradient s·(p − y) shaped like x, or
    an empty tensor without ``want_grad``) from the compiled CPU kernel on the
    rows of ``x`` (half inputs in float32); ``check``: let the kernel check a
    dense target in its pass (it raises :class:`BadTarget`).  ``ce_rows``
    is never set here (``CROSS_ENTROPY`` is False)."""
    if ce_rows:
        raise NotImplementedError("the CPU loss kernel keeps the Fenchel–Young rows only (CROSS_ENTROPY is False)")
    n = x.shape[-1]
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32  # the compute dtype
    z = x if tau == 1.0 and x.dtype == ct else scaled_rows(x, tau, family, k if k_rows is None else k_rows,
                                                           shift=tau != 1.0)
    if z.dim() != 2:
        z = z.reshape(-1, n)
    tol = -1.0
    if target.is_floating_point():
        if target.dim() != 2:
            target = target.reshape(-1, n)
        if target.dtype != ct:
            target = target.to(ct)  # checked by the caller in its own dtype
        elif check:
            tol = sum_tolerance(1.0, n, ct)
    else:
        if target.dim() != 1:
            target = target.reshape(-1)
        if target.dtype != torch.int64:
            target = target.long()
    kr = None if k_rows is None else k_rows.reshape(-1).to(ct).contiguous()
    out, grad = _launcher.fenchel_young_fused_rows(
        z if z.is_contiguous() else z.contiguous(), target if target.is_contiguous() else target.contiguous(),
        family, k, k_rows=kr, inv_tau=1.0 / tau, ignore_index=ignore_index, reduction=reduction,
        want_grad=want_grad, tol=tol)
    if reduction == "none" and x.dim() != 2:
        out = out.view(x.shape[:-1])
    if grad is None:
        grad = _NO_GRAD
    elif x.dim() != 2:
        grad = grad.view(x.shape)
    if x.dtype != ct:  # half input: computed in float32
        out, grad = out.to(x.dtype), grad.to(x.dtype)
    return out, grad
