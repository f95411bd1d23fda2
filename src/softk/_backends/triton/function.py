"""Launchers for the Triton kernels, on contiguous (rows, n) tensors.

:mod:`.threshold` calls them as the "triton" kernel of op "threshold"
(:mod:`softk._backends.kernels`), inside the custom ops of :mod:`softk._ops.op`,
which hold the one autograd contract.

The forward (the λ search) and the backward (one streaming pass) have
their own launch settings (:func:`_config`), chosen from the sweep of
``benchmarks/gpu/tune.py`` (BENCHMARKS.md has the table and the machine):

* Forward.  Rows of at most :data:`ONCHIP_MAX` entries run "on chip": the
  kernel loads the row once into registers (a block of the next power of
  two) and runs every pass of the λ search on that copy.  Narrow rows share
  a program: a [ROWS, BLOCK] tile of :data:`TILE` entries (ROWS = TILE //
  BLOCK), 8 entries per thread, so a 64-wide router row gets 1/8 of a
  program; a 1024-wide row has one warp to itself.  Wider rows loop over
  blocks in every pass, their later passes re-reading the row from L1/L2:
  blocks of 512 at one warp up to 2048 entries and two up to 4096, then
  blocks of :data:`LOOP_BLOCK` at four warps.  Few warps per row leave
  room for many rows in flight on each SM, which hides the latency of the
  search's reductions.  The looped search starts from the maxima of the
  block's lanes, so a wider block gives a better start and fewer passes:
  :data:`LOOP_BLOCK` weighs that against the rows in flight (the pass
  counts of ``tests/backends/triton/test_triton_passes.py`` hold at it).
* The lean forward (:mod:`.lean`) of sparsemax, entmax15 and α-entmax for
  1.125 ≤ α ≤ 2 holds rows of up to :data:`LEAN_MAX` entries in registers,
  narrow rows in tiles of :data:`LEAN_TILE` entries on one warp (the
  settings of :func:`_lean_config`), and reads the row once: sparsemax and
  entmax15 search that copy, α-entmax from 1.5 a buffer of the row's
  candidates (:func:`_lean_compacts`).  Wider rows of those maps
  (:mod:`.lean_wide`, one row per program in blocks of
  :data:`LEAN_WIDE_BLOCK`): sparsemax and entmax15 read them three times on
  normal rows (the lane maxima, a sweep from their bound, the write),
  α-entmax twice (the lane maxima, then a buffer of candidates;
  :func:`_lean_wide_compacts`); exp, sigmoid and laplace top-k up to
  :data:`LEAN_MAX` (:mod:`.lean_topk`) once.
* Backward.  On chip up to :data:`BWD_ONCHIP_MAX` entries, rows narrower
  than 1024 in tiles of :data:`BWD_NARROW_TILE` entries at 8 a thread, the
  others in tiles of :data:`BWD_TILE`; wider rows loop over blocks of
  :data:`BWD_LOOP_BLOCK` at 32 warps.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels import threshold_bwd_kernel, threshold_fwd_kernel
from .launch import cdiv, constant
from .lean import lean_fwd_kernel
from .lean_topk import lean_topk_fwd_kernel
from .lean_wide import lean_wide_fwd_kernel

from ...threshold.entmax_anchor import NEAR_ONE, needs_anchor
from ...threshold.families import KERNEL_IDS as FAMILY_IDS  # one table for every backend
from ...threshold.families import by_name

# The kernel ids whose backward forms the slope from the input (Family.slope_from_x).
FROM_X = frozenset(i for name, i in FAMILY_IDS.items() if by_name(name).slope_from_x)

# The forward: on chip up to ONCHIP_MAX entries, narrow rows in tiles of
# TILE entries (at most ROWS_MAX rows); wider ones in blocks of SHORT_BLOCK
# up to SHORT_MAX entries, else of LOOP_BLOCK.
ONCHIP_MAX = 1024
TILE = 512
ROWS_MAX = 128
SHORT_MAX = 4096
SHORT_BLOCK = 512
LOOP_BLOCK = 2048
# The backward: on chip up to BWD_ONCHIP_MAX, tiles of BWD_TILE, else blocks of BWD_LOOP_BLOCK.
BWD_ONCHIP_MAX = 8192
BWD_TILE = 2048
BWD_NARROW_TILE = 512  # rows narrower than 1024: tiles of 512 entries at 2 warps
BWD_LOOP_BLOCK = 4096
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
    float32 precision, the torch backend's error model): every kernel id, and
    for α-entmax (id 3) every float α with 1 < α ≤ :data:`ALPHA_MAX`.

    α outside [1.125, 2] takes the anchor form (:mod:`.anchor`) in the
    forward, and α > 2 the log-slope backward, as the torch backend does.
    Beyond 1e30 a·log p leaves float32's range; those calls (and α ≤ 1, NaN
    or inf, which the public functions refuse anyway) belong on the torch
    path.  The kernel's ``serves`` (:mod:`softk._backends.kernels`) asks this
    before the dispatcher picks it.

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
    """(α − 1 in float64 then float32, BIG: α > 2, ANCHOR: 0 for f(z − λ), 1 for
    the anchor form, 2 for the anchor form at the row maximum (α − 1 < 1/8))."""
    am1 = float(alpha) - 1.0
    if fam != FAMILY_IDS["entmax"]:
        return am1, False, False
    if not serves(fam, alpha):
        raise ValueError(f"alpha must be in (1, {ALPHA_MAX:g}] for the Triton kernels, got {alpha}")
    return am1, alpha > 2, (2 if am1 < NEAR_ONE else 1) if needs_anchor(alpha) else 0


def _placeholder(device, dtype=torch.int32) -> Tensor:
    """A one-element buffer, passed where the kernel reads and writes nothing."""
    return constant(device, dtype, 0)


def _pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())


def _config(n: int, onchip: bool | None, block: int | None, rows: int | None = None, *, backward: bool = False):
    """(onchip, BLOCK, num_warps, ROWS) for rows of ``n`` entries, for the
    forward (λ search) or the ``backward`` kernel; ``onchip``, ``block`` and
    ``rows`` (a power of two) override the automatic choice.

    >>> _config(64, None, None), _config(1024, None, None), _config(3000, None, None), _config(32768, None, None)
    ((True, 64, 2, 8), (True, 1024, 1, 1), (False, 512, 2, 1), (False, 2048, 4, 1))
    >>> _config(64, None, None, backward=True), _config(32768, None, None, backward=True)
    ((True, 64, 2, 8), (False, 4096, 32, 1))
    """
    on_max, tile = (BWD_ONCHIP_MAX, BWD_TILE) if backward else (ONCHIP_MAX, TILE)
    if onchip is None:
        onchip = n <= on_max
    if onchip:
        blk = _pow2(n)
        if backward and blk < 1024:
            tile = BWD_NARROW_TILE
        rows = rows or max(1, min(ROWS_MAX, tile // blk))
        if backward:  # 4 entries per thread, 8 in tiles of narrow rows (see the module docstring)
            if rows == 1:
                warps = 4 if blk <= 512 else 8 if blk <= 2048 else 16
            else:
                warps = max(1, min(16, rows * blk // 256)) if blk < 1024 else 8
        else:  # 8 entries per thread in a tile of rows; a row alone: one warp per 1024 entries
            warps = max(1, min(16, rows * blk // 256)) if rows > 1 else max(1, min(16, blk // 1024))
    elif backward:
        blk, rows = block or BWD_LOOP_BLOCK, rows or 1
        warps = max(1, min(32, blk // 128))
    else:
        blk, rows = block or (SHORT_BLOCK if n <= SHORT_MAX else LOOP_BLOCK), rows or 1
        # 16 entries per thread, 8 in the blocks of rows of 2049–SHORT_MAX entries
        warps = max(1, min(16, blk // (256 if 2048 < n <= SHORT_MAX else 512)))
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
    no memory and are not counted.  The maps with a lean forward
    (:func:`takes_lean`) take it (:func:`lean_forward_rows`) unless
    ``onchip`` or ``block`` is given; its count is of sweeps of the search
    (over the row's candidates where it has a buffer of them, plus the
    general search's passes on the rows it hands on)."""
    if onchip is None and block is None and takes_lean(fam, rows.shape[-1], alpha):
        return lean_forward_rows(rows, fam, k, tau, alpha, return_passes=return_passes,
                                 rows_per_program=rows_per_program, out=out)
    out = _out(out, rows)
    r, n = rows.shape
    # the pass counts, or (WRITE_ITS off: never written) one placeholder per
    # device: no allocation and no fill kernel per call
    its = torch.zeros(r, dtype=torch.int32, device=rows.device) if return_passes else _placeholder(rows.device)
    if r:
        oc, blk, warps, rpp = _config(n, onchip, block, rows_per_program)
        am1, big, anchor = _entmax_flags(fam, alpha)
        threshold_fwd_kernel[(cdiv(r, rpp),)](
            rows, out, its, r, n, float(k), 1.0 / tau, am1,
            FAM=fam, ROWS=rpp, BLOCK=blk, ONCHIP=oc, BIG=big, PROBE=fam >= FAMILY_IDS["exp"] or big, ANCHOR=anchor,
            NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=return_passes, num_warps=warps,
        )
    return (out, its) if return_passes else out


def backward_rows(p: Tensor, g: Tensor, fam: int, tau: float, alpha: float = 1.5, *,
                  x: Tensor | None = None, k: float | None = None, onchip: bool | None = None, block: int | None = None,
                  rows_per_program: int | None = None, out: Tensor | None = None) -> Tensor:
    """∂L/∂x for contiguous (r, n) ``p`` (the saved output) and ``g``,
    written into ``out`` when given; ``x``, the input (contiguous, p's
    dtype), for the families whose slope is formed from it
    (``Family.slope_from_x``: sigmoid and laplace), and ``k``, their budget,
    for the rows whose every p lies above ½."""
    if (fam in FROM_X) != (x is not None):
        raise ValueError(f"backward_rows: x is {'required' if fam in FROM_X else 'not taken'} for family id {fam}")
    dx = _out(out, p)
    r, n = p.shape
    if r:
        oc, blk, warps, rpp = _config(n, onchip, block, rows_per_program, backward=True)
        am1, big, _ = _entmax_flags(fam, alpha)
        threshold_bwd_kernel[(cdiv(r, rpp),)](p, p if x is None else x, g, dx, r, n, 1.0 / tau, am1,
                                              1.0 if k is None else float(k), FAM=fam, ROWS=rpp, BLOCK=blk,
                                              ONCHIP=oc, LOGD=big, FROM_X=x is not None,
                                              REFINE=x is not None and k is not None, num_warps=warps)
    return dx


# The lean forward (:mod:`.lean`): sparsemax, entmax15 and α-entmax for
# 1.125 ≤ α ≤ 2 on rows of up to LEAN_MAX entries, held in registers; rows
# of at least LEAN_GROUP_MIN entries start the search at the root over the
# maxima of groups of LEAN_GROUP entries.  Sparsemax and entmax15 then sweep
# the whole row in registers, which took less time on a GPU than a search
# on a buffer of the candidates above that root at every width timed (the
# buffer's prefix count, its round trip through memory and the scattered
# write cost more than the sweeps they save; BENCHMARKS.md has the sweep).  α-entmax
# from LEAN_COMPACT_ALPHA, whose sweeps take a power per entry, searches
# such a buffer of LEAN_SLOTS candidates (below it the support widens as α
# nears 1 and the buffer would overflow; the whole row is searched).
LEAN_MAX = 8192
LEAN_SLOTS = 64
LEAN_GROUP = 16
LEAN_GROUP_MIN = 4 * LEAN_SLOTS
LEAN_COMPACT_ALPHA = 1.5
# Rows wider than LEAN_MAX (:mod:`.lean_wide`): a buffer of LEAN_WIDE_SLOTS
# candidates per row, wide enough for α-entmax's supports at α = 1.3.
LEAN_WIDE_SLOTS = 1024
LEAN_WIDE_BLOCK = 1024
# The lean forward's tile of narrow rows (several rows a program, one warp).
LEAN_TILE = 256


# The smooth top-k maps' lean forward (:mod:`.lean_topk`): the lean sweeps a
# row may take before it goes to the general search.
LEAN_TOPK_IT = 8
LEAN_SIMPLEX = (FAMILY_IDS["sparsemax"], FAMILY_IDS["entmax15"], FAMILY_IDS["entmax"])
LEAN_TOPK = (FAMILY_IDS["exp"], FAMILY_IDS["sigmoid"], FAMILY_IDS["laplace"])


def takes_lean(fam: int, n: int, alpha: float) -> bool:
    """Whether rows of ``n`` entries of this family take a lean forward:
    sparsemax, entmax15, α-entmax for 1.125 ≤ α ≤ 2 at every width (:mod:`.lean`
    up to :data:`LEAN_MAX` entries, :mod:`.lean_wide` above) and the smooth
    top-k maps exp, sigmoid and laplace up to :data:`LEAN_MAX` (:mod:`.lean_topk`)."""
    if fam not in LEAN_SIMPLEX + LEAN_TOPK or (n > LEAN_MAX and fam in LEAN_TOPK):
        return False
    return fam != FAMILY_IDS["entmax"] or (serves(fam, alpha) and not needs_anchor(alpha) and alpha <= 2)


def _lean_config(n: int, fam: int) -> tuple[int, int]:
    """The lean forward's launch setting at width ``n``: (rows per program,
    warps) up to :data:`LEAN_MAX` entries, (block, warps) above, where a
    program loops over its row.

    The search is a chain of row reductions, so it wants few warps: one warp
    on tiles of :data:`LEAN_TILE` entries (8 a thread) while rows fit in one;
    a row alone, 16 entries a thread, and for sparsemax and entmax15 at most
    8 warps (32 a thread at 8192 entries, where 16 warps were slower); a
    row swept in blocks of :data:`LEAN_WIDE_BLOCK`
    entries, 16 a thread (4 where it fills a buffer of candidates).
    α-entmax was timed at α = 1.3 only, where (below
    :data:`LEAN_COMPACT_ALPHA`) it searches its whole row and fewer warps
    were slower: every α keeps tiles of :data:`TILE` entries, 8 a thread.
    Soft top-k "exp" takes a row of 1024 on one warp, where two were
    slower; sigmoid and laplace, not timed there, keep two.
    ``benchmarks/gpu/tune.py`` sweeps the alternatives (BENCHMARKS.md has
    the sweeps)."""
    if n > LEAN_MAX:
        return LEAN_WIDE_BLOCK, LEAN_WIDE_BLOCK // (128 if _lean_wide_compacts(fam) else 512)
    blk = _pow2(n)
    if fam == FAMILY_IDS["entmax"]:
        rpp = max(1, min(ROWS_MAX, TILE // blk))
        return rpp, max(1, min(16, rpp * blk // 256))
    if blk <= LEAN_TILE:
        return LEAN_TILE // blk, 1
    if fam == FAMILY_IDS["exp"] and blk == 1024:
        return 1, 1
    return 1, min(8 if fam in LEAN_SIMPLEX else 16, blk // 512)


def _lean_compacts(fam: int, alpha: float) -> bool:
    """Whether the lean forward of a row of at least :data:`LEAN_GROUP_MIN`
    entries searches a buffer of its candidates (α-entmax from
    :data:`LEAN_COMPACT_ALPHA`) rather than the whole row (sparsemax, entmax15,
    α-entmax below it)."""
    return fam == FAMILY_IDS["entmax"] and alpha >= LEAN_COMPACT_ALPHA


def _lean_wide_compacts(fam: int) -> bool:
    """Whether the lean forward of a row wider than :data:`LEAN_MAX` searches
    a buffer of the candidates its second read finds (two reads in all:
    α-entmax, whose sweeps take a power per entry) rather than sweeping the
    row, a read each step, then a read to write p (sparsemax and entmax15,
    whose sweeps took less time on a GPU than the buffer; BENCHMARKS.md has
    the sweep)."""
    return fam == FAMILY_IDS["entmax"]


def lean_searches_buffer(n: int, fam: int, alpha: float) -> bool:
    """Whether the lean forward of rows of ``n`` entries searches a buffer of
    candidates (:func:`_lean_wide_compacts` above :data:`LEAN_MAX`, else
    :func:`_lean_compacts` from :data:`LEAN_GROUP_MIN` entries) rather than
    its rows."""
    if n > LEAN_MAX:
        return _lean_wide_compacts(fam)
    return _pow2(n) >= LEAN_GROUP_MIN and _lean_compacts(fam, alpha)


def _candidates(r: int, slots: int, compact: bool, device) -> tuple[Tensor, Tensor]:
    """The lean forward's buffers of candidates: (values, columns), ``slots``
    per row; one-element placeholders where the kernel keeps none."""
    if not compact:
        return _placeholder(device, torch.float32), _placeholder(device)
    return (torch.empty((r, slots), dtype=torch.float32, device=device),
            torch.empty((r, slots), dtype=torch.int32, device=device))


def lean_forward_rows(rows: Tensor, fam: int, k: float, tau: float, alpha: float = 1.5, *,
                      return_passes: bool = False, rows_per_program: int | None = None, out: Tensor | None = None):
    """p for contiguous ``rows`` (r, n) through the lean forward (and with
    ``return_passes`` the search's sweeps per row, int32)."""
    out = _out(out, rows)
    r, n = rows.shape
    its = torch.zeros(r, dtype=torch.int32, device=rows.device) if return_passes else _placeholder(rows.device)
    if r:
        if n > LEAN_MAX:  # the lane maxima, then the candidates into a buffer (or sweeps of the row)
            block, warps = _lean_config(n, fam)
            compact = lean_searches_buffer(n, fam, alpha)
            slots = LEAN_WIDE_SLOTS if compact else 1
            sz, si = _candidates(r, slots, compact, rows.device)
            lean_wide_fwd_kernel[(r,)](
                rows, out, its, sz, si, r, n, float(k), 1.0 / tau, float(alpha) - 1.0, FAM=fam, BLOCK=block,
                C=slots, BIG=False, NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=return_passes, COMPACT=compact,
                num_warps=warps)
            return (out, its) if return_passes else out
        blk = _pow2(n)
        rpp, warps = _lean_config(n, fam)
        if rows_per_program is not None:
            rpp, warps = rows_per_program, max(1, min(16, rows_per_program * blk // 512))
        if rpp & (rpp - 1):
            raise ValueError(f"rows_per_program must be a power of two, got {rpp}")
        if fam in LEAN_TOPK:
            lean_topk_fwd_kernel[(cdiv(r, rpp),)](
                rows, out, its, r, n, float(k), 1.0 / tau, FAM=fam, ROWS=rpp, BLOCK=blk, LEAN_IT=LEAN_TOPK_IT,
                NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=return_passes, num_warps=warps)
            return (out, its) if return_passes else out
        grouped = blk >= LEAN_GROUP_MIN
        compact = lean_searches_buffer(n, fam, alpha)
        slots = LEAN_SLOTS if compact else 1
        sz, si = _candidates(r, slots, compact, rows.device)
        lean_fwd_kernel[(cdiv(r, rpp),)](
            rows, out, its, sz, si, r, n, float(k), 1.0 / tau, float(alpha) - 1.0,
            FAM=fam, ROWS=rpp, BLOCK=blk, COUNT=k > 1, COMPACT=compact, GROUP=LEAN_GROUP if grouped else 0, C=slots, MAXIT=MAXIT,
            WRITE_ITS=return_passes, num_warps=warps,
        )
    return (out, its) if return_passes else out
