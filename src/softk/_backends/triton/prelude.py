r"""The row prelude of every Triton kernel, written once: how an entry is read
and scaled, and the first pass over the raw row.

The torch backend forms z = (x − r)/τ with r an entry of the row
(:func:`softk.threshold.rows.scaled_rows`): shifted *before* dividing by τ,
so that neither an offset of 1e6 nor τ = 1e-3 rounds away the differences
that carry the mass (x/τ first rounds every entry to ulp(x/τ): at offset
1e4 and τ = 0.3 that is 2e-3 of p).  The kernels do the same: the first
pass reads the raw x (:func:`_row_stats`); every later pass reads an entry
through :func:`_scaled` (:func:`_frame_z` for the λ search and the last
pass), which forms (x − ref)·(1/τ) with ``ref`` a [ROWS, 1] column chosen
after the first pass (the row maximum, or a point next to the threshold for
the top-k families: see :mod:`softk._backends.triton.frame`).  Arithmetic is
float32 whatever the input dtype.
"""

import triton
import triton.language as tl

from .ids import EXP

FLT_MAX = tl.constexpr(3.4028234663852886e38)  # the largest finite float32
EPS = tl.constexpr(1.1920928955078125e-07)  # float32 machine epsilon


@triton.jit
def _lam_tol(lam, FAM: tl.constexpr):
    # λ's resolution in the search (its stopping tolerance): a few ulps of the
    # data's scale around λ, of λ in the frame, and of the unit width of f
    # for the capped families
    return 4.0 * EPS * (tl.abs(lam) + (1.0 if FAM >= EXP else 0.0))


@triton.jit
def _cols(start, BLOCK: tl.constexpr):
    # the lane offsets of one block, as a [1, BLOCK] row (broadcast over rows)
    return start + tl.arange(0, BLOCK)[None, :]


@triton.jit
def _load_x(xr, rmask, cols, n):
    # the raw entries in float32; lanes past the row's end (and rows past
    # the last) read as −inf, which every pass treats as a masked entry
    return tl.load(xr + cols, mask=rmask & (cols < n), other=float("-inf")).to(tl.float32)


@triton.jit
def _shift_scale(x, ref, inv_tau):
    """(x − ref)·(1/τ), ref finite.  With τ > 1 the difference of two entries
    of both signs near the float max overflows where the quotient does not:
    there it is formed from the halves, (x/2 − ref/2)·(2/τ), exact as they
    are (as :func:`softk.threshold.rows.shift_over_tau`).  The test is one
    scalar branch: a call with τ ≤ 1 does no more work than the plain form."""
    d = x - ref
    z = d * inv_tau
    if inv_tau < 1.0:
        over = (tl.abs(d) == float("inf")) & (tl.abs(x) < float("inf"))
        z = tl.where(over, (x * 0.5 - ref * 0.5) * (inv_tau * 2.0), z)
    return z


@triton.jit
def _scaled(x, ref, inv_tau):
    """z = (x − ref)·(1/τ): shift first, then scale (−inf stays −inf); a
    finite x whose z overflows gets the largest float32 instead of +inf
    (which marks a broken row), as :func:`softk.threshold.rows.scaled_rows`."""
    z = _shift_scale(x, ref, inv_tau)
    return tl.where((z == float("inf")) & (x < float("inf")), FLT_MAX, z)


@triton.jit
def _load_z(xr, rmask, cols, n, ref, inv_tau):
    return _scaled(_load_x(xr, rmask, cols, n), ref, inv_tau)


@triton.jit
def _frame_z(x, ref, inv_tau, FAM: tl.constexpr):
    """z in a row's frame for the family ``FAM``: :func:`_scaled`, and for
    the top-k families (FAM ≥ 4) a finite x also stays finite below, at
    −FLT_MAX where (x − ref)/τ overflows: it remains an entry of the row
    (p = 0 there, and p = 1 on a row of at most k finite entries), where
    −inf would read as masked.  The k = 1 maps keep :func:`_scaled`."""
    if FAM >= EXP:
        z = _shift_scale(x, ref, inv_tau)
        fin = (x > float("-inf")) & (x < float("inf"))
        z = tl.where(fin, tl.minimum(tl.maximum(z, -FLT_MAX), FLT_MAX), z)
    else:
        z = _scaled(x, ref, inv_tau)
    return z


@triton.jit
def _load_frame_z(xr, rmask, cols, n, ref, inv_tau, FAM: tl.constexpr):
    return _frame_z(_load_x(xr, rmask, cols, n), ref, inv_tau, FAM)


@triton.jit
def _finite_or_zero(v):
    # a per-row reference must be finite: 0 on rows with no finite entry
    # (fully masked, or broken rows, which the row conventions fill)
    return tl.where((v > float("-inf")) & (v < float("inf")), v, 0.0)


@triton.jit
def _lse_step(M, S, x, inv_tau):
    """One block of Σ e^{(x − M)/τ} with a running max M of the raw x (per
    row): the new (M, lane sums); sums kept at the old M are moved to the
    new one (0 while nothing was finite)."""
    Mn = tl.maximum(M, tl.max(x, 1, keep_dims=True))
    s = _finite_or_zero(Mn)
    a = tl.where(M > float("-inf"), tl.exp(_shift_scale(M, s, inv_tau)), 0.0)
    return Mn, S * a + tl.exp(_scaled(x, s, inv_tau))


@triton.jit
def _stats_block(x):
    # per lane: x where finite (−inf / +inf elsewhere, for the max and the
    # min), the finite and the NaN/+inf indicators
    fin = x > float("-inf")
    fin = fin & (x < float("inf"))
    return (tl.where(fin, x, float("-inf")), tl.where(fin, x, float("inf")), fin.to(tl.float32),
            ((x != x) | (x == float("inf"))).to(tl.float32))


@triton.jit
def _row_stats(xr, rmask, n, inv_tau, LSE: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
               ONCHIP: tl.constexpr):
    """Pass 1 over the raw rows: (xrow, lanes, max x, min x over the finite
    entries, their count m, whether the row holds a NaN or +inf, and with
    ``LSE`` Σ e^{(x − max x)/τ}), per row as [ROWS, 1] columns.

    ``xrow`` is the register copy of the rows (ONCHIP; 0 otherwise);
    ``lanes`` ([ROWS, BLOCK], looped variant) the maximum of each lane over
    the blocks (lane j holds entries j, j + BLOCK, …): a subset of the row
    that the λ search starts from (:mod:`softk._backends.triton.frame`)."""
    if ONCHIP:  # the row is one block: its lanes are the row's
        xrow = _load_x(xr, rmask, _cols(0, BLOCK), n)
        st = _stats_block(xrow)
        lanes = st[0]
        xmax = tl.max(st[0], 1, keep_dims=True)
        S = tl.zeros_like(xrow)
        if LSE:
            S = tl.exp(_scaled(st[0], _finite_or_zero(xmax), inv_tau))
    else:
        xrow = 0.0
        st = (tl.full([ROWS, BLOCK], float("-inf"), tl.float32), tl.full([ROWS, BLOCK], float("inf"), tl.float32),
              tl.zeros([ROWS, BLOCK], tl.float32), tl.zeros([ROWS, BLOCK], tl.float32))
        M = tl.full([ROWS, 1], float("-inf"), tl.float32)
        S = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            x = _load_x(xr, rmask, _cols(start, BLOCK), n)
            b = _stats_block(x)
            st = (tl.maximum(st[0], b[0]), tl.minimum(st[1], b[1]), st[2] + b[2], st[3] + b[3])
            if LSE:
                M, S = _lse_step(M, S, b[0], inv_tau)
        lanes = st[0]
    # the lse sum is relative to its running max, which ends at max x
    return (xrow, lanes, tl.max(st[0], 1, keep_dims=True), tl.min(st[1], 1, keep_dims=True),
            tl.sum(st[2], 1, keep_dims=True), tl.sum(st[3], 1, keep_dims=True) > 0, tl.sum(S, 1, keep_dims=True))
