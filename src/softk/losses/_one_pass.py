r"""Pieces shared by the fused loss's one-pass forms (cross-entropy's in
:mod:`._cross_entropy`, TS²'s in :mod:`._ts2`, the sparse Fenchel–Young losses' in
:mod:`._fy_live`): each works on a chunk's logits in place, without autograd.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..threshold.rows import shift_over_tau


def exp_(logp: Tensor) -> Tensor:
    """p = exp(log p) in place on a chunk of log-probabilities.  On the CPU the
    entries under log(tiny) become exact zeros first: exp of such an entry is
    a denormal or 0, and the CPU's exp takes a slow path for those
    (BENCHMARKS.md); p < tiny is below any gradient's rounding."""
    if logp.is_cpu:
        torch.nn.functional.threshold(logp, math.log(torch.finfo(logp.dtype).tiny), -math.inf, inplace=True)
    return logp.exp_()


def support_rows(z: Tensor, zy: Tensor, p: Tensor, r: Tensor, j: Tensor, tau: float, psi) -> Tensor:
    r"""The Fenchel–Young loss of each row of z (C, V) at z/τ from the support
    entries (r, j) of p = map(z/τ) alone, with Ω(p) = Σ ψ(p_j), ψ(0) = 0 and
    Σ p = 1:

    .. math:: L = \sum_{j \in \operatorname{supp} p} \bigl[p_j (z_j - z_y)/\tau - \psi(p_j)\bigr] + \psi(1),

    zy (C,) the target's logit; differences to z_y keep far-from-origin
    logits exact.  Clamped at 0 (exact L ≥ 0; only rounding goes below)."""
    pj = p[r, j]
    psi1 = psi(torch.ones((), dtype=z.dtype, device=z.device))
    rows = torch.zeros_like(zy).index_add(0, r, pj * shift_over_tau(z[r, j], zy[r], tau, check=False) - psi(pj)) + psi1
    return torch.clamp(rows, min=0.0)
