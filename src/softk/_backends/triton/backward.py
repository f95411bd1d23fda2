r"""The backward kernel, from the saved p: dx = d (g − Σdg/Σd)/τ with
d = f′(u) read off p (``_d_from_p``), ``ROWS`` rows per program (as in the
forward kernel: [ROWS, BLOCK] tiles, per-row sums as [ROWS, 1] columns, rows
past ``R`` masked off); a row holding a NaN p gets a NaN dx.  On-chip rows
are read once; wider rows twice (the two sums, then dx), in blocks of
``BLOCK``.

``LOGD`` (α-entmax with α > 2, where d = p^(2−α) spans more than float32
holds: 1e58 at p = 0.06, α = 50, and g − Σdg/Σd cancels to nothing) takes
the log-slope form of :func:`softk._backends.torch.threshold.vjp_from_log_slope`:
with log d = (2 − α) log p, w = d/Σd and m the entry of largest d,

.. math:: dx_i = d_i\bigl((g_i - g_m) - \textstyle\sum_j w_j (g_j - g_m)\bigr), \qquad
          dx_m = \textstyle\sum_{j \ne m} e^{\log d_m + \log d_j - \log\Sigma d}\,(g_m - g_j),

divided by τ; no cancellation, and exact where d overflows only because the
Jacobian itself does.  Three reads of p and g on looped rows, one on chip.

``FROM_X`` (the families with ``Family.slope_from_x``: sigmoid and laplace,
whose f′ ≈ 1 − p near p = 1 is lost to p's rounding) reads the input x as
well and forms d = f′(u) from u = (x − x_j)/τ + f⁻¹(p_j), j the entry
whose p_j holds u best, a normal p ≤ ½ where the row has one
(:func:`softk._backends.torch.threshold.anchored_slope`): one
read of p, x and g on chip; on looped rows a read of p and x for the anchor,
then two of x and g, as the other families read p and g.  ``REFINE`` (the
budget k given) refines the anchor on a row whose every p lies above ½ by
two Newton steps on Σf(u) = k over the tails (two more reads of x on
looped rows, taken only where such a row is).
"""

import triton
import triton.language as tl

from .family_math import _d_from_p, _f_inv, _log_tail, _tail
from .prelude import _shift_scale

IBIG = tl.constexpr(2147483647)


@triton.jit
def _load_d_g(P, G, base, rmask, cols, n, am1, FAM: tl.constexpr):
    mask = rmask & (cols < n)
    p = tl.load(P + base + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + base + cols, mask=mask, other=0.0).to(tl.float32)
    # a NaN p (a NaN/+inf row) gives NaN d, so the row's sums and its whole
    # dx are NaN, torch.softmax's convention (_d_from_p alone maps it to 0
    # for the families whose d is a comparison)
    return tl.where(p != p, p, _d_from_p(p, FAM, am1)), g


@triton.jit
def _coef(sdg, sd):
    # Σdg/Σd per row, and 0 on a row with Σd = 0 (filled rows: p is 0/1 there)
    tot = tl.sum(sd, 1, keep_dims=True)
    return tl.where(tot > 0, tl.sum(sdg, 1, keep_dims=True) / tl.where(tot > 0, tot, 1.0), 0.0)


@triton.jit
def _store_dx(DX, base, rmask, cols, n, d, g, coef, inv_tau):
    tl.store(DX + base + cols, (d * (g - coef) * inv_tau).to(DX.dtype.element_ty), mask=rmask & (cols < n))


# ------------------------------------------------------------ log-slope form
@triton.jit
def _load_logd_g(P, G, base, rmask, cols, n, am1):
    mask = rmask & (cols < n)
    p = tl.load(P + base + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + base + cols, mask=mask, other=0.0).to(tl.float32)
    logd = tl.where(p > 0, (1.0 - am1) * tl.log(tl.where(p > 0, p, 1.0)), tl.where(p != p, p, float("-inf")))
    return logd, g, (p != p).to(tl.float32)


@triton.jit
def _argmax_pick(bv, bg, bi):
    # the row's largest log d, the lowest index holding it and its g
    M = tl.max(bv, 1, keep_dims=True)
    idx = tl.min(tl.where(bv == M, bi, IBIG), 1, keep_dims=True)
    gm = tl.sum(tl.where((bi == idx) & (bv == M), bg, 0.0), 1, keep_dims=True)
    return M, idx, gm


@triton.jit
def _logd_terms(logd, g, M, lse, gm, idx, cols):
    # per lane: w_j (g_j − g_m) and, off m, e^{log d_m + log d_j − lse}(g_m − g_j)
    w = tl.exp(logd - lse)
    dm = tl.where(cols != idx, tl.exp((M + logd) - lse) * (gm - g), 0.0)
    return tl.where(logd > float("-inf"), w * (g - gm), 0.0), tl.where(logd > float("-inf"), dm, 0.0)


@triton.jit
def _store_dx_logd(DX, base, rmask, cols, n, logd, g, gm, S1, dm, idx, ok, bad, inv_tau):
    out = tl.where(logd > float("-inf"), tl.exp(logd) * ((g - gm) - S1), 0.0)
    out = tl.where(cols == idx, dm, out)
    out = tl.where(bad > 0, float("nan"), tl.where(ok, out, 0.0))
    tl.store(DX + base + cols, (out * inv_tau).to(DX.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def _bwd_logd(P, G, DX, base, rmask, n, inv_tau, am1, ROWS: tl.constexpr, BLOCK: tl.constexpr,
              ONCHIP: tl.constexpr):
    if ONCHIP:
        cols = tl.arange(0, BLOCK)[None, :]
        logd, g, nanp = _load_logd_g(P, G, base, rmask, cols, n, am1)
        bad = tl.max(nanp, 1, keep_dims=True)
        M, idx, gm = _argmax_pick(logd, g, cols + tl.zeros_like(logd).to(tl.int32))
        Ms = tl.where((M > float("-inf")) & (M < float("inf")), M, 0.0)
        lse = Ms + tl.log(tl.sum(tl.exp(logd - Ms), 1, keep_dims=True))
        t1, t2 = _logd_terms(logd, g, M, lse, gm, idx, cols)
        S1 = tl.sum(t1, 1, keep_dims=True)
        dm = tl.sum(t2, 1, keep_dims=True)
        ok = (lse > float("-inf")) & (lse < float("inf"))
        _store_dx_logd(DX, base, rmask, cols, n, logd, g, gm, S1, dm, idx, ok, bad, inv_tau)
    else:
        # read 1: the lse of log d (running max per row) and the argmax per lane
        M = tl.full([ROWS, 1], float("-inf"), tl.float32)
        S = tl.zeros([ROWS, BLOCK], tl.float32)
        bv = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
        bg = tl.zeros([ROWS, BLOCK], tl.float32)
        bi = tl.zeros([ROWS, BLOCK], tl.int32) + IBIG
        badl = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            logd, g, nanp = _load_logd_g(P, G, base, rmask, cols, n, am1)
            badl = tl.maximum(badl, nanp)
            Mn = tl.maximum(M, tl.max(tl.where(logd == logd, logd, float("-inf")), 1, keep_dims=True))
            Mns = tl.where(Mn > float("-inf"), Mn, 0.0)
            S = S * tl.where(M > float("-inf"), tl.exp(M - Mns), 0.0) + tl.exp(logd - Mns)
            M = Mn
            upd = logd > bv
            bv = tl.where(upd, logd, bv)
            bg = tl.where(upd, g, bg)
            bi = tl.where(upd, cols + tl.zeros_like(bi), bi)
        bad = tl.max(badl, 1, keep_dims=True)
        Ms = tl.where(M > float("-inf"), M, 0.0)
        lse = Ms + tl.log(tl.sum(S, 1, keep_dims=True))
        M, idx, gm = _argmax_pick(bv, bg, bi)
        # read 2: the two sums
        s1 = tl.zeros([ROWS, BLOCK], tl.float32)
        s2 = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            logd, g, _ = _load_logd_g(P, G, base, rmask, cols, n, am1)
            t1, t2 = _logd_terms(logd, g, M, lse, gm, idx, cols)
            s1 += t1
            s2 += t2
        S1 = tl.sum(s1, 1, keep_dims=True)
        dm = tl.sum(s2, 1, keep_dims=True)
        ok = (lse > float("-inf")) & (lse < float("inf"))
        # read 3: dx
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            logd, g, _ = _load_logd_g(P, G, base, rmask, cols, n, am1)
            _store_dx_logd(DX, base, rmask, cols, n, logd, g, gm, S1, dm, idx, ok, bad, inv_tau)


# ---------------------------------------------- slope from the input
@triton.jit
def _load_pxm(P, X, base, rmask, cols, n):
    # p, x (−inf past the row: d = 0 there) and the key by which the anchor
    # is chosen (torch.threshold.anchored_slope): 1 + p for a normal p ≤ ½,
    # 1 − p above ½, p/tiny for a subnormal p (tiny: P's dtype's smallest
    # normal); −1 (never the anchor) at p = 0, 1 or NaN; x where p rounded
    # to 1 (+inf elsewhere), for a row of 0s and 1s; and 1 where x is finite
    mask = rmask & (cols < n)
    p = tl.load(P + base + cols, mask=mask, other=0.0).to(tl.float32)
    x = _load_x(X, base, rmask, cols, n)
    if P.dtype.element_ty == tl.float16:
        tiny = 6.103515625e-05  # 2^-14
    else:
        tiny = 1.1754943508222875e-38  # 2^-126: float32 and bfloat16
    key = tl.where(p > 0.5, 1.0 - p, tl.where(p >= tiny, 1.0 + p, p * (1.0 / tiny)))
    return (p, x, tl.where((p > 0) & (p < 1.0), key, -1.0), tl.where(p == 1.0, x, float("inf")),
            (x > float("-inf")).to(tl.float32))


@triton.jit
def _anchor(P, bm, bp, bx, bi, bo, bf, k, FAM: tl.constexpr, REFINE: tl.constexpr):
    # the row's anchor (the lowest index among ties): whether it lies
    # strictly inside (0, 1), f⁻¹(p_j), x_j, and whether to refine it, as
    # [ROWS, 1] columns.  With ``REFINE``, a row of 0s and 1s anchors at its
    # lowest x whose p rounded to 1 (``bo``), at u = −f⁻¹(ε/4), where
    # rounding to 1 begins (ε: P's dtype's), and is refined, unless it has
    # at most k finite entries (``bf`` counts them): p = 1 fills those
    # exactly, and d = 0
    M = tl.max(bm, 1, keep_dims=True)
    idx = tl.min(tl.where(bm == M, bi, IBIG), 1, keep_dims=True)
    at = (bi == idx) & (bm == M)
    pj = tl.sum(tl.where(at, bp, 0.0), 1, keep_dims=True)
    xj = tl.sum(tl.where(at, bx, 0.0), 1, keep_dims=True)
    inside = M > 0
    c = _f_inv(tl.where(inside, pj, 0.5), FAM)
    refine = inside & (M < 1.0)
    if REFINE:
        xo = tl.min(bo, 1, keep_dims=True)
        alone = (M <= 0) & (xo < float("inf")) & (tl.sum(bf, 1, keep_dims=True) > k)
        if P.dtype.element_ty == tl.float16:
            eps = 0.0009765625  # 2^-10
        elif P.dtype.element_ty == tl.bfloat16:
            eps = 0.0078125  # 2^-7
        else:
            eps = 1.1920928955078125e-07  # 2^-23
        c = tl.where(alone, -_f_inv(tl.zeros_like(c) + 0.25 * eps, FAM), c)
        xj = tl.where(alone, xo, xj)
        refine = refine | alone
        inside = inside | alone
    # (x_j = 0 off such rows, where it may be −inf: no −inf − −inf below)
    return inside, c, tl.where(inside, xj, 0.0), refine


@triton.jit
def _load_x(X, base, rmask, cols, n):
    return tl.load(X + base + cols, mask=rmask & (cols < n), other=float("-inf")).to(tl.float32)


@triton.jit
def _slope_x(x, inside, c, xj, inv_tau, bad, FAM: tl.constexpr):
    # d = f′(u), u = (x − x_j)/τ + f⁻¹(p_j); 0 on a row with no p inside
    # (0, 1); NaN on a row whose p is NaN (``bad``: a NaN or +inf score), so
    # that its sums and its whole dx are NaN
    u = tl.where(inside, _shift_scale(x, xj, inv_tau) + c, 0.0)
    return tl.where(bad, float("nan"), tl.where(inside, _tail(u, FAM)[1], 0.0))


@triton.jit
def _tail_terms(x, xj, c, inv_tau, FAM: tl.constexpr):
    # per lane: the tails' shares below and above λ, their slopes, and the
    # count above (``Family.residual``; past the row x = −inf adds nothing)
    u = _shift_scale(x, xj, inv_tau) + c
    up = u >= 0
    t, d = _tail(u, FAM)
    return tl.where(up, 0.0, t), tl.where(up, t, 0.0), tl.where(up, 0.0, d), tl.where(up, d, 0.0), up.to(tl.float32)


@triton.jit
def _log_terms(x, xj, c, inv_tau, FAM: tl.constexpr):
    # per lane: log f(−|u|) and log f′(u) on each side of λ (−inf off it)
    u = _shift_scale(x, xj, inv_tau) + c
    up = u >= 0
    lt, ld = _log_tail(u, FAM)
    ninf = float("-inf")
    return tl.where(up, ninf, lt), tl.where(up, ninf, ld), tl.where(up, lt, ninf), tl.where(up, ld, ninf)


@triton.jit
def _log_acc(m, st, sd, lt, ld):
    # a side's running maximum of log f(−|u|) per lane, and its two sums
    # relative to it (the online log-sum-exp)
    mn = tl.maximum(m, lt)
    ms = tl.where(mn > float("-inf"), mn, 0.0)
    keep = tl.where(m > float("-inf"), tl.exp(m - ms), 0.0)
    return mn, st * keep + tl.exp(lt - ms), sd * keep + tl.exp(ld - ms)


@triton.jit
def _log_side(m, st, sd, extra):
    # (log T, Σf′/T) of the side's tail T = Σ e^{log f(−|u|)} + extra from its
    # lanes' maxima and sums (Family.residual with logspace)
    M = tl.max(m, 1, keep_dims=True)
    Ms = tl.where(M > float("-inf"), M, 0.0)
    w = tl.where(m > float("-inf"), tl.exp(m - Ms), 0.0)
    t = tl.sum(st * w, 1, keep_dims=True)
    d = tl.sum(sd * w, 1, keep_dims=True)
    ex = tl.exp(tl.log(extra) - Ms)
    total = t + ex
    log_t = tl.where(ex == float("inf"), tl.log(extra), Ms + tl.log(total))
    return log_t, tl.where(total > 0, d / tl.where(total > 0, total, 1.0), 0.0)


@triton.jit
def _newton_c(c, ta, tb, da, db, cnt, k, refine, ma, sta, sda, mb, stb, sdb):
    # one Newton step of the anchor's f⁻¹(p_j) on Σf(u) = k, on the log-ratio
    # of the tails (the λ search's residual), on the rows that ``refine``;
    # where a tail's every share underflowed, on the tails summed as logs
    # (ma, sta, sda and mb, stb, sdb: _log_acc's per lane)
    a = tl.maximum(tl.sum(cnt, 1, keep_dims=True) - k, 0.0)
    b = tl.maximum(k - tl.sum(cnt, 1, keep_dims=True), 0.0)
    A = tl.sum(ta, 1, keep_dims=True) + a
    B = tl.sum(tb, 1, keep_dims=True) + b
    ok = refine & (A > 0) & (B > 0)
    As = tl.where(ok, A, 1.0)
    Bs = tl.where(ok, B, 1.0)
    r = tl.log(As) - tl.log(Bs)
    s = tl.sum(da, 1, keep_dims=True) / As + tl.sum(db, 1, keep_dims=True) / Bs
    la, sa = _log_side(ma, sta, sda, a)
    lb, sb = _log_side(mb, stb, sdb, b)
    lost = refine & ~ok & (la > float("-inf")) & (lb > float("-inf"))
    r = tl.where(lost, la - lb, r)
    s = tl.where(lost, sa + sb, s)
    return c - tl.where((ok | lost) & (s > 0), r / tl.where(s > 0, s, 1.0), 0.0)


@triton.jit
def _load_g(G, base, rmask, cols, n):
    return tl.load(G + base + cols, mask=rmask & (cols < n), other=0.0).to(tl.float32)


@triton.jit
def _bwd_from_x(P, X, G, DX, base, rmask, n, inv_tau, k, FAM: tl.constexpr, ROWS: tl.constexpr,
                BLOCK: tl.constexpr, ONCHIP: tl.constexpr, REFINE: tl.constexpr):
    if ONCHIP:
        cols = tl.arange(0, BLOCK)[None, :]
        p, x, m, o, f = _load_pxm(P, X, base, rmask, cols, n)
        inside, c, xj, refine = _anchor(P, m, p, x, cols + tl.zeros_like(m).to(tl.int32), o, f, k, FAM, REFINE)
        if REFINE:
            if tl.max(tl.max(refine.to(tl.int32), 1), 0) > 0:
                for _ in range(2):
                    ta, tb, da, db, cnt = _tail_terms(x, xj, c, inv_tau, FAM)
                    lta, lda, ltb, ldb = _log_terms(x, xj, c, inv_tau, FAM)
                    none = tl.full(lta.shape, float("-inf"), tl.float32)
                    zero = tl.zeros(lta.shape, tl.float32)
                    ma, sta, sda = _log_acc(none, zero, zero, lta, lda)
                    mb, stb, sdb = _log_acc(none, zero, zero, ltb, ldb)
                    c = _newton_c(c, ta, tb, da, db, cnt, k, refine, ma, sta, sda, mb, stb, sdb)
        d = _slope_x(x, inside, c, xj, inv_tau, p != p, FAM)
        g = _load_g(G, base, rmask, cols, n)
        _store_dx(DX, base, rmask, cols, n, d, g, _coef(d * g, d), inv_tau)
    else:
        # read 1: the anchor (per lane, then per row)
        bm = tl.full([ROWS, BLOCK], -2.0, tl.float32)
        bp = tl.zeros([ROWS, BLOCK], tl.float32)
        bx = tl.zeros([ROWS, BLOCK], tl.float32)
        bi = tl.zeros([ROWS, BLOCK], tl.int32) + IBIG
        bo = tl.full([ROWS, BLOCK], float("inf"), tl.float32)
        bf = tl.zeros([ROWS, BLOCK], tl.float32)
        badl = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            p, x, m, o, f = _load_pxm(P, X, base, rmask, cols, n)
            bo = tl.minimum(bo, o)
            bf += f
            badl = tl.maximum(badl, (p != p).to(tl.float32))
            upd = m > bm
            bm = tl.where(upd, m, bm)
            bp = tl.where(upd, p, bp)
            bx = tl.where(upd, x, bx)
            bi = tl.where(upd, cols + tl.zeros_like(bi), bi)
        inside, c, xj, refine = _anchor(P, bm, bp, bx, bi, bo, bf, k, FAM, REFINE)
        bad = tl.max(badl, 1, keep_dims=True) > 0
        if REFINE:
            if tl.max(tl.max(refine.to(tl.int32), 1), 0) > 0:
                for _ in range(2):  # two more reads of x
                    ta = tl.zeros([ROWS, BLOCK], tl.float32)
                    tb = tl.zeros([ROWS, BLOCK], tl.float32)
                    da = tl.zeros([ROWS, BLOCK], tl.float32)
                    db = tl.zeros([ROWS, BLOCK], tl.float32)
                    cnt = tl.zeros([ROWS, BLOCK], tl.float32)
                    ma = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
                    mb = tl.full([ROWS, BLOCK], float("-inf"), tl.float32)
                    sta = tl.zeros([ROWS, BLOCK], tl.float32)
                    sda = tl.zeros([ROWS, BLOCK], tl.float32)
                    stb = tl.zeros([ROWS, BLOCK], tl.float32)
                    sdb = tl.zeros([ROWS, BLOCK], tl.float32)
                    for start in range(0, n, BLOCK):
                        cols = start + tl.arange(0, BLOCK)[None, :]
                        xb = _load_x(X, base, rmask, cols, n)
                        a1, b1, a2, b2, c1 = _tail_terms(xb, xj, c, inv_tau, FAM)
                        ta += a1
                        tb += b1
                        da += a2
                        db += b2
                        cnt += c1
                        lta, lda, ltb, ldb = _log_terms(xb, xj, c, inv_tau, FAM)
                        ma, sta, sda = _log_acc(ma, sta, sda, lta, lda)
                        mb, stb, sdb = _log_acc(mb, stb, sdb, ltb, ldb)
                    c = _newton_c(c, ta, tb, da, db, cnt, k, refine, ma, sta, sda, mb, stb, sdb)
        # read 2: the two sums; read 3: dx
        sdg = tl.zeros([ROWS, BLOCK], tl.float32)
        sd = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            d = _slope_x(_load_x(X, base, rmask, cols, n), inside, c, xj, inv_tau, bad, FAM)
            g = _load_g(G, base, rmask, cols, n)
            sdg += d * g
            sd += d
        coef = _coef(sdg, sd)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            d = _slope_x(_load_x(X, base, rmask, cols, n), inside, c, xj, inv_tau, bad, FAM)
            _store_dx(DX, base, rmask, cols, n, d, _load_g(G, base, rmask, cols, n), coef, inv_tau)


@triton.jit
def threshold_bwd_kernel(P, X, G, DX, R, n, inv_tau, am1, k, FAM: tl.constexpr, ROWS: tl.constexpr,
                         BLOCK: tl.constexpr, ONCHIP: tl.constexpr, LOGD: tl.constexpr,
                         FROM_X: tl.constexpr, REFINE: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    base = rows * n
    if LOGD:
        _bwd_logd(P, G, DX, base, rmask, n, inv_tau, am1, ROWS, BLOCK, ONCHIP)
    elif FROM_X:
        _bwd_from_x(P, X, G, DX, base, rmask, n, inv_tau, k, FAM, ROWS, BLOCK, ONCHIP, REFINE)
    elif ONCHIP:
        cols = tl.arange(0, BLOCK)[None, :]
        d, g = _load_d_g(P, G, base, rmask, cols, n, am1, FAM)
        _store_dx(DX, base, rmask, cols, n, d, g, _coef(d * g, d), inv_tau)
    else:
        sdg = tl.zeros([ROWS, BLOCK], tl.float32)
        sd = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            d, g = _load_d_g(P, G, base, rmask, start + tl.arange(0, BLOCK)[None, :], n, am1, FAM)
            sdg += d * g
            sd += d
        coef = _coef(sdg, sd)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            d, g = _load_d_g(P, G, base, rmask, cols, n, am1, FAM)
            _store_dx(DX, base, rmask, cols, n, d, g, coef, inv_tau)
