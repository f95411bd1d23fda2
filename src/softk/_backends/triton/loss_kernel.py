r"""The fused Fenchel–Young loss kernel: per row, λ, the loss value and the
gradient (p − y)/τ, ``ROWS`` rows per program (as in the forward kernel:
[ROWS, BLOCK] tiles, every per-row value a [ROWS, 1] column, rows past ``R``
masked off; the launcher's ROWS and warps are the forward's, see
:func:`.function._config`).

The first pass and the λ search are the forward kernel's own
(:func:`.passes._row_stats`, :func:`.search._find_lambda`, and for α-entmax
outside [1.125, 2] :func:`.anchor._solve_anchor`; with ``LEAN``, rows held
in registers of sparsemax, entmax15 and α-entmax for 1.125 ≤ α ≤ 2 take the
lean forward's search, :func:`.lean._lean_search`); the last pass,
instead of writing p, writes the gradient and sums the value.  With
u = z − λ (λ = c + t, so u = (z − c) − t keeps its precision far from the
origin) and Σy = Σp = k,

.. math:: L = \Phi(z) + \Omega(y) - \langle z, y\rangle
            = \sum_i F(u_i) - \langle u, y\rangle + \sum_i \psi(y_i),

since Φ(z) = Σ_i F(z_i − λ) + kλ and ⟨z, y⟩ = ⟨u, y⟩ + kλ (the kλ cancel).
F(u) = u f(u) − ψ(f(u)) is the Fenchel equality at p = f(u), an identity in
u, so L is also Σ [u_i p_i − ψ(p_i)] − ⟨u, y⟩ + Ω(y); F is written below per
family without logarithms where it can be (softmax: F = p).  A class-index
target y = e_t reads ⟨u, y⟩ = u_t and Ω(y) = ψ(1) (ψ(0) = 0 for every family).
Rows filled by the row conventions (at most k finite entries: p = 1 on them)
take λ as their finite maximum and the same formula with F(u_i) replaced by
u_i − ψ(1) on the finite entries.

Row conventions, as on the unfused path: a target weighting a masked
(−inf) class gives +inf (−u_t = +inf), a fully masked row too; a row holding
NaN or +inf gives NaN and a NaN gradient; exact L ≥ 0, so rounding below 0 is
clamped.  An ignored row (class index −1 here; the caller maps
``ignore_index`` to it) skips the search and writes loss 0 and gradient 0.

Memory, beyond the input and the target: the gradient, one buffer shaped
like the input in the input's dtype (``SCALE`` is folded into it: 1/#kept
rows for the mean), and the per-row loss in float32 (one float per row).
Nothing else shaped like the input is made: the row is read in its own dtype
and every sum is float32 in registers.  The backward then only scales the
saved gradient by the incoming one (one more buffer of the input's shape,
the gradient autograd hands on).  ``torch.nn.functional.cross_entropy``
keeps the same: its log-softmax output (input's shape and dtype) for the
backward, which makes a new gradient buffer.
"""

import triton
import triton.language as tl

from .ids import ENTMAX, ENTMAX15, EXP, LAPLACE, SIGMOID, SOFTMAX, SPARSE, SPARSEMAX
from .anchor import _anchor_p, _solve_anchor
from .family_math import _f, _log1p
from .frame import _solve
from .lean import _lean_search, _lower_bound
from .prelude import EPS, FLT_MAX, _cols, _frame_z, _load_frame_z, _row_stats


@triton.jit
def _xlogx(v):
    return tl.where(v > 0, v * tl.log(tl.where(v > 0, v, 1.0)), 0.0)


@triton.jit
def _F(u, p, FAM: tl.constexpr, am1):
    """F(u) = ∫f, F(−∞) = 0, given p = f(u) (the same formulas as ``Family.F``)."""
    w = tl.maximum(u, 0.0)
    if FAM == SOFTMAX:
        r = p
    elif FAM == SPARSEMAX:
        r = 0.5 * w * w
    elif FAM == ENTMAX15:
        r = p * w / 3.0  # (u/2)² u/3 = u³/12
    elif FAM == ENTMAX:
        r = p * tl.maximum(am1 * u, 0.0) / (1.0 + am1)
    elif FAM == EXP:
        r = tl.where(u <= 0, p, 1.0 + u)
    elif FAM == SIGMOID:
        r = w + _log1p(tl.exp(-tl.abs(u)))  # softplus
    elif FAM == LAPLACE:
        h = 0.5 * tl.exp(-tl.abs(u))
        r = tl.where(u >= 0, u + h, h)
    else:
        r = tl.where(u >= 1, u - 0.5, 0.5 * w * w)
    return r


@triton.jit
def _psi(y, FAM: tl.constexpr, am1):
    """ψ(y), the conjugate of F (the same formulas as ``Family.psi``); ψ(0) = 0."""
    if FAM == SOFTMAX or FAM == EXP:
        r = _xlogx(y) - y
    elif FAM == SPARSEMAX or FAM == SPARSE:
        r = 0.5 * y * y
    elif FAM == ENTMAX15:
        r = y * tl.sqrt(y) / 0.75
    elif FAM == ENTMAX:
        r = tl.where(y > 0, tl.exp((1.0 + am1) * tl.log(tl.where(y > 0, y, 1.0))), 0.0) / ((1.0 + am1) * am1)
    elif FAM == SIGMOID:
        r = _xlogx(y) + _xlogx(1.0 - y)
    else:
        r = tl.where(y < 0.5, 0.5 * _xlogx(2.0 * y) - y, 0.5 * _xlogx(2.0 * (1.0 - y)) - (1.0 - y))
    return r


@triton.jit
def _loss_block(T, G, base, rmask, cols, n, z, c, t, A, ell, psi1, am1, scale, active, broken, keep, tgt,
                FAM: tl.constexpr, DENSE: tl.constexpr, WANT_GRAD: tl.constexpr, ANCHOR: tl.constexpr):
    """One block of the last pass: the block's terms of L (per lane), and
    the gradient scale·(p − y)/τ stored (``scale`` includes 1/τ).  With
    ``ANCHOR`` p comes from the anchor entry A and its log-probability ℓ
    (λ = c + t = A − e^{aℓ}/a then, for u)."""
    mask = rmask & (cols < n)
    fin = z > float("-inf")
    u = (z - c) - t
    if FAM >= EXP:
        # an entry at ±FLT_MAX (its x/τ overflowed) less a far λ stays
        # finite, as z does: F(u) − u·y then cancels instead of inf − inf
        u = tl.where(fin, tl.minimum(tl.maximum(u, -FLT_MAX), FLT_MAX), u)
    if ANCHOR:
        p = tl.where(fin, _anchor_p(z, A, ell, am1, 1.0 / am1, tl.log(am1)), 0.0)
    else:
        p = tl.where(fin, _f(u, FAM, am1), 0.0)
    term = tl.where(active, tl.where(fin, _F(u, p, FAM, am1), 0.0), tl.where(fin, u - psi1, 0.0))
    p = tl.where(active, p, tl.where(broken, float("nan"), fin.to(tl.float32)))
    if DENSE:
        y = tl.load(T + base + cols, mask=mask, other=0.0).to(tl.float32)
        term -= tl.where(y != 0, u * y, 0.0) - _psi(y, FAM, am1)
    else:
        y = (cols == tgt).to(tl.float32)
        term -= tl.where(cols == tgt, u, 0.0)
    if WANT_GRAD:
        gr = tl.where(keep, (p - y) * scale, 0.0)
        tl.store(G + base + cols, gr.to(G.dtype.element_ty), mask=mask)
    return term, tl.where(cols == tgt, p, 0.0)


@triton.jit
def fenchel_young_fwd_kernel(X, T, G, LOSS, SCALE, R, n, k, inv_tau, am1,
                             FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                             BIG: tl.constexpr, PROBE: tl.constexpr, ANCHOR: tl.constexpr,
                             NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr, DENSE: tl.constexpr,
                             WANT_GRAD: tl.constexpr, LEAN: tl.constexpr):
    """Per row: LOSS[row] = L (float32) and, with WANT_GRAD, G = SCALE·(p − y)/τ
    in G's dtype.  T is the dense target (R, n) when DENSE, else the class
    index per row (int64, −1 for an ignored row)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    base = rows * n
    xr = X + base
    if DENSE:
        tgt = tl.full([ROWS, 1], -1, tl.int64)
        keep = tl.full([ROWS, 1], 1, tl.int1)
    else:
        tgt = tl.load(T + rows, mask=rmask, other=-1).to(tl.int64)
        keep = tgt >= 0

    # ---- pass 1 (raw x), the frame and the λ search, as in the forward kernel
    xrow, lanes, xmax, xmin, m, broken, lseS = _row_stats(xr, rmask, n, inv_tau, FAM == SOFTMAX or FAM == EXP,
                                                          ROWS, BLOCK, ONCHIP)
    active = (m > k) & (~broken)
    search = active & keep  # an ignored row is not searched
    m = tl.where(search, m, k + 1.0)
    if ANCHOR:
        ref, A, ell, _ = _solve_anchor(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, search, k, am1,
                                       FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT, ANCHOR)
        c = A
        t = -tl.exp(am1 * ell) / am1
    elif LEAN:  # on chip: the lean search in the frame of the max, from λ's lower bound
        ref = tl.where((xmax > float("-inf")) & (xmax < float("inf")), xmax, 0.0)
        lam0 = tl.zeros([ROWS, 1], tl.float32) + _lower_bound(k, am1, FAM)
        zf = _frame_z(xrow, ref, inv_tau, FAM)
        c, _ = _lean_search(zf, lam0, search, k, am1, FAM, MAXIT)
        t = tl.zeros([ROWS, 1], tl.float32)
        if FAM != ENTMAX:
            # λ = c + t, t searched again in the frame of c less a few ulps
            # (the rounding of c): in the frame of the max λ carries half an
            # ulp of its own size to every entry of the support (f′ = 1 for
            # sparsemax), 2e-5 of Σp on 1024 entries with λ near −½; t is
            # small, and so is its rounding
            c = c - 4.0 * EPS * tl.abs(c)
            t, _ = _lean_search(zf - c, t, search, k, am1, FAM, MAXIT)
        A = c
        ell = c
    else:
        ref, c, t, _ = _solve(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, search, k, am1,
                              FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT)
        A = c
        ell = c
    # λ of a filled row: its finite maximum, 0 in its frame (the maximum)
    c = tl.where(active, c, 0.0)
    t = tl.where(active, t, 0.0)

    # ---- last pass: the gradient and the terms of L
    psi1 = _psi(tl.full((), 1.0, tl.float32), FAM, am1)
    scale = tl.load(SCALE) * inv_tau
    if ONCHIP:
        acc, pt = _loss_block(T, G, base, rmask, _cols(0, BLOCK), n, _frame_z(xrow, ref, inv_tau, FAM), c, t, A,
                              ell, psi1, am1, scale, active, broken, keep, tgt, FAM, DENSE, WANT_GRAD, ANCHOR)
    else:
        acc = tl.zeros([ROWS, BLOCK], tl.float32)
        pt = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            cols = _cols(start, BLOCK)
            z = _load_frame_z(xr, rmask, cols, n, ref, inv_tau, FAM)
            a_blk, p_blk = _loss_block(T, G, base, rmask, cols, n, z, c, t, A, ell, psi1, am1, scale, active, broken,
                                       keep, tgt, FAM, DENSE, WANT_GRAD, ANCHOR)
            acc += a_blk
            pt += p_blk
    loss = tl.sum(acc, 1, keep_dims=True)
    if not DENSE:
        loss += psi1
        if FAM == SPARSEMAX or FAM == ENTMAX15 or FAM == ENTMAX:
            # p = e_t exactly (a sparse map's one-hot at the target): L is 0,
            # where the sum above leaves an ulp of its cancellation (as in
            # the native kernel, kernels_loss.h)
            loss = tl.where(tl.sum(pt, 1, keep_dims=True) == 1.0, 0.0, loss)
    # exact L ≥ 0: only rounding goes below (NaN stays NaN)
    loss = tl.where(loss < 0, 0.0, loss)
    loss = tl.where(broken, float("nan"), loss)
    tl.store(LOSS + rows, tl.where(keep, loss, 0.0), mask=rmask)
