r"""Dedicated Triton kernels for softmax, log_softmax and logsumexp.

The generic threshold kernel (:mod:`.kernels`) runs a λ search and
a separate statistics pass; softmax needs neither: λ = logsumexp is found
with an *online* max and rescaled sum (Milakov & Gimelshein, 2018).

Every kernel works on a tile of ``[ROWS, BLOCK]`` entries: ``ROWS``
consecutive rows of a contiguous (R, n) tensor, so that narrow rows (a
64-wide router row) share a program instead of each getting one.  Rows are
independent: every reduction is along axis 1, so a NaN, +inf or fully
masked row never leaks into its neighbours in the tile.

* ``SINGLE``: the whole row fits in one block (BLOCK ≥ n): it is read once
  into registers, reduced, and the output written from the registers.
* otherwise two passes over blocks of ``BLOCK``: pass 1 keeps a running max
  M per row and a per-lane sum rescaled by e^{(M_old − M_new)/τ} whenever M
  moves; pass 2 re-reads x and writes.

Arithmetic is float32 in registers whatever the input dtype; outputs are
cast to the output tensor's dtype on the store.  The scaled entries are
u = (x − max x)·(1/τ): shifted *before* scaling, through the prelude every
Triton kernel shares (:mod:`.prelude`, after
:func:`softk.threshold.rows.scaled_rows`), so an offset of 1e6 with
τ = 1e-3 keeps the differences that carry the mass.

Row conventions (:mod:`softk.threshold.rows`): ``-inf`` entries are masked
(p = 0, log p = −inf); a fully masked row gives p = 0, log p = −inf and
lse = −inf; a row holding NaN or +inf gives NaN everywhere.

``OUT`` (constexpr) picks what the forward writes: 0 p, 1 log p, 2 the
per-row τ·logsumexp(x/τ) only (Y has R entries), 3 G[row]·p (the backward
of logsumexp: G holds one incoming gradient per row).
"""

import triton
import triton.language as tl

from .prelude import _finite_or_zero, _lse_step, _scaled


@triton.jit
def _tile(pid, R, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # the tile's rows ([ROWS, 1], int64: R·n may exceed 2^31), their first
    # entries, which of them exist (the last program is ragged), the columns
    rows = (pid.to(tl.int64) * ROWS + tl.arange(0, ROWS))[:, None]
    return rows, rows * n, rows < R, tl.arange(0, BLOCK)[None, :]


@triton.jit
def _load(P, base, cols, n, rmask, other):
    return tl.load(P + base + cols, mask=rmask & (cols < n), other=other).to(tl.float32)


@triton.jit
def _broken(x):
    # 1.0 on rows holding a NaN or +inf (per row, [ROWS, 1])
    return tl.max(((x != x) | (x == float("inf"))).to(tl.float32), 1, keep_dims=True)


@triton.jit
def _store_out(Y, G, rows, base, cols, n, rmask, u, e, S, bad, OUT: tl.constexpr):
    """Write p = e/S (OUT 0), log p = u − log S (1) or g·p (3) for one block,
    u = (x − shift)/τ and e = e^u, NaN on broken rows.  A fully masked row
    needs no case of its own: u = −inf, e = 0 and S = 0 (taken as 1) give
    p = 0 and log p = −inf."""
    Ss = tl.where(S > 0, S, 1.0)
    if OUT == 1:
        y = u - tl.log(Ss)
    else:
        y = e / Ss
        if OUT == 3:
            y = y * tl.load(G + rows, mask=rmask, other=0.0).to(tl.float32)
    y = tl.where(bad > 0, float("nan"), y)
    tl.store(Y + base + cols, y.to(Y.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def _pass1(X, base, cols, n, rmask, inv_tau, ROWS: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    """The first pass over the rows: (bad, M, sh, u, e, S), per row whether
    it holds a NaN or +inf, its maximum M, the shift sh (M, 0 on rows with no
    finite entry) and S = Σ e^{(x − sh)/τ}; with ``SINGLE`` also the block's
    u = (x − sh)/τ and e = e^u, kept for the write (0 otherwise)."""
    if SINGLE:
        x = _load(X, base, cols, n, rmask, float("-inf"))
        bad = _broken(x)
        M = tl.max(x, 1, keep_dims=True)
        sh = _finite_or_zero(M)  # 0 on fully masked (and broken) rows
        u = _scaled(x, sh, inv_tau)
        e = tl.exp(u)  # masked lanes: e^{-inf} = 0
        S = tl.sum(e, 1, keep_dims=True)
    else:
        # running max M per row, lane sums kept relative to it
        M = tl.full([ROWS, 1], float("-inf"), tl.float32)
        bad = tl.zeros([ROWS, 1], tl.float32)
        acc = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            x = _load(X, base, start + cols, n, rmask, float("-inf"))
            bad = tl.maximum(bad, _broken(x))
            M, acc = _lse_step(M, acc, x, inv_tau)
        sh = _finite_or_zero(M)
        S = tl.sum(acc, 1, keep_dims=True)
        u = 0.0
        e = 0.0
    return bad, M, sh, u, e, S


@triton.jit
def softmax_fwd_kernel(X, Y, G, R, n, inv_tau, tau,
                       OUT: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    rows, base, rmask, cols = _tile(tl.program_id(0), R, n, ROWS, BLOCK)
    bad, M, sh, u, e, S = _pass1(X, base, cols, n, rmask, inv_tau, ROWS, BLOCK, SINGLE)
    if OUT == 2:
        lse = tl.where(M == float("-inf"), float("-inf"), sh + tau * tl.log(tl.where(S > 0, S, 1.0)))
        lse = tl.where(bad > 0, float("nan"), lse)
        tl.store(Y + rows, lse.to(Y.dtype.element_ty), mask=rmask)
    elif SINGLE:
        # written from the registers: no second read, no second exp
        _store_out(Y, G, rows, base, cols, n, rmask, u, e, S, bad, OUT)
    else:
        # pass 2: re-read x and write
        for start in range(0, n, BLOCK):
            x = _load(X, base, start + cols, n, rmask, float("-inf"))
            ub = _scaled(x, sh, inv_tau)  # (not u: _pass1's u is a scalar here, and a loop keeps a name's type)
            _store_out(Y, G, rows, base, start + cols, n, rmask, ub, tl.exp(ub), S, bad, OUT)


@triton.jit
def _bwd_terms(Y, G, base, cols, n, rmask, LOG: tl.constexpr):
    # (y, g, the per-lane term of the row sum, whether the entry is not −inf)
    if LOG:
        y = _load(Y, base, cols, n, rmask, float("-inf"))
        g = _load(G, base, cols, n, rmask, 0.0)
        return y, g, g, (y != float("-inf")).to(tl.float32)
    else:
        y = _load(Y, base, cols, n, rmask, 0.0)
        g = _load(G, base, cols, n, rmask, 0.0)
        return y, g, y * g, tl.zeros_like(y)


@triton.jit
def _bwd_store(DX, base, cols, n, rmask, y, g, s, has, inv_tau, LOG: tl.constexpr):
    if LOG:
        # d log p / dx = (I − 1 pᵀ)/τ transposed: (g − p Σg)/τ; a fully
        # masked row (no entry above −inf) has a zero gradient.  A NaN
        # entry counts as present, so a NaN row stays NaN.
        dx = tl.where(has > 0, (g - tl.exp(y) * s) * inv_tau, 0.0)
    else:
        dx = y * (g - s) * inv_tau  # (diag p − p pᵀ)/τ · g
    tl.store(DX + base + cols, dx.to(DX.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def softmax_bwd_kernel(Y, G, DX, R, n, inv_tau,
                       LOG: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    """dx from the saved output y (p, or log p with ``LOG``) and g:
    softmax p(g − Σpg)/τ, log_softmax (g − e^{log p} Σg)/τ."""
    rows, base, rmask, cols = _tile(tl.program_id(0), R, n, ROWS, BLOCK)
    if SINGLE:
        y, g, t, h = _bwd_terms(Y, G, base, cols, n, rmask, LOG)
        s = tl.sum(t, 1, keep_dims=True)
        has = tl.max(h, 1, keep_dims=True)
        _bwd_store(DX, base, cols, n, rmask, y, g, s, has, inv_tau, LOG)
    else:
        st = tl.zeros([ROWS, BLOCK], tl.float32)
        sh = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            y, g, t, h = _bwd_terms(Y, G, base, start + cols, n, rmask, LOG)
            st += t
            sh = tl.maximum(sh, h)
        s = tl.sum(st, 1, keep_dims=True)
        has = tl.max(sh, 1, keep_dims=True)
        for start in range(0, n, BLOCK):
            y, g, t, h = _bwd_terms(Y, G, base, start + cols, n, rmask, LOG)
            _bwd_store(DX, base, start + cols, n, rmask, y, g, s, has, inv_tau, LOG)


@triton.jit
def _store_index_grad(GR, base, cols, n, rmask, e, S, tgt, scale, live, broken):
    # scale·(p − e_t) on a row that counts (0 elsewhere), NaN on broken rows
    p = tl.where(broken, float("nan"), e / tl.where(S > 0, S, 1.0))
    gr = tl.where(live, (p - (cols == tgt).to(tl.float32)) * scale, 0.0)
    tl.store(GR + base + cols, gr.to(GR.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def softmax_index_loss_kernel(X, T, GR, LOSS, SCALE, R, n, inv_tau, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                              SINGLE: tl.constexpr, WANT_GRAD: tl.constexpr, CE_ROWS: tl.constexpr):
    """Softmax's Fenchel–Young loss with class indices, which is
    cross-entropy: per row LOSS = log Σ_i e^{u_i} − u_t with u = (x − max x)/τ
    (T holds t, −1 on an ignored row: loss 0, gradient 0), and with
    ``WANT_GRAD`` GR = SCALE·(p − e_t)/τ, in GR's dtype.  The passes of
    softmax_fwd_kernel (one read of a row of at most BLOCK entries, else two)
    and one load of x_t: no per-entry term of the loss, whose Σ_i F(u_i) is
    Σp = 1 here.

    Rows, as the generic loss kernel (:mod:`.loss_kernel`) keeps them: NaN
    or +inf in the row gives NaN (loss and gradient); a masked (−inf)
    target class gives +inf; a row with no finite score gives +inf, and
    p = 0 in its gradient.  With ``CE_ROWS``, torch's cross-entropy's: a
    row with no finite score is NaN too, and a NaN row's gradient is NaN
    even where its class index is ignored."""
    rows, base, rmask, cols = _tile(tl.program_id(0), R, n, ROWS, BLOCK)
    tgt = tl.load(T + rows, mask=rmask, other=-1).to(tl.int64)
    keep = tgt >= 0
    bad, M, sh, _, e, S = _pass1(X, base, cols, n, rmask, inv_tau, ROWS, BLOCK, SINGLE)
    xt = tl.load(X + base + tl.where(keep, tgt, 0), mask=rmask & keep, other=0.0).to(tl.float32)
    empty = M == float("-inf")
    broken = bad > 0
    if CE_ROWS:
        broken = broken | empty
    loss = tl.log(tl.where(S > 0, S, 1.0)) - _scaled(xt, sh, inv_tau)
    loss = tl.where(loss < 0, 0.0, loss)  # exact L ≥ 0: only rounding goes below
    loss = tl.where(broken, float("nan"), tl.where(empty, float("inf"), loss))
    tl.store(LOSS + rows, tl.where(keep, loss, 0.0), mask=rmask)
    if WANT_GRAD:
        scale = tl.load(SCALE) * inv_tau
        live = keep
        if CE_ROWS:
            live = keep | broken
        if SINGLE:
            _store_index_grad(GR, base, cols, n, rmask, e, S, tgt, scale, live, broken)
        else:
            for start in range(0, n, BLOCK):
                x = _load(X, base, start + cols, n, rmask, float("-inf"))
                eb = tl.exp(_scaled(x, sh, inv_tau))  # (not e: see softmax_fwd_kernel's pass 2)
                _store_index_grad(GR, base, start + cols, n, rmask, eb, S, tgt, scale, live, broken)
