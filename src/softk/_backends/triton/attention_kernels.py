r"""The fused attention forward kernel: out = p·V with p = f(s − m − λ) per
query row, s = scale·q·kᵀ + mask (with a soft cap c·tanh(scale·q·kᵀ / c) +
mask, :mod:`.attention_tiles`), for softmax, sparsemax, entmax15 and
entmax α (per head), without ever holding the L×S scores.

Program (i, b·H + h) takes query rows i·BM … i·BM + BM − 1 of head h of
batch b; its keys and values are those of kv head h // GROUP (GQA).  Causal
programs stop at the key block holding their last row's diagonal.

* softmax: one pass, flash-style (online row max, the running sum and the
  p·V accumulator rescaled as the max moves); λ = log Σ e^{s − m}.
* the sparse maps (:mod:`.attention_gather`):
  1. the max sweep: the row max m, and the candidates of λ gathered into a
     per-row buffer (sparsemax: the keys above max − 1 and above the root
     over the buffer; entmax15 and α-entmax for 1.5 ≤ α ≤ 2: group maxima,
     then a second sweep gathers the keys above their root); it sets each
     block's flag for the general search;
  2. λ solved on each row's buffer, and the blocks holding its support
     marked; rows the buffer does not serve (overflow, other α) take the
     general search over key blocks (:func:`.attention_search._search`),
     which stops recomputing blocks that lie wholly below a lower bound of λ;
  3. p·V in float32, over the marked blocks; each block's tile flag (0
     where p is exactly zero on the tile) is written for the backward.

Fully masked rows (no key takes part): out = 0, m = 0, λ = +inf, so that
f(s − m − λ) = 0 for every key by the same formula.
"""

import triton
import triton.language as tl

from .ids import ENTMAX, SOFTMAX, SPARSEMAX
from .attention_gather import EPS, GROUP_KEYS, LEAN_ALPHA_MAX, LEAN_ALPHA_MIN, _buffer_lambda, _gather_pass, _t_bound
from .attention_search import _max_pass, _refine_t, _search
from .attention_tiles import NEAR_ONE, _any, _dot, _key_blocks, _load_2d, _p_entmax, _qk_tile, _shift
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
def _pv_pass(q, Kb, skn, skd, Vb, svn, svd, rows, L, S, E, EV, scale, softcap, Mb, smm, smn, nkb, FL, LV, bit, marked,
             m, lam, alpha, FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
             SKIP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr, EVP: tl.constexpr):
    """Σ_j p_j v_j per row over the live blocks, and how many blocks took a
    p·V product; ``LV`` gets each block's tile flag for the backward (0 only
    where p is exactly zero on the whole tile).  ``marked``: the flags' bit
    marks exactly the blocks holding a key of some row's support (or within
    a few ulps of it: :func:`.attention_gather._buffer_lambda`), so a live
    block needs no test of p."""
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
            # f(−inf) = 0 for these maps: a key that takes no part needs no test
            if FAM == ENTMAX:  # lam holds α-entmax's saved threshold
                p = _p_entmax(z, lam, alpha - 1.0)
            else:
                p = _f(z - lam, FAM, alpha - 1.0)
            nz = live
            if not marked:
                nz = _any(p > 0)
            if not SKIP:
                nz = flag >= 0
            if nz:
                v = _load_2d(Vb, j * BN + tl.arange(0, BN)[:, None], svn, svd, S, EV, EVP)
                acc += _dot(p.to(v.dtype), v)
                used += 1
            tl.store(LV + j, tl.where(nz, 1, 0).to(tl.int8))
        else:
            tl.store(LV + j, tl.zeros((), tl.int8))
    return acc, used


@triton.jit
def attn_fwd_kernel(Q, K, V, MASK, ALPHA, OUT, M, LAM, TILES, LIVE, SZ, SI, STATS,
                    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smh, smm, smn,
                    H, GROUP, L, S, E, EV, NKB, scale, softcap, alpha_f,
                    FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
                    SKIP: tl.constexpr, WITH_STATS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr,
                    EVP: tl.constexpr, NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr, C: tl.constexpr):
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
        searched = passes
        raised = passes
    else:
        alpha = tl.full((), 0.0, tl.float32) + alpha_f  # a scalar tensor in the interpreter too
        if FAM == ENTMAX:
            alpha = tl.load(ALPHA + h).to(tl.float32)
        prog = bh.to(tl.int64) * tl.num_programs(0) + pid
        FL = TILES + prog * NKB
        lo0 = -1.0 / (alpha - 1.0)
        # the buffer's λ: C > 0, the lean search's α range (a per-head scalar)
        lean = (C > 0) & SKIP
        if FAM == ENTMAX:
            lean = lean & (alpha >= LEAN_ALPHA_MIN) & (alpha <= LEAN_ALPHA_MAX)
        if lean:
            base = (prog * BM + tl.arange(0, BM)[:, None]) * C  # the rows' buffers
            m = tl.full([BM, 1], float("-inf"), tl.float32)
            bound = m
            fits = rows >= 0
            # sparsemax's candidates are few: gathered in the max sweep; the
            # entmax maps' support is wider, so the max sweep gathers group
            # maxima, whose root bounds λ closely, and a second sweep the
            # keys above it (:mod:`.attention_gather`)
            G: tl.constexpr = 1 if FAM == SPARSEMAX else min(GROUP_KEYS, BN)
            m, cnt, fits, bound, raised = _gather_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn,
                                                       nkb, lo0, alpha - 1.0, FL, SZ, SI, base, m, bound, fits, FAM, MASK_KIND, CAUSAL,
                                               SOFTCAP, BM, BN, EP, C, MAXIT, G, True)
            active = m > float("-inf")
            m = tl.where(active, m, 0.0)
            fits = fits & active
            if G > 1:
                lam = _buffer_lambda(SZ, SI, base, cnt, fits, bound, m, lo0, alpha - 1.0, scale, FL, FAM, MASK_KIND,
                                     BM, BN, C, MAXIT, False)
                lam = lam - 4.0 * EPS * tl.abs(lam)  # a few ulps lower: the search's rounding
                bound = tl.where(fits, tl.maximum(bound, _t_bound(m, lam, scale, MASK_KIND)), bound)
                m, cnt, fits, bound, more = _gather_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn,
                                                         nkb, lo0, alpha - 1.0, FL, SZ, SI, base, m, bound, fits, FAM,
                                                         MASK_KIND, CAUSAL, SOFTCAP, BM, BN, EP, C, MAXIT, 1, False)
                raised += more
            lam = _buffer_lambda(SZ, SI, base, cnt, fits, bound, m, lo0, alpha - 1.0, scale, FL, FAM, MASK_KIND, BM,
                                 BN, C, MAXIT, True)
            # an upper bound of the count of keys taking part (the search's α > 2 bracket)
            n = tl.where(active, (nkb * BN).to(tl.float32), 0.0)
            todo = active & ~fits
        else:
            m, n = _max_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, lo0, FL,
                             MASK_KIND, CAUSAL, SOFTCAP, BM, BN, EP)
            active = n > 0
            m = tl.where(active, m, 0.0)
            lam = tl.zeros([BM, 1], tl.float32)
            todo = active
            raised = tl.full((), 0, tl.int32)
        bit = tl.full((), 2, tl.int32)
        passes = tl.full((), 0, tl.int32)
        visited = passes
        marked = lean & ~_any(todo)
        searched = tl.sum(tl.sum(todo.to(tl.int32), 1), 0)
        if _any(todo):  # the general search, over key blocks, for the rows the buffer does not serve
            lams, bit, passes, visited = _search(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL,
                                                 m, n, todo, alpha, FAM, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP,
                                                 NEWTON_CAP, MAXIT)
            lam = tl.where(todo, lams, lam)
        if FAM == ENTMAX:
            # near α = 1 the saved threshold is t = λ + 1/(α−1), refined
            # (:func:`.attention_tiles._p_entmax`); above, λ itself
            if alpha - 1.0 < NEAR_ONE:
                lam = lam + 1.0 / (alpha - 1.0)
                lam, more = _refine_t(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, FL, m, lam,
                                      active, alpha - 1.0, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP)
                passes += more
        acc, used = _pv_pass(q, Kb, skn, skd, Vb, svn, svd, rows, L, S, E, EV, scale, softcap, Mb, smm, smn, nkb, FL,
                             LIVE + prog * NKB, bit, marked, m, lam, alpha, FAM, MASK_KIND, CAUSAL, SOFTCAP, SKIP, BM, BN, EP,
                             EVP)
    # the fully-masked-row convention (module docstring)
    m = tl.where(active, m, 0.0)
    lam = tl.where(active, lam, float("inf"))
    ob = bh.to(tl.int64) * L
    c = tl.arange(0, EVP)[None, :]
    tl.store(OUT + (ob + rows) * EV + c, acc.to(OUT.dtype.element_ty), mask=(rows < L) & (c < EV))
    tl.store(M + ob + rows, m, mask=rows < L)
    tl.store(LAM + ob + rows, lam, mask=rows < L)
    if WITH_STATS:
        sp = STATS + (bh.to(tl.int64) * tl.num_programs(0) + pid) * 6
        tl.store(sp, nkb)
        tl.store(sp + 1, passes)
        tl.store(sp + 2, visited)
        tl.store(sp + 3, used)
        tl.store(sp + 4, searched)
        tl.store(sp + 5, raised)
