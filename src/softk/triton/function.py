"""Launchers for the Triton kernels, on contiguous (rows, n) tensors.

:class:`softk.dispatch.TritonBackend` calls them inside the custom ops of
:mod:`softk.threshold.op`, which hold the one autograd contract.

Rows of at most :data:`ONCHIP_MAX` entries run "on chip": the kernel loads the
row once into registers (a block of the next power of two) and runs every
pass of the λ search on that copy.  8192 float32 entries are 32 KiB, 16 per
thread at 16 warps, so the row plus the per-entry temporaries of one pass fit
in the register file: compiled for sm_90 (ptxas), every family stays within
128 registers without spilling at 8192 except sigmoid (24 bytes); at 16384
(32 entries per thread) most families spill 40–380 bytes.  Wider rows loop
over blocks of :data:`LOOP_BLOCK` in every pass (any width); their later
passes re-read the row, from L2 when the rows in flight fit there.  None of
this has been timed on a GPU yet.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels import threshold_bwd_kernel, threshold_fwd_kernel

from ..threshold.families import KERNEL_IDS as FAMILY_IDS  # one table for every backend

ONCHIP_MAX = 8192
LOOP_BLOCK = 2048
# Newton-type steps allowed before the search falls back to pure bisection,
# and the hard cap on search passes (bisection then has MAXIT - NEWTON_CAP
# halvings of a bracket that Newton has already shrunk).
NEWTON_CAP = 24
MAXIT = 60


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _config(n: int, onchip: bool | None, block: int | None):
    if onchip is None:
        onchip = n <= ONCHIP_MAX
    if onchip:
        blk = _pow2(n)
        warps = 4 if blk <= 512 else 8 if blk <= 2048 else 16
    else:
        blk = block or LOOP_BLOCK
        warps = 16
    return onchip, blk, warps


def forward_rows(rows: Tensor, fam: int, k: float, tau: float, alpha: float = 1.5, *,
                      onchip: bool | None = None, block: int | None = None, return_passes: bool = False):
    """p for contiguous ``rows`` (r, n).  ``onchip``/``block`` override the
    automatic choice (tests use them to run both variants on small rows);
    with ``return_passes`` also the number of λ-search passes per row (int32,
    r): the kernel's total is that + 2 (the first and the writing pass)."""
    out = torch.empty_like(rows)
    r, n = rows.shape
    its = torch.zeros(r if return_passes else 1, dtype=torch.int32, device=rows.device)
    if r:
        oc, blk, warps = _config(n, onchip, block)
        big = fam == 3 and alpha > 2
        threshold_fwd_kernel[(r,)](
            rows, out, its, n, float(k), 1.0 / tau, float(alpha),
            FAM=fam, BLOCK=blk, ONCHIP=oc, BIG=big, PROBE=fam >= 4 or big,
            NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=return_passes, num_warps=warps,
        )
    return (out, its) if return_passes else out


def backward_rows(p: Tensor, g: Tensor, fam: int, tau: float, alpha: float = 1.5, *,
                       onchip: bool | None = None, block: int | None = None) -> Tensor:
    """∂L/∂x for contiguous (r, n) ``p`` (the saved output) and ``g``."""
    dx = torch.empty_like(p)
    r, n = p.shape
    if r:
        oc, blk, warps = _config(n, onchip, block)
        threshold_bwd_kernel[(r,)](p, g, dx, n, 1.0 / tau, float(alpha), FAM=fam, BLOCK=blk, ONCHIP=oc, num_warps=warps)
    return dx
