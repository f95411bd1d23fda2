r"""The kernels: forward p = f(z − λ), Σp = k, and backward from the saved p.

One program per row.  Rows of up to ``ONCHIP_MAX`` (8192, function.py) entries are loaded once
into registers (``ONCHIP``: the block is the next power of two ≥ n) and every
pass below runs on that copy; wider rows are read in blocks of ``BLOCK`` in a
loop, so any width works (no 65,536 limit).  Arithmetic is float32 whatever
the input dtype.

λ is kept as a pair of floats (c, t), λ = c + t, re-centred after every step
(an exact two-sum), and every entry is evaluated as u = (z − c) − t.  c sits
next to λ, so z − c is exact for the entries that decide λ and u keeps its
relative precision even where λ is far from 0 or from the row max.  The
bracket [lo, hi] (g(lo) ≥ k ≥ g(hi), g(λ) = Σ f(z − λ)) is kept relative to
max z, and "a few ulps" means 4 float32 eps of |λ − max z| (+ 1 for the
capped families, whose f has unit width).

Forward, in passes over the row ("pass" = one read of the row, or one sweep
over the register copy):

1. one pass: max, min, finite count, a NaN/+inf flag, and (softmax, exp) the
   row's logsumexp with an online max;
2. the search for λ, one pass per step; every evaluated point tightens the
   bracket:

   * softmax: none (λ = lse(z) − log k from pass 1);
   * sparsemax: Michelot's iteration λ ← (Σ_{z>λ} z − k)/#{z>λ} from
     λ0 = max − k: Newton from the left on a convex g, never overshoots, exact
     once the support stops changing (checked by the next pass);
   * entmax15: Newton on √g from λ0 = max − 2√k (convex, nearly linear, never
     overshoots), and each pass also solves Σ((z−λ)/2)² = k in closed form on
     its support; that candidate is accepted when the count of entries above
     it equals the support it came from (counted in the next pass);
   * entmax α ≤ 2: Newton on g^(1/q) (q = 1/(α−1)) from λ0 = max − k^(α−1)/(α−1),
     stopping when the step is a few ulps;
     α > 2 (f' is infinite at the edge of the support, g^(1/q) not convex):
     the same Newton step unless it is under 1/64 of the bracket, else false
     position on g^(1/q) (Illinois), plus the bracket midpoint in the same
     pass; it stops only when the bracket itself is a few ulps wide;
   * exp (soft top-k): λ ← lse_{z<λ}(z) − log(k − #{z≥λ}) from λ0 = lse(z) − log k
     (Newton in e^{−λ} on a concave function: never overshoots; the
     unsaturated lse has its own max so it cannot underflow); exact when the
     saturated count stops changing, or when #sat reaches k;
   * sigmoid: Newton on log(A + a) − log(B + b), A = Σ_{u<0} f, B = Σ_{u≥0} (1 − f)
     (a, b the integer part of the balance A − B = k − #{u ≥ 0}), nearly
     linear even when every entry is far from λ; sums kept with their own max;
   * laplace: the exact root on the current upper set (a quadratic in e^λ,
     solved in log space), exact when the upper set stops changing;
   * sparse (clip): Newton on the piecewise-linear g, exact when the
     saturated and linear counts stop changing.

   The capped families (exp, sigmoid, laplace, sparse) also evaluate a second
   point in the same pass from the second step on (the bracket midpoint; for
   exp the midpoint between the lower bound and the iterate), so the bracket
   at least halves every pass even where Newton crawls (entries far apart,
   τ → 0); the next point is the better of the two Newton proposals.  A
   proposal outside the bracket, or any step after ``NEWTON_CAP``, is
   replaced by bisection; the loop stops at ``MAXIT`` passes whatever
   happens, with λ inside the bracket.
3. one pass writing p (or the row conventions: NaN rows, ≤ k finite entries).

Passes over the row, forward, including 1 and 3 — typical: the median over
random normal rows of 100–8000 entries at scales 0.01–1000 (k from 1 to
n − 8 for the top-k maps); worst: the largest over those and over adversarial
rows (ties, sqrt/log/geometric/quadratic spacing, one dominant entry, two
clusters, 70 % masked, offset by 1000), measured through the interpreter:

    softmax 2 | sparsemax 4 (≤ 12) | entmax15 4 (≤ 8) | entmax α ≤ 2: 5 (≤ 7)
    entmax α > 2: 3, mean 7–8 (≤ 24) | exp 5 (≤ 22; 3 when nothing saturates)
    sigmoid 6 (≤ 22) | laplace 5 (≤ 21) | sparse 7 (≤ 23)

and never more than 2 + ``MAXIT`` = 62.  The previous kernels took 62 for
every family but softmax (60 bisection steps), and 3 for softmax.  The passes
with a second point (exp, sigmoid, laplace, sparse, entmax α > 2) cost twice
the arithmetic of a plain pass, not twice the memory traffic.

Backward: Σ d·g and Σ d, then d (g − Σdg/Σd)/τ, with d = f'(u) read off the
saved p (the same formulas as ``Family.d_from_p``); one read of p and g for
on-chip rows, two otherwise.

Family ids: 0 softmax, 1 sparsemax, 2 entmax15, 3 entmax α, 4 exp (soft top-k),
5 sigmoid, 6 laplace, 7 sparse (capped simplex).
"""

import triton
import triton.language as tl

EPS = tl.constexpr(1.1920928955078125e-07)  # float32 machine epsilon
LOG2 = tl.constexpr(0.6931471805599453)


# ---------------------------------------------------------------- helpers
@triton.jit
def _two_sum(a, b):
    # s + e == a + b exactly (Knuth); no products, so FMA contraction cannot touch it.
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@triton.jit
def _f(u, FAM: tl.constexpr, alpha):
    if FAM == 0:
        r = tl.exp(u)
    elif FAM == 1:
        r = tl.maximum(u, 0.0)
    elif FAM == 2:
        h = tl.maximum(u, 0.0) * 0.5
        r = h * h
    elif FAM == 3:
        s = tl.maximum((alpha - 1.0) * u, 0.0)
        r = tl.where(s > 0, tl.exp(tl.log(tl.where(s > 0, s, 1.0)) / (alpha - 1.0)), 0.0)
    elif FAM == 4:
        r = tl.exp(tl.minimum(u, 0.0))
    elif FAM == 5:
        r = 1.0 / (1.0 + tl.exp(-u))
    elif FAM == 6:
        r = tl.where(u >= 0, 1.0 - 0.5 * tl.exp(-tl.abs(u)), 0.5 * tl.exp(-tl.abs(u)))
    else:
        r = tl.minimum(tl.maximum(u, 0.0), 1.0)
    return r


@triton.jit
def _d_from_p(p, FAM: tl.constexpr, alpha):
    if FAM == 0:
        d = p
    elif FAM == 1:
        d = tl.where(p > 0, 1.0, 0.0)
    elif FAM == 2:
        d = tl.sqrt(p)
    elif FAM == 3:
        d = tl.where(p > 0, tl.exp((2.0 - alpha) * tl.log(tl.where(p > 0, p, 1.0))), 0.0)
    elif FAM == 4:
        d = tl.where(p < 1, p, 0.0)
    elif FAM == 5:
        d = p * (1.0 - p)
    elif FAM == 6:
        d = tl.minimum(p, 1.0 - p)
    else:
        d = tl.where((p > 0) & (p < 1), 1.0, 0.0)
    return d


# ------------------------------------------- per-family sums over the row
# The sums at λ = c + t are kept per lane ([BLOCK] vectors) and reduced once
# per pass (_red).  Sums of exponentials carry a running max per row (a
# scalar, raised block by block; the lane sums are rescaled when it moves), so
# each block costs one max reduction per such sum and no per-entry rescaling.
# _fin turns the row's sums into (r = g − k, d = proposed step, s1, s2 =
# counts that identify the piece of g, x = family extra).
@triton.jit
def _init(FAM: tl.constexpr, BLOCK: tl.constexpr):
    v = tl.zeros([BLOCK], tl.float32)
    ninf = tl.full((), float("-inf"), tl.float32)
    if FAM == 4:
        acc = (v, ninf, v)
    elif FAM == 5 or FAM == 6:
        acc = (v, ninf, v, v, ninf, v, v)
    else:
        acc = (v, v, v)
    return acc


@triton.jit
def _rescale(M, Mb):
    # the new running max and the factor e^{M − Mnew} for sums kept at M
    Mn = tl.maximum(M, Mb)
    a = tl.where(M > float("-inf"), tl.exp(M - tl.where(Mn > float("-inf"), Mn, 0.0)), 0.0)
    return Mn, a, tl.where(Mn > float("-inf"), Mn, 0.0)


@triton.jit
def _acc(z, c, t, alpha, acc, FAM: tl.constexpr):
    fin = z > float("-inf")
    u = (z - c) - t
    if FAM == 1:
        sup = fin & (u > 0)
        acc = (acc[0] + sup.to(tl.float32), acc[1] + tl.where(sup, u, 0.0), acc[2])
    elif FAM == 2:
        w = tl.where(fin & (u > 0), u, 0.0)
        acc = (acc[0] + (w > 0).to(tl.float32), acc[1] + w, acc[2] + w * w)
    elif FAM == 3:
        y = tl.where(fin, tl.maximum((alpha - 1.0) * u, 0.0), 0.0)
        pos = y > 0
        ys = tl.where(pos, y, 1.0)
        fy = tl.where(pos, tl.exp(tl.log(ys) / (alpha - 1.0)), 0.0)
        acc = (acc[0] + fy, acc[1] + fy / ys, acc[2])  # g, −g' = Σ y^(q−1)
    elif FAM == 4:
        sat = fin & (u >= 0)
        low = fin & (u < 0)
        M, a, Ms = _rescale(acc[1], tl.max(tl.where(low, u, float("-inf")), 0))
        acc = (acc[0] + sat.to(tl.float32), M, acc[2] * a + tl.where(low, tl.exp(u - Ms), 0.0))
    elif FAM == 5 or FAM == 6:
        up = fin & (u >= 0)
        low = fin & (u < 0)
        y = -tl.abs(u)
        Ma, aa, Mas = _rescale(acc[1], tl.max(tl.where(low, y, float("-inf")), 0))
        Mb, ab, Mbs = _rescale(acc[4], tl.max(tl.where(up, y, float("-inf")), 0))
        Mside = tl.where(low, Mas, Mbs)
        ee = tl.where(fin, tl.exp(y - Mside), 0.0)  # e^{−|u|} / e^{M(side)}
        if FAM == 5:
            w = 1.0 / (1.0 + ee * tl.exp(Mside))  # f = e^{−|u|} w on the low side, 1 − f on the up side
            w2 = w * w  # f' = e^{−|u|} w²
        else:
            w = 0.5
            w2 = 0.5
        ea = tl.where(low, ee, 0.0)
        eb = tl.where(up, ee, 0.0)
        acc = (acc[0] + up.to(tl.float32), Ma, acc[2] * aa + ea * w, acc[3] * aa + ea * w2,
               Mb, acc[5] * ab + eb * w, acc[6] * ab + eb * w2)
    else:
        sat = fin & (u >= 1)
        lin = fin & (u > 0) & (u < 1)
        acc = (acc[0] + sat.to(tl.float32), acc[1] + lin.to(tl.float32), acc[2] + tl.where(lin, u, 0.0))
    return acc


@triton.jit
def _red(acc, FAM: tl.constexpr):
    if FAM == 4:
        r = (tl.sum(acc[0], 0), acc[1], tl.sum(acc[2], 0))
    elif FAM == 5 or FAM == 6:
        r = (tl.sum(acc[0], 0), acc[1], tl.sum(acc[2], 0), tl.sum(acc[3], 0), acc[4], tl.sum(acc[5], 0), tl.sum(acc[6], 0))
    else:
        r = (tl.sum(acc[0], 0), tl.sum(acc[1], 0), tl.sum(acc[2], 0))
    return r


@triton.jit
def _fin(acc, k, q, FAM: tl.constexpr):
    if FAM == 1:
        cnt = acc[0]
        r = acc[1] - k
        d = r / cnt
        s1 = cnt
        s2 = 0.0
        x = 0.0
    elif FAM == 2:
        cnt = acc[0]
        W1 = acc[1]
        g = acc[2] * 0.25
        r = g - k
        rg = tl.sqrt(g)
        d = 4.0 * (rg - tl.sqrt(k)) * rg / W1  # Newton on √g
        # closed form on this support: Σ (w − δ)² = 4k, the smaller root
        x = 4.0 * r / (W1 + tl.sqrt(tl.maximum(W1 * W1 - 4.0 * cnt * r, 0.0)))
        s1 = cnt
        s2 = 0.0
    elif FAM == 3:
        g = acc[0]
        r = g - k
        # Newton on h = g^(1/q) − k^(1/q): Δ = q h g^(1−1/q) / (−g')
        lg = tl.log(g)
        x = tl.exp(lg / q) - tl.exp(tl.log(k) / q)  # h, for false position (α > 2)
        d = q * x * tl.exp(lg - lg / q) / acc[1]
        s1 = 0.0
        s2 = 0.0
    elif FAM == 4:
        ns = acc[0]
        M = acc[1]
        S = acc[2]
        r = (ns - k) + tl.exp(M) * S
        d = M + tl.log(S) - tl.log(k - ns)  # NaN/inf when ns ≥ k or nothing unsaturated
        s1 = ns
        s2 = 0.0
        x = 0.0
    elif FAM == 5 or FAM == 6:
        nup = acc[0]
        Ma = acc[1]
        Sa = acc[2]
        Ta = acc[3]
        Mb = acc[4]
        Sb = acc[5]
        Tb = acc[6]
        cb = k - nup  # the balance: A − B = cb at the root
        la = tl.where(Sa > 0, Ma + tl.log(tl.where(Sa > 0, Sa, 1.0)), float("-inf"))
        lb = tl.where(Sb > 0, Mb + tl.log(tl.where(Sb > 0, Sb, 1.0)), float("-inf"))
        A = tl.exp(la)
        B = tl.exp(lb)
        r = (A - B) - cb
        if FAM == 5:
            ap = tl.maximum(-cb, 0.0)
            bp = tl.maximum(cb, 0.0)
            logL = tl.where(ap > 0, tl.log(ap + A), la)
            logR = tl.where(bp > 0, tl.log(bp + B), lb)
            qa = tl.where(ap > 0, tl.exp(Ma) * Ta / (ap + A), tl.where(Sa > 0, Ta / tl.where(Sa > 0, Sa, 1.0), 0.0))
            qb = tl.where(bp > 0, tl.exp(Mb) * Tb / (bp + B), tl.where(Sb > 0, Tb / tl.where(Sb > 0, Sb, 1.0), 0.0))
            d = (logL - logR) / (qa + qb)
        else:
            # A e^{−δ} − B e^{δ} = cb, a quadratic in e^δ, in the form without cancellation
            h = tl.sqrt(cb * cb + 4.0 * tl.exp(la + lb))
            dpos = LOG2 + la - tl.log(cb + h)
            dneg = tl.log(-cb + h) - LOG2 - lb
            d = tl.where(cb == 0, 0.5 * (la - lb), tl.where(cb > 0, dpos, dneg))
        s1 = nup
        s2 = 0.0
        x = 0.0
    else:
        ns = acc[0]
        nl = acc[1]
        r = (ns - k) + acc[2]
        d = r / nl
        s1 = ns
        s2 = nl
        x = 0.0
    return r, d, s1, s2, x


@triton.jit
def _search_pass(xr, zrow, n, inv_tau, c, t, qc, qt, cc, ct, k, alpha, q,
                 FAM: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                 PROBE: tl.constexpr, BIG: tl.constexpr):
    """One pass: the sums at λ = c + t, at the probe qc + qt (PROBE) and, for
    entmax15, the count of entries above the candidate cc + ct."""
    accX = _init(FAM, BLOCK)
    accQ = accX
    cntC = tl.zeros([BLOCK], tl.float32)
    if ONCHIP:  # reduce each point's sums at once: fewer live registers
        accX = _red(_acc(zrow, c, t, alpha, accX, FAM), FAM)
        accQ = accX
        if PROBE:
            accQ = _red(_acc(zrow, qc, qt, alpha, _init(FAM, BLOCK), FAM), FAM)
        if FAM == 2:
            cntC = ((zrow > float("-inf")) & (((zrow - cc) - ct) > 0)).to(tl.float32)
    else:
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(xr + offs, mask=offs < n, other=float("-inf")).to(tl.float32) * inv_tau
            accX = _acc(z, c, t, alpha, accX, FAM)
            if PROBE:
                accQ = _acc(z, qc, qt, alpha, accQ, FAM)
            if FAM == 2:
                cntC += ((z > float("-inf")) & (((z - cc) - ct) > 0)).to(tl.float32)
        accX = _red(accX, FAM)
        accQ = _red(accQ, FAM)
    cntC = tl.sum(cntC, 0)
    rX, dX, s1X, s2X, xX = _fin(accX, k, q, FAM)
    rQ, dQ, s1Q, s2Q, xQ = _fin(accQ, k, q, FAM)
    return rX, dX, s1X, s2X, xX, rQ, dQ, s1Q, s2Q, xQ, cntC


# ------------------------------------------------------------------ forward
@triton.jit
def threshold_fwd_kernel(X, Y, ITS, n, k, inv_tau, alpha,
                         FAM: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                         BIG: tl.constexpr, PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr,
                         MAXIT: tl.constexpr, WRITE_ITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = X + row * n
    yr = Y + row * n

    # ---- pass 1: max, min, finite count, NaN/+inf, and lse for softmax/exp
    if ONCHIP:
        offs = tl.arange(0, BLOCK)
        zrow = tl.load(xr + offs, mask=offs < n, other=float("-inf")).to(tl.float32) * inv_tau
        fin = zrow > float("-inf")
        zmax = tl.max(tl.where(fin, zrow, float("-inf")), 0)
        zmin = tl.min(tl.where(fin, zrow, float("inf")), 0)
        m = tl.sum(fin.to(tl.float32), 0)
        broken = tl.sum(((zrow != zrow) | (zrow == float("inf"))).to(tl.float32), 0) > 0
        lseS = tl.full((), 1.0, tl.float32)
        if FAM == 0 or FAM == 4:
            lseS = tl.sum(tl.where(fin, tl.exp(zrow - tl.where(zmax > float("-inf"), zmax, 0.0)), 0.0), 0)
    else:
        zrow = 0.0
        vmax = tl.full([BLOCK], float("-inf"), tl.float32)
        vmin = tl.full([BLOCK], float("inf"), tl.float32)
        vcnt = tl.zeros([BLOCK], tl.float32)
        vbad = tl.zeros([BLOCK], tl.float32)
        lseM = tl.full((), float("-inf"), tl.float32)
        vlse = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(xr + offs, mask=offs < n, other=float("-inf")).to(tl.float32) * inv_tau
            fin = z > float("-inf")
            vmax = tl.maximum(vmax, tl.where(fin, z, float("-inf")))
            vmin = tl.minimum(vmin, tl.where(fin, z, float("inf")))
            vcnt += fin.to(tl.float32)
            vbad += ((z != z) | (z == float("inf"))).to(tl.float32)
            if FAM == 0 or FAM == 4:
                lseM, a, Ms = _rescale(lseM, tl.max(tl.where(fin, z, float("-inf")), 0))
                vlse = vlse * a + tl.where(fin, tl.exp(z - Ms), 0.0)
        zmax = tl.max(vmax, 0)
        zmin = tl.min(vmin, 0)
        m = tl.sum(vcnt, 0)
        nbad = tl.sum(vbad, 0)
        lseS = tl.sum(vlse, 0)  # relative to lseM, which ends at max z
        broken = nbad > 0
    active = (m > k) & (~broken)
    m = tl.where(active, m, k + 1.0)  # keeps the brackets finite on rows filled below
    zmax = tl.where(active, zmax, 0.0)
    zmin = tl.where(active, zmin, 0.0)

    # ---- pass 2..: λ.  λ = c + t (two floats, re-centred after each step);
    # the bracket [lo, hi] and the probe are kept relative to max z.
    it = tl.full((), 0, tl.int32)
    if FAM == 0:
        c = zmax
        t = tl.log(tl.where(active, lseS, 1.0)) - tl.log(k)
    else:
        q = 1.0 / (alpha - 1.0)
        spread = zmin - zmax
        if FAM == 1:
            lo = -k
            hi = tl.full((), 0.0, tl.float32)
            x0 = lo
        elif FAM == 2:
            lo = -2.0 * tl.sqrt(k)
            hi = tl.full((), 0.0, tl.float32)
            x0 = lo
        elif FAM == 3:
            lo = -tl.exp((alpha - 1.0) * tl.log(k)) * q
            hi = -tl.exp((alpha - 1.0) * tl.log(k / m)) * q
            x0 = lo
        elif FAM == 4:
            lo = spread
            hi = tl.log(m / k)
            x0 = tl.log(tl.where(active, lseS, 1.0)) - tl.log(k)
        elif FAM == 5:
            rr = tl.log(k) - tl.log(m - k)
            lo = spread - rr
            hi = -rr
            x0 = 0.5 * (lo + hi)
        elif FAM == 6:
            lo = spread + tl.log(2.0 * (m - k) / m)
            hi = tl.log(m / k)
            x0 = 0.5 * (lo + hi)
        else:
            lo = spread - 1.0
            hi = tl.full((), 0.0, tl.float32)
            x0 = 0.5 * (lo + hi)
        c, t = _two_sum(zmax, x0)
        # X0 for exp is the Newton iterate from "nothing saturated"
        newt = tl.full((), 1 if FAM == 4 else 0, tl.int32)
        ps1 = tl.full((), 0.0, tl.float32)
        ps2 = tl.full((), 0.0, tl.float32)
        # probe; α > 2 evaluates both ends of the bracket first (false position needs them)
        qc, qt = _two_sum(zmax, hi)
        qv = tl.full((), 1 if BIG else 0, tl.int32)
        hlo = tl.full((), 1.0, tl.float32)  # α > 2: h = g^(α−1) − k^(α−1) at lo and hi
        hhi = tl.full((), -1.0, tl.float32)
        side = tl.full((), 0, tl.int32)
        cc = c
        ct = t
        pcnt = tl.full((), -1.0, tl.float32)  # entmax15: support size the candidate came from
        done = tl.where(active, 0, 1)
        while (it < MAXIT) & (done == 0):
            rX, dX, s1X, s2X, xX, rQ, dQ, s1Q, s2Q, xQ, cntC = _search_pass(
                xr, zrow, n, inv_tau, c, t, qc, qt, cc, ct, k, alpha, q, FAM, BLOCK, ONCHIP, PROBE, BIG)
            it += 1
            lamX = (c - zmax) + t  # relative to max z, like lo and hi
            # a few ulps of the data's scale around λ: of λ − max z, and of
            # the unit width of f for the capped families
            tol = 4.0 * EPS * (tl.abs(lamX) + (1.0 if FAM >= 4 else 0.0))
            upl = (rX > 0) & (lamX >= lo)
            uph = (rX < 0) & (lamX <= hi)
            lo = tl.where(upl, lamX, lo)
            hi = tl.where(uph, lamX, hi)
            if BIG:
                # Illinois: the false-position point replaced the same end twice
                # running, so halve the value kept at the other end
                hhi = tl.where(upl & (side > 0), 0.5 * hhi, hhi)
                hlo = tl.where(uph & (side < 0), 0.5 * hlo, hlo)
                side = tl.where(upl, 1, tl.where(uph, -1, 0))
            hlo = tl.where(upl, xX, hlo)
            hhi = tl.where(uph, xX, hhi)
            if PROBE:
                lamQ = (qc - zmax) + qt
                upl = (qv != 0) & (rQ > 0) & (lamQ >= lo)
                uph = (qv != 0) & (rQ < 0) & (lamQ <= hi)
                lo = tl.where(upl, lamQ, lo)
                hi = tl.where(uph, lamQ, hi)
                hlo = tl.where(upl, xQ, hlo)
                hhi = tl.where(uph, xQ, hhi)
            mid = 0.5 * (lo + hi)
            # Newton proposals (from λ and from the probe); the best one
            pxc, pxt = _two_sum(c, t + dX)
            pxr = (pxc - zmax) + pxt
            okX = (tl.abs(dX) < float("inf")) & (pxr >= lo) & (pxr <= hi)
            bc = pxc
            bt = pxt
            bs1 = s1X
            bs2 = s2X
            bok = okX
            if BIG:
                # The Newton step, unless it is a small part of the bracket (entries
                # just inside the support make −g' huge there): then false
                # position on h (Illinois); the midpoint probe keeps halving [lo, hi].
                fp = lo + hlo / (hlo - hhi) * (hi - lo)
                fp = tl.where((tl.abs(fp) < float("inf")) & (fp >= lo) & (fp <= hi), fp, mid)
                fc_, ft_ = _two_sum(zmax, fp)
                useN = okX & (tl.abs(dX) * 64.0 > (hi - lo))
                bc = tl.where(useN, pxc, fc_)
                bt = tl.where(useN, pxt, ft_)
                bok = tl.full((), 1, tl.int1)
            elif PROBE:
                pqc, pqt = _two_sum(qc, qt + dQ)
                pqr = (pqc - zmax) + pqt
                okQ = (qv != 0) & (tl.abs(dQ) < float("inf")) & (pqr >= lo) & (pqr <= hi)
                if FAM == 4:  # the probe is above the root: its iterate is the better one
                    useQ = okQ & (rQ < 0)
                else:
                    useQ = okQ & ((~okX) | (tl.abs(dQ) < tl.abs(dX)))
                bc = tl.where(useQ, pqc, bc)
                bt = tl.where(useQ, pqt, bt)
                bs1 = tl.where(useQ, s1Q, bs1)
                bs2 = tl.where(useQ, s2Q, bs2)
                bok = okX | useQ
            mc, mt = _two_sum(zmax, mid)
            # ---- stopping rules, most specific first; (fc, ft) is the answer
            stop = rX == 0
            fc = c
            ft = t
            if PROBE:
                s = (~stop) & (qv != 0) & (rQ == 0)
                fc = tl.where(s, qc, fc)
                ft = tl.where(s, qt, ft)
                stop = stop | s
            if FAM == 1 or FAM == 4 or FAM == 6 or FAM == 7:
                # λ came from the exact root of a piece that it lies on: exact;
                # this pass's own proposal (same piece, computed next to λ) polishes it.
                s = (~stop) & (newt != 0) & (s1X == ps1) & (s2X == ps2)
                fc = tl.where(s & okX, pxc, fc)
                ft = tl.where(s & okX, pxt, ft)
                stop = stop | s
            if FAM == 2:
                s = (~stop) & (cntC == pcnt)
                fc = tl.where(s, cc, fc)
                ft = tl.where(s, ct, ft)
                stop = stop | s
            if FAM == 4:
                # an iterate from above that reaches or passes the root (rounding)
                s = (~stop) & (newt != 0) & ((rX > 0) | (s1X >= k))
                stop = stop | s
            if not BIG:
                s = (~stop) & (tl.abs(dX) < float("inf")) & (tl.abs(dX) <= tol)
                fc = tl.where(s, pxc, fc)
                ft = tl.where(s, pxt, ft)
                stop = stop | s
            s = (~stop) & ((hi - lo) <= (2.0 * tol if BIG else tol))
            fc = tl.where(s, tl.where(bok, bc, mc), fc)
            ft = tl.where(s, tl.where(bok, bt, mt), ft)
            stop = stop | s
            # ---- next point: Newton while allowed and inside the bracket, else bisection
            go = bok & (it < NEWTON_CAP)
            s = (~stop) & (~go) & ((mid <= lo) | (mid >= hi))
            fc = tl.where(s, mc, fc)
            ft = tl.where(s, mt, ft)
            stop = stop | s
            if FAM == 2:
                cc, ct = _two_sum(c, t + xX)
                pcnt = tl.where((tl.abs(xX) < float("inf")), s1X, -1.0)
            nc = tl.where(go, bc, mc)
            nt = tl.where(go, bt, mt)
            if PROBE:
                nr = (nc - zmax) + nt
                qn = mid
                if FAM == 4:
                    qn = 0.5 * (lo + nr)
                qv = tl.where(go & (qn > lo) & (qn < hi) & (qn != nr), 1, 0)
                qc, qt = _two_sum(zmax, qn)
            newt = tl.where(go, 1, 0)
            ps1 = bs1
            ps2 = bs2
            c = tl.where(stop, fc, nc)
            t = tl.where(stop, ft, nt)
            done = tl.where(stop, 1, 0)
    if WRITE_ITS:
        tl.store(ITS + row, it)

    # ---- last pass: p
    if ONCHIP:
        offs = tl.arange(0, BLOCK)
        fin = zrow > float("-inf")
        p = tl.where(fin, _f((zrow - c) - t, FAM, alpha), 0.0)
        filled = tl.where(broken, float("nan"), tl.where(fin, 1.0, 0.0))
        p = tl.where(active, p, filled)
        tl.store(yr + offs, p.to(Y.dtype.element_ty), mask=offs < n)
    else:
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(xr + offs, mask=offs < n, other=float("-inf")).to(tl.float32) * inv_tau
            fin = z > float("-inf")
            p = tl.where(fin, _f((z - c) - t, FAM, alpha), 0.0)
            filled = tl.where(broken, float("nan"), tl.where(fin, 1.0, 0.0))
            p = tl.where(active, p, filled)
            tl.store(yr + offs, p.to(Y.dtype.element_ty), mask=offs < n)


# ----------------------------------------------------------------- backward
@triton.jit
def threshold_bwd_kernel(P, G, DX, n, inv_tau, alpha, FAM: tl.constexpr, BLOCK: tl.constexpr,
                         ONCHIP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if ONCHIP:
        offs = tl.arange(0, BLOCK)
        p = tl.load(P + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
        g = tl.load(G + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
        d = _d_from_p(p, FAM, alpha)
        tot = tl.sum(d, 0)
        coef = tl.where(tot > 0, tl.sum(d * g, 0) / tl.where(tot > 0, tot, 1.0), 0.0)
        tl.store(DX + row * n + offs, (d * (g - coef) * inv_tau).to(DX.dtype.element_ty), mask=offs < n)
    else:
        sdg = tl.zeros([BLOCK], tl.float32)
        sd = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p = tl.load(P + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
            g = tl.load(G + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
            d = _d_from_p(p, FAM, alpha)
            sdg += d * g
            sd += d
        tot = tl.sum(sd, 0)
        coef = tl.where(tot > 0, tl.sum(sdg, 0) / tl.where(tot > 0, tot, 1.0), 0.0)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            p = tl.load(P + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
            g = tl.load(G + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
            d = _d_from_p(p, FAM, alpha)
            tl.store(DX + row * n + offs, (d * (g - coef) * inv_tau).to(DX.dtype.element_ty), mask=offs < n)
