r"""The passes of the forward kernel over its rows: the first (max, min,
counts, logsumexp), one λ-search pass (the sums of :mod:`.family_math` at the
points the search asks for) and the last (writing p).

A program holds ``ROWS`` rows: ``xr``/``yr`` are [ROWS, 1] columns of row
pointers and ``rmask`` says which of them exist (the last program may be
ragged); blocks are [ROWS, BLOCK] and every per-row result is a [ROWS, 1]
column, reduced along axis 1 only, so no row's result depends on its
neighbours.  Each pass has one per-block body, run either once on the
register copy of the rows (``ONCHIP``: the block is the whole row, loaded by
the first pass) or in a loop over blocks of ``BLOCK`` read from memory (any
width; the launcher uses ROWS = 1 there).
"""

import triton
import triton.language as tl

from .family_math import _acc, _f, _fin, _init, _red, _rescale


@triton.jit
def _load_z(xr, rmask, cols, n, inv_tau):
    # z = x/τ in float32 whatever the input dtype; lanes past the row's end
    # (and rows past the last) read as −inf, which every pass treats as a
    # masked entry.
    return tl.load(xr + cols, mask=rmask & (cols < n), other=float("-inf")).to(tl.float32) * inv_tau


@triton.jit
def _cols(start, BLOCK: tl.constexpr):
    # the lane offsets of one block, as a [1, BLOCK] row (broadcast over rows)
    return start + tl.arange(0, BLOCK)[None, :]


# ----------------------------------------------------------------- pass 1
@triton.jit
def _stats_block(z, lseM, FAM: tl.constexpr):
    """One block of z: per lane, z where finite (−inf / +inf elsewhere, for
    the max and the min), finite and NaN/+inf indicators; for softmax and exp
    (which start from λ = lse(z) − log k) also the running max of the lse
    moved to this block, the factor for lane sums kept at the old max, and
    this block's terms e^{z − max}."""
    fin = z > float("-inf")
    a = tl.full((), 0.0, tl.float32)
    e = tl.zeros_like(z)
    if FAM == 0 or FAM == 4:
        lseM, a, Ms = _rescale(lseM, tl.max(tl.where(fin, z, float("-inf")), 1, keep_dims=True))
        e = tl.where(fin, tl.exp(z - Ms), 0.0)
    return (tl.where(fin, z, float("-inf")), tl.where(fin, z, float("inf")), fin.to(tl.float32),
            ((z != z) | (z == float("inf"))).to(tl.float32), lseM, a, e)


@triton.jit
def _row_stats(xr, rmask, n, inv_tau, FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
               ONCHIP: tl.constexpr):
    """Pass 1, per row ([ROWS, 1] each): (zrow, max z, min z over the finite
    entries, their count m, whether the row holds a NaN or +inf,
    Σ e^{z − max z}).  ``zrow`` is the register copy of the rows (ONCHIP),
    unused otherwise."""
    lseM = tl.full([ROWS, 1], float("-inf"), tl.float32)
    if ONCHIP:  # the row is one block: its lanes are the row's
        zrow = _load_z(xr, rmask, _cols(0, BLOCK), n, inv_tau)
        st = _stats_block(zrow, lseM, FAM)
        vlse = st[6]
    else:  # lanes merged block by block; the lse sums follow their running max
        zrow = 0.0
        st = (tl.full([ROWS, BLOCK], float("-inf"), tl.float32), tl.full([ROWS, BLOCK], float("inf"), tl.float32),
              tl.zeros([ROWS, BLOCK], tl.float32), tl.zeros([ROWS, BLOCK], tl.float32))
        vlse = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            b = _stats_block(_load_z(xr, rmask, _cols(start, BLOCK), n, inv_tau), lseM, FAM)
            st = (tl.maximum(st[0], b[0]), tl.minimum(st[1], b[1]), st[2] + b[2], st[3] + b[3])
            lseM = b[4]
            if FAM == 0 or FAM == 4:
                vlse = vlse * b[5] + b[6]
    # the lse sum is relative to its running max, which ends at max z
    return (zrow, tl.max(st[0], 1, keep_dims=True), tl.min(st[1], 1, keep_dims=True),
            tl.sum(st[2], 1, keep_dims=True), tl.sum(st[3], 1, keep_dims=True) > 0, tl.sum(vlse, 1, keep_dims=True))


# --------------------------------------------------------- a search pass
@triton.jit
def _search_pass(xr, rmask, zrow, n, inv_tau, c, t, qc, qt, cc, ct, k, alpha, q,
                 FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                 PROBE: tl.constexpr):
    """One pass: (r, d, s1, s2, x) of ``_fin`` at λ = c + t and at the probe
    qc + qt (PROBE), and, for entmax15, the count of entries above the
    candidate cc + ct; per row, as [ROWS, 1] columns."""
    accX = _init(FAM, ROWS, BLOCK)
    accQ = accX
    cntC = tl.zeros([ROWS, BLOCK], tl.float32)
    if ONCHIP:  # reduce each point's sums at once: fewer live registers
        accX = _red(_acc(zrow, c, t, alpha, accX, FAM), FAM)
        accQ = accX
        if PROBE:
            accQ = _red(_acc(zrow, qc, qt, alpha, _init(FAM, ROWS, BLOCK), FAM), FAM)
        if FAM == 2:
            cntC = ((zrow > float("-inf")) & (((zrow - cc) - ct) > 0)).to(tl.float32)
    else:
        for start in range(0, n, BLOCK):
            z = _load_z(xr, rmask, _cols(start, BLOCK), n, inv_tau)
            accX = _acc(z, c, t, alpha, accX, FAM)
            if PROBE:
                accQ = _acc(z, qc, qt, alpha, accQ, FAM)
            if FAM == 2:
                cntC += ((z > float("-inf")) & (((z - cc) - ct) > 0)).to(tl.float32)
        accX = _red(accX, FAM)
        accQ = _red(accQ, FAM)
    return _fin(accX, k, q, FAM), _fin(accQ, k, q, FAM), tl.sum(cntC, 1, keep_dims=True)


# -------------------------------------------------------------- last pass
@triton.jit
def _store_p(yr, rmask, cols, n, z, c, t, alpha, active, broken, FAM: tl.constexpr):
    # p = f(z − λ) on a searched row; on the others the row conventions:
    # NaN where the row holds a NaN or +inf, else 1 on the finite entries
    # (≤ k of them) and 0 on the masked ones.
    fin = z > float("-inf")
    p = tl.where(fin, _f((z - c) - t, FAM, alpha), 0.0)
    filled = tl.where(broken, float("nan"), tl.where(fin, 1.0, 0.0))
    p = tl.where(active, p, filled)
    tl.store(yr + cols, p.to(yr.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def _write_p(xr, yr, rmask, zrow, n, inv_tau, c, t, alpha, active, broken,
             FAM: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr):
    """The last pass: p at λ = c + t ([ROWS, 1] columns)."""
    if ONCHIP:
        _store_p(yr, rmask, _cols(0, BLOCK), n, zrow, c, t, alpha, active, broken, FAM)
    else:
        for start in range(0, n, BLOCK):
            cols = _cols(start, BLOCK)
            _store_p(yr, rmask, cols, n, _load_z(xr, rmask, cols, n, inv_tau), c, t, alpha, active, broken, FAM)
