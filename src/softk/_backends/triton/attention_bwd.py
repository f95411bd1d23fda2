r"""The fused attention backward kernels: p recomputed from q, k, m and λ
(p = f(z − λ), z = s − m formed by :func:`.attention_tiles._shift`), d = f′ read off p (:func:`.family_math._d_from_p`), and
dS_j = d_j (dP_j − δ) with dP_j = dO·v_j, δ = Σ_j d_j dP_j / Σ_j d_j (the
Jacobian diag(d) − d dᵀ/Σd of each row; softmax: d = p, δ = dO·out).  With
a soft cap, dS_j is then multiplied by the cap's slope 1 − tanh²(scale·q·k_j / c)
(:func:`.attention_tiles._cap_slope`, recomputed from the q·k tile) before
the dq and dk products; δ, dv and dα are those of the capped scores.  The
maths and the learned-α term are in :mod:`.attention`.

Two kernels, sharing the tile size (BM queries × BN keys):

* ``attn_bwd_dq_kernel``, one program per query block and head, one sweep
  over the key blocks.  δ is known only once every block has been seen, so
  dS is split around a reference known before the sweep, δ̂ = dO·out
  (out read as float32, whatever its dtype):

  .. math:: dq / \mathrm{scale} = \sum_j d_j (dP_j - \delta) k_j
            = \underbrace{\textstyle\sum_j d_j (dP_j - \hat\delta) k_j}_{\mathrm{acc}_1}
            - (\delta - \hat\delta) \underbrace{\textstyle\sum_j d_j k_j}_{\mathrm{acc}_2}

  (with a soft cap, s_j·d_j in place of d_j in both, s_j the slope).  Each
  live tile costs q·kᵀ, dP = dO·vᵀ and the two products with the keys;
  besides them the sweep sums Σd and Σ d·dP (and, for a learned α,
  Σ p log p, Σ p log p·dP, Γ = Σ p γ(−a log p) and Σ p γ(−a log p)·dP),
  and at its end δ = Σ d·dP / Σd (written for the other kernel), dq and the
  row's dα term.  Why δ̂ and not 0: the operands of the products are
  rounded to the keys' dtype, so what is rounded is d_j (dP_j − δ̂); δ̂ is,
  like δ, an average of dP over the row's support (Σ_j p_j dP_j, up to the
  rounding of out), so a large offset common to the dP_j (values sharing a
  component) cancels before the rounding, as in d_j (dP_j − δ); the
  correction (δ − δ̂)·acc₂ is then small, and formed in float32.  For
  softmax with a float32 out δ̂ is δ, and acc₂, Σd and Σ d·dP are not
  formed.  The keys enter centred on the first key, k_j − k_0 (not
  through a soft cap): Σ_j dS_j = 0 makes that exact, and it keeps an offset
  shared by the keys out of the rounded products.

  The live tiles (p > 0 somewhere; a dead one adds exactly 0 to every sum)
  are decided from p, one byte per tile written to ``TILES`` for the other
  kernel; or, with ``SKIP`` = 2, read from ``TILES`` (the caller's, e.g.
  the forward's): then a dead tile costs no q·kᵀ either, and nothing is
  written (``SKIP`` = 0 computes every tile).  Softmax reads and writes no flags.
* ``attn_bwd_dkdv_kernel``, one program per key block and kv head: the
  query heads of its group and their query blocks (causal: from the
  diagonal on), live tiles only (the flags), accumulating dk and dv without
  atomics; the tile is computed transposed ([keys, queries]), so that its
  products with dO and q need no transposes of the large operands: k·qᵀ,
  pᵀ·dO, v·dOᵀ and dSᵀ·q per live tile.
"""

import triton
import triton.language as tl

from .ids import ENTMAX, SOFTMAX
from .attention_tiles import _any, _cap_slope, _dot, _key_blocks, _load_2d, _p_entmax, _scores, _shift
from .family_math import _d_from_p, _f


@triton.jit
def _p_d(z, lam, alpha, FAM: tl.constexpr):
    # p = f(z − λ) and d = f′ on a tile of z = s − m (0 where z = −inf);
    # α-entmax reads its saved threshold (:func:`.attention_tiles._p_entmax`)
    if FAM == ENTMAX:
        p = tl.where(z > float("-inf"), _p_entmax(z, lam, alpha - 1.0), 0.0)
    else:
        p = tl.where(z > float("-inf"), _f(z - lam, FAM, alpha - 1.0), 0.0)
    return p, _d_from_p(p, FAM, alpha - 1.0)


@triton.jit
def _xlogx(p):
    return tl.where(p > 0, p * tl.log(tl.where(p > 0, p, 1.0)), 0.0)


@triton.jit
def _p_gamma(p, d, am1):
    # p·γ(−a log p), γ(y) = e^y − 1 − y: its series to y¹⁹/19! below y = 1,
    # d − p − p·y above (p·e^y = d = p^(1−a)); the bound and the terms are
    # :func:`softk.threshold.entmax_alpha.p_gamma`'s (GAMMA_SERIES, GAMMA_TERMS)
    y = tl.where(p > 0, -am1 * tl.log(tl.where(p > 0, p, 1.0)), 0.0)
    small = tl.abs(y) < 1.0
    ys = tl.where(small, y, 0.0)
    ser = tl.zeros_like(ys)
    for n in tl.static_range(19, 1, -1):
        ser = (ser + 1.0) * ys / n
    return tl.where(p > 0, tl.where(small, p * ser * ys, d - p - p * y), 0.0)


@triton.jit
def attn_bwd_dq_kernel(Q, K, V, MASK, ALPHA, OUT, DO, M, LAM, DQ, DELTA, DAROW, TILES,
                       sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn,
                       sob, soh, som, sod, sdb, sdh, sdm, sdd,
                       H, GROUP, L, S, E, EV, NKB, scale, softcap, alpha_f,
                       FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
                       SKIP: tl.constexpr, NEED_DALPHA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       EP: tl.constexpr, EVP: tl.constexpr, OUT_F32: tl.constexpr, DQ_HERE: tl.constexpr):
    # SKIP: 0 every tile in range is computed; 1 the live ones, decided from p
    # (the flags written to TILES); 2 the ones TILES marks live (read).
    # DQ_HERE: dq is formed here; else the dk/dv kernel adds it up and this
    # kernel gives δ, dα and the flags only
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    h64 = h.to(tl.int64)
    Kb = K + b * skb + hk * skh
    Vb = V + b * svb + hk * svh
    Mb = MASK + b * smb + h64 * smh
    qstart = pid * BM
    rows = qstart + tl.arange(0, BM)[:, None]  # [BM, 1]
    q = _load_2d(Q + b * sqb + h64 * sqh, rows, sqm, sqd, L, E, EP)
    do = _load_2d(DO + b * sdb + h64 * sdh, rows, sdm, sdd, L, EV, EVP)
    ob = bh.to(tl.int64) * L
    m = tl.load(M + ob + rows, mask=rows < L, other=0.0)
    lam = tl.load(LAM + ob + rows, mask=rows < L, other=float("inf"))
    nkb = _key_blocks(qstart, S, CAUSAL, BM, BN)
    FL = TILES + (bh.to(tl.int64) * tl.num_programs(0) + pid) * NKB
    alpha = tl.full((), 0.0, tl.float32) + alpha_f
    if FAM == ENTMAX:
        alpha = tl.load(ALPHA + h).to(tl.float32)
    # δ̂ = dO·out = Σ_j p_j dP_j, the offset subtracted from dP before the
    # product with the keys (module docstring); δ itself for softmax with a
    # float32 out, where nothing is left to correct
    o = _load_2d(OUT + b * sob + h64 * soh, rows, som, sod, L, EV, EVP).to(tl.float32)
    dhat = tl.sum(do.to(tl.float32) * o, 1, keep_dims=True)
    EXACT: tl.constexpr = FAM == SOFTMAX and OUT_F32
    sd = tl.zeros([BM, 1], tl.float32)
    sdp = tl.zeros([BM, 1], tl.float32)
    hs = tl.zeros([BM, 1], tl.float32)
    gs = tl.zeros([BM, 1], tl.float32)
    pdp = tl.zeros([BM, 1], tl.float32)  # Σ_j p_j dP_j recomputed, for a half out
    gam = tl.zeros([BM, 1], tl.float32)  # Γ = Σ_j p_j γ(−a ℓ_j)
    gdp = tl.zeros([BM, 1], tl.float32)  # Σ_j p_j γ(−a ℓ_j) dP_j
    acc1 = tl.zeros([BM, EP], tl.float32)  # Σ_j d_j (dP_j − δ̂) k_j
    acc2 = tl.zeros([BM, EP], tl.float32)  # Σ_j d_j k_j
    # Σ_j ds_j = 0 on every row, so dq = Σ_j ds_j (k_j − k_0): centred keys
    # keep the rounding of the operands (cast to the keys' dtype for the
    # products) from being multiplied by an offset the keys share.  Not
    # through a soft cap: its slope weighs each ds_j, and the row sum is no longer 0
    ec = tl.arange(0, EP)[None, :]
    kref = tl.zeros([1, EP], tl.float32)
    if not SOFTCAP:
        kref = tl.load(Kb + ec * skd, mask=ec < E, other=0.0).to(tl.float32)
    # softmax with a float32 out and dq formed elsewhere: δ = δ̂, nothing to sweep
    nsweep = nkb
    if not (DQ_HERE or not EXACT):
        nsweep = 0
    for j in range(0, nsweep):
        go = nkb >= 0
        if SKIP == 2:  # the caller's flags: a dead tile costs no q·kᵀ
            go = tl.load(FL + j) != 0
        if go:
            kidx = j * BN + tl.arange(0, BN)[:, None]
            k = _load_2d(Kb, kidx, skn, skd, S, E, EP)
            raw = _dot(q, tl.trans(k))
            t = _scores(raw, rows, j * BN + tl.arange(0, BN)[None, :],
                        L, S, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL, SOFTCAP)
            z = _shift(t, m, scale, MASK_KIND)
            p, d = _p_d(z, lam, alpha, FAM)
            live = nkb >= 0
            if SKIP != 2:
                if SKIP == 1:
                    live = _any(p > 0)
                if FAM != SOFTMAX:  # for the dk/dv kernel
                    tl.store(FL + j, tl.where(live, 1, 0).to(tl.int8))
            if live:
                v = _load_2d(Vb, kidx, svn, svd, S, EV, EVP)
                dp = _dot(do, tl.trans(v))
                if not EXACT:
                    sd += tl.sum(d, 1, keep_dims=True)
                    sdp += tl.sum(d * dp, 1, keep_dims=True)
                if NEED_DALPHA:
                    pl = _xlogx(p)
                    hs += tl.sum(pl, 1, keep_dims=True)
                    gs += tl.sum(pl * dp, 1, keep_dims=True)
                    pg = _p_gamma(p, d, alpha - 1.0)
                    gam += tl.sum(pg, 1, keep_dims=True)
                    gdp += tl.sum(pg * dp, 1, keep_dims=True)
                    if not OUT_F32:
                        pdp += tl.sum(p * dp, 1, keep_dims=True)
                if DQ_HERE:
                    ds = d * (dp - dhat)
                    w = d
                    if SOFTCAP:  # dS of the scaled product, through the cap
                        slope = _cap_slope(raw, scale, softcap)
                        ds = ds * slope
                        w = w * slope
                    kc = tl.where(kidx < S, k.to(tl.float32) - kref, 0.0).to(k.dtype)
                    acc1 += _dot(ds.to(k.dtype), kc)
                    if not EXACT:
                        acc2 += _dot(w.to(k.dtype), kc)
    if EXACT:
        delta = dhat
        dq = acc1
    else:
        delta = tl.where(sd > 0, sdp / tl.where(sd > 0, sd, 1.0), 0.0)
        # ds_j = d_j (dP_j − δ) = d_j (dP_j − δ̂) − (δ − δ̂) d_j
        dq = acc1 - (delta - dhat) * acc2
    if NEED_DALPHA:
        am1 = alpha - 1.0
        if OUT_F32:
            pdp = dhat
        # the cancellation-free form (:mod:`.attention`): both terms are O(a²)
        dar = tl.where(sd > 0, (gam * (pdp - am1 * gs) - (1.0 - am1 * hs) * gdp)
                       / (am1 * am1 * tl.where(sd > 0, sd, 1.0)), 0.0)
        tl.store(DAROW + ob + rows, dar, mask=rows < L)
    tl.store(DELTA + ob + rows, delta, mask=rows < L)
    if DQ_HERE:
        c = tl.arange(0, EP)[None, :]
        tl.store(DQ + (ob + rows) * E + c, (dq * scale).to(DQ.dtype.element_ty), mask=(rows < L) & (c < E))


@triton.jit
def attn_bwd_dkdv_kernel(Q, K, V, MASK, ALPHA, DO, M, LAM, DELTA, DK, DV, TILES, DQACC,
                         sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn,
                         sdb, sdh, sdm, sdd,
                         H, HKV, GROUP, L, S, E, EV, NQB, NKB, scale, softcap, alpha_f,
                         FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr, EVP: tl.constexpr,
                         ATOMIC_DQ: tl.constexpr):
    # ATOMIC_DQ: each live tile also adds its dS·(k − k_0)·scale to the
    # float32 rows of DQACC (B·H·L × E) by atomics, in whatever order the
    # programs run: the dq kernel then skips its own products
    kb = tl.program_id(0)
    bhk = tl.program_id(1)
    b = (bhk // HKV).to(tl.int64)
    hk = bhk % HKV
    kstart = kb * BN
    kidx = kstart + tl.arange(0, BN)[:, None]  # [BN, 1]: the keys, as rows of the tile
    k = _load_2d(K + b * skb + hk.to(tl.int64) * skh, kidx, skn, skd, S, E, EP)
    v = _load_2d(V + b * svb + hk.to(tl.int64) * svh, kidx, svn, svd, S, EV, EVP)
    dk = tl.zeros([BN, EP], tl.float32)
    dv = tl.zeros([BN, EVP], tl.float32)
    qb0 = 0
    if CAUSAL:
        qb0 = kstart // BM  # earlier query blocks lie wholly above the diagonal
    ce = tl.arange(0, EP)[None, :]
    kc = k
    if ATOMIC_DQ:  # the keys centred on the first key, as in the dq kernel (not through a soft cap)
        kref = tl.zeros([1, EP], tl.float32)
        if not SOFTCAP:
            kref = tl.load(K + b * skb + hk.to(tl.int64) * skh + ce * skd, mask=ce < E, other=0.0).to(tl.float32)
        kc = tl.where(kidx < S, k.to(tl.float32) - kref, 0.0).to(k.dtype)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        h64 = h.to(tl.int64)
        bh = b * H + h64
        alpha = tl.full((), 0.0, tl.float32) + alpha_f
        if FAM == ENTMAX:
            alpha = tl.load(ALPHA + h).to(tl.float32)
        Mb = MASK + b * smb + h64 * smh
        for qb in range(qb0, NQB):
            live = qb >= 0
            if FAM != SOFTMAX:
                live = tl.load(TILES + (bh * NQB + qb) * NKB + kb) != 0
            if live:
                ridx = qb * BM + tl.arange(0, BM)[:, None]
                rows = qb * BM + tl.arange(0, BM)[None, :]  # [1, BM]: the queries, as columns
                q = _load_2d(Q + b * sqb + h64 * sqh, ridx, sqm, sqd, L, E, EP)
                do = _load_2d(DO + b * sdb + h64 * sdh, ridx, sdm, sdd, L, EV, EVP)
                ob = bh * L
                m = tl.load(M + ob + rows, mask=rows < L, other=0.0)
                lam = tl.load(LAM + ob + rows, mask=rows < L, other=float("inf"))
                delta = tl.load(DELTA + ob + rows, mask=rows < L, other=0.0)
                rawt = _dot(k, tl.trans(q))
                tt = _scores(rawt, rows, kidx, L, S, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL, SOFTCAP)
                zt = _shift(tt, m, scale, MASK_KIND)  # [BN, BM]
                pt, dt = _p_d(zt, lam, alpha, FAM)
                dv += _dot(pt.to(do.dtype), do)
                dpt = _dot(v, tl.trans(do))
                dst = dt * (dpt - delta)
                if SOFTCAP:
                    dst = dst * _cap_slope(rawt, scale, softcap)
                dk += _dot(dst.to(q.dtype), q)
                if ATOMIC_DQ:
                    dqt = _dot(tl.trans(dst).to(k.dtype), kc) * scale  # [BM, EP]
                    tl.atomic_add(DQACC + (ob + ridx) * EP + ce, dqt, mask=ridx < L)
    base = bhk.to(tl.int64) * S + kidx
    cv = tl.arange(0, EVP)[None, :]
    tl.store(DK + base * E + ce, (dk * scale).to(DK.dtype.element_ty), mask=(kidx < S) & (ce < E))
    tl.store(DV + base * EV + cv, dv.to(DV.dtype.element_ty), mask=(kidx < S) & (cv < EV))
