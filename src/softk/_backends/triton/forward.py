"""The forward kernel: p = f(z − λ) with Σp = k, ``ROWS`` rows per program.

Program i holds rows i·ROWS … i·ROWS + ROWS − 1 of the ``R`` rows (the last
program may hold fewer: its missing rows are masked off); every per-row value
is a [ROWS, 1] column and every block a [ROWS, BLOCK] tile.  Pass 1 over the
raw rows (:func:`.prelude._row_stats`), the frame and the λ search
(:func:`.frame._solve`; entmax α outside [1.125, 2] solves for an anchor
entry's log-probability instead, :func:`.anchor._solve_anchor`, which
searches the row only where the lane maxima's anchor does not serve it),
and the pass writing p.  The on-chip and
looped variants run the same body; ``ONCHIP`` only decides whether each
pass reads the register copy of the rows or loops over blocks.
"""

import triton
import triton.language as tl

from .ids import EXP, SOFTMAX
from .anchor import _solve_anchor, _write_p_anchor
from .frame import _solve
from .passes import _write_p
from .prelude import _row_stats


@triton.jit
def threshold_fwd_kernel(X, Y, ITS, R, n, k, inv_tau, am1,
                         FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                         BIG: tl.constexpr, PROBE: tl.constexpr, ANCHOR: tl.constexpr, NEWTON_CAP: tl.constexpr,
                         MAXIT: tl.constexpr, WRITE_ITS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    xr = X + rows * n
    yr = Y + rows * n

    # ---- pass 1 (raw x): max, min, finite count, NaN/+inf, lse for softmax/exp
    xrow, lanes, xmax, xmin, m, broken, lseS = _row_stats(xr, rmask, n, inv_tau, FAM == SOFTMAX or FAM == EXP,
                                                          ROWS, BLOCK, ONCHIP)
    active = (m > k) & (~broken)
    m = tl.where(active, m, k + 1.0)  # keeps the brackets finite on rows filled below

    # ---- the frame and passes 2..: λ = c + t in z = (x − ref)/τ
    if ANCHOR:
        # α-entmax far from 1.5: p from the anchor entry's log-probability
        ref, A, ell, it = _solve_anchor(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, active, k, am1,
                                        FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT, ANCHOR)
    else:
        ref, c, t, it = _solve(xr, rmask, xrow, lanes, n, inv_tau, xmax, xmin, m, lseS, active, k, am1,
                               FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT)
    if WRITE_ITS:
        tl.store(ITS + rows, it, mask=rmask)

    # ---- last pass: p
    if ANCHOR:
        _write_p_anchor(xr, yr, rmask, xrow, n, ref, inv_tau, A, ell, am1, active, broken, BLOCK, ONCHIP)
    else:
        _write_p(xr, yr, rmask, xrow, n, ref, inv_tau, c, t, am1, k, active, broken, FAM, BLOCK, ONCHIP)
