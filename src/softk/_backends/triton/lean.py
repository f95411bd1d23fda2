r"""The lean forward of the simplex maps whose f vanishes below 0: sparsemax,
entmax15 and α-entmax for 1.125 ≤ α ≤ 2, on rows held in registers.

p = f(z − λ) with Σp = k, z = (x − max x)/τ.  Only the entries above a lower
bound of λ can carry mass, and λ is a function of those few; so the row is
read once, and the λ search runs on as few entries as the row allows:

1. one read: the row max, the finite count and the NaN/+inf flag; z once.
2. wider rows (``GROUP`` > 0): the maxima of groups of ``GROUP`` neighbours
   are a subset of the row, and the root of g over a subset is a lower bound
   of λ (g only loses terms), a closer start than max z − f⁻¹(k).
   Sparsemax and entmax15 then search and write in the frame of that bound
   (z less the bound: λ less it is small, and so its rounding, which every
   entry of a wide support would carry into Σp).  With ``COMPACT``, the
   entries above it, the *candidates*, are written to a per-row buffer of
   ``C`` slots in row order (a prefix sum gives each its slot), and the
   search runs on that buffer.  A row with more than ``C`` candidates searches its whole row
   instead (per row: its neighbours keep their buffers).  The launcher asks
   for the buffer for α-entmax from α = 1.5 only: on a GPU, sparsemax's and
   entmax15's sweeps over the row in registers cost less than the buffer's
   prefix count, round trip through memory and scattered write.
3. the search (:func:`_lean_search`), from a lower bound, each step one
   sweep over its entries, every evaluated point below or at λ:

   * sparsemax: Michelot's step λ ← λ + (Σ_S u − k)/|S| on the support S of
     the current λ (u = z − λ), exact once every entry of S stays above the
     new λ (the minimum of u over S, taken in the same sweep, says so);
   * entmax15: the closed form on S (the smaller root of Σ_S (u − δ)² = 4k),
     exact under the same test, else a Newton step on √g (convex, from the
     left: never overshoots);
   * α-entmax: Newton on g^(α−1), convex and nearly linear on a fixed
     support, from the left, until the step is a few ulps of λ.

4. one write: zeros below the candidates' bound, f(z − λ) on the candidates
   (scattered from the buffer to their columns), or the row conventions
   (NaN on a row with a NaN or +inf, 1 on the finite entries of a row with at
   most k of them).

Every per-row quantity is a [ROWS, 1] column and every reduction runs along
the row, so a row's result does not depend on the rows sharing its program.
Rows wider than the launcher's limit take :mod:`.lean_wide` (a read for a
bound, then sweeps or a buffer of candidates); the
general kernel (:mod:`.kernels`) keeps the other families and α outside
[1.125, 2].
"""

import triton
import triton.language as tl

from .family_math import _f
from .ids import ENTMAX, ENTMAX15, SPARSEMAX
from .prelude import EPS, _cols, _shift_scale


@triton.jit
def _lower_bound(k, am1, FAM: tl.constexpr):
    # λ ≥ max z − f⁻¹(k): the row's largest entry alone carries k there (max z = 0)
    if FAM == SPARSEMAX:
        lo = -k
    elif FAM == ENTMAX15:
        lo = -2.0 * tl.sqrt(k)
    else:
        lo = -tl.exp(am1 * tl.log(k)) / am1
    return lo


@triton.jit
def _lean_sums(z, lam, am1, FAM: tl.constexpr):
    """The sums one sweep at λ ([ROWS, 1]) takes over the entries z ([ROWS,
    W], −inf for none), each a [ROWS, 1] column: (g, −g′, 0, 0) for
    α-entmax; for sparsemax and entmax15 the support's size, Σ u, Σ u²
    (entmax15; else 0) and min u over it (u = z − λ).  A row swept in blocks
    adds the blocks' sums (and takes the least of their minima)."""
    u = z - lam
    pos = u > 0
    if FAM == ENTMAX:
        y = am1 * u
        ys = tl.where(pos, y, 1.0)
        fy = tl.where(pos, tl.exp(tl.log(ys) / am1), 0.0)
        s0 = tl.sum(fy, 1, keep_dims=True)
        s1 = tl.sum(fy / ys, 1, keep_dims=True)  # −g′
        s2 = tl.zeros_like(s0)
        mn = s2
    else:
        w = tl.where(pos, u, 0.0)
        s0 = tl.sum(pos.to(tl.float32), 1, keep_dims=True)
        s1 = tl.sum(w, 1, keep_dims=True)
        if FAM == ENTMAX15:
            s2 = tl.sum(w * w, 1, keep_dims=True)
        else:
            s2 = tl.zeros_like(s1)
        mn = tl.min(tl.where(pos, u, float("inf")), 1, keep_dims=True)
    return s0, s1, s2, mn


@triton.jit
def _lean_delta(s0, s1, s2, mn, lam, k, am1, FAM: tl.constexpr):
    """From one sweep's sums (:func:`_lean_sums`) at λ: the step δ to the next
    point and whether λ + δ is λ itself."""
    if FAM == ENTMAX:
        g = s0
        gd = s1
        # Newton on h = g^(α−1) − k^(α−1): δ = h g^(1−(α−1)) / ((α−1)(−g′))
        lg = tl.log(g)
        h = tl.exp(am1 * lg) - tl.exp(am1 * tl.log(k))
        d = h * tl.exp(lg - am1 * lg) / (am1 * gd)
        # from the left on a convex h every exact step is ≥ 0: one below 0 is
        # the sums' rounding, λ as close as they resolve (a step of a few ulps
        # of λ there can stay above 4 ulps when λ is small, all the way to MAXIT)
        exact = (tl.abs(d) <= 4.0 * EPS * tl.abs(lam)) | (d <= 0.0)
    else:
        cnt = s0
        w1 = s1
        # the closed form on the support S of λ is exact where S stays the
        # support at λ + δ: where min_S u ≥ δ (f(0) = 0, so an entry landing on
        # λ + δ changes nothing)
        if FAM == SPARSEMAX:
            d = (w1 - k) / cnt
            exact = mn >= d
        else:
            w2 = s2
            r = w2 - 4.0 * k
            # the smaller root of cnt δ² − 2 w1 δ + r = 0, without cancellation
            # in the root, but the discriminant D = w1² − cnt·r = cnt (4k − Σ(u − ū)²)
            # is a difference of terms of size w1²: far below λ on a wide
            # support (u near 2 on near-equal rows, √D near 2√cnt) it keeps
            # few digits.  Its rounding moves δ by about EPS δ w1 / (2√D),
            # and the support's own scale at the root is √D / cnt: a step
            # that is not within 4 EPS of that is taken, not trusted, and the
            # next sweep's, from next to λ, where D ≈ w1², ends the search.
            D = tl.maximum(w1 * w1 - cnt * r, 0.0)
            dc = r / (w1 + tl.sqrt(D))
            rg = tl.sqrt(0.25 * w2)
            dn = 4.0 * (rg - tl.sqrt(k)) * rg / w1
            on = mn >= dc
            d = tl.where(on, dc, dn)
            exact = on & (tl.abs(dc) * w1 * cnt <= 8.0 * D)
    return d, exact


@triton.jit
def _lean_step(z, lam, k, am1, FAM: tl.constexpr):
    """One sweep at λ ([ROWS, 1]) over the entries z ([ROWS, W], −inf for
    none): the step δ to the next point and whether λ + δ is λ itself."""
    s0, s1, s2, mn = _lean_sums(z, lam, am1, FAM)
    return _lean_delta(s0, s1, s2, mn, lam, k, am1, FAM)


@triton.jit
def _lean_search(z, lam, todo, k, am1, FAM: tl.constexpr, MAXIT: tl.constexpr):
    """λ ([ROWS, 1]) from the lower bound ``lam`` for the rows ``todo``, and
    the sweeps each took; the other rows keep ``lam`` and count 0."""
    it = tl.zeros(lam.shape, tl.int32)
    run = todo
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        d, exact = _lean_step(z, lam, k, am1, FAM)
        lam, run, it = _lean_advance(lam, d, exact, run, it, MAXIT)
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    return lam, it


@triton.jit
def _lean_advance(lam, d, exact, run, it, MAXIT: tl.constexpr):
    """One step of the search on the rows ``run``: λ + δ where the step is
    finite, the sweep counted, and which rows go on (not exact, still moving,
    under ``MAXIT`` sweeps)."""
    it += run.to(tl.int32)
    new = lam + d
    ok = tl.abs(d) < float("inf")
    moved = new != lam
    lam = tl.where(run & ok, new, lam)
    run = run & ok & moved & (~exact) & (it < MAXIT)
    return lam, run, it


@triton.jit
def _store_row(yr, cols, inb, z, x, lam, am1, active, broken, FAM: tl.constexpr, ROWS: tl.constexpr):
    """The write of a whole row: p on the searched rows; on the others NaN
    (a NaN or +inf in the row), or 1 on the finite entries of a row with at
    most k of them (the row conventions).  A program of searched rows only
    (the common case) skips the conventions' arithmetic."""
    p = _f(z - lam, FAM, am1)
    if tl.min(tl.min(active.to(tl.int32), 1), 0) == 0:
        filled = tl.where(broken, float("nan"), tl.where(x > float("-inf"), 1.0, 0.0))
        p = tl.where(active, p, filled)
    tl.store(yr + cols, p.to(yr.dtype.element_ty), mask=inb)


@triton.jit
def lean_fwd_kernel(X, Y, ITS, SZ, SI, R, n, k, inv_tau, am1,
                    FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, COUNT: tl.constexpr,
                    COMPACT: tl.constexpr, GROUP: tl.constexpr, C: tl.constexpr, MAXIT: tl.constexpr,
                    WRITE_ITS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    cols = _cols(0, BLOCK)
    inb = rmask & (cols < n)

    # ---- the one read: the max, z in its frame (x − max ≤ 0: no overflow to
    # +inf), a NaN or +inf in the row (a max of +inf, or a NaN in Σz: with a
    # finite max every other z is finite and ≤ 0, or −inf), and with COUNT (k > 1) the finite
    # count, for the rows of at most k finite entries (with k ≤ 1 the search
    # itself gives them p = 1, or 0 on a row with none)
    x = tl.load(X + rows * n + cols, mask=inb, other=float("-inf")).to(tl.float32)
    xmax = tl.max(x, 1, keep_dims=True)
    ref = tl.where((xmax > float("-inf")) & (xmax < float("inf")), xmax, 0.0)
    z = _shift_scale(x, ref, inv_tau)
    sz = tl.sum(z, 1, keep_dims=True)
    broken = (sz != sz) | (xmax == float("inf"))
    active = ~broken
    if COUNT:
        active = active & (tl.sum((x > float("-inf")).to(tl.float32), 1, keep_dims=True) > k)
    lam0 = tl.zeros([ROWS, 1], tl.float32) + _lower_bound(k, am1, FAM)

    yr = Y + rows * n
    if GROUP > 0:
        # a lower bound from the group maxima (a few ulps lower: its rounding)
        zg = tl.max(tl.reshape(z, [ROWS, BLOCK // GROUP, GROUP]), 2)
        lam0, _ = _lean_search(zg, lam0, active, k, am1, FAM, MAXIT)
        lam0 = lam0 - 4.0 * EPS * tl.abs(lam0)
        if FAM != ENTMAX:
            # search and write in the frame of that bound: λ − bound is small,
            # so its rounding is far below λ's in the frame of the max, which
            # every entry of a wide support would carry into Σp (their tests
            # of exactness read the support, not λ's size: any frame serves)
            z = z - lam0
            lam0 = tl.zeros_like(lam0)
    if COMPACT:
        # the candidates: the entries above the bound
        lamg = lam0
        cand = z > lamg
        ci = cand.to(tl.int32)
        nc = tl.sum(ci, 1, keep_dims=True)
        fits = active & (nc <= C)
        # each candidate's slot in its row's buffer: the prefix count, in row order
        slot = tl.cumsum(ci, 1)
        keep = cand & fits
        base = rows * C - 1
        tl.store(SZ + base + slot, z, mask=keep)
        tl.store(SI + base + slot, tl.broadcast_to(cols, [ROWS, BLOCK]), mask=keep)
        tl.debug_barrier()
        j = _cols(0, C)
        live = fits & (j < nc)
        zc = tl.load(SZ + rows * C + j, mask=live, other=float("-inf"))
        ic = tl.load(SI + rows * C + j, mask=live, other=0)
        lam, it = _lean_search(zc, lamg, fits, k, am1, FAM, MAXIT)
        # the write: each entry once, the candidates from the buffer
        if tl.min(tl.min((fits | (~rmask)).to(tl.int32), 1), 0) > 0:
            tl.store(yr + cols, tl.zeros([ROWS, BLOCK], yr.dtype.element_ty), mask=inb & (~cand))
        else:  # some row has more candidates than slots: it searches and writes its whole row
            over = active & (~fits)
            lamf, itf = _lean_search(z, lamg, over, k, am1, FAM, MAXIT)
            lam = tl.where(over, lamf, lam)
            it = tl.where(over, itf, it)
            _store_row(yr, cols, inb & (~keep), z, x, lam, am1, active, broken, FAM, ROWS)
        tl.store(yr + ic, _f(zc - lam, FAM, am1).to(yr.dtype.element_ty), mask=live)
    else:
        lam, it = _lean_search(z, lam0, active, k, am1, FAM, MAXIT)
        _store_row(yr, cols, inb, z, x, lam, am1, active, broken, FAM, ROWS)
    if WRITE_ITS:
        tl.store(ITS + rows, it, mask=rmask)
