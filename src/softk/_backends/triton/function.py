"""Launchers for the Triton kernels, on contiguous (rows, n) tensors.

:class:`softk._backends.dispatch.TritonBackend` calls them inside the custom ops of
:mod:`softk._contract.op`, which hold the one autograd contract.

Rows of at most :data:`ONCHIP_MAX` entries run "on chip": the kernel loads the
row once into registers (a block of the next power of two) and runs every
pass of the λ search on that copy.  8192 float32 entries are 32 KiB, 16 per
thread at 16 warps, so the row plus the per-entry temporaries of one pass fit
in the register file: compiled for sm_90 (ptxas), every family stays within
128 registers without spilling at 8192 except sigmoid (24 bytes); at 16384
(32 entries per thread) most families spill 40–380 bytes.  Wider rows loop
over blocks of :data:`LOOP_BLOCK` in every pass (any width); their later
passes re-read the row, from L2 when the rows in flight fit there.

Narrow rows share a program: an on-chip block of BLOCK < :data:`TILE` lanes
holds ROWS = TILE // BLOCK rows (at most :data:`ROWS_MAX`), a [ROWS, BLOCK]
tile, so a 64-wide router row gets 1/32 of a program instead of a program
of its own (width 16: 128 rows; 256: 8; 1024: 2; ≥ 2048: 1, and the looped
variant always 1).  The warps give each thread 4 entries of the tile (16
warps for a 2048 tile; 8 at BLOCK 1024, where 16 warps made ptxas stop at 64
registers and spill).  Compiled for sm_90a with triton 3.9's ptxas, that
keeps every family at 128 registers or fewer (the backward at 40); the few
spills are 8–40 bytes of spill stores + loads (sparsemax and entmax α at
width 16, entmax α at 32 and 512, entmax α > 2 at 1024); 8 entries per
thread took 140–255 registers and sigmoid spilled 1–2 KB.  One row per
program took 20–65 registers at these widths.  These choices
are UNTUNED: no GPU was available when they were made, so TILE, ROWS_MAX and
the warps are only what compiles without spilling, not what runs fastest.
None of this has been timed on a GPU yet.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from .kernels import threshold_bwd_kernel, threshold_fwd_kernel

from ...threshold.entmax_anchor import needs_anchor
from ...threshold.families import KERNEL_IDS as FAMILY_IDS  # one table for every backend

ONCHIP_MAX = 8192
LOOP_BLOCK = 2048
# On-chip rows narrower than TILE share a program: ROWS = TILE // BLOCK rows,
# at most ROWS_MAX (untuned, see the module docstring).
TILE = 2048
ROWS_MAX = 128
# Newton-type steps allowed before the search falls back to pure bisection,
# and the hard cap on search passes (bisection then has MAXIT - NEWTON_CAP
# halvings of a bracket that Newton has already shrunk).
NEWTON_CAP = 24
MAXIT = 60


# α-entmax: the largest α the kernels serve (a·ℓ and log(a·d) stay finite in
# float32 up to here); larger α goes to the torch path, see serves().
ALPHA_MAX = 1e30


def serves(kernel_id: int, alpha: float) -> bool:
    """Whether the Triton kernels give this family an exact result (to
    float32 precision, the torch route's error model): every kernel id, and
    for α-entmax (id 3) every float α with 1 < α ≤ :data:`ALPHA_MAX`.

    α outside [1.125, 2] takes the anchor form (:mod:`.anchor`) in the
    forward, and α > 2 the log-slope backward, as the torch route does.
    Beyond 1e30 a·log p leaves float32's range; those calls (and α ≤ 1, NaN
    or inf, which the public functions refuse anyway) belong on the torch
    path.  :class:`softk._backends.dispatch.TritonBackend` asks this before it runs
    the kernels.

    >>> serves(FAMILY_IDS["entmax"], 10.0), serves(FAMILY_IDS["entmax"], 1e31), serves(FAMILY_IDS["exp"], 1.5)
    (True, False, True)
    """
    if kernel_id not in FAMILY_IDS.values():
        return False
    if kernel_id != FAMILY_IDS["entmax"]:
        return True
    a = float(alpha)
    return 1.0 < a <= ALPHA_MAX


def _entmax_flags(fam: int, alpha: float):
    """(α − 1 in float64 then float32, BIG: α > 2, ANCHOR: the anchor form)."""
    am1 = float(alpha) - 1.0
    if fam != FAMILY_IDS["entmax"]:
        return am1, False, False
    if not serves(fam, alpha):
        raise ValueError(f"alpha must be in (1, {ALPHA_MAX:g}] for the Triton kernels, got {alpha}")
    return am1, alpha > 2, needs_anchor(alpha)


_PLACEHOLDERS: dict = {}


def _placeholder(device) -> Tensor:
    """An int32 buffer per device, passed where the kernel writes nothing."""
    buf = _PLACEHOLDERS.get(device)
    if buf is None:
        buf = _PLACEHOLDERS[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return buf


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _rows_per_program(blk: int) -> int:
    """Rows per program for an on-chip block of ``blk`` lanes: a tile of
    about :data:`TILE` entries, at most :data:`ROWS_MAX` rows."""
    return max(1, min(ROWS_MAX, TILE // blk))


def _config(n: int, onchip: bool | None, block: int | None, rows: int | None = None):
    """(onchip, BLOCK, num_warps, ROWS) for rows of ``n`` entries; ``rows``
    overrides ROWS (a power of two)."""
    if onchip is None:
        onchip = n <= ONCHIP_MAX
    if onchip:
        blk = _pow2(n)
        rows = rows or _rows_per_program(blk)
        if rows == 1:
            warps = 4 if blk <= 512 else 8 if blk <= 2048 else 16
        elif blk < 1024:  # 4 entries per thread (see the module docstring)
            warps = min(16, max(4, rows * blk // 128))
        else:
            warps = 8
    else:
        blk = block or LOOP_BLOCK
        rows = rows or 1
        warps = 16
    if rows & (rows - 1):
        raise ValueError(f"rows_per_program must be a power of two, got {rows}")
    return onchip, blk, warps, rows


def _out(out: Tensor | None, like: Tensor) -> Tensor:
    if out is None:
        return torch.empty_like(like)
    if out.shape != like.shape or out.dtype != like.dtype or out.device != like.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {tuple(like.shape)} {like.dtype} tensor on {like.device}, "
                         f"got {tuple(out.shape)} {out.dtype} on {out.device}")
    return out


def forward_rows(rows: Tensor, fam: int, k: float, tau: float, alpha: float = 1.5, *,
                 onchip: bool | None = None, block: int | None = None, return_passes: bool = False,
                 rows_per_program: int | None = None, out: Tensor | None = None):
    """p for contiguous ``rows`` (r, n), written into ``out`` when given.
    ``onchip``/``block``/``rows_per_program`` override the automatic choice
    (tests use them to run both variants on small rows, and one or many rows
    per program); with ``return_passes`` also the number of λ-search passes
    per row (int32, r): the kernel's total is that + 2 (the first and the
    writing pass).  The count is of reads of the row (or sweeps over its
    register copy): the λ search's, a second search in a moved frame
    (:mod:`.frame`), and for entmax α outside [1.125, 2] the anchor's
    (:mod:`.anchor`); the looped variant's sweeps over its lane maxima read
    no memory and are not counted."""
    out = _out(out, rows)
    r, n = rows.shape
    # the pass counts, or (WRITE_ITS off: never written) one placeholder per
    # device: no allocation and no fill kernel per call
    its = torch.zeros(r, dtype=torch.int32, device=rows.device) if return_passes else _placeholder(rows.device)
    if r:
        oc, blk, warps, rpp = _config(n, onchip, block, rows_per_program)
        am1, big, anchor = _entmax_flags(fam, alpha)
        threshold_fwd_kernel[(triton.cdiv(r, rpp),)](
            rows, out, its, r, n, float(k), 1.0 / tau, am1,
            FAM=fam, ROWS=rpp, BLOCK=blk, ONCHIP=oc, BIG=big, PROBE=fam >= 4 or big, ANCHOR=anchor,
            NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=return_passes, num_warps=warps,
        )
    return (out, its) if return_passes else out


def backward_rows(p: Tensor, g: Tensor, fam: int, tau: float, alpha: float = 1.5, *,
                  onchip: bool | None = None, block: int | None = None,
                  rows_per_program: int | None = None, out: Tensor | None = None) -> Tensor:
    """∂L/∂x for contiguous (r, n) ``p`` (the saved output) and ``g``,
    written into ``out`` when given."""
    dx = _out(out, p)
    r, n = p.shape
    if r:
        oc, blk, warps, rpp = _config(n, onchip, block, rows_per_program)
        am1, big, _ = _entmax_flags(fam, alpha)
        threshold_bwd_kernel[(triton.cdiv(r, rpp),)](p, g, dx, r, n, 1.0 / tau, am1, FAM=fam, ROWS=rpp,
                                                     BLOCK=blk, ONCHIP=oc, LOGD=big, num_warps=warps)
    return dx
