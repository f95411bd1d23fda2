r"""α-entmax p to float32 precision for α outside [1.125, 2], from a λ known
only to its float resolution: the anchor form of
:mod:`softk.threshold.entmax_anchor`, in the kernels.

With a = α − 1, β = 1/a and w_i = a(z_i − λ): p_i = (w_i)_+^β, Σp = 1.  For
large α an entry with p = 0.03 at α = 5 has w = p⁴ ≈ 1e-6, so z_i − λ would
have to be resolved far below ulp(z_i); for α → 1 the rounding of w is
multiplied by β.  Instead the unknown is ℓ = log p_j of an anchor entry j
(the smallest entry of the support; the row maximum for α − 1 < 1/8,
:func:`_solve_near_one`, as on the torch backend): w_j = e^{aℓ}, w_i = w_j + a·d_i with
d_i = z_i − z_j, and

.. math::  \log p_i = \ell + \beta\,\mathrm{softplus}(\log(a d_i) - a\ell)
           \quad (d_i > 0), \qquad \log p_i = \ell \quad (d_i = 0),

log1p(−e^{log(a|d_i|) − aℓ}) for d_i < 0 (−inf once that is ≥ 1), and
β·log(w_j + a d_i) where that rounds less (the same rules as the torch
backend's ``_log_terms``).  G(ℓ) = Σ p_i is increasing; Newton on it runs
inside [lo, 0] (p_j = 1 gives G ≥ 1), bisecting when a step leaves it.

The anchor: first the largest entry at or below the search's λ (one pass);
while even p_j → 0 leaves G ≥ 1 (G₀ = Σ_{d>0} (a d)^β ≥ 1) it is not in the
support and the next entry up is taken, in the same pass as a Newton step.
Each pass (the candidate's, each Newton step or move) is one more read of
the row, counted in the kernel's passes.  The looped variant first solves
its lane maxima (a subset of the row, held in registers: no read of the
row) to the end, the λ search and then this anchor on them, and starts the
row's Newton from that anchor and ℓ, with neither the row's search nor the
candidate pass: on a row whose support lies on distinct lanes its first
pass finds G = 1.  The lanes' ℓ is at or above the row's (more entries,
more mass), so an entry of the row's support below that anchor would be
inside at the lanes' ℓ; where the first pass sees none and the anchor is
in the support, it is the support's smallest entry, as the search would
have found; where it sees some, the smallest of them becomes the anchor.
An anchor out of the support (the lanes' own, where the row holds more
mass above it than the lanes do, or the one moved down to) moves up as
above; a row whose anchor would move more than twice in all, or whose
lanes' support is too wide to lie on distinct lanes (α near 1), is searched
and refined as above.

Every quantity is a difference of nearby entries, a log or a softplus, so p
keeps its relative precision whatever its w; a·ℓ and log(a d) stay finite
for any float32 α (the launcher sends α above 1e30 elsewhere, see
:func:`.function.serves`).
"""

import triton
import triton.language as tl

from .family_math import _log1p
from .frame import _lane_start, _solve
from .prelude import EPS, _cols, _finite_or_zero, _load_x, _load_z, _scaled

TINY = tl.constexpr(1.1754943508222875e-38)  # the smallest normal float32
TRIAL_MOVES = tl.constexpr(2)  # anchor moves allowed from the lanes' anchor


@triton.jit
def _log_terms(d, ell, a, beta, log_a):
    """(log p_i, d log p_i / dℓ) for anchor offsets d at anchor log-prob ℓ."""
    pos = d > 0
    neg = d < 0
    absd = tl.where(pos | neg, tl.abs(d), 1.0)
    L = log_a + tl.log(absd) - a * ell  # log(a|d|/w_j)
    up = beta * (tl.maximum(L, 0.0) + _log1p(tl.exp(-tl.abs(L))))  # β softplus(L)
    # the direct β·log(w_j + a d_i) where it rounds less: eps·(β + |log p_i|)
    # against eps·(|ℓ| + β·softplus) (entries far above a small anchor)
    wj = tl.exp(a * ell)
    direct = pos & (wj >= TINY)
    logw = tl.log(tl.where(direct, wj + a * tl.where(direct, d, 0.0), 1.0))
    better = direct & (beta + tl.abs(beta * logw) < tl.abs(ell) + up)
    up = tl.where(better, beta * logw - ell, up)
    y = tl.exp(tl.minimum(L, 0.0))
    inside = neg & (L < 0)
    yi = tl.where(inside, y, 0.0)
    down = beta * _log1p(-yi)
    logp = ell + tl.where(pos, up, tl.where(inside, down, 0.0))
    logp = tl.where(neg & (~inside), float("-inf"), logp)
    slope = tl.where(pos, 1.0 / (1.0 + tl.exp(tl.minimum(L, 80.0))), tl.where(inside, 1.0 / (1.0 - yi), 1.0))
    return logp, tl.where(logp > float("-inf"), slope, 0.0)


@triton.jit
def _anchor_p(z, A, ell, a, beta, log_a):
    # p of every entry given the anchor entry A and its log-probability ℓ
    logp, _ = _log_terms(z - A, ell, a, beta, log_a)
    return tl.exp(logp)


@triton.jit
def _candidate_block(z, c, t):
    # per lane: the largest z at or below λ = c + t, and the smallest z
    fin = z > float("-inf")
    below = fin & (((z - c) - t) <= 0)
    return tl.where(below, z, float("-inf")), tl.where(fin, z, float("inf"))


@triton.jit
def _newton_block(z, A, ell, a, beta, log_a):
    # per lane: G, G', G₀ (Σ over d > 0 of (a d)^β), the next entry above
    # A, the count of entries in the support, and the smallest entry below
    # A that is in it
    d = z - A
    logp, slope = _log_terms(d, ell, a, beta, log_a)
    p = tl.exp(logp)
    pos = d > 0
    inside = logp > float("-inf")
    g0 = tl.where(pos, tl.exp(beta * (log_a + tl.log(tl.where(pos, d, 1.0)))), 0.0)
    return (p, p * slope, g0, tl.where(pos, z, float("inf")), inside.to(tl.float32),
            tl.where(inside & (d < 0), z, float("inf")))


@triton.jit
def _rsum(v):
    return tl.sum(v, 1, keep_dims=True)


@triton.jit
def _first_ell(A, c, t, a, beta):
    # ℓ from the search's λ: p_j = (a (A − λ))^β, −1 where that is 0
    w = tl.maximum(a * ((A - c) - t), 0.0)
    ell = tl.where(w > 0, beta * tl.log(tl.where(w > 0, w, 1.0)), -1.0)
    return tl.minimum(ell, 0.0)


@triton.jit
def _anchor_refine(xr, rmask, xrow, n, ref, inv_tau, c, t, am1, active, A0, ell0, given,
                   ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr, MAXIT: tl.constexpr):
    """(A, ℓ, passes, failed, support count) per row: the anchor entry (a
    frame value) and its log-probability, from the search's λ = c + t (frame
    ``ref``).

    Rows ``given`` start from the anchor A0 at ℓ0 instead (no candidate
    pass), which must be the solution on a subset of the row (the lane
    maxima); where support entries lie below A0 such a row moves its anchor
    down to them, and where its anchor is out of the support up, as any
    row; after ``TRIAL_MOVES`` moves it stops and is ``failed``, for the
    caller to search (below)."""
    a = am1
    beta = 1.0 / a
    log_a = tl.log(a)
    # ---- the candidate: the largest entry at or below λ (the smallest if none)
    cand = active & (~given)
    below = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
    low = tl.full([ROWS, BLOCK], float("inf"), tl.float32)
    if tl.max(tl.max(cand.to(tl.int32), 1), 0) > 0:  # no read of the row when every row is given
        if ONCHIP:
            below, low = _candidate_block(_scaled(xrow, ref, inv_tau), c, t)
        else:
            for start in range(0, n, BLOCK):
                b0, b1 = _candidate_block(_load_z(xr, rmask, _cols(start, BLOCK), n, ref, inv_tau), c, t)
                below = tl.maximum(below, b0)
                low = tl.minimum(low, b1)
    A = tl.max(below, 1, keep_dims=True)
    A = tl.where(A > float("-inf"), A, tl.min(low, 1, keep_dims=True))
    A = tl.where(active, tl.where(given, A0, A), 0.0)
    it = tl.where(cand, 1, 0)
    ell = tl.where(given, ell0, _first_ell(A, c, t, a, beta))
    lo = tl.full([ROWS, 1], float("-inf"), tl.float32)
    hi = tl.zeros([ROWS, 1], tl.float32)
    failed = tl.zeros([ROWS, 1], tl.int32)
    moves = tl.zeros([ROWS, 1], tl.int32)
    cnt = tl.zeros([ROWS, 1], tl.float32)
    done = tl.where(active, 0, 1)
    run = (done == 0) & (it < MAXIT)
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        # ---- one pass: G, G', G₀, the next entry up, the support count,
        # the smallest support entry below the anchor
        if ONCHIP:
            acc = _newton_block(_scaled(xrow, ref, inv_tau), A, ell, a, beta, log_a)
        else:
            acc = (tl.zeros([ROWS, BLOCK], tl.float32), tl.zeros([ROWS, BLOCK], tl.float32),
                   tl.zeros([ROWS, BLOCK], tl.float32), tl.full([ROWS, BLOCK], float("inf"), tl.float32),
                   tl.zeros([ROWS, BLOCK], tl.float32), tl.full([ROWS, BLOCK], float("inf"), tl.float32))
            for start in range(0, n, BLOCK):
                s = _newton_block(_load_z(xr, rmask, _cols(start, BLOCK), n, ref, inv_tau), A, ell, a, beta, log_a)
                acc = (acc[0] + s[0], acc[1] + s[1], acc[2] + s[2], tl.minimum(acc[3], s[3]), acc[4] + s[4],
                       tl.minimum(acc[5], s[5]))
        G = _rsum(acc[0])
        dG = _rsum(acc[1])
        G0 = _rsum(acc[2])
        nxt = tl.min(acc[3], 1, keep_dims=True)
        cnt = tl.where(run, _rsum(acc[4]), cnt)
        bot = tl.min(acc[5], 1, keep_dims=True)
        it += run.to(tl.int32)
        # the anchor is out of the support: move it up, restart ℓ there.
        # A given row's first pass also checks for support entries below
        # A0: ℓ0 lies at or above the row's root (A0 and ℓ0 solve a subset
        # of the row), so an entry in the support at the root is inside at
        # ℓ0; none there means A0 is the smallest support entry.  Else the
        # smallest entry inside becomes the anchor (the support's smallest
        # entry, or one below it, which moves up as any anchor does), its ℓ
        # from this pass: an anchor above support entries cannot resolve
        # them (log1p of a difference far below an ulp of w_j).  A given
        # row moves its anchor at most TRIAL_MOVES times, down or up: where
        # the lanes are that far off, it stops, failed, for the caller to
        # search (a move costs a pass; the search's anchor is off by
        # rounding only).
        out = (G0 >= 1.0) & (nxt < float("inf"))
        lower = given & (~out) & (it == 1) & (bot < float("inf"))
        fail = given & out & (moves >= TRIAL_MOVES)
        out = out & (~fail)
        # Newton on G(ℓ) = 1 inside [lo, hi], bisection (or halving towards
        # −∞ while no lower end is known) where a step leaves it
        hi = tl.where(G >= 1.0, tl.minimum(hi, ell), hi)
        lo = tl.where(G < 1.0, tl.maximum(lo, ell), lo)
        step = (G - 1.0) / tl.where(dG > 0, dG, 1.0)
        new = ell - step
        ok = (dG > 0) & (new > lo) & (new < hi)
        new = tl.where(ok, new, tl.where(lo > float("-inf"), 0.5 * (lo + hi), 2.0 * hi - 1.0))
        exact = tl.abs(G - 1.0) <= EPS
        # ℓ at its resolution: a Newton step (before the safeguard) or a
        # bracket of a few ulps of ℓ moves each p by that much relatively
        # (d log p/dℓ ≤ 1), whatever G's own rounding, which keeps a float32
        # Newton stepping around the root
        res = 4.0 * EPS * tl.maximum(tl.abs(ell), 1.0)
        short = (dG > 0) & (tl.abs(step) <= res)
        settled = short | ((hi - lo) <= res) | \
            ((tl.abs(G - 1.0) <= 2.0 * tl.maximum(cnt, 1.0) * EPS) & (dG > 0) & (tl.abs(step) <= 16.0 * res))
        stop = (~out) & (~fail) & (~lower) & (exact | (new == ell) | settled)
        new = tl.where(exact | short, ell - step, new)
        # ℓ at the new anchor from this pass's Newton point where that
        # leaves it inside, else from ℓ0
        ell_bot, _ = _log_terms(bot - A, new, a, beta, log_a)
        ell_b0, _ = _log_terms(bot - A, ell, a, beta, log_a)
        ell_bot = tl.where(ell_bot > float("-inf"), ell_bot, ell_b0)
        An = tl.where(out, nxt, tl.where(lower, bot, A))
        ell_out = _first_ell(An, c, t, a, beta)
        ell = tl.where(run, tl.where(out, ell_out, tl.where(lower, ell_bot, new)), ell)
        lo = tl.where(run & (out | lower), float("-inf"), lo)
        hi = tl.where(run & (out | lower), 0.0, hi)
        A = tl.where(run, An, A)
        moves = tl.where(run & (out | lower), moves + 1, moves)
        failed = tl.where(run & fail, 1, failed)
        done = tl.where(run & (stop | fail), 1, done)
        run = (done == 0) & (it < MAXIT)
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    return A, ell, it, failed, cnt


@triton.jit
def _near_block(z, ell, a, beta, log_a):
    # per lane: G and G' at the row maximum's log-probability ℓ (d = z ≤ 0)
    logp, slope = _log_terms(z, ell, a, beta, log_a)
    p = tl.exp(logp)
    return p, p * slope


@triton.jit
def _solve_near_one(xr, rmask, xrow, n, inv_tau, xmax, m, active, am1,
                    ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr, MAXIT: tl.constexpr):
    """(ref, A, ℓ, passes) for α − 1 < 1/8: the anchor is the row maximum
    (A = 0 in the frame ``ref`` = max), so ℓ = log p_max lies in
    [−log m, 0] (m finite entries, each p_i ≤ p_max) and keeps float32's
    relative precision, where the smallest support entry's ℓ (down to
    −500 and below near α = 1) would not.  Every d_i ≤ 0 takes the
    log1p branch, β·log1p(−a|d_i|e^{−aℓ}) → −|d_i| as a → 0: softmax.
    Newton runs on log G, which is linear in ℓ at α = 1 (one step there),
    inside the bracket, bisecting where a step leaves it; no λ search."""
    ref = _finite_or_zero(xmax)
    a = am1
    beta = 1.0 / a
    log_a = tl.log(a)
    A = tl.zeros([ROWS, 1], tl.float32)
    lo = -tl.log(tl.maximum(m, 1.0))
    hi = tl.zeros([ROWS, 1], tl.float32)
    ell = lo
    it = tl.zeros([ROWS, 1], tl.int32)
    done = tl.where(active, 0, 1)
    run = done == 0
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        if ONCHIP:
            acc = _near_block(_scaled(xrow, ref, inv_tau), ell, a, beta, log_a)
        else:
            acc = (tl.zeros([ROWS, BLOCK], tl.float32), tl.zeros([ROWS, BLOCK], tl.float32))
            for start in range(0, n, BLOCK):
                s = _near_block(_load_z(xr, rmask, _cols(start, BLOCK), n, ref, inv_tau), ell, a, beta, log_a)
                acc = (acc[0] + s[0], acc[1] + s[1])
        G = _rsum(acc[0])
        dG = _rsum(acc[1])
        it += run.to(tl.int32)
        hi = tl.where(G >= 1.0, tl.minimum(hi, ell), hi)
        lo = tl.where(G < 1.0, tl.maximum(lo, ell), lo)
        # Newton on log G (G' / G its slope); the step is tested before the
        # safeguard: one that no longer moves ℓ beyond its resolution is
        # convergence, not a reason to bisect
        step = tl.log(tl.where(G > 0, G, 1.0)) / tl.where(dG > 0, dG / tl.where(G > 0, G, 1.0), 1.0)
        res = 4.0 * EPS * tl.maximum(tl.abs(ell), 1.0)
        settled = (tl.abs(G - 1.0) <= EPS) | ((dG > 0) & (tl.abs(step) <= res)) | ((hi - lo) <= res)
        new = ell - step
        ok = (G > 0) & (dG > 0) & (new > lo) & (new < hi)
        new = tl.where(ok | settled, new, 0.5 * (lo + hi))
        new = tl.where(tl.abs(G - 1.0) <= EPS, ell, new)
        ell = tl.where(run, new, ell)
        done = tl.where(run & settled, 1, done)
        run = (done == 0) & (it < MAXIT)
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    return ref, A, ell, it


@triton.jit
def _solve_anchor(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, active, k, am1,
                  FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                  BIG: tl.constexpr, PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr,
                  ANCHOR: tl.constexpr = 1):
    """(ref, A, ℓ, passes) per row: the anchor entry and its log-probability
    in the frame ``ref`` (the row maximum), for α-entmax outside [1.125, 2]
    (``ANCHOR`` = 2, α − 1 < 1/8: :func:`_solve_near_one`).

    Looped variant: the lane maxima (a subset of the row, in registers) are
    solved to the end, λ_S and then the anchor (A_S, ℓ_S) on them, and the
    row goes straight to the anchor's Newton from there, with no search
    and no candidate pass: where the lanes hold the row's support its first
    pass finds G = 1 and the row is done in that one pass (support entries
    above A_S that shared a lane with another only cost Newton steps, those
    below A_S a move of the anchor down to them, :func:`_anchor_refine`).
    A row whose anchor would move more than ``TRIAL_MOVES`` times, a row
    whose lanes' support is too wide to lie on distinct lanes, and every
    on-chip row, is searched (:func:`.frame._solve`) and refined from the
    search's λ."""
    if ANCHOR == 2:
        return _solve_near_one(xr, rmask, xrow, n, inv_tau, xmax, m, active, am1, ROWS, BLOCK, ONCHIP, MAXIT)
    ref = _finite_or_zero(xmax)
    zero = tl.zeros([ROWS, 1], tl.float32)
    nogiven = active & (zero > 1.0)
    A = zero
    ell = zero
    it = tl.zeros([ROWS, 1], tl.int32)
    todo = active
    if not ONCHIP:
        _, la, lc, lt = _lane_start(xr, rmask, lanes, ref, inv_tau, active, k, am1, FAM, ROWS, BLOCK, BIG, PROBE,
                                    NEWTON_CAP, MAXIT)
        As, ells, _, _, cl = _anchor_refine(xr, rmask, lanes, BLOCK, ref, inv_tau, lc, lt, am1, la, zero, zero,
                                            nogiven, ROWS, BLOCK, True, MAXIT)
        # only where the lanes' support is small enough that the row's is
        # likely all on distinct lanes (s² ≤ 2·BLOCK: no two of s entries
        # share one of BLOCK lanes with odds ≳ e⁻¹); a wide support (α near
        # 1) always has entries that are no lane's maximum, and a try there
        # would only add a pass
        trial = la & (cl * cl <= 2.0 * BLOCK)
        A, ell, it, failed, _ = _anchor_refine(xr, rmask, xrow, n, ref, inv_tau, lc, lt, am1, trial, As, ells, trial,
                                               ROWS, BLOCK, ONCHIP, MAXIT)
        todo = active & ((~trial) | (failed != 0))
    ref, c, t, it2 = _solve(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, todo, k, am1,
                            FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT)
    A2, ell2, it3, _, _ = _anchor_refine(xr, rmask, xrow, n, ref, inv_tau, c, t, am1, todo, zero, zero, nogiven,
                                         ROWS, BLOCK, ONCHIP, MAXIT)
    A = tl.where(todo, A2, A)
    ell = tl.where(todo, ell2, ell)
    return ref, A, ell, it + it2 + it3


@triton.jit
def _store_p_anchor(yr, rmask, cols, n, x, z, A, ell, a, beta, log_a, active, broken):
    # the row conventions read finite off the raw x (as _store_p does)
    p = tl.where(z > float("-inf"), _anchor_p(z, A, ell, a, beta, log_a), 0.0)
    filled = tl.where(broken, float("nan"), tl.where(x > float("-inf"), 1.0, 0.0))
    tl.store(yr + cols, tl.where(active, p, filled).to(yr.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def _write_p_anchor(xr, yr, rmask, xrow, n, ref, inv_tau, A, ell, am1, active, broken,
                    BLOCK: tl.constexpr, ONCHIP: tl.constexpr):
    """The last pass: p from the anchor A and ℓ ([ROWS, 1] columns)."""
    beta = 1.0 / am1
    log_a = tl.log(am1)
    if ONCHIP:
        _store_p_anchor(yr, rmask, _cols(0, BLOCK), n, xrow, _scaled(xrow, ref, inv_tau), A, ell, am1, beta, log_a,
                        active, broken)
    else:
        for start in range(0, n, BLOCK):
            cols = _cols(start, BLOCK)
            x = _load_x(xr, rmask, cols, n)
            _store_p_anchor(yr, rmask, cols, n, x, _scaled(x, ref, inv_tau), A, ell, am1, beta, log_a, active, broken)
