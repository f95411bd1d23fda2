r"""Where each row's λ search runs: its frame z = (x − ref)/τ, its start, and
the search itself (:func:`_solve`, shared by the forward and the fused loss
kernels).

The frame.  A float entry near the threshold keeps its precision only if it
is read relative to a point near the threshold.  The torch backend takes the
row maximum for the k = 1 maps and the k-th largest entry for the top-k
families (:func:`softk.threshold.solve.lambda_reference`), both within
O(1 + log n) of λ in z units.  The kernels take:

* the row maximum for softmax, sparsemax, entmax15 and entmax α (λ lies
  within 1/(α − 1) of it), as the torch backend does;
* for the top-k families (exp, sigmoid, laplace, sparse) a point next to the
  threshold instead of the k-th largest entry, which a kernel cannot find
  without a selection: on the looped variant λ solved on the lane maxima
  (below); and on every variant, when λ still lies more than ``FAR`` = 8
  frame units from the reference (an outlier next to the top k, τ far below
  the spread, a k beyond the lane count), the row is searched once more in
  the frame moved to that λ, starting from it.  Either way λ ends within
  ``FAR`` of the reference, so the rounding of (x − ref)/τ near the threshold
  is at most 2·eps·(FAR + |u|), the torch backend's own model with W ≤ FAR.

The extreme rows.  That move is only as good as the first λ: the entries
near it were read ~|λ| frame units from the reference, each rounded by
eps·|λ|, so past ``LIM`` = 2^23 = FAR/(8 eps) units the moved frame would
miss the threshold by more than FAR (and where (x − ref)/τ overflows, as for
[1, 2, 3e37] at τ = 0.01, the first λ means nothing at all).  The first
search stops a row as soon as its bracket lies beyond ±LIM
(:func:`.search._find_lambda`), and such a row takes the torch route's
reference instead: its ⌊k⌋-th largest finite entry, found exactly by a
search on the float32 keys (:func:`_kth_largest`: one counting pass over
the row, or its register copy, per step, at three pivots, each step moving
the bracket ends onto entries; at most 16 passes, 1-7 on the rows tested,
none for ⌊k⌋ = 1).  The row is then searched once in that frame, with no
move: λ lies within O(1 + log n) of it, or where it does not (sigmoid and
laplace between far clusters) every p is 0 or 1 in float32 anyway.  Rows
within LIM run none of this (their p and pass count are unchanged); their
only extra work is the row-wise test.  In the frame of a top-k family a
finite entry far below reads as −FLT_MAX, far above as FLT_MAX
(:func:`.prelude._frame_z`): never as masked or broken.

The start (looped variant: rows wider than the on-chip limit, read from
memory once per pass).  The first pass keeps, per lane, the maximum of the
entries the lane reads (lane j: entries j, j + BLOCK, …).  Those lane maxima
are a subset of the row, so g_S(λ) = Σ_lanes f(z − λ) ≤ g(λ) and their root
λ_S is a lower bound of λ; it is found in registers (the on-chip search on
the [ROWS, BLOCK] lane array, no memory traffic) and gives the row search its
lower bracket end and first iterate (Newton from the left for sparsemax,
entmax15 and entmax α ≤ 2; the first point for sigmoid, laplace and sparse;
the lower end, under exp's iterate from above, for exp), and the top-k
families their frame.  For α-entmax outside [1.125, 2] the lanes also give
the anchor that the row's refinement starts from (:mod:`.anchor`).  The
lane sweeps are not counted as passes: they read no memory.
"""

import triton
import triton.language as tl

from .ids import EXP, SOFTMAX, SPARSE
from .prelude import EPS, _cols, _finite_or_zero, _frame_z, _load_x
from .search import _find_lambda

FAR = tl.constexpr(8.0)
# 2^23 = FAR/(8 eps): a λ this far from its frame is known to FAR units of
# z (its entries and λ itself are rounded relatively), which one move of
# the frame still resolves; beyond it the row takes its k-th largest entry
LIM = tl.constexpr(8388608.0)
IMAX = tl.constexpr(2147483647)
IMIN = tl.constexpr(-2147483648)


@triton.jit
def _frame_values(xmax, xmin, lseS, ref, inv_tau, active, FAM: tl.constexpr):
    # max z, min z and lse(z) of the rows in the frame ``ref`` (0 on rows
    # that are not searched, which keeps their brackets finite)
    zmax = tl.where(active, _frame_z(xmax, ref, inv_tau, FAM), 0.0)
    zmin = tl.where(active, _frame_z(xmin, ref, inv_tau, FAM), 0.0)
    lz = zmax + tl.log(tl.where(active & (lseS > 0), lseS, 1.0))
    return zmax, zmin, lz


@triton.jit
def _lane_start(xr, rmask, lanes, ref, inv_tau, active, k, am1,
                FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, BIG: tl.constexpr,
                PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr):
    """λ_S on the lane maxima (frame ``ref``, the row maximum), a lower bound
    of λ less a margin for its rounding (−inf where not solved), whether the
    lanes could be solved (more than k finite lanes), and λ_S = c + t."""
    zl = _frame_z(lanes, ref, inv_tau, FAM)
    fin = zl > float("-inf")
    ml = tl.sum(fin.to(tl.float32), 1, keep_dims=True)
    la = active & (ml > k)
    zmax = tl.where(la, tl.max(zl, 1, keep_dims=True), 0.0)
    zmin = tl.where(la, tl.min(tl.where(fin, zl, float("inf")), 1, keep_dims=True), 0.0)
    lz = tl.zeros_like(zmax)
    if FAM == EXP:
        lz = tl.log(tl.where(la, tl.sum(tl.exp(zl - zmax), 1, keep_dims=True), 1.0)) + zmax
    none = tl.full([ROWS, 1], float("-inf"), tl.float32)
    nan = tl.full([ROWS, 1], float("nan"), tl.float32)
    never = tl.full((), float("inf"), tl.float32)
    c, t, _ = _find_lambda(xr, rmask, lanes, BLOCK, ref, inv_tau, zmax, zmin, tl.where(la, ml, k + 1.0), lz, la,
                           k, am1, none, nan, never, FAM, ROWS, BLOCK, True, BIG, PROBE, NEWTON_CAP, MAXIT)
    lam = c + t
    return tl.where(la, lam - 16.0 * EPS * (tl.abs(lam) + 1.0), float("-inf")), la, c, t


@triton.jit
def _key(x):
    # a finite float32 as an int32 of the same order (−0 just below +0)
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b < 0, b ^ IMAX, b)


@triton.jit
def _count_ge(x, v):
    """Per row: how many finite x have a key ≥ v, the least such key and
    the greatest key below v (IMAX / IMIN where none)."""
    fin = (x > float("-inf")) & (x < float("inf"))
    kx = _key(x)
    ge = fin & (kx >= v)
    return (tl.sum(ge.to(tl.int32), 1, keep_dims=True), tl.min(tl.where(ge, kx, IMAX), 1, keep_dims=True),
            tl.max(tl.where(fin & (~ge), kx, IMIN), 1, keep_dims=True))


@triton.jit
def _merge(s, b):
    # the counts of two blocks of a row, as one
    return s[0] + b[0], tl.minimum(s[1], b[1]), tl.maximum(s[2], b[2])


@triton.jit
def _narrow(lo, hi, s, kk):
    # [lo, hi) from one pivot's count: onto its least key at or above it
    # (count ≥ ⌊k⌋; exactly ⌊k⌋: that key is the answer), or one past the
    # greatest key below it (count < ⌊k⌋)
    cnt = s[0]
    a = s[1].to(tl.int64)
    lo = tl.where(cnt >= kk, tl.maximum(lo, a), lo)
    hi = tl.where(cnt == kk, tl.minimum(hi, a + 1), tl.where(cnt < kk, tl.minimum(hi, s[2].to(tl.int64) + 1), hi))
    return lo, hi


@triton.jit
def _kth_largest(xr, rmask, xrow, n, xmax, xmin, k, sel,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr):
    """(the ⌊k⌋-th largest finite x, passes) of the rows ``sel`` (xmax on
    the others, 0 passes), by search on the keys of float32 (:func:`_key`).
    [lo, hi) holds the answer's key: count(≥ lo) ≥ ⌊k⌋ > count(≥ hi).  A
    pass over the raw row counts at the three quartiles of [lo, hi) and
    moves each end onto an entry (:func:`_narrow`), so the bracket shrinks
    at least fourfold and lands on the answer as soon as few entries are
    left near it: at most 16 passes, 4-7 on random rows of 300-16384 (none
    for ⌊k⌋ = 1: the maximum)."""
    kk = tl.maximum((tl.zeros([ROWS, 1], tl.float32) + k).to(tl.int32), 1)
    lo = tl.where(sel, _key(tl.where(kk == 1, xmax, xmin)), 0).to(tl.int64)  # ⌊k⌋ = 1: the maximum
    hi = tl.where(sel, _key(xmax).to(tl.int64) + 1, lo + 1)
    it = tl.zeros([ROWS, 1], tl.int32)
    run = (hi - lo) > 1
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        w = hi - lo
        v1 = (lo + (w >> 2)).to(tl.int32)
        v2 = (lo + (w >> 1)).to(tl.int32)
        v3 = (lo + ((3 * w) >> 2)).to(tl.int32)
        if ONCHIP:
            s1 = _count_ge(xrow, v1)
            s2 = _count_ge(xrow, v2)
            s3 = _count_ge(xrow, v3)
        else:
            x = _load_x(xr, rmask, _cols(0, BLOCK), n)
            s1 = _count_ge(x, v1)
            s2 = _count_ge(x, v2)
            s3 = _count_ge(x, v3)
            for start in range(BLOCK, n, BLOCK):
                x = _load_x(xr, rmask, _cols(start, BLOCK), n)
                s1 = _merge(s1, _count_ge(x, v1))
                s2 = _merge(s2, _count_ge(x, v2))
                s3 = _merge(s3, _count_ge(x, v3))
        it += run.to(tl.int32)
        lo1, hi1 = _narrow(lo, hi, s1, kk)
        lo1, hi1 = _narrow(lo1, hi1, s2, kk)
        lo1, hi1 = _narrow(lo1, hi1, s3, kk)
        lo = tl.where(run, lo1, lo)
        hi = tl.where(run, hi1, hi)
        run = (hi - lo) > 1
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    v = lo.to(tl.int32)
    v = tl.where(v < 0, v ^ IMAX, v).to(tl.float32, bitcast=True)
    return tl.where(sel, v, xmax), it


@triton.jit
def _solve(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, active, k, am1,
           FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
           BIG: tl.constexpr, PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr):
    """(ref, c, t, passes) per row: λ = c + t in the frame z = (x − ref)/τ.
    Rows not ``active`` get the row maximum (0 if none) as ref and λ = 0."""
    ref = _finite_or_zero(xmax)
    zmax, zmin, lz = _frame_values(xmax, xmin, lseS, ref, inv_tau, active, FAM)
    zero = tl.zeros([ROWS, 1], tl.float32)
    it = tl.zeros([ROWS, 1], tl.int32)
    if FAM == SOFTMAX:  # softmax: λ = lse(z) − log k, no search
        c = tl.where(active, lz, 0.0) - tl.log(k)
        t = zero
    else:
        hlo = tl.full([ROWS, 1], float("-inf"), tl.float32)
        hx0 = tl.full([ROWS, 1], float("nan"), tl.float32)
        if not ONCHIP:
            hlo, la, _, _ = _lane_start(xr, rmask, lanes, ref, inv_tau, active, k, am1, FAM, ROWS, BLOCK, BIG,
                                        PROBE, NEWTON_CAP, MAXIT)
            if FAM >= EXP:
                # the top-k families move their frame to the lanes' λ
                lam = hlo
                nref = tl.where(la, ref + lam / inv_tau, ref)
                hlo = tl.where(la, (lam - _frame_z(nref, ref, inv_tau, FAM)) - 16.0 * EPS * (tl.abs(lam) + 1.0),
                               hlo)
                ref = nref
                zmax, zmin, lz = _frame_values(xmax, xmin, lseS, ref, inv_tau, active, FAM)
                if FAM != EXP:  # exp keeps its iterate from above
                    hx0 = tl.where(la, hlo, hx0)
        c = zero
        t = zero
        todo = active
        stage = tl.full((), 0, tl.int32)
        more = tl.full((), 1, tl.int32)
        while more > 0:
            lim = tl.where(stage == 0, LIM, float("inf"))
            c2, t2, it2 = _find_lambda(xr, rmask, xrow, n, ref, inv_tau, zmax, zmin, m, lz, todo, k, am1, hlo, hx0,
                                       lim, FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT)
            c = tl.where(todo, c2, c)
            t = tl.where(todo, t2, t)
            it += it2
            far = todo & (zero > 1.0)  # none, for the k = 1 maps
            if FAM >= EXP:
                lam = c + t
                # beyond LIM: the row's frame becomes its k-th largest entry
                sel = todo & (stage == 0) & (tl.abs(lam) > LIM)
                far = todo & (stage == 0) & (tl.abs(lam) > FAR) & (~sel)
                # else once more in the frame moved to λ, from λ (exp: from
                # just above it, its iterates come from above)
                nref = tl.where(far, ref + lam / inv_tau, ref)
                x0 = lam - _frame_z(nref, ref, inv_tau, FAM)
                if FAM == EXP:
                    x0 += 32.0 * EPS * (tl.abs(lam) + 1.0)
                kth, its = _kth_largest(xr, rmask, xrow, n, xmax, xmin, k, sel, ROWS, BLOCK, ONCHIP)
                it += its
                ref = tl.where(sel, kth, nref)
                # searched from the entry (exp: from log m + 1 above it,
                # where g ≤ ⌊k⌋ − 1 + 1/e: its iterates come from above)
                if FAM == EXP:
                    x0 = tl.where(sel, tl.log(m) + 1.0, x0)
                else:
                    x0 = tl.where(sel, 0.0, x0)
                far = far | sel
                hx0 = tl.where(far, x0, hx0)
                hlo = tl.where(far, float("-inf"), hlo)
                if FAM == SPARSE:
                    # in the frame of the ⌈k⌉-th largest entry the clipped map's λ
                    # lies in [−1, 0] (at −1 those ⌈k⌉ entries saturate, at 0 at most
                    # ⌈k⌉ − 1 count); without the lower end the bracket reached the
                    # row's far entries (±1e20), which bisection does not cross in MAXIT
                    hlo = tl.where(sel, -1.0 - 4.0 * EPS, hlo)
                zmax, zmin, lz = _frame_values(xmax, xmin, lseS, ref, inv_tau, active, FAM)
            todo = far
            stage += 1
            more = tl.max(tl.max(far.to(tl.int32), 1), 0)
    return ref, c, t, it
