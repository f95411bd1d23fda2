"""The forward kernel: p = f(z − λ) with Σp = k, one program per row.

Pass 1 (:func:`.passes._row_stats`), the λ search (:func:`.search._find_lambda`,
none for softmax), and the pass writing p (:func:`.passes._write_p`).  The
on-chip and looped variants run the same body; ``ONCHIP`` only decides
whether each pass reads the register copy of the row or loops over blocks.
"""

import triton
import triton.language as tl

from .passes import _row_stats, _write_p
from .search import _find_lambda


@triton.jit
def threshold_fwd_kernel(X, Y, ITS, n, k, inv_tau, alpha,
                         FAM: tl.constexpr, BLOCK: tl.constexpr, ONCHIP: tl.constexpr,
                         BIG: tl.constexpr, PROBE: tl.constexpr, NEWTON_CAP: tl.constexpr,
                         MAXIT: tl.constexpr, WRITE_ITS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = X + row * n
    yr = Y + row * n

    # ---- pass 1: max, min, finite count, NaN/+inf, and lse for softmax/exp
    zrow, zmax, zmin, m, broken, lseS = _row_stats(xr, n, inv_tau, FAM, BLOCK, ONCHIP)
    active = (m > k) & (~broken)
    m = tl.where(active, m, k + 1.0)  # keeps the brackets finite on rows filled below
    zmax = tl.where(active, zmax, 0.0)
    zmin = tl.where(active, zmin, 0.0)

    # ---- pass 2..: λ = c + t
    it = tl.full((), 0, tl.int32)
    if FAM == 0:
        c = zmax
        t = tl.log(tl.where(active, lseS, 1.0)) - tl.log(k)
    else:
        c, t, it = _find_lambda(xr, zrow, n, inv_tau, zmax, zmin, m, lseS, active, k, alpha,
                                FAM, BLOCK, ONCHIP, BIG, PROBE, NEWTON_CAP, MAXIT)
    if WRITE_ITS:
        tl.store(ITS + row, it)

    # ---- last pass: p
    _write_p(xr, yr, zrow, n, inv_tau, c, t, alpha, active, broken, FAM, BLOCK, ONCHIP)
