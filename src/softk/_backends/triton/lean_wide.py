r"""The lean forward of sparsemax, entmax15 and α-entmax (1.125 ≤ α ≤ 2) on
rows too wide for registers: a read for a bound of λ, then a buffer of the
candidates (α-entmax: two reads and one write) or sweeps of the row
(sparsemax and entmax15: one sweep on normal rows, then the write).

One program per row, blocks of ``BLOCK`` entries:

1. the first read keeps, per lane, the maximum of the entries it reads
   (lane j: entries j, j + BLOCK, …); the row max is theirs;
2. the lane maxima are a subset of the row, so the root of g over them is a
   lower bound of λ (:func:`.lean._lean_search`, in registers, no memory);
3. the second read writes 0 for every entry at or below that bound (its p is
   0 whatever λ turns out to be) and appends the entries above it, the
   candidates, to the row's buffer of ``C`` slots, in row order (a prefix
   sum per block, and the count so far);
4. the search on the buffer, and p scattered from it to the candidates'
   columns.

A row whose candidates overflow the buffer, or that holds a NaN or +inf,
takes the general search and writes its whole row (:func:`.frame._solve`,
:func:`.passes._write_p`, reading it again), its 0s then rewritten by the
same lanes in program order.  So a row's result depends on its own entries
only.

Without ``COMPACT`` (the launcher's :func:`.function._lean_wide_compacts`
says which), steps 3–4 are sweeps of the row from the bound instead: each
step of the search one read, its blocks' sums added
(:func:`.lean._lean_sums`, :func:`.lean._lean_delta`), then one read to
write p, or the row conventions; no buffer, nothing to overflow.
``benchmarks/gpu/tune.py`` times both.
"""

import triton
import triton.language as tl

from .lean import EPS, _lean_advance, _lean_delta, _lean_search, _lean_sums, _lower_bound
from .family_math import _f
from .ids import ENTMAX, SPARSEMAX
from .frame import _solve
from .passes import _write_p
from .prelude import _cols, _load_x, _shift_scale


@triton.jit
def _swept_search(xr, rmask, n, ref, inv_tau, origin, lam, todo, k, am1,
                  FAM: tl.constexpr, BLOCK: tl.constexpr, MAXIT: tl.constexpr):
    """:func:`.lean._lean_search` on a row read in blocks, in the frame z −
    ``origin``: each step one read of the row, its blocks' sums added; λ
    ([1, 1], in that frame) from the lower bound ``lam`` where ``todo``, the
    reads it took, and −dΣp/dλ at the last step's λ (the support's size for
    sparsemax, Σu/2 over it for entmax15: how far λ's rounding moves Σp)."""
    it = tl.zeros(lam.shape, tl.int32)
    slope = tl.zeros(lam.shape, tl.float32)
    run = todo
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        s0 = tl.zeros(lam.shape, tl.float32)
        s1 = s0
        s2 = s0
        mn = tl.full(lam.shape, float("inf"), tl.float32)
        for start in range(0, n, BLOCK):
            z = _shift_scale(_load_x(xr, rmask, _cols(start, BLOCK), n), ref, inv_tau) - origin
            b0, b1, b2, bm = _lean_sums(z, lam, am1, FAM)
            s0 += b0
            s1 += b1
            s2 += b2
            mn = tl.minimum(mn, bm)
        d, exact = _lean_delta(s0, s1, s2, mn, lam, k, am1, FAM)
        slope = tl.where(run, s0 if FAM == SPARSEMAX else 0.5 * s1, slope)
        lam, run, it = _lean_advance(lam, d, exact, run, it, MAXIT)
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    return lam, it, slope


@triton.jit
def lean_wide_fwd_kernel(X, Y, ITS, SZ, SI, R, n, k, inv_tau, am1,
                         FAM: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr, BIG: tl.constexpr,
                         NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr, WRITE_ITS: tl.constexpr,
                         COMPACT: tl.constexpr = True):
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)[:, None]  # [1, 1]
    rmask = rows < R
    xr = X + rows * n
    yr = Y + rows * n

    # ---- first read: the lane maxima and the finite count (and without the
    # buffer, whose read sums z for it, the NaNs)
    lanes = tl.full([1, BLOCK], float("-inf"), tl.float32)
    fin = tl.zeros([1, BLOCK], tl.float32)
    nan = tl.zeros([1, BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        x = _load_x(xr, rmask, _cols(start, BLOCK), n)
        lanes = tl.maximum(lanes, x)
        fin += (x > float("-inf")).to(tl.float32)
        if not COMPACT:
            nan += (x != x).to(tl.float32)
    xmax = tl.max(lanes, 1, keep_dims=True)
    m = tl.sum(fin, 1, keep_dims=True)
    # z ≤ 0 for every finite entry in the frame of a finite max: Σz is NaN
    # exactly where the row holds a NaN
    ref = tl.where((xmax > float("-inf")) & (xmax < float("inf")), xmax, 0.0)
    active = (m > k) & (xmax < float("inf"))

    # ---- a lower bound of λ from the lane maxima (a few ulps lower: its rounding)
    lam0 = tl.zeros([1, 1], tl.float32) + _lower_bound(k, am1, FAM)
    lamg, _ = _lean_search(_shift_scale(lanes, ref, inv_tau), lam0, active, k, am1, FAM, MAXIT)
    lamg = lamg - 4.0 * EPS * tl.abs(lamg)

    if not COMPACT:
        # ---- without the buffer: the search sweeps the row from the bound,
        # a read each step, then one more read writes p (or the conventions)
        broken = (tl.sum(nan, 1, keep_dims=True) > 0) | (xmax == float("inf"))
        search = active & (~broken)
        # sparsemax and entmax15 search in the frame of the bound (λ − bound
        # is small, and so its rounding, which a wide support carries into Σp);
        # α-entmax's Newton stops on a step relative to λ: the frame of the max
        if FAM == ENTMAX:
            origin = tl.zeros_like(lamg)
            lam = lamg
        else:
            origin = lamg
            lam = tl.zeros_like(lamg)
        lam, it, slope = _swept_search(xr, rmask, n, ref, inv_tau, origin, lam, search, k, am1, FAM, BLOCK, MAXIT)
        if FAM != ENTMAX:
            # the bound can itself lie far below λ (near-equal rows: the
            # lanes' root about −1/BLOCK, λ about −1/n): every p is then a
            # difference of two terms of about |λ| in its frame, whose
            # roundings (alike on alike entries) add up over the support;
            # where −dΣp/dλ |λ| exceeds 2k (about 1 of EPS·k in Σp per half
            # ulp), one more search in the frame of λ (less its rounding),
            # usually a single read.  On normal rows the lanes' root is λ
            # to a few ulps, and none is taken.
            again = search & (slope * tl.abs(lam) > 2.0 * k)
            if tl.max(tl.max(again.to(tl.int32), 1), 0) > 0:
                o2 = origin + (lam - 4.0 * EPS * (tl.abs(origin) + tl.abs(lam)))
                lam2, it2, slope2 = _swept_search(xr, rmask, n, ref, inv_tau, o2, tl.zeros_like(lam), again, k, am1, FAM,
                                             BLOCK, MAXIT)
                origin = tl.where(again, o2, origin)
                lam = tl.where(again, lam2, lam)
                it += it2
        for start in range(0, n, BLOCK):
            cols = _cols(start, BLOCK)
            inb = rmask & (cols < n)
            x = tl.load(xr + cols, mask=inb, other=float("-inf")).to(tl.float32)
            p = _f((_shift_scale(x, ref, inv_tau) - origin) - lam, FAM, am1)
            p = tl.where(search, p, tl.where(broken, float("nan"), tl.where(x > float("-inf"), 1.0, 0.0)))
            tl.store(yr + cols, p.to(yr.dtype.element_ty), mask=inb)
    else:
        # ---- second read: 0 below the bound, the candidates into the buffer
        nc = tl.zeros([1, 1], tl.int32)
        sz = tl.zeros([1, BLOCK], tl.float32)
        base = rows * C - 1
        for start in range(0, n, BLOCK):
            cols = _cols(start, BLOCK)
            inb = rmask & (cols < n)
            x = tl.load(xr + cols, mask=inb, other=float("-inf")).to(tl.float32)
            z = _shift_scale(x, ref, inv_tau)
            sz += z
            cand = z > lamg
            ci = cand.to(tl.int32)
            slot = nc + tl.cumsum(ci, 1)
            keep = cand & (slot <= C)
            tl.store(SZ + base + slot, z, mask=keep)
            tl.store(SI + base + slot, cols + tl.zeros([1, 1], tl.int32), mask=keep)
            tl.store(yr + cols, tl.zeros([1, BLOCK], yr.dtype.element_ty), mask=inb & (~cand))
            nc += tl.sum(ci, 1, keep_dims=True)
        broken = (tl.sum(sz, 1, keep_dims=True) != tl.sum(sz, 1, keep_dims=True)) | (xmax == float("inf"))
        fits = active & (~broken) & (nc <= C)
        tl.debug_barrier()

        it = tl.zeros([1, 1], tl.int32)
        if tl.max(tl.max(fits.to(tl.int32), 1), 0) > 0:
            # ---- the search on the buffer, p scattered to the candidates' columns
            j = _cols(0, C)
            live = fits & (j < nc)
            zc = tl.load(SZ + rows * C + j, mask=live, other=float("-inf"))
            ic = tl.load(SI + rows * C + j, mask=live, other=0)
            lam, it = _lean_search(zc, lamg, fits, k, am1, FAM, MAXIT)
            tl.store(yr + ic, _f(zc - lam, FAM, am1).to(yr.dtype.element_ty), mask=live)
        else:
            # ---- a whole write: the general search where the buffer overflowed,
            # else the row conventions (NaN/+inf, at most k finite entries)
            search = active & (~broken)
            gref = ref
            c = tl.zeros([1, 1], tl.float32)
            t = c
            if tl.max(tl.max(search.to(tl.int32), 1), 0) > 0:
                xmin = tl.full([1, 1], float("inf"), tl.float32)
                for start in range(0, n, BLOCK):
                    x = _load_x(xr, rmask, _cols(start, BLOCK), n)
                    xmin = tl.minimum(xmin, tl.min(tl.where(x > float("-inf"), x, float("inf")), 1, keep_dims=True))
                gref, c, t, it = _solve(xr, rmask, 0.0, lanes, n, inv_tau, xmax, xmin, m, tl.zeros([1, 1], tl.float32),
                                        search, k, am1, FAM, 1, BLOCK, False, BIG, BIG, NEWTON_CAP, MAXIT)
            _write_p(xr, yr, rmask, 0.0, n, gref, inv_tau, c, t, am1, k, search, broken, FAM, BLOCK, False)
    if WRITE_ITS:
        tl.store(ITS + rows, it, mask=rmask)
