"""The backward kernel, from the saved p: dx = d (g − Σdg/Σd)/τ with
d = f′(u) read off p (``_d_from_p``), ``ROWS`` rows per program (as in the
forward kernel: [ROWS, BLOCK] tiles, per-row sums as [ROWS, 1] columns, rows
past ``R`` masked off); a row holding a NaN p gets a NaN dx.  On-chip rows
are read once; wider rows twice (the two sums, then dx), in blocks of
``BLOCK``.
"""

import triton
import triton.language as tl

from .family_math import _d_from_p


@triton.jit
def _load_d_g(P, G, base, rmask, cols, n, alpha, FAM: tl.constexpr):
    mask = rmask & (cols < n)
    p = tl.load(P + base + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + base + cols, mask=mask, other=0.0).to(tl.float32)
    # a NaN p (a NaN/+inf row) gives NaN d, so the row's sums and its whole
    # dx are NaN, torch.softmax's convention (_d_from_p alone maps it to 0
    # for the families whose d is a comparison)
    return tl.where(p != p, p, _d_from_p(p, FAM, alpha)), g


@triton.jit
def _coef(sdg, sd):
    # Σdg/Σd per row, and 0 on a row with Σd = 0 (filled rows: p is 0/1 there)
    tot = tl.sum(sd, 1, keep_dims=True)
    return tl.where(tot > 0, tl.sum(sdg, 1, keep_dims=True) / tl.where(tot > 0, tot, 1.0), 0.0)


@triton.jit
def _store_dx(DX, base, rmask, cols, n, d, g, coef, inv_tau):
    tl.store(DX + base + cols, (d * (g - coef) * inv_tau).to(DX.dtype.element_ty), mask=rmask & (cols < n))


@triton.jit
def threshold_bwd_kernel(P, G, DX, R, n, inv_tau, alpha, FAM: tl.constexpr, ROWS: tl.constexpr,
                         BLOCK: tl.constexpr, ONCHIP: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]  # [ROWS, 1]
    rmask = rows < R
    base = rows * n
    if ONCHIP:
        cols = tl.arange(0, BLOCK)[None, :]
        d, g = _load_d_g(P, G, base, rmask, cols, n, alpha, FAM)
        _store_dx(DX, base, rmask, cols, n, d, g, _coef(d * g, d), inv_tau)
    else:
        sdg = tl.zeros([ROWS, BLOCK], tl.float32)
        sd = tl.zeros([ROWS, BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            d, g = _load_d_g(P, G, base, rmask, start + tl.arange(0, BLOCK)[None, :], n, alpha, FAM)
            sdg += d * g
            sd += d
        coef = _coef(sdg, sd)
        for start in range(0, n, BLOCK):
            cols = start + tl.arange(0, BLOCK)[None, :]
            d, g = _load_d_g(P, G, base, rmask, cols, n, alpha, FAM)
            _store_dx(DX, base, rmask, cols, n, d, g, coef, inv_tau)
