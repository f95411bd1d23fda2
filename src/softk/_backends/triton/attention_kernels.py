r"""The fused attention forward kernel: out = p·V with p = f(s − m − λ) per
query row, s = scale·q·kᵀ + mask (with a soft cap c·tanh(scale·q·kᵀ / c) +
mask, :mod:`.attention_tiles`), for softmax, sparsemax, entmax15 and
entmax α (per head), without ever holding the L×S scores.

Program (i, b·H + h) takes query rows i·BM … i·BM + BM − 1 of head h of
batch b; its keys and values are those of kv head h // GROUP (GQA).  Causal
programs stop at the key block holding their last row's diagonal.

* softmax: one pass, flash-style (online row max, the running sum and the
  p·V accumulator rescaled as the max moves); λ = log Σ e^{s − m}.
* the sparse maps, in passes over the key blocks, each recomputing q·kᵀ:
  1. the row max m, the count of keys taking part, and the first block
     flags (:func:`.attention_search._max_pass`);
  2. the λ search (:func:`.attention_search._search`), which stops
     recomputing blocks that lie wholly below a lower bound of λ;
  3. p·V in float32, over the blocks still live; a block whose p is zero
     everywhere skips its p·V product as well.

Fully masked rows (no key takes part): out = 0, m = 0, λ = +inf, so that
f(s − m − λ) = 0 for every key by the same formula.
"""

import triton
import triton.language as tl

from .ids import ENTMAX, SOFTMAX
from .attention_search import NEAR_ONE, _max_pass, _refine_t, _search
from .attention_tiles import _any, _dot, _key_blocks, _load_2d, _p_entmax, _qk_tile, _shift
from .family_math import _f


@triton.jit
def _softmax_pass(q, Kb, skn, skd, Vb, svn, svd, rows, L, S, E, EV, scale, softcap, Mb, smm, smn, nkb,
                  MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, BM: tl.constexpr,
                  BN: tl.constexpr, EP: tl.constexpr, EVP: tl.constexpr):
    """(Σ e^z v, m, Σ e^z) per row, z = s − max s formed from m by ``_shift``,
    in one pass (online max)."""
    m = tl.full([BM, 1], float("-inf"), tl.float32)
    l = tl.zeros([BM, 1], tl.float32)
    acc = tl.zeros([BM, EVP], tl.float32)
    for j in range(0, nkb):
        s = _qk_tile(q, Kb, skn, skd, j * BN, rows, L, S, E, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL, SOFTCAP,
                     BN, EP)
        mn = tl.maximum(m, tl.max(s, 1, keep_dims=True))
        ms = tl.where(mn > float("-inf"), mn, 0.0)
        a = tl.exp(_shift(m, ms, scale, MASK_KIND))  # 0 while the row has seen no key (m = −inf)
        p = tl.exp(_shift(s, ms, scale, MASK_KIND))
        l = l * a + tl.sum(p, 1, keep_dims=True)
        v = _load_2d(Vb, j * BN + tl.arange(0, BN)[:, None], svn, svd, S, EV, EVP)
        acc = acc * a + _dot(p.to(v.dtype), v)
        m = mn
    return acc, m, l


@triton.jit
def _pv_pass(q, Kb, skn, skd, Vb, svn, svd, rows, L, S, E, EV, scale, softcap, Mb, smm, smn, nkb, FL, bit, m, lam,
             alpha, FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
             SKIP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr, EVP: tl.constexpr):
    """Σ_j p_j v_j per row over the live blocks, and how many blocks took a p·V product."""
    acc = tl.zeros([BM, EVP], tl.float32)
    used = tl.full((), 0, tl.int32)
    for j in range(0, nkb):
        flag = tl.load(FL + j).to(tl.int32)
        live = (flag & bit) != 0
        if not SKIP:
            live = flag >= 0
        if live:
            t = _qk_tile(q, Kb, skn, skd, j * BN, rows, L, S, E, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL,
                         SOFTCAP, BN, EP)
            z = _shift(t, m, scale, MASK_KIND)
            if FAM == ENTMAX:  # lam holds t = λ + 1/(α−1)
                p = tl.where(z > float("-inf"), _p_entmax(z, lam, alpha - 1.0), 0.0)
            else:
                p = tl.where(z > float("-inf"), _f(z - lam, FAM, alpha - 1.0), 0.0)
            nz = _any(p > 0)
            if not SKIP:
                nz = flag >= 0
            if nz:
                v = _load_2d(Vb, j * BN + tl.arange(0, BN)[:, None], svn, svd, S, EV, EVP)
                acc += _dot(p.to(v.dtype), v)
                used += 1
    return acc, used


@triton.jit
def attn_fwd_kernel(Q, K, V, MASK, ALPHA, OUT, M, LAM, TILES, STATS,
                    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn,
                    H, GROUP, L, S, E, EV, NKB, scale, softcap, alpha_f,
                    FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
                    SKIP: tl.constexpr, WITH_STATS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr,
                    EVP: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = bh % H
    hk = (h // GROUP).to(tl.int64)
    Qb = Q + b * sqb + h.to(tl.int64) * sqh
    Kb = K + b * skb + hk * skh
    Vb = V + b * svb + hk * svh
    Mb = MASK + b * smb + h.to(tl.int64) * smh
    qstart = pid * BM
    rows = qstart + tl.arange(0, BM)[:, None]  # [BM, 1]
    q = _load_2d(Qb, rows, sqm, sqd, L, E, EP)
    nkb = _key_blocks(qstart, S, CAUSAL, BM, BN)
    if FAM == SOFTMAX:
        acc, m, l = _softmax_pass(q, Kb, skn, skd, Vb, svn, svd, rows, L, S, E, EV, scale, softcap, Mb, smm, smn, nkb,
                                  MASK_KIND, CAUSAL, SOFTCAP, BM, BN, EP, EVP)
        active = l > 0
        acc = acc / tl.where(active, l, 1.0)
        lam = tl.log(tl.where(active, l, 1.0))
        passes = tl.full((), 0, tl.int32)
        visited = passes
        used = nkb
    else:
        alpha = tl.full((), 0.0, tl.float32) + alpha_f  # a scalar tensor in the interpreter too
        if FAM == ENTMAX:
            alpha = tl.load(ALPHA + h).to(tl.float32)
        FL = TILES + (bh.to(tl.int64) * tl.num_programs(0) + pid) * NKB
        lo0 = -1.0 / (alpha - 1.0)
        m, n = _max_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, lo0, FL,
                         MASK_KIND, CAUSAL, SOFTCAP, BM, BN, EP)
        active = n > 0
        m = tl.where(active, m, 0.0)
        lam, bit, passes, visited = _search(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, m, n,
                                            active, alpha, FAM, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP,
                                            NEWTON_CAP, MAXIT)
        if FAM == ENTMAX:
            # the shifted threshold t = λ + 1/(α−1), refined near α = 1
            lam = lam + 1.0 / (alpha - 1.0)
            if alpha - 1.0 < NEAR_ONE:
                lam, more = _refine_t(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, m, lam,
                                      active, alpha - 1.0, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP)
                passes += more
        acc, used = _pv_pass(q, Kb, skn, skd, Vb, svn, svd, rows, L, S, E, EV, scale, softcap, Mb, smm, smn, nkb, FL,
                             bit, m, lam, alpha, FAM, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP, EVP)
    # the fully-masked-row convention (module docstring)
    m = tl.where(active, m, 0.0)
    lam = tl.where(active, lam, float("inf"))
    ob = bh.to(tl.int64) * L
    c = tl.arange(0, EVP)[None, :]
    tl.store(OUT + (ob + rows) * EV + c, acc.to(OUT.dtype.element_ty), mask=(rows < L) & (c < EV))
    tl.store(M + ob + rows, m, mask=rows < L)
    tl.store(LAM + ob + rows, lam, mask=rows < L)
    if WITH_STATS:
        sp = STATS + (bh.to(tl.int64) * tl.num_programs(0) + pid) * 4
        tl.store(sp, nkb)
        tl.store(sp + 1, passes)
        tl.store(sp + 2, visited)
        tl.store(sp + 3, used)
