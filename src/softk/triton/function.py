"""Launcher and autograd Function for the Triton kernels.

The launcher moves ``dim`` last, makes rows contiguous and views them as
(rows, n); the Function saves only p, like the torch backend's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels import threshold_bwd_kernel, threshold_fwd_kernel

FAMILY_IDS = {"softmax": 0, "sparsemax": 1, "entmax15": 2, "entmax": 3, "exp": 4, "sigmoid": 5, "laplace": 6, "sparse": 7}
BLOCK = 1024
ITERS = 60  # bisection halvings: bracket width / 2^60 is below float32 resolution


def _block(n: int) -> int:
    return min(BLOCK, max(16, 1 << (n - 1).bit_length()))


class TritonThresholdFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, fam: int, k: int, tau: float, alpha: float) -> Tensor:
        rows = x.contiguous().view(-1, x.shape[-1])
        out = torch.empty_like(rows)
        n = rows.shape[-1]
        if rows.shape[0]:
            threshold_fwd_kernel[(rows.shape[0],)](
                rows, out, n, float(k), 1.0 / tau, float(alpha), FAM=fam, BLOCK=_block(n), ITERS=ITERS
            )
        out = out.view(x.shape)
        ctx.save_for_backward(out)
        ctx.fam, ctx.tau, ctx.alpha = fam, tau, alpha
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        n = p.shape[-1]
        prow = p.view(-1, n)
        grow = g.contiguous().view(-1, n)
        dx = torch.empty_like(prow)
        if prow.shape[0]:
            threshold_bwd_kernel[(prow.shape[0],)](
                prow, grow, dx, n, 1.0 / ctx.tau, float(ctx.alpha), FAM=ctx.fam, BLOCK=_block(n)
            )
        return dx.view(p.shape), None, None, None, None


def triton_threshold_map(x: Tensor, family: str, k: int, dim: int, tau: float, alpha: float = 1.5) -> Tensor:
    """p = f(x/τ − λ), Σp = k along ``dim`` with the Triton kernels (arguments
    already validated by the caller; ``family`` a key of :data:`FAMILY_IDS`)."""
    if x.numel() == 0:
        return x * 0
    out = TritonThresholdFunction.apply(x.movedim(dim, -1), FAMILY_IDS[family], k, tau, alpha)
    return out.movedim(-1, dim)
