"""The backward kernel, from the saved p: dx = d (g − Σdg/Σd)/τ with
d = f′(u) read off p (``_d_from_p``), one program per row.  On-chip rows are
read once; wider rows twice (the two sums, then dx), in blocks of ``BLOCK``.
"""

import triton
import triton.language as tl

from .family_math import _d_from_p


@triton.jit
def _load_d_g(P, G, base, offs, n, alpha, FAM: tl.constexpr):
    p = tl.load(P + base + offs, mask=offs < n, other=0.0).to(tl.float32)
    g = tl.load(G + base + offs, mask=offs < n, other=0.0).to(tl.float32)
    return _d_from_p(p, FAM, alpha), g


@triton.jit
def _coef(sdg, sd):
    # Σdg/Σd, and 0 on a row with Σd = 0 (filled rows: p is 0/1 there)
    tot = tl.sum(sd, 0)
    return tl.where(tot > 0, tl.sum(sdg, 0) / tl.where(tot > 0, tot, 1.0), 0.0)


@triton.jit
def _store_dx(DX, base, offs, n, d, g, coef, inv_tau):
    tl.store(DX + base + offs, (d * (g - coef) * inv_tau).to(DX.dtype.element_ty), mask=offs < n)


@triton.jit
def threshold_bwd_kernel(P, G, DX, n, inv_tau, alpha, FAM: tl.constexpr, BLOCK: tl.constexpr,
                         ONCHIP: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * n
    if ONCHIP:
        offs = tl.arange(0, BLOCK)
        d, g = _load_d_g(P, G, base, offs, n, alpha, FAM)
        _store_dx(DX, base, offs, n, d, g, _coef(d * g, d), inv_tau)
    else:
        sdg = tl.zeros([BLOCK], tl.float32)
        sd = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            d, g = _load_d_g(P, G, base, start + tl.arange(0, BLOCK), n, alpha, FAM)
            sdg += d * g
            sd += d
        coef = _coef(sdg, sd)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            d, g = _load_d_g(P, G, base, offs, n, alpha, FAM)
            _store_dx(DX, base, offs, n, d, g, coef, inv_tau)
