"""Launcher of the fused Fenchel–Young loss kernel (:mod:`.loss_kernel`) on
contiguous (rows, n) tensors, with the forward kernel's settings per width
(:func:`.function._config`: on chip up to ``ONCHIP_MAX`` entries, else
blocks of ``LOOP_BLOCK``; narrow rows several to a program); softmax with class
indices, which is cross-entropy, runs :func:`.softmax.index_loss_rows`
instead (the softmax kernel's passes and tiles, and no per-entry term of
the loss)."""

from __future__ import annotations

import torch
from torch import Tensor

from .function import LEAN_SIMPLEX, MAXIT, NEWTON_CAP, _config, _entmax_flags
from .launch import cdiv
from .loss_kernel import fenchel_young_fwd_kernel
from .softmax import LOOP_BLOCK as SOFTMAX_LOOP_BLOCK, index_loss_rows
from ...threshold.families import KERNEL_IDS


def fenchel_young_fused_rows(x: Tensor, target: Tensor, scale: Tensor, fam: int, k: float, tau: float,
                             alpha: float = 1.5, *, want_grad: bool = True, onchip: bool | None = None,
                             block: int | None = None, rows_per_program: int | None = None, ce_rows: bool = False):
    """(loss per row in float32 (r,), gradient scale·(p − y)/τ in x's dtype (r, n),
    or an empty tensor without ``want_grad``).

    ``target``: a dense (r, n) target (any float dtype, read as float32), or
    class indices (r,) with −1 for ignored rows.  ``scale``: a one-element
    float32 tensor folded into the gradient (1/#kept rows for the mean).
    ``onchip``/``block``/``rows_per_program`` override the automatic choice,
    as for the forward.  ``ce_rows``: the rows of torch's cross-entropy
    (softmax with class indices only; see
    :func:`.softmax_kernels.softmax_index_loss_kernel`).
    """
    r, n = x.shape
    dense = target.dim() == 2
    if fam == KERNEL_IDS["softmax"] and not dense:  # cross-entropy: the softmax kernel's passes
        loop = block or (SOFTMAX_LOOP_BLOCK if onchip is False else None)
        return index_loss_rows(x, target, scale, tau, want_grad=want_grad, ce_rows=ce_rows, block=loop,
                               rows_per_program=rows_per_program)
    if ce_rows:
        raise ValueError("ce_rows: cross-entropy's rows are softmax's with class indices")
    loss = torch.empty(r, dtype=torch.float32, device=x.device)
    grad = torch.empty_like(x) if want_grad else torch.empty(0, dtype=x.dtype, device=x.device)
    if r:
        oc, blk, warps, rpp = _config(n, onchip, block, rows_per_program)
        am1, big, anchor = _entmax_flags(fam, alpha)
        fenchel_young_fwd_kernel[(cdiv(r, rpp),)](
            x, target, grad if want_grad else x, loss, scale, r, n, float(k), 1.0 / tau, am1,
            FAM=fam, ROWS=rpp, BLOCK=blk, ONCHIP=oc, BIG=big, PROBE=fam >= KERNEL_IDS["exp"] or big, ANCHOR=anchor,
            NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, DENSE=dense, WANT_GRAD=want_grad,
            LEAN=oc and onchip is None and fam in LEAN_SIMPLEX and not (big or anchor), num_warps=warps,
        )
    return loss, grad
