r"""The passes of the forward kernel over its rows after the first (which is
:func:`.prelude._row_stats`): one λ-search pass (the sums of
:mod:`.family_math` at the points the search asks for) and the last
(writing p).

A program holds ``ROWS`` rows: ``xr``/``yr`` are [ROWS, 1] columns of row
pointers and ``rmask`` says which of them exist (the last program may be
ragged); blocks are [ROWS, BLOCK] and every per-row result is a [ROWS, 1]
column, reduced along axis 1 only, so no row's result depends on its
neighbours.  Each pass has one per-block body, run either once on the
register copy of the raw rows (``ONCHIP``: the block is the whole row,
loaded by the first pass) or in a loop over blocks of ``BLOCK`` read from
memory (any width; the launcher uses ROWS = 1 there).  Every entry is read
through the prelude: z = (x − ref)/τ in the row's frame ``ref``
(:func:`.prelude._frame_z`).
"""

import triton
import triton.language as tl

from .ids import ENTMAX15, EXP
from .family_math import _acc, _f, _fin, _init, _red, _written
from .prelude import _cols, _frame_z, _lam_tol, _load_frame_z, _load_x


# --------------------------------------------------------- a search pass
@triton.jit
def _search_pass(xr, rmask, xrow, n, ref, inv_tau, c, t, qc, qt, cc, ct, k, am1, q,
                 FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                 PROBE: tl.constexpr):
    """One pass: (r, d, s1, s2, x) of ``_fin`` at λ = c + t and at the probe
    qc + qt (PROBE), and, for entmax15, the count of entries above the
    candidate cc + ct; per row, as [ROWS, 1] columns."""
    accX = _init(FAM, ROWS, BLOCK)
    accQ = accX
    cntC = tl.zeros([ROWS, BLOCK], tl.float32)
    if ONCHIP:  # reduce each point's sums at once: fewer live registers
        z = _frame_z(xrow, ref, inv_tau, FAM)
        accX = _red(_acc(z, c, t, am1, accX, FAM), FAM)
        accQ = accX
        if PROBE:
            accQ = _red(_acc(z, qc, qt, am1, _init(FAM, ROWS, BLOCK), FAM), FAM)
        if FAM == ENTMAX15:
            cntC = ((z > float("-inf")) & (((z - cc) - ct) > 0)).to(tl.float32)
    else:
        for start in range(0, n, BLOCK):
            z = _load_frame_z(xr, rmask, _cols(start, BLOCK), n, ref, inv_tau, FAM)
            accX = _acc(z, c, t, am1, accX, FAM)
            if PROBE:
                accQ = _acc(z, qc, qt, am1, accQ, FAM)
            if FAM == ENTMAX15:
                cntC += ((z > float("-inf")) & (((z - cc) - ct) > 0)).to(tl.float32)
        accX = _red(accX, FAM)
        accQ = _red(accQ, FAM)
    return _fin(accX, k, q, FAM), _fin(accQ, k, q, FAM), tl.sum(cntC, 1, keep_dims=True)


# -------------------------------------------------------------- last pass
@triton.jit
def _store_p(yr, rmask, cols, n, x, z, c, t, am1, active, broken, cut, FAM: tl.constexpr):
    # p = f(z − λ) on a searched row; on the others the row conventions:
    # NaN where the row holds a NaN or +inf, else 1 on the finite entries
    # (≤ k of them) and 0 on the masked ones.  Finite is read off the raw x:
    # a finite entry whose z overflows to −inf is still an entry of the row.
    # (cut: see _exp_cut)
    u = (z - c) - t
    p = tl.where(z > float("-inf"), _written(_f(u, FAM, am1), u, cut, yr, FAM), 0.0)
    filled = tl.where(broken, float("nan"), tl.where(x > float("-inf"), 1.0, 0.0))
    p = tl.where(active, p, filled)
    tl.store(yr + cols, p.to(yr.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def _exp_cut(z, c, t, k, tol):
    """For soft top-k exp on a row in registers: the u up to which entries
    are written unsaturated, below 1 (``_written``).  Fewer than k entries
    saturate on a row with more than k finite entries (the rest has mass),
    but where that mass is below the rounding of Σp, g(λ) = k in float32
    all along a flat of λ, and the search may stop on it below the k-th
    entry, saturating it with u well above 0: where k entries or more have
    u > tol, the lowest of them (ties at the k-th place) are the ones below
    the root, with p = 1 − tiny and slope 1.  Else ``tol``."""
    u = (z - c) - t
    sat = u > tol
    lo = tl.min(tl.where(sat, u, float("inf")), 1, keep_dims=True)
    return tl.where(tl.sum(sat.to(tl.float32), 1, keep_dims=True) >= k, lo, tol)


@triton.jit
def _write_p(xr, yr, rmask, xrow, n, ref, inv_tau, c, t, am1, k, active, broken,
             FAM: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr):
    """The last pass: p at λ = c + t ([ROWS, 1] columns) in the frame ``ref``.
    Soft top-k exp writes an entry within λ's resolution of the kink (the
    search's stopping tolerance, ``_lam_tol``) as unsaturated, below 1, and
    on a row in registers one that a flat of g left above λ (``_exp_cut``)."""
    tol = _lam_tol(c + t, FAM)
    if ONCHIP:
        z = _frame_z(xrow, ref, inv_tau, FAM)
        cut = tol
        if FAM == EXP:
            cut = _exp_cut(z, c, t, k, tol)
        _store_p(yr, rmask, _cols(0, BLOCK), n, xrow, z, c, t, am1, active, broken, cut, FAM)
    else:
        for start in range(0, n, BLOCK):
            cols = _cols(start, BLOCK)
            x = _load_x(xr, rmask, cols, n)
            _store_p(yr, rmask, cols, n, x, _frame_z(x, ref, inv_tau, FAM), c, t, am1, active, broken, tol, FAM)
