r"""The lean forward of the smooth top-k maps (exp, sigmoid, laplace) on rows
held in registers: p = f(z − λ), Σp = k, z = (x − max x)/τ.

These f are dense, so every entry counts in every sweep; what a sweep costs
is its arithmetic, and how many sweeps a row takes.  The row is read once and
z formed once; then per row, from a start next to λ:

* exp (f = e^{min(u, 0)}): the root on the current partition, λ ← M + log Σ_L
  e^{z − M} − log(k − #U) with U = {z ≥ λ}, L the rest and M = max_L z, from
  above (λ₀ = lse(z) − log k, where g ≤ k); exact once no entry of L reaches
  the new λ (M ≤ λ', read in the same sweep);
* laplace: the root on the current partition, a quadratic in e^δ
  (A e^{−δ} − B e^{δ} = k − #U with A = ½Σ_L e^{u}, B = ½Σ_U e^{−u}), from
  λ₀ = lse(z) − log 2k; exact once no entry changes side at λ + δ;
* sigmoid: Newton on g − k = A − B − (k − #U), A = Σ_L σ(u), B = Σ_U σ(−u)
  (each summed without cancellation), from λ₀ = lse(z) − log k, until the
  step is a few ulps.

A row whose search has not ended after ``LEAN_IT`` sweeps, whose λ lies more
than ``FAR`` frame units from its max (where z = (x − max)/τ no longer
resolves the entries near λ: an outlier, τ far below the spread), or whose
step fails, takes the general search (:func:`.frame._solve`, with its frame
moves and bracket) on the same registers, as do its neighbours only if they
need it.  So rows are exact to the general kernel's precision, and typical
rows pay a few lean sweeps.
"""

import triton
import triton.language as tl

from .family_math import _f, _written
from .frame import FAR, _solve
from .ids import EXP, LAPLACE
from .passes import _write_p
from .prelude import EPS, _cols, _shift_scale

LOG2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _topk_step(z, lam, k, FAM: tl.constexpr):
    """One sweep at λ ([ROWS, 1]): the next point and whether it is exact."""
    u = z - lam
    up = u >= 0
    c = tl.sum(up.to(tl.float32), 1, keep_dims=True)
    cb = k - c
    if FAM == EXP:
        zl = tl.where(up, float("-inf"), z)
        M = tl.max(zl, 1, keep_dims=True)
        S = tl.sum(tl.exp(zl - M), 1, keep_dims=True)
        new = M + tl.log(S) - tl.log(cb)
        exact = M <= new
    else:
        e = tl.exp(-tl.abs(u))
        if FAM == LAPLACE:
            A = 0.5 * tl.sum(tl.where(up, 0.0, e), 1, keep_dims=True)
            B = 0.5 * tl.sum(tl.where(up, e, 0.0), 1, keep_dims=True)
            la = tl.log(A)
            lb = tl.log(B)
            h = tl.sqrt(cb * cb + 4.0 * A * B)
            dpos = LOG2 + la - tl.log(cb + h)
            dneg = tl.log(h - cb) - LOG2 - lb
            d = tl.where(cb == 0, 0.5 * (la - lb), tl.where(cb > 0, dpos, dneg))
            mn = tl.min(tl.where(up, u, float("inf")), 1, keep_dims=True)
            mx = tl.max(tl.where(up, float("-inf"), u), 1, keep_dims=True)
            exact = (mn >= d) & (mx <= d)
        else:
            w = 1.0 / (1.0 + e)
            ew = e * w  # σ(u) below λ, σ(−u) = 1 − σ(u) above
            A = tl.sum(tl.where(up, 0.0, ew), 1, keep_dims=True)
            B = tl.sum(tl.where(up, ew, 0.0), 1, keep_dims=True)
            gd = tl.sum(ew * w, 1, keep_dims=True)  # −g′ = Σ σ(u) σ(−u)
            d = ((A - B) - cb) / gd
            exact = tl.abs(d) <= 4.0 * EPS * (tl.abs(lam) + 1.0)
        new = lam + d
    return new, exact


@triton.jit
def lean_topk_fwd_kernel(X, Y, ITS, R, n, k, inv_tau,
                         FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, LEAN_IT: tl.constexpr,
                         NEWTON_CAP: tl.constexpr, MAXIT: tl.constexpr, WRITE_ITS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    cols = _cols(0, BLOCK)
    inb = rmask & (cols < n)
    xr = X + rows * n
    yr = Y + rows * n

    # ---- the one read: max, finite count, z in the frame of the max, and
    # Σ e^z (its log is exp's start; NaN exactly where the row holds a NaN,
    # and a max of +inf marks the other broken rows)
    x = tl.load(xr + cols, mask=inb, other=float("-inf")).to(tl.float32)
    xmax = tl.max(x, 1, keep_dims=True)
    m = tl.sum((x > float("-inf")).to(tl.float32), 1, keep_dims=True)
    ref = tl.where((xmax > float("-inf")) & (xmax < float("inf")), xmax, 0.0)
    z = _shift_scale(x, ref, inv_tau)
    S0 = tl.sum(tl.exp(z), 1, keep_dims=True)
    broken = (S0 != S0) | (xmax == float("inf"))
    active = (m > k) & (~broken)

    # ---- the lean search
    lam = tl.log(tl.where(active, S0, 1.0)) - tl.log(k)
    if FAM == LAPLACE:
        lam -= LOG2
    it = tl.zeros([ROWS, 1], tl.int32)
    done = ~active
    run = active
    more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    while more > 0:
        new, exact = _topk_step(z, lam, k, FAM)
        it += run.to(tl.int32)
        ok = tl.abs(new) < float("inf")
        lam = tl.where(run & ok, new, lam)
        done = done | (run & ok & exact)
        run = run & ok & (~exact) & (it < LEAN_IT)
        more = tl.max(tl.max(run.to(tl.int32), 1), 0)
    # ---- the rows the lean search does not serve: the general search
    fb = active & ((~done) | (tl.abs(lam) > FAR))
    if tl.max(tl.max(fb.to(tl.int32), 1), 0) > 0:
        xmin = tl.min(tl.where(x > float("-inf"), x, float("inf")), 1, keep_dims=True)
        fref, c, t, its = _solve(xr, rmask, x, x, n, inv_tau, xmax, xmin, m, S0, fb, k, 1.0,
                                 FAM, ROWS, BLOCK, True, False, True, NEWTON_CAP, MAXIT)
        it += its
        _write_p(xr, yr, rmask & fb, x, n, fref, inv_tau, c, t, 1.0, k, fb, broken, FAM, BLOCK, True)
    # ---- the write of the other rows: p, or the row conventions (NaN on a
    # broken row, 1 on the finite entries of a row with at most k of them)
    p = _written(_f(z - lam, FAM, 1.0), z - lam, 0.0, Y, FAM)  # λ from the closed form
    if tl.min(tl.min((active | (~rmask)).to(tl.int32), 1), 0) == 0:
        p = tl.where(active, p, tl.where(broken, float("nan"), tl.where(x > float("-inf"), 1.0, 0.0)))
    tl.store(yr + cols, p.to(Y.dtype.element_ty), mask=inb & (~fb))
    if WRITE_ITS:
        tl.store(ITS + rows, it, mask=rmask)
