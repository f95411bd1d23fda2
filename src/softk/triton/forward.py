"""The forward kernel: p = f(z − λ) with Σp = k, ``ROWS`` rows per program.

Program i holds rows i·ROWS … i·ROWS + ROWS − 1 of the ``R`` rows (the last
program may hold fewer: its missing rows are masked off); every per-row value
is a [ROWS, 1] column and every block a [ROWS, BLOCK] tile.  Pass 1
(:func:`.passes._row_stats`), the λ search (:func:`.search._find_lambda`,
none for softmax), and the pass writing p (:func:`.passes._write_p`).  The
on-chip and looped variants run the same body; ``ONCHIP`` only decides
whether each pass reads the register copy of the rows or loops over blocks.
"""

import triton
import triton.language as tl

from .passes import _row_stats, _write_p
from .search import _find_lambda


@triton.jit
def threshold_fwd_kernel(X, Y, ITS, R, n, k, inv_tau, alpha,
                         FAM: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                         BIG: tl.constexpr, PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr,
                         MAXIT: tl.constexpr, WRITE_ITS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    xr = X + rows * n
    yr = Y + rows * n

    # ---- pass 1: max, min, finite count, NaN/+inf, and lse for softmax/exp
    zrow, zmax, zmin, m, broken, lseS = _row_stats(xr, rmask, n, inv_tau, FAM, ROWS, BLOCK, ONCHIP)
    active = (m > k) & (~broken)
    m = tl.where(active, m, k + 1.0)  # keeps the brackets finite on rows filled below
    zmax = tl.where(active, zmax, 0.0)
    zmin = tl.where(active, zmin, 0.0)

    # ---- pass 2..: λ = c + t
    if FAM == 0:
        it = tl.zeros([ROWS, 1], tl.int32)
        c = zmax
        t = tl.log(tl.where(active, lseS, 1.0)) - tl.log(k)
    else:
        c, t, it = _find_lambda(xr, rmask, zrow, n, inv_tau, zmax, zmin, m, lseS, active, k, alpha,
                                FAM, ROWS, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT)
    if WRITE_ITS:
        tl.store(ITS + rows, it, mask=rmask)

    # ---- last pass: p
    _write_p(xr, yr, rmask, zrow, n, inv_tau, c, t, alpha, active, broken, FAM, BLOCK, ONCHIP)
