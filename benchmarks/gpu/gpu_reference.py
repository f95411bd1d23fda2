"""A float64 reference for the GPU correctness check, computed with torch ops on any device.

Written from the definitions, not from softk's code (like ``tests/oracle.py``,
which it is tested against): p_i = f(z_i − λ) with Σ p = k over the finite
entries, λ found by bisection in float64.  The bracket [lo, hi] starts at
[z_(k) − 1, z_max + 1] (z_(k) the k-th largest) and is widened by doubling
until g(lo) ≥ k ≥ g(hi), g(λ) = Σ f(z − λ); then ``iters`` halvings (the
default 200 take any bracket below 2^60 to adjacent floats).  Conventions: −inf
entries get p = 0; a row with at most k finite entries gets 1 on each of
them (all zeros when fully masked).  Rows are vectorised: all rows bisect
together.

The backward is the vector–Jacobian product of the map, written through the
derivative d = f′(z − λ) expressed with p:
dx = d ⊙ g − d · (Σ d g) / (Σ d), and 0 where Σ d = 0.
"""

from __future__ import annotations

import torch

# f(u) per family, and f′ written through p = f(u) (what a backward that saved p can use).
def _entmax_f(alpha):
    return lambda u: torch.clamp((alpha - 1.0) * u, min=0.0) ** (1.0 / (alpha - 1.0))


def _f_laplace(u):
    e = 0.5 * torch.exp(-u.abs())
    return torch.where(u >= 0, 1.0 - e, e)


FAMILIES = {
    # name: (f, d_from_p, k, alpha or None)
    "softmax": (torch.exp, lambda p: p, 1, None),
    "sparsemax": (lambda u: torch.clamp(u, min=0.0), lambda p: (p > 0).double(), 1, None),
    "entmax15": (_entmax_f(1.5), lambda p: p.sqrt(), 1, 1.5),
    "entmax_a1.3": (_entmax_f(1.3), lambda p: p ** (2.0 - 1.3), 1, 1.3),
    "exp": (lambda u: torch.exp(torch.clamp(u, max=0.0)), lambda p: torch.where(p < 1, p, torch.zeros_like(p)), 3, None),
    "sigmoid": (torch.sigmoid, lambda p: p * (1.0 - p), 3, None),
    "laplace": (_f_laplace, lambda p: torch.minimum(p, 1.0 - p), 3, None),
    "sparse": (lambda u: torch.clamp(u, 0.0, 1.0), lambda p: ((p > 0) & (p < 1)).double(), 3, None),
}
# Where f′ jumps or is not Lipschitz (in u): the gradient is ambiguous for an entry sitting there.
KINKS = {"sparsemax": (0.0,), "entmax15": (0.0,), "entmax_a1.3": (0.0,), "exp": (0.0,), "sparse": (0.0, 1.0)}


def _masked_sum(f, z, fin, lam):
    return torch.where(fin, f(z - lam[:, None]), torch.zeros_like(z)).sum(-1)


def solve(x: torch.Tensor, family: str, iters: int = 200):
    """(p, λ, z) in float64 for the rows of 2-D ``x`` (τ = 1); λ is NaN on rows with at most k finite entries."""
    f, _, k, _ = FAMILIES[family]
    z = x.detach().to(torch.float64)
    fin = torch.isfinite(z)
    nfin = fin.sum(-1)
    easy = nfin <= k  # at most k finite entries: p = 1 on each (no λ)
    zf = torch.where(fin, z, torch.zeros_like(z))
    zmax = torch.where(fin, z, torch.full_like(z, -torch.inf)).max(-1).values
    zk = torch.where(fin, z, torch.full_like(z, -torch.inf)).topk(min(k, z.shape[-1]), dim=-1).values[:, -1]
    zmax = torch.where(easy, torch.zeros_like(zmax), zmax)
    zk = torch.where(easy, torch.zeros_like(zk), zk)
    kk = torch.full_like(zmax, float(k))
    lo, hi = zk - 1.0, zmax + 1.0
    step_lo, step_hi = torch.ones_like(lo), torch.ones_like(hi)
    for _ in range(80):  # widen: 2^80 covers any finite float32 row
        need_lo = (_masked_sum(f, zf, fin, lo) < kk) & ~easy
        need_hi = (_masked_sum(f, zf, fin, hi) > kk) & ~easy
        if not (need_lo.any() or need_hi.any()):
            break
        step_lo = torch.where(need_lo, 2 * step_lo, step_lo)
        step_hi = torch.where(need_hi, 2 * step_hi, step_hi)
        lo = torch.where(need_lo, zk - step_lo, lo)
        hi = torch.where(need_hi, zmax + step_hi, hi)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        above = _masked_sum(f, zf, fin, mid) > kk  # g decreases in λ: too much mass means λ is too small
        lo = torch.where(above, mid, lo)
        hi = torch.where(above, hi, mid)
    lam = 0.5 * (lo + hi)
    p = torch.where(fin, f(zf - lam[:, None]), torch.zeros_like(z))
    p = torch.where(easy[:, None], fin.double(), p)
    lam = torch.where(easy, torch.full_like(lam, torch.nan), lam)
    return p, lam, z


def derivative(family: str, p: torch.Tensor) -> torch.Tensor:
    """f′(z − λ) written through p (float64), 0 where p = 0."""
    _, d_of_p, _, _ = FAMILIES[family]
    p = p.to(torch.float64)
    return torch.where(p > 0, d_of_p(p.clamp(min=0.0)), torch.zeros_like(p))


def vjp(family: str, p: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """dx for upstream gradient ``g`` at output ``p`` (float64), through f′ written with p."""
    d = derivative(family, p)
    g = g.to(torch.float64)
    s = d.sum(-1, keepdim=True)
    ghat = torch.where(s > 0, (d * g).sum(-1, keepdim=True) / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))
    return d * (g - ghat)


def near_kink(family: str, z: torch.Tensor, lam: torch.Tensor, delta: float) -> torch.Tensor:
    """Per row: some finite entry has z − λ within ``delta`` of a point where f′ is not Lipschitz."""
    out = torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    fin = torch.isfinite(z) & torch.isfinite(lam)[:, None]
    u = torch.where(fin, z - torch.nan_to_num(lam)[:, None], torch.full_like(z, torch.inf))
    for kink in KINKS.get(family, ()):
        out |= ((u - kink).abs() <= delta).any(-1)
    return out
