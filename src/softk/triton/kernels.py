r"""The kernels: forward p = f(z − λ), Σp = k, and backward from the saved p.

One program per row; the row is read in blocks of ``BLOCK`` in a loop, so any
width works (no 65,536 limit).  Arithmetic is float32 whatever the input dtype.

Forward:
1. one pass for the row's max/min, finite count and a NaN/+inf flag;
2. softmax: one more pass (the closed form λ = lse(z) − log k);
   every other family: ``ITERS`` bisection steps on g(λ) = Σ f(z − λ) inside a
   bracket with g(lo) ≥ k ≥ g(hi) (one pass each).  60 halvings of the bracket
   reach adjacent float32 numbers, i.e. λ to float32 precision;
3. one pass writing p (or the row conventions: NaN rows, ≤ k finite entries).

Backward (two passes): Σ d·g and Σ d, then d (g − Σdg/Σd)/τ, with d = f'(u)
read off the saved p (the same formulas as ``Family.d_from_p``).

Family ids: 0 softmax, 1 sparsemax, 2 entmax15, 3 entmax α, 4 exp (soft top-k),
5 sigmoid, 6 laplace, 7 sparse (capped simplex).
"""

import triton
import triton.language as tl


@triton.jit
def _f(u, FAM: tl.constexpr, alpha):
    if FAM == 0:
        r = tl.exp(u)
    elif FAM == 1:
        r = tl.maximum(u, 0.0)
    elif FAM == 2:
        h = tl.maximum(u, 0.0) * 0.5
        r = h * h
    elif FAM == 3:
        s = tl.maximum((alpha - 1.0) * u, 0.0)
        r = tl.where(s > 0, tl.exp(tl.log(tl.where(s > 0, s, 1.0)) / (alpha - 1.0)), 0.0)
    elif FAM == 4:
        r = tl.exp(tl.minimum(u, 0.0))
    elif FAM == 5:
        r = 1.0 / (1.0 + tl.exp(-u))
    elif FAM == 6:
        r = tl.where(u >= 0, 1.0 - 0.5 * tl.exp(-tl.abs(u)), 0.5 * tl.exp(-tl.abs(u)))
    else:
        r = tl.minimum(tl.maximum(u, 0.0), 1.0)
    return r


@triton.jit
def _d_from_p(p, FAM: tl.constexpr, alpha):
    if FAM == 0:
        d = p
    elif FAM == 1:
        d = tl.where(p > 0, 1.0, 0.0)
    elif FAM == 2:
        d = tl.sqrt(p)
    elif FAM == 3:
        d = tl.where(p > 0, tl.exp((2.0 - alpha) * tl.log(tl.where(p > 0, p, 1.0))), 0.0)
    elif FAM == 4:
        d = tl.where(p < 1, p, 0.0)
    elif FAM == 5:
        d = p * (1.0 - p)
    elif FAM == 6:
        d = tl.minimum(p, 1.0 - p)
    else:
        d = tl.where((p > 0) & (p < 1), 1.0, 0.0)
    return d


@triton.jit
def threshold_fwd_kernel(X, Y, n, k, inv_tau, alpha, FAM: tl.constexpr, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xr = X + row * n
    yr = Y + row * n
    NEG = float("-inf")
    vmax = tl.full([BLOCK], NEG, tl.float32)
    vmin = tl.full([BLOCK], float("inf"), tl.float32)
    cnt = tl.zeros([BLOCK], tl.float32)
    bad = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = tl.load(xr + offs, mask=offs < n, other=NEG).to(tl.float32) * inv_tau
        fin = z > NEG
        bad += tl.where((z != z) | (z == float("inf")), 1.0, 0.0)
        vmax = tl.maximum(vmax, tl.where(fin, z, NEG))
        vmin = tl.minimum(vmin, tl.where(fin, z, float("inf")))
        cnt += tl.where(fin, 1.0, 0.0)
    zmax = tl.max(vmax, 0)
    zmin = tl.min(vmin, 0)
    m = tl.sum(cnt, 0)
    broken = tl.sum(bad, 0) > 0
    active = (m > k) & (~broken)
    m = tl.where(active, m, k + 1.0)  # keeps the brackets finite on rows filled below
    if FAM == 0:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(xr + offs, mask=offs < n, other=NEG).to(tl.float32) * inv_tau
            acc += tl.where(z > NEG, tl.exp(z - zmax), 0.0)
        lam = zmax + tl.log(tl.sum(acc, 0)) - tl.log(k)
    else:
        # Brackets with g(lo) >= k >= g(hi), from the family's shape.
        if FAM == 1:
            lo = zmax - 1.0
            hi = zmax
        elif FAM == 2:
            lo = zmax - 2.0
            hi = zmax
        elif FAM == 3:
            lo = zmax - 1.0 / (alpha - 1.0)
            hi = zmax
        elif FAM == 4:
            lo = zmin
            hi = zmax + tl.log(m / k)
        elif FAM == 5:
            r = tl.log(k / m) - tl.log(1.0 - k / m)
            lo = zmin - r
            hi = zmax - r
        elif FAM == 6:
            lo = zmin + tl.log(2.0 * (1.0 - k / m))
            hi = zmax + tl.log(m / k)
        else:
            lo = zmin - 1.0
            hi = zmax
        for _ in range(ITERS):
            mid = 0.5 * (lo + hi)
            acc = tl.zeros([BLOCK], tl.float32)
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                z = tl.load(xr + offs, mask=offs < n, other=NEG).to(tl.float32) * inv_tau
                acc += tl.where(z > NEG, _f(z - mid, FAM, alpha), 0.0)
            ge = tl.sum(acc, 0) >= k
            lo = tl.where(ge, mid, lo)
            hi = tl.where(ge, hi, mid)
        lam = 0.5 * (lo + hi)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        z = tl.load(xr + offs, mask=offs < n, other=NEG).to(tl.float32) * inv_tau
        fin = z > NEG
        p = tl.where(fin, _f(z - lam, FAM, alpha), 0.0)
        filled = tl.where(broken, float("nan"), tl.where(fin, 1.0, 0.0))
        p = tl.where(active, p, filled)
        tl.store(yr + offs, p.to(Y.dtype.element_ty), mask=offs < n)


@triton.jit
def threshold_bwd_kernel(P, G, DX, n, inv_tau, alpha, FAM: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    sdg = tl.zeros([BLOCK], tl.float32)
    sd = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(P + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
        g = tl.load(G + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
        d = _d_from_p(p, FAM, alpha)
        sdg += d * g
        sd += d
    tot = tl.sum(sd, 0)
    coef = tl.where(tot > 0, tl.sum(sdg, 0) / tl.where(tot > 0, tot, 1.0), 0.0)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        p = tl.load(P + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
        g = tl.load(G + row * n + offs, mask=offs < n, other=0.0).to(tl.float32)
        d = _d_from_p(p, FAM, alpha)
        tl.store(DX + row * n + offs, (d * (g - coef) * inv_tau).to(DX.dtype.element_ty), mask=offs < n)
