r"""α-entmax with α a tensor (per row, learnable): gradients for x *and* α.

With β = 1/(α−1) and p_i = [(α−1)(z_i−λ)]_+^β, differentiating Σp = 1 at fixed
z gives (Peters et al. 2019, §3.2; the same expression as the entmax package's
``EntmaxBisectFunction``):

.. math::  \frac{\partial p_i}{\partial\alpha} =
   \frac{p_i - \tilde p_i}{(\alpha-1)^2} - \frac{p_i\log p_i - \tilde p_i\sum_j p_j\log p_j}{\alpha-1},
   \qquad \tilde p_i = \frac{p_i^{2-\alpha}}{\sum_j p_j^{2-\alpha}}.

Both terms are of size 1/(α−1) and cancel to O(1) as α → 1 (float32 at
α = 1.001 kept no correct digit).  With a = α − 1, ℓ_i = log p_i,
S = Σ_j p_j ℓ_j and γ(y) = e^y − 1 − y (= y²/2 + …), the same derivative is

.. math::  \frac{\partial p_i}{\partial\alpha} =
   \frac{p_i\,\bigl[\Gamma\,(1 - a\ell_i) - \gamma(-a\ell_i)\,(1 - aS)\bigr]}{a^2\,\sum_j p_j^{1-a}},
   \qquad \Gamma = \sum_j p_j\,\gamma(-a\ell_j),

(from p̃_i ∝ p_i e^{−aℓ_i} and e^{−aℓ} = 1 − aℓ + γ(−aℓ)), whose two terms
are of size a² and form the O(a²) numerator without cancelling to it; γ is
summed as a series for small arguments (:func:`p_gamma`).  At α = 1
exactly (softmax) it is the limit ∂p_i/∂α = p_i (Σ_j p_j log²p_j − log²p_i) / 2,
written with the next term of its series in α − 1 (0 there in value) so that
its own derivative in α is right too.

This module is the mathematics: p (:func:`entmax_rows`), log f′ through p
(:func:`entmax_log_d`) and ∂p/∂α (:func:`dp_dalpha`).  Its autograd rule and
the custom op ``softk::entmax_alpha`` are :mod:`softk._ops.entmax_alpha`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .families import entmax_family
from .rows import compute_dtype, row_status, shift_over_tau
from .entmax_anchor import entmax_probs, needs_anchor
from .fast_paths import solve_on_candidates
from .solve import solve_probs


def entmax_log_d(p: Tensor, a: Tensor) -> Tensor:
    # log f'(u) through p: (2 − α) log p on the support, −inf off it.  Kept in
    # log space: p^(2−α) overflows for small p at large α.
    logp = torch.log(torch.where(p > 0, p, 1.0))
    return torch.where(p > 0, (2 - a) * logp, float("-inf"))


def entmax_rows(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """p of α-entmax on the last dimension (no autograd), one α per row.

    The row is shifted by its finite maximum before dividing by τ (entmax is
    shift invariant; x/τ first rounds the differences away at large offsets
    or tiny τ), and p comes from :func:`softk.threshold.solve.solve_probs`
    (exact for every α > 1, softmax at α = 1).  Row conventions as every map.
    """
    ct = compute_dtype(x.dtype)
    xc = x.to(ct)
    a = alpha.to(ct)
    finite, active, broken = row_status(xc, 1)
    top = torch.where(finite, xc, float("-inf")).amax(-1, keepdim=True)
    s = torch.where(active, shift_over_tau(xc, torch.where(active, top, 0.0), tau, check=False), 0.0)
    soft = a == 1
    family = entmax_family(torch.where(soft, 2.0, a))
    if s.shape[-1] >= 64:
        # λ from the pooled fast path (no sort of the row), then p refined on its support
        lam, _, _, idx, valid = solve_on_candidates(family, s, 1)
        if needs_anchor(family.alpha):
            p = entmax_probs(family.alpha, s, lam, active)
        elif idx is not None:  # p = 0 off the gathered candidates: evaluate only those
            vals = torch.where(valid, family.f(s.gather(-1, idx) - lam), 0.0)
            p = torch.zeros_like(s).scatter_add_(-1, idx, vals)
        else:
            p = family.f(s - lam)
    else:
        p, _ = solve_probs(family, s, 1, active)
    if bool(soft.any()):
        p = torch.where(soft, torch.softmax(s, -1), p)
    filled = torch.where(broken, float("nan"), finite.to(ct))
    return torch.where(active, p, filled)


# below this y = −aℓ, γ(y) = e^y − 1 − y is summed as its series, to the
# term y^GAMMA_TERMS/GAMMA_TERMS! (the first left out, y²⁰/20!, is below 1e−18
# of γ there); above, p·γ = d − p − p·y, whose terms cancel by a factor
# e^y/γ(y) ≤ e/(e − 2) ≈ 3.8 (against ~140 at y = 1/8, where a smaller
# bound left float32's dα 30 times less precise for α ≈ 1.03–1.08)
GAMMA_SERIES = 1.0
GAMMA_TERMS = 19


def p_gamma(p: Tensor, logp: Tensor, d: Tensor, a) -> Tensor:
    """p·γ(−a log p) with γ(y) = e^y − 1 − y, from p, log p and d = p^{1−a}
    (p·e^y = d: no overflow where p is tiny); 0 where p = 0."""
    y = torch.where(p > 0, -a * logp, 0.0)
    small = torch.abs(y) < GAMMA_SERIES
    ys = torch.where(small, y, 0.0)
    series = torch.zeros_like(ys)
    for n in range(GAMMA_TERMS, 1, -1):  # Horner: Σ_{n≥2} yⁿ/n!
        series = (series + 1.0) * ys / n
    series = series * ys  # y²/2 + y³/6 + …
    return torch.where(p > 0, torch.where(small, p * series, d - p - p * y), 0.0)


def dp_dalpha(p: Tensor, a: Tensor, logd: Tensor) -> Tensor:
    """∂p/∂α (the module docstring's cancellation-free form and its α = 1
    limit), from the output p, α and log d (d = f′ through p)."""
    logp = torch.log(torch.where(p > 0, p, 1.0))
    am1 = torch.where(a == 1, 1.0, a - 1)
    d = torch.exp(logd)
    e = d.sum(-1, keepdim=True)
    pg = p_gamma(p, logp, d, am1)
    big_g = pg.sum(-1, keepdim=True)
    s_ent = (p * logp).sum(-1, keepdim=True)
    general = (p * big_g * (1 - am1 * logp) - pg * (1 - am1 * s_ent)) / (am1**2 * torch.where(e > 0, e, 1.0))
    # at α = 1 the limit, plus (α − 1) times the next term of its series in
    # α − 1 at fixed p, which is 0 in value but gives the derivative's own
    # α-derivative: with ℓ = log p, S = Σpℓ and M_k = Σpℓᵏ,
    # ∂p_i/∂α = p_i[(M₂ − ℓ_i²)/2 + (α − 1)((ℓ_i³ − M₃)/6 + (S − ℓ_i)M₂/2) + O((α − 1)²)]
    m2 = (p * logp**2).sum(-1, keepdim=True)
    m3 = (p * logp**3).sum(-1, keepdim=True)
    limit = p * (0.5 * (m2 - logp**2) + (a - 1) * ((logp**3 - m3) / 6 + (s_ent - logp) * m2 / 2))
    return torch.where(a == 1, limit, general)
