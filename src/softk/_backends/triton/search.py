r"""The λ search of the forward kernel (the scalar side: the passes over the
row are in :mod:`.passes`).  The method per family, the bracket, the probe and
the stopping rules are described in :mod:`softk._backends.triton.kernels`.

Everything here is in the units of the row's *frame*: z = (x − ref)/τ with
the per-row ``ref`` of :mod:`.frame` (the row maximum for the k = 1 maps, a
point next to the threshold for the top-k families), so λ, the bracket, the
midpoint and the probe are plain frame values, of the order of the data's
spread near the threshold rather than of the offset.  λ is a pair of
floats (c, t), λ = c + t, re-centred after every step by an exact two-sum.
A pass returns, at λ and at the probe, the tuple (r, d, s1, s2, x) of
``_fin``: r = g − k, d the proposed Newton step, s1/s2 the counts that
identify the piece of g, x a family extra.

A program searches ``ROWS`` rows at once: every quantity here (λ, the
bracket, the probe, the Newton state, the pass count ``it`` and ``done``) is
a [ROWS, 1] column, one entry per row, and every step is elementwise, so a
row's λ and pass count do not depend on the rows next to it.  The loop runs
while some row still searches; a row that has stopped (or reached ``MAXIT``)
keeps its λ and its count while the others go on.
"""

import triton
import triton.language as tl

from .ids import ENTMAX, ENTMAX15, EXP, LAPLACE, SIGMOID, SPARSE, SPARSEMAX
from .passes import _search_pass
from .prelude import EPS, _lam_tol


@triton.jit
def _two_sum(a, b):
    # s + e == a + b exactly (Knuth); no products, so FMA contraction cannot touch it.
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@triton.jit
def _start(zmax, zmin, m, lz, active, k, am1, q, hlo, hx0, FAM: tl.constexpr, ROWS: tl.constexpr):
    """The first bracket [lo, hi] (loop-carried: of fixed shape [ROWS, 1]),
    the first iterate x0 and whether x0 is exp's Newton iterate from above
    (lse − log k).  ``hlo`` is a known lower bound of λ (−inf: none), ``hx0``
    a first iterate (NaN: none); zmax, zmin, lz = lse(z) are in the frame."""
    if FAM == SPARSEMAX:
        lo = zmax - k
        hi = zmax
    elif FAM == ENTMAX15:
        lo = zmax - 2.0 * tl.sqrt(k)
        hi = zmax
    elif FAM == ENTMAX:
        lo = zmax - tl.exp(am1 * tl.log(k)) * q
        hi = zmax - tl.exp(am1 * tl.log(k / m)) * q
    elif FAM == EXP:
        lo = zmin
        hi = zmax + tl.log(m / k)
    elif FAM == SIGMOID:
        rr = tl.log(k) - tl.log(m - k)
        lo = zmin - rr
        hi = zmax - rr
    elif FAM == LAPLACE:
        lo = zmin + tl.log(2.0 * (m - k) / m)
        hi = zmax + tl.log(m / k)
    else:
        lo = zmin - 1.0
        hi = zmax
    lo = tl.broadcast_to(tl.minimum(tl.maximum(lo, hlo), hi), [ROWS, 1])
    hi = tl.broadcast_to(hi, [ROWS, 1])
    if FAM < EXP:  # Newton from the left (α > 2: false position from both ends)
        x0 = lo
    elif FAM == EXP:  # from above: the root without saturation
        x0 = tl.where(active, lz, 0.0) - tl.log(k)
    else:
        x0 = 0.5 * (lo + hi)
    given = hx0 == hx0
    x0 = tl.where(given, tl.minimum(tl.maximum(hx0, lo), hi), x0)
    return lo, hi, x0, tl.where(given, 0, 1 if FAM == EXP else 0)


@triton.jit
def _tighten(lo, hi, hlo, hhi, side, lamX, X, qc, qt, Q, qv, PROBE: tl.constexpr, BIG: tl.constexpr):
    """Every evaluated point tightens the bracket; hlo, hhi are h = x at its
    ends (false position, α > 2) and ``side`` the end moved last."""
    upl = (X[0] > 0) & (lamX >= lo)
    uph = (X[0] < 0) & (lamX <= hi)
    lo = tl.where(upl, lamX, lo)
    hi = tl.where(uph, lamX, hi)
    if BIG:
        # Illinois: the false-position point replaced the same end twice
        # running, so halve the value kept at the other end
        hhi = tl.where(upl & (side > 0), 0.5 * hhi, hhi)
        hlo = tl.where(uph & (side < 0), 0.5 * hlo, hlo)
        side = tl.where(upl, 1, tl.where(uph, -1, 0))
    hlo = tl.where(upl, X[4], hlo)
    hhi = tl.where(uph, X[4], hhi)
    if PROBE:
        lamQ = qc + qt
        upl = (qv != 0) & (Q[0] > 0) & (lamQ >= lo)
        uph = (qv != 0) & (Q[0] < 0) & (lamQ <= hi)
        lo = tl.where(upl, lamQ, lo)
        hi = tl.where(uph, lamQ, hi)
        hlo = tl.where(upl, Q[4], hlo)
        hhi = tl.where(uph, Q[4], hhi)
    return lo, hi, hlo, hhi, side


@triton.jit
def _proposal(c, t, X, qc, qt, Q, qv, lo, hi, hlo, hhi, mid,
              FAM: tl.constexpr, PROBE: tl.constexpr, BIG: tl.constexpr):
    """The Newton proposal from λ, (pxc, pxt) and whether it lies in the
    bracket, okX; and the best next point (bc, bt) with the counts of the
    piece it came from, whether it is usable, bok, and the length of the
    step that gave it, bd."""
    pxc, pxt = _two_sum(c, t + X[1])
    pxr = pxc + pxt
    okX = (tl.abs(X[1]) < float("inf")) & (pxr >= lo) & (pxr <= hi)
    bc = pxc
    bt = pxt
    bs1 = X[2]
    bs2 = X[3]
    bok = okX
    bd = tl.abs(X[1])
    if BIG:
        # The Newton step, unless it is a small part of the bracket (entries
        # just inside the support make −g' huge there): then false
        # position on h (Illinois); the midpoint probe keeps halving [lo, hi].
        fp = lo + hlo / (hlo - hhi) * (hi - lo)
        fp = tl.where((tl.abs(fp) < float("inf")) & (fp >= lo) & (fp <= hi), fp, mid)
        useN = okX & (tl.abs(X[1]) * 64.0 > (hi - lo))
        bc = tl.where(useN, pxc, fp)
        bt = tl.where(useN, pxt, 0.0)
        bok = tl.full((), 1, tl.int1)
    elif PROBE:
        pqc, pqt = _two_sum(qc, qt + Q[1])
        pqr = pqc + pqt
        okQ = (qv != 0) & (tl.abs(Q[1]) < float("inf")) & (pqr >= lo) & (pqr <= hi)
        if FAM == EXP:  # the probe is above the root: its iterate is the better one
            useQ = okQ & (Q[0] < 0)
        else:
            useQ = okQ & ((~okX) | (tl.abs(Q[1]) < tl.abs(X[1])))
        bc = tl.where(useQ, pqc, bc)
        bt = tl.where(useQ, pqt, bt)
        bs1 = tl.where(useQ, Q[2], bs1)
        bs2 = tl.where(useQ, Q[3], bs2)
        bok = okX | useQ
        bd = tl.where(useQ, tl.abs(Q[1]), bd)
    return pxc, pxt, okX, bc, bt, bs1, bs2, bok, bd


@triton.jit
def _stop_at(stop, fc, ft, s, ac, at):
    # a rule that holds (s) where no earlier one stopped: stop there with (ac, at)
    s = (~stop) & s
    return stop | s, tl.where(s, ac, fc), tl.where(s, at, ft)


@triton.jit
def _exact_stop(c, t, X, qc, qt, Q, qv, pxc, pxt, okX, newt, ps1, ps2, cc, ct, cntC, pcnt, k,
                FAM: tl.constexpr, PROBE: tl.constexpr):
    """The rules under which λ is exact, most specific first: (stop, and
    the answer (fc, ft) where it stops)."""
    stop = X[0] == 0
    fc = c
    ft = t
    if PROBE:
        stop, fc, ft = _stop_at(stop, fc, ft, (qv != 0) & (Q[0] == 0), qc, qt)
    if FAM == SPARSEMAX or FAM == EXP or FAM == LAPLACE or FAM == SPARSE:
        # λ came from the exact root of a piece that it lies on: exact;
        # this pass's own proposal (same piece, computed next to λ) polishes it.
        stop, fc, ft = _stop_at(stop, fc, ft, (newt != 0) & (X[2] == ps1) & (X[3] == ps2),
                                tl.where(okX, pxc, fc), tl.where(okX, pxt, ft))
    if FAM == ENTMAX15:
        stop, fc, ft = _stop_at(stop, fc, ft, cntC == pcnt, cc, ct)
    if FAM == EXP:
        # an iterate from above that reaches or passes the root (rounding)
        stop, fc, ft = _stop_at(stop, fc, ft, (newt != 0) & ((X[0] > 0) | (X[2] >= k)), fc, ft)
    return stop, fc, ft


@triton.jit
def _converged(stop, fc, ft, X, pxc, pxt, bok, bc, bt, mc, mt, lo, hi, mid, tol, go, BIG: tl.constexpr):
    """The rules that stop on width: a Newton step of a few ulps, a bracket a
    few ulps wide, or a midpoint that no longer splits it."""
    if not BIG:
        stop, fc, ft = _stop_at(stop, fc, ft, (tl.abs(X[1]) < float("inf")) & (tl.abs(X[1]) <= tol), pxc, pxt)
    stop, fc, ft = _stop_at(stop, fc, ft, (hi - lo) <= (2.0 * tol if BIG else tol),
                            tl.where(bok, bc, mc), tl.where(bok, bt, mt))
    stop, fc, ft = _stop_at(stop, fc, ft, (~go) & ((mid <= lo) | (mid >= hi)), mc, mt)
    return stop, fc, ft


@triton.jit
def _next_probe(nc, nt, lo, hi, mid, go, FAM: tl.constexpr):
    # the bracket midpoint (for exp: between the lower end and the next
    # iterate, which comes from above), used only where it is a new point
    nr = nc + nt
    qn = mid
    if FAM == EXP:
        qn = 0.5 * (lo + nr)
    qv = tl.where(go & (qn > lo) & (qn < hi) & (qn != nr), 1, 0)
    return qn, tl.zeros_like(qn), qv


@triton.jit
def _find_lambda(xr, rmask, xrow, n, ref, inv_tau, zmax, zmin, m, lz, active, k, am1, hlo, hx0, lim,
                 FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                 BIG: tl.constexpr, PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr):
    """λ = c + t in the frame ``ref`` for every family but softmax, and the
    number of passes, per row ([ROWS, 1] columns).  Rows not ``active``
    keep their first iterate and count 0 passes.  The top-k families stop
    a row as soon as its bracket lies beyond ±``lim`` (inf: never), with λ
    at the bracket end there: its frame cannot resolve it (:mod:`.frame`)."""
    zero = tl.zeros([ROWS, 1], tl.float32)
    izero = tl.zeros([ROWS, 1], tl.int32)
    it = izero
    q = 1.0 / am1
    lo, hi, x0, newt = _start(zmax, zmin, m, lz, active, k, am1, q, hlo, hx0, FAM, ROWS)
    c = x0
    t = zero
    ps1 = zero
    ps2 = zero
    # probe; α > 2 evaluates both ends of the bracket first (false position needs them)
    qc = hi
    qt = zero
    qv = izero + (1 if BIG else 0)
    hlo_ = zero + 1.0  # α > 2: h = g^(α−1) − k^(α−1) at lo and hi
    hhi_ = zero - 1.0
    side = izero
    cc = c
    ct = t
    pcnt = zero - 1.0  # entmax15: support size the candidate came from
    done = tl.where(active, 0, 1)
    # rows still searching; the loop runs while there is one
    run = (done == 0) & (it < MAXIT)
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        X, Q, cntC = _search_pass(xr, rmask, xrow, n, ref, inv_tau, c, t, qc, qt, cc, ct, k, am1, q,
                                  FAM, ROWS, BLOCK, ONCHIP, PROBE)
        it += run.to(tl.int32)  # rows that have stopped keep their count
        lamX = c + t
        tol = _lam_tol(lamX, FAM)
        lo, hi, hlo_, hhi_, side = _tighten(lo, hi, hlo_, hhi_, side, lamX, X, qc, qt, Q, qv, PROBE, BIG)
        mid = 0.5 * (lo + hi)
        # Newton proposals (from λ and from the probe); the best one
        pxc, pxt, okX, bc, bt, bs1, bs2, bok, bd = _proposal(c, t, X, qc, qt, Q, qv, lo, hi, hlo_, hhi_, mid,
                                                             FAM, PROBE, BIG)
        # ---- stopping rules, most specific first; (fc, ft) is the answer
        stop, fc, ft = _exact_stop(c, t, X, qc, qt, Q, qv, pxc, pxt, okX, newt, ps1, ps2, cc, ct, cntC, pcnt, k,
                                   FAM, PROBE)
        # Newton while allowed and inside the bracket, else bisection
        go = bok & (it < NEWTON_CAP)
        stop, fc, ft = _converged(stop, fc, ft, X, pxc, pxt, bok, bc, bt, mid, zero, lo, hi, mid, tol, go, BIG)
        if FAM >= EXP:
            stop, fc, ft = _stop_at(stop, fc, ft, (hi < -lim) | (lo > lim), tl.where(hi < -lim, hi, lo), zero)
        # ---- next point (the state of stopped rows moves on too, unread:
        # only their λ and count are kept, below)
        if FAM == ENTMAX15:
            cc, ct = _two_sum(c, t + X[4])
            pcnt = tl.where((tl.abs(X[4]) < float("inf")), X[2], -1.0)
        nc = tl.where(go, bc, mid)
        nt = tl.where(go, bt, 0.0)
        if FAM == EXP:
            # Exp's Newton iterates come from above, and one that reaches or
            # passes the root is taken as the root (above): a pass by its
            # rounding, λ's own for a step next to λ.  A longer step rounds
            # by ulps of its length (from the probe 38 frame units away,
            # 2e-6), and where an entry lies that close under the root the
            # iterate lands below it, which then reads as saturated (p = 1
            # for 1 − 8e-7) while the row looks solved.  Such an iterate is
            # moved up by its rounding (and by that of the lse's terms, up
            # to log m): above the root, on the piece it was solved on, so
            # that the next pass takes the exact rule above with a step
            # next to λ.  λ's resolution bounds the rounding of shorter steps.
            nr = nc + nt
            lift = go & (bd > tl.abs(nr) + 1.0)
            lc, lt = _two_sum(nc, nt + 8.0 * EPS * (bd + 2.0 * tl.log(m) + 1.0))
            lift = lift & ((lc + lt) < hi)
            nc = tl.where(lift, lc, nc)
            nt = tl.where(lift, lt, nt)
        if PROBE:
            qc, qt, qv = _next_probe(nc, nt, lo, hi, mid, go, FAM)
        newt = tl.where(go, 1, 0)
        ps1 = bs1
        ps2 = bs2
        c = tl.where(run, tl.where(stop, fc, nc), c)
        t = tl.where(run, tl.where(stop, ft, nt), t)
        done = tl.where(run & stop, 1, done)
        run = (done == 0) & (it < MAXIT)
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    return c, t, it
