r"""Per-family arithmetic of the Triton kernels, on float32 entries.

``_f`` is the map f(u), ``_d_from_p`` is f′(u) read off p = f(u) (the same
formulas as ``Family.d_from_p``; entmax's α enters as ``am1`` = α − 1,
passed as such so that α near 1 keeps its relative precision), ``_f_inv``
and ``_tail`` form f′ from u for the families with ``Family.slope_from_x``,
and ``_init``/``_acc``/``_red``/``_fin`` are the sums over a row that the λ search evaluates at one point λ = c + t
(see :mod:`softk._backends.triton.search`).  Every function branches on the constexpr
family id ``FAM``, compared with the named ids of :mod:`.ids` (the values of
:data:`softk.threshold.families.KERNEL_IDS`), so a compiled kernel holds one
family's code only.
"""

import triton
import triton.language as tl

from .ids import ENTMAX, ENTMAX15, EXP, LAPLACE, SIGMOID, SOFTMAX, SPARSE, SPARSEMAX

LOG2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _log1p(e):
    # log(1 + e) for e > −1, accurate for tiny |e| (Goldberg's trick: the
    # rounding of 1 + e cancels in log(w)·e/(w − 1)), with no log1p intrinsic
    w = 1.0 + e
    return tl.where(w == 1.0, e, tl.log(w) * (e / tl.where(w == 1.0, 1.0, w - 1.0)))


# ---------------------------------------------------------------- f and f′
@triton.jit
def _f(u, FAM: tl.constexpr, am1):
    if FAM == SOFTMAX:
        r = tl.exp(u)
    elif FAM == SPARSEMAX:
        r = tl.maximum(u, 0.0)
    elif FAM == ENTMAX15:
        h = tl.maximum(u, 0.0) * 0.5
        r = h * h
    elif FAM == ENTMAX:
        s = tl.maximum(am1 * u, 0.0)
        r = tl.where(s > 0, tl.exp(tl.log(tl.where(s > 0, s, 1.0)) / am1), 0.0)
    elif FAM == EXP:
        r = tl.exp(tl.minimum(u, 0.0))
    elif FAM == SIGMOID:
        r = 1.0 / (1.0 + tl.exp(-u))
    elif FAM == LAPLACE:
        r = tl.where(u >= 0, 1.0 - 0.5 * tl.exp(-tl.abs(u)), 0.5 * tl.exp(-tl.abs(u)))
    else:
        r = tl.minimum(tl.maximum(u, 0.0), 1.0)
    return r


@triton.jit
def _written(p, u, tol, Y, FAM: tl.constexpr):
    """p = f(u) as the maps store it in Y's dtype (``Family.written``): the
    exp family's entries at u ≤ tol at most the largest float of that dtype
    below 1, which the store's rounding to nearest could make 1 (read as
    saturated, f′ = 0, by the backward).  ``tol``: λ's resolution in the
    search that found it (0 for a closed form): an entry within it of the
    kink is taken as unsaturated, as it is in the generic case (the k-th
    entry of a row with a gap after it, ties there included).  The sparse
    family's entries below 1 in the registers (clip(u, 0, 1) is 1 exactly
    from the kink on) stay below 1 in a half-precision store, as the torch
    path's ``output`` keeps them."""
    if FAM == SPARSE:
        ty = Y.dtype.element_ty
        if ty == tl.bfloat16:
            p = tl.where(p < 1.0, tl.minimum(p, 0.99609375), p)  # 1 − 2^-8
        elif ty == tl.float16:
            p = tl.where(p < 1.0, tl.minimum(p, 0.99951171875), p)  # 1 − 2^-11
    if FAM == EXP:
        ty = Y.dtype.element_ty
        if ty == tl.bfloat16:
            b = 0.99609375  # 1 − 2^-8
        elif ty == tl.float16:
            b = 0.99951171875  # 1 − 2^-11
        else:
            b = 0.999999940395355224609375  # 1 − 2^-24 (float32 registers)
        p = tl.where(u <= tol, tl.minimum(p, b), p)
    return p


@triton.jit
def _d_from_p(p, FAM: tl.constexpr, am1):
    if FAM == SOFTMAX:
        d = p
    elif FAM == SPARSEMAX:
        d = tl.where(p > 0, 1.0, 0.0)
    elif FAM == ENTMAX15:
        d = tl.sqrt(p)
    elif FAM == ENTMAX:
        d = tl.where(p > 0, tl.exp((1.0 - am1) * tl.log(tl.where(p > 0, p, 1.0))), 0.0)
    elif FAM == EXP:
        d = tl.where(p < 1, p, 0.0)
    elif FAM == SIGMOID:
        d = p * (1.0 - p)
    elif FAM == LAPLACE:
        d = tl.minimum(p, 1.0 - p)
    else:
        d = tl.where((p > 0) & (p < 1), 1.0, 0.0)
    return d


@triton.jit
def _f_inv(p, FAM: tl.constexpr):
    """u = f⁻¹(p) for 0 < p < 1, of the families whose backward anchors u at
    an entry near p = ½ (``Family.f_inv`` of sigmoid and laplace)."""
    if FAM == SIGMOID:
        u = tl.log(p / (1.0 - p))
    else:
        u = tl.where(p <= 0.5, tl.log(2.0 * p), -tl.log(2.0 * (1.0 - p)))
    return u


@triton.jit
def _tail(u, FAM: tl.constexpr):
    """(f(−|u|), f′(u)) of sigmoid and laplace: each entry's share of its
    tail of Σf (f(u) + f(−u) = 1), and the slope (``Family.residual``,
    ``Family.df``), both from e^{−|u|}, which keeps its relative precision
    on both sides of λ."""
    e = tl.exp(-tl.abs(u))
    if FAM == SIGMOID:
        t = e / (1.0 + e)
        d = t * (1.0 - t)
    else:
        t = 0.5 * e
        d = t
    return t, d


@triton.jit
def _log_tail(u, FAM: tl.constexpr):
    """The logarithms of :func:`_tail`'s (f(−|u|), f′(u)), finite where
    e^{−|u|} underflows (|u| > 104 in float32): the backward's tails, summed
    as logs where every share of one underflows."""
    a = tl.abs(u)
    if FAM == SIGMOID:
        l1 = tl.log(1.0 + tl.exp(-a))
        lt = -a - l1
        ld = lt - l1
    else:
        lt = -a - 0.6931471805599453
        ld = lt
    return lt, ld


# ------------------------------------------- per-family sums over the row
# The sums at λ = c + t are kept per lane ([ROWS, BLOCK] blocks: ROWS rows of
# BLOCK lanes) and reduced along the row once per pass (_red), to [ROWS, 1]
# columns, one value per row.  Sums of exponentials carry a running max per
# row (a [ROWS, 1] column, raised block by block; the lane sums are rescaled
# when it moves), so each block costs one max reduction per such sum and no
# per-entry rescaling.  Nothing here mixes rows: every reduction is along axis 1.
# _fin turns the row's sums into (r = g − k, d = proposed step, s1, s2 =
# counts that identify the piece of g, x = family extra).
@triton.jit
def _init(FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    v = tl.zeros([ROWS, BLOCK], tl.float32)
    ninf = tl.full([ROWS, 1], float("-inf"), tl.float32)
    if FAM == EXP:
        acc = (v, ninf, v)
    elif FAM == SIGMOID or FAM == LAPLACE:
        acc = (v, ninf, v, v, ninf, v, v)  # type: ignore[assignment]  # FAM is a constexpr: one branch is compiled
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
def _acc(z, c, t, am1, acc, FAM: tl.constexpr):
    fin = z > float("-inf")
    u = (z - c) - t
    if FAM == SPARSEMAX:
        sup = fin & (u > 0)
        acc = (acc[0] + sup.to(tl.float32), acc[1] + tl.where(sup, u, 0.0), acc[2])
    elif FAM == ENTMAX15:
        w = tl.where(fin & (u > 0), u, 0.0)
        acc = (acc[0] + (w > 0).to(tl.float32), acc[1] + w, acc[2] + w * w)
    elif FAM == ENTMAX:
        y = tl.where(fin, tl.maximum(am1 * u, 0.0), 0.0)
        pos = y > 0
        ys = tl.where(pos, y, 1.0)
        fy = tl.where(pos, tl.exp(tl.log(ys) / am1), 0.0)
        acc = (acc[0] + fy, acc[1] + fy / ys, acc[2])  # g, −g' = Σ y^(q−1)
    elif FAM == EXP:
        sat = fin & (u >= 0)
        low = fin & (u < 0)
        M, a, Ms = _rescale(acc[1], tl.max(tl.where(low, u, float("-inf")), 1, keep_dims=True))
        acc = (acc[0] + sat.to(tl.float32), M, acc[2] * a + tl.where(low, tl.exp(u - Ms), 0.0))
    elif FAM == SIGMOID or FAM == LAPLACE:
        up = fin & (u >= 0)
        low = fin & (u < 0)
        y = -tl.abs(u)
        Ma, aa, Mas = _rescale(acc[1], tl.max(tl.where(low, y, float("-inf")), 1, keep_dims=True))
        Mb, ab, Mbs = _rescale(acc[4], tl.max(tl.where(up, y, float("-inf")), 1, keep_dims=True))
        Mside = tl.where(low, Mas, Mbs)
        ee = tl.where(fin, tl.exp(y - Mside), 0.0)  # e^{−|u|} / e^{M(side)}
        if FAM == SIGMOID:
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
def _rsum(v):
    # a row's sum over its lanes, kept as a [ROWS, 1] column
    return tl.sum(v, 1, keep_dims=True)


@triton.jit
def _red(acc, FAM: tl.constexpr):
    if FAM == EXP:
        r = (_rsum(acc[0]), acc[1], _rsum(acc[2]))
    elif FAM == SIGMOID or FAM == LAPLACE:
        r = (_rsum(acc[0]), acc[1], _rsum(acc[2]), _rsum(acc[3]), acc[4], _rsum(acc[5]), _rsum(acc[6]))  # type: ignore[assignment]
    else:
        r = (_rsum(acc[0]), _rsum(acc[1]), _rsum(acc[2]))
    return r


@triton.jit
def _fin_two_sided(acc, k, FAM: tl.constexpr):
    # sigmoid and laplace: A = Σ_{u<0} f and B = Σ_{u≥0} (1 − f), each kept as
    # (running max, sum at that max) so that neither underflows; r = g − k and
    # the proposed step d.
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
    if FAM == SIGMOID:
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
    return r, d


@triton.jit
def _fin(acc, k, q, FAM: tl.constexpr):
    # s1, s2: the counts that identify the piece of g (support, saturated,
    # linear); x: entmax15's closed-form candidate step, entmax α's h
    s1 = acc[0]
    s2 = tl.zeros_like(acc[0])  # [ROWS, 1]: loop-carried through the search
    x = tl.zeros_like(acc[0])
    if FAM == SPARSEMAX:
        r = acc[1] - k
        d = r / s1
    elif FAM == ENTMAX15:
        cnt = acc[0]
        W1 = acc[1]
        g = acc[2] * 0.25
        r = g - k
        rg = tl.sqrt(g)
        d = 4.0 * (rg - tl.sqrt(k)) * rg / W1  # Newton on √g
        # closed form on this support: Σ (w − δ)² = 4k, the smaller root;
        # +inf (no candidate) where the discriminant's cancellation leaves it
        # more than 4 EPS of the support's scale off (see lean._lean_delta)
        D = tl.maximum(W1 * W1 - 4.0 * cnt * r, 0.0)
        x = 4.0 * r / (W1 + tl.sqrt(D))
        x = tl.where(tl.abs(x) * W1 * cnt <= 8.0 * D, x, float("inf"))
    elif FAM == ENTMAX:
        g = acc[0]
        r = g - k
        # Newton on h = g^(1/q) − k^(1/q): Δ = q h g^(1−1/q) / (−g')
        lg = tl.log(g)
        x = tl.exp(lg / q) - tl.exp(tl.log(k) / q)  # h, for false position (α > 2)
        d = q * x * tl.exp(lg - lg / q) / acc[1]
        s1 = tl.zeros_like(acc[0])
    elif FAM == EXP:
        ns = acc[0]
        M = acc[1]
        S = acc[2]
        r = (ns - k) + tl.exp(M) * S
        d = M + tl.log(S) - tl.log(k - ns)  # NaN/inf when ns ≥ k or nothing unsaturated
    elif FAM == SIGMOID or FAM == LAPLACE:
        r, d = _fin_two_sided(acc, k, FAM)  # s1: entries at or above λ
    else:
        nl = acc[1]
        r = (acc[0] - k) + acc[2]
        d = r / nl
        s2 = nl
    return r, d, s1, s2, x
