r"""The λ search of the sparse attention forward (sparsemax, entmax15,
entmax α), over key blocks, for a block of ``BM`` query rows.

Every row's λ solves g(λ) = Σ_j f(z_j − λ) = 1 on z = s − m (m the row
max, found by the first pass), with f the family's map
[(α−1)u]_+^{1/(α−1)}.  The per-row sums at a point come from the threshold
kernels' family maths (:func:`.family_math._acc`, ``_red``, ``_fin``:
r = g − 1, the Newton step, the support count, entmax15's closed-form step),
so the maths of each map lives in one place; this module only supplies the
passes (a pass = q·kᵀ recomputed for every live key block) and the
iteration on top:

* the bracket starts at lo = −1/(α−1) (the row max alone has p = 1 there,
  so g ≥ 1: any key with z ≤ lo is outside the support) and hi = 0, and
  for α > 2 at hi = −n^{1−α}/(α−1) (n keys taking part, p = 1/n each);
* sparsemax: Newton (Michelot) from lo, exact once the support count stops
  changing; entmax15: Newton on √g from lo, plus each pass's closed form on
  its support, accepted when the next pass counts the same support above
  it; entmax α ≤ 2: Newton on g^{α−1} from lo, stopping at a step of a few
  ulps of λ; entmax α > 2 (decided per head at run time; g^{α−1} is not
  convex): the Newton step while it is more than 1/64 of the bracket, else
  false position (Illinois), stopping when the bracket is a few ulps wide.
  A proposal outside the bracket, or any after ``NEWTON_CAP`` passes, is
  replaced by bisection; at most ``MAXIT`` passes.  Rows iterate together
  (the loop runs while one still searches; the others keep their λ).

Block skipping.  Each key block of the program has a flag byte (``FL``):
bit 0 says some entry lies above the row's lower bound ``lo`` as it stood
when the block was last visited, bit 1 that some entry lies above the λ
evaluated then.  The max sweep sets bit 0 (:func:`_max_pass` both) from
the running max (z > m_run − 1/(α−1), a valid test since m_run ≤ m), and
the search's first pass reads bit 0; a sweep that gathers candidates
(:mod:`.attention_gather`) may set both bits on more blocks.  A later pass reads
bit 1 when every row still searching had g(λ) ≥ 1 at the previous pass
(λ was then below its root: Newton from below, always, for α ≤ 2), bit 0
otherwise; a block whose bit is clear holds no entry that can reach the
support, is not recomputed, and stays dead (lo only grows).
"""

import triton
import triton.language as tl

from .ids import ENTMAX, ENTMAX15, SPARSEMAX
from .attention_tiles import _any, _p_entmax, _qk_tile, _shift
from .family_math import _acc, _fin, _init, _red
from .prelude import EPS

REFINE_MAX = tl.constexpr(6)  # Newton passes at most; two from the search's rounding in practice


@triton.jit
def _max_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, lo0, FL,
              MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
              EP: tl.constexpr):
    """Pass 1: the row reference m (the max of the raw q·k, or of s: see
    :mod:`.attention_tiles`) and the count n of keys taking part ([BM, 1]
    each); sets every block's flag (see the module docstring)."""
    m = tl.full([BM, 1], float("-inf"), tl.float32)
    n = tl.zeros([BM, 1], tl.float32)
    for j in range(0, nkb):
        s = _qk_tile(q, Kb, skn, skd, j * BN, rows, L, S, E, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL, SOFTCAP,
                     BN, EP)
        sr = tl.max(s, 1, keep_dims=True)
        m = tl.maximum(m, sr)
        n += tl.sum((s > float("-inf")).to(tl.float32), 1, keep_dims=True)
        live = _any((sr > float("-inf")) & (_shift(sr, tl.where(m > float("-inf"), m, 0.0), scale, MASK_KIND) > lo0))
        tl.store(FL + j, tl.where(live, 3, 0).to(tl.int8))
    return m, n


@triton.jit
def _search_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, bit,
                 m, lam, lo, cand, alpha,
                 FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
                 SKIP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr):
    """One pass at λ = ``lam`` (relative to m) over the live blocks: the
    row sums of ``_acc``, the count of entries above ``cand`` (entmax15)
    and the number of blocks recomputed; rewrites their flags."""
    # the row sums of _acc, reduced per block: [BM, 1] columns (lane
    # accumulators of a whole tile would hold 3–4 tiles of registers)
    zero = tl.zeros([BM, 1], tl.float32)
    tot = (zero, zero, zero)
    cnt = zero
    visited = tl.full((), 0, tl.int32)
    for j in range(0, nkb):
        flag = tl.load(FL + j).to(tl.int32)
        live = (flag & bit) != 0
        if not SKIP:
            live = flag >= 0  # every block (the flags are 0 … 3)
        if live:
            t = _qk_tile(q, Kb, skn, skd, j * BN, rows, L, S, E, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL,
                         SOFTCAP, BN, EP)
            z = _shift(t, m, scale, MASK_KIND)
            t = _red(_acc(z, lam, 0.0, alpha - 1.0, _init(FAM, BM, BN), FAM), FAM)
            tot = (tot[0] + t[0], tot[1] + t[1], tot[2] + t[2])  # plain sums for families 1–3
            if FAM == ENTMAX15:
                cnt += tl.sum(((z > float("-inf")) & (z > cand)).to(tl.float32), 1, keep_dims=True)
            zr = tl.max(z, 1, keep_dims=True)
            nb = tl.where(_any(zr > lo), 1, 0) + tl.where(_any(zr > lam), 2, 0)
            tl.store(FL + j, nb.to(tl.int8))
            visited += 1
    return tot, cnt, visited


@triton.jit
def _search(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, m, n, active, alpha,
            FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, SKIP: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr):
    """λ per row (relative to m; [BM, 1]), the flag bit that the pass
    writing p may read, the number of passes, and the blocks recomputed."""
    beta = 1.0 / (alpha - 1.0)
    zero = tl.zeros([BM, 1], tl.float32)
    # α > 2: g^{α−1} is not convex (entmax α, per head, at run time); [BM, 1]
    # columns, as the interpreter cannot & a block with a scalar
    big = (zero + alpha) > 2.0
    small = (zero + alpha) <= 2.0
    if FAM == SPARSEMAX:
        lo = zero - 1.0
    elif FAM == ENTMAX15:
        lo = zero - 2.0
    else:
        lo = zero - beta * (1.0 + 4.0 * EPS)  # a few ulps below: g(lo) ≥ 1 despite rounding
    nn = tl.where(n > 0, n, 1.0)
    hi = tl.where(big, -beta * tl.exp((1.0 - alpha) * tl.log(nn)) * (1.0 - 8.0 * EPS), 0.0) + zero
    lam = lo
    leval = lam
    cand = lam
    pcnt = zero - 1.0  # the support count the next point came from (sparsemax, entmax15)
    hlo = zero + 1.0  # α > 2: h = g^{α−1} − 1 at lo and hi (false position)
    hhi = zero - 1.0
    side = tl.zeros([BM, 1], tl.int32)
    it = tl.zeros([BM, 1], tl.int32)
    done = ~active
    run = ~done
    bit = tl.full((), 1, tl.int32)  # the first pass reads bit 0: the bound the flags' writer tested
    passes = tl.full((), 0, tl.int32)
    visited = tl.full((), 0, tl.int32)
    while _any(run):
        acc, cntC, vis = _search_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, bit,
                                      m, lam, lo, cand, alpha, FAM, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP)
        passes += 1
        visited += vis
        r, d, s1, s2, x = _fin(acc, 1.0, beta, FAM)
        it += run.to(tl.int32)
        # bit 1 (z > λ) stays valid where every searching row was below its root
        bit = tl.where(_any(run & (r < 0)), 1, 2)
        # ---- the bracket (and, for α > 2, h at its ends, Illinois-halved)
        upl = (r > 0) & (lam >= lo)
        uph = (r < 0) & (lam <= hi)
        if FAM == ENTMAX:
            hhi = tl.where(upl & (side > 0), 0.5 * hhi, hhi)
            hlo = tl.where(uph & (side < 0), 0.5 * hlo, hlo)
            side = tl.where(upl, 1, tl.where(uph, -1, 0))
            hlo = tl.where(upl, x, hlo)
            hhi = tl.where(uph, x, hhi)
        lo = tl.where(upl, lam, lo)
        hi = tl.where(uph, lam, hi)
        mid = 0.5 * (lo + hi)
        # ---- the next point: Newton inside the bracket, else bisection
        prop = lam + d
        ok = (tl.abs(d) < float("inf")) & (prop >= lo) & (prop <= hi) & (it < NEWTON_CAP)
        # (α > 2: not back onto an end already evaluated, where Newton can cycle)
        ok = ok & (small | ((prop > lo) & (prop < hi)))
        nxt = tl.where(ok, prop, mid)
        if FAM == ENTMAX:
            fp = lo + hlo / (hlo - hhi) * (hi - lo)
            fp = tl.where((tl.abs(fp) < float("inf")) & (fp >= lo) & (fp <= hi) & (it < NEWTON_CAP), fp, mid)
            nxt = tl.where(big & ~(ok & (tl.abs(d) * 64.0 > (hi - lo))), fp, nxt)
        tol = 4.0 * EPS * tl.abs(lam)
        # ---- stopping rules, most specific first; fin is the answer
        stop = r == 0
        fin = lam
        if FAM == SPARSEMAX:  # λ is the root of the piece it lies on
            s = (~stop) & (s1 == pcnt)
            fin = tl.where(s, tl.where(ok, prop, lam), fin)
            stop = stop | s
            pcnt = tl.where(ok, s1, -1.0)
        if FAM == ENTMAX15:  # the closed form on the support it came from is that support's
            s = (~stop) & (cntC == pcnt)
            fin = tl.where(s, cand, fin)
            stop = stop | s
            cand = lam + x
            pcnt = tl.where(tl.abs(x) < float("inf"), s1, -1.0)
        s = (~stop) & ok & (tl.abs(d) <= tol) & small
        fin = tl.where(s, prop, fin)
        stop = stop | s
        s = (~stop) & ((hi - lo) <= tl.where(big, 2.0 * tol, tol))
        fin = tl.where(s, nxt, fin)
        stop = stop | s
        s = (~stop) & ((mid <= lo) | (mid >= hi)) & ~ok
        fin = tl.where(s, mid, fin)
        stop = stop | s
        leval = lam
        lam = tl.where(run, tl.where(stop, fin, nxt), lam)
        done = done | (run & stop)
        run = (~done) & (it < MAXIT)
    # bit 1 was written against the λ last evaluated: valid for p where λ did not move down since
    bit = tl.where((bit == 2) & ~_any(active & (lam < leval)), 2, 1)
    return lam, bit, passes, visited


@triton.jit
def _refine_t(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, m, t, active, am1,
              MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, SKIP: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr):
    """t = λ + 1/(α−1) to its own precision, for α − 1 < 1/8, and the passes
    taken.  The search's λ is of size 1/(α−1) and rounded to its ulp, which
    p = (1 + a(z − t))^{1/a} would turn into a relative error of eps/a; t is
    O(log n).  Newton on G(t) = Σ p_j = 1 (G′ = −Σ_j p_j^{1−a}, G convex and
    decreasing) from the search's t, over the blocks that can hold the
    support (flag bit 0: an entry above the search's lower bound); it stops
    where a step is below t's resolution."""
    zero = tl.zeros([BM, 1], tl.float32)
    run = active
    passes = tl.full((), 0, tl.int32)
    while _any(run) & (passes < REFINE_MAX):
        g = zero
        dg = zero
        for j in range(0, nkb):
            live = (tl.load(FL + j).to(tl.int32) & 1) != 0
            if not SKIP:
                live = nkb >= 0
            if live:
                z = _shift(_qk_tile(q, Kb, skn, skd, j * BN, rows, L, S, E, scale, softcap, Mb, smm, smn, MASK_KIND,
                                    CAUSAL, SOFTCAP, BN, EP), m, scale, MASK_KIND)
                p = tl.where(z > float("-inf"), _p_entmax(z, t, am1), 0.0)
                g += tl.sum(p, 1, keep_dims=True)
                dg += tl.sum(tl.where(p > 0, tl.exp((1.0 - am1) * tl.log(tl.where(p > 0, p, 1.0))), 0.0), 1,
                             keep_dims=True)
        passes += 1
        step = tl.where(run & (dg > 0), (g - 1.0) / tl.where(dg > 0, dg, 1.0), 0.0)
        t = t + step
        run = run & (tl.abs(step) > 2.0 * EPS * tl.maximum(tl.abs(t), 1.0))
    return t, passes

