r"""α-entmax p to the working dtype's precision for every α > 1, from a λ
that is only known to its float resolution.

With a = α − 1, β = 1/a and w_i = a(z_i − λ):  p_i = (w_i)_+^β,  Σp = 1.

Why λ alone is not enough.  p_i depends on w_i, i.e. on z_i − λ, and two
regimes defeat a float λ:

* large α: an entry with p = 0.03 at α = 5 has w = p⁴ ≈ 1e−6, so z_i − λ must
  be resolved far below ulp(z_i) (float32 α = 5, x = [0, −0.2178]: the grid
  of λ puts p₂ at 0 or ±1 %; at α = 50 float64 every p < 0.5 is below an ulp);
* α → 1⁺: w ≈ 1 for every entry and p = w^β with β = 1/a large, so the
  absolute rounding of w (eps) becomes a relative error β·eps of p
  (float32 α = 1.0001 on zeros(5) gave 0.2001 each).

The anchor form.  Take an entry j of the support (the smallest one) as the
anchor and its log-probability ℓ = log p_j as the unknown.  Then
w_j = e^{aℓ} and w_i = w_j + a·d_i with d_i = z_i − z_j, so

.. math::  \log p_i = \ell + \beta\,\mathrm{softplus}\bigl(\log(a d_i) - a\ell\bigr)
           \quad (d_i > 0), \qquad \log p_i = \ell \quad (d_i = 0),

and for d_i < 0 the same with log1p(−e^{log(a|d_i|) − aℓ}) (0 once that is
≥ 1).  Every quantity is a difference of nearby entries, a log or a softplus:
the edge entry p_j = e^ℓ is resolved to its own relative precision whatever
its w, and for a → 0 the softplus term is d_i·e^{−aℓ}·(1 + O(a)), so
log p_i → ℓ + d_i: softmax, continuously.  For huge α (1e10, 1e30) the terms
with d_i < 0 vanish and p tends to the argmax (uniform on ties); a·ℓ and
log(a·d) stay finite for every finite α, so no ceiling on α is needed
(α = inf is refused by the callers).

Near α = 1 (α − 1 < 1/8) the anchor is the row's maximum instead.  The
smallest support entry can then sit hundreds of units below the rest (an
entry 500 below three zeros at α = 1.0001 has ℓ ≈ −514), and ℓ's own float
resolution, ulp(ℓ), becomes a relative error of every p; at the maximum
ℓ = log p_max lies in [−log m, 0] (m finite entries, each p_i ≤ p_max), every
d_i ≤ 0 takes the log1p form, which tends to log p_i = ℓ + d_i (softmax), and
G is convex in ℓ.

G(ℓ) = Σ_i p_i is increasing in ℓ (and convex on the terms with d_i ≥ 0:
d log p_i/dℓ = σ(a ℓ − log(a d_i)) ∈ (0, 1]); Newton runs inside the bracket
(−∞, 0] (p_j = 1 gives G ≥ 1), bisecting when a step leaves it.  The anchor is
chosen from the solver's λ; when even p_j → 0 leaves G ≥ 1 the anchor is
not in the support and the next entry up is
taken, starting from the largest entry at or below λ (a few rounds: only
entries within the rounding of λ are in doubt).
"""

from __future__ import annotations

import torch
from torch import Tensor

_ROUNDS = 4
# Below this α − 1 the anchor is the row's maximum (see the module docstring).
NEAR_ONE = 0.125
_NEWTON = 60


def _log_terms(d: Tensor, ell: Tensor, a, beta, log_a) -> tuple:
    """(log p_i, d log p_i / dℓ) for anchor offsets d at anchor log-prob ℓ."""
    pos = d > 0
    neg = d < 0
    absd = torch.where(pos | neg, torch.abs(d), 1.0)
    L = log_a + torch.log(absd) - a * ell  # log(a|d|/w_j); a·ℓ finite for any finite α
    sp = torch.nn.functional.softplus(L)
    up = beta * sp
    # The same log p_i = β·log(w_j + a·d_i) taken directly: its rounding is
    # eps·(β + |log p_i|) against eps·(|ℓ| + β·softplus) above, smaller on the
    # entries far above a small anchor when β is moderate; used where w_j is
    # a normal number (a w_j that underflowed would be lost in the sum).
    wj = torch.exp(a * ell)
    direct = pos & (wj >= torch.finfo(d.dtype).tiny)
    w = wj + a * torch.where(direct, d, 0.0)
    logw = torch.log(torch.where(direct, w, 1.0))
    better = direct & (beta + torch.abs(beta * logw) < torch.abs(ell) + up)
    up = torch.where(better, beta * logw - ell, up)
    y = torch.exp(torch.clamp(L, max=0.0))
    inside = neg & (L < 0)
    down = beta * torch.log1p(-torch.where(inside, y, 0.0))
    logp = ell + torch.where(pos, up, torch.where(inside, down, 0.0))
    logp = torch.where(neg & ~inside, float("-inf"), logp)
    slope = torch.where(pos, torch.sigmoid(-L), torch.where(inside, 1.0 / (1.0 - torch.where(inside, y, 0.0)), 1.0))
    slope = torch.where(torch.isfinite(logp), slope, 0.0)
    return logp, slope


def needs_anchor(alpha) -> bool:
    """Whether p = f(s − λ) with a float λ falls short for this α: near 1
    (β = 1/(α−1) > 8 multiplies w's rounding) or above 2 (support entries
    with w = p^{α−1} ≪ p sit below λ's grid).  For 1.125 ≤ α ≤ 2 the error
    of f(s − λ) is β·eps·(1 + |log p|) at most, the same as the anchor form's."""
    if isinstance(alpha, (int, float)):  # (a float is a double: the same test as below, no tensor made)
        return alpha - 1 < 0.125 or alpha - 1 > 1
    a = torch.as_tensor(alpha, dtype=torch.float64) - 1
    return bool(((a < 0.125) | (a > 1)).any())


def entmax_probs(alpha, s: Tensor, lam: Tensor, active: Tensor) -> Tensor:
    """p of α-entmax (k = 1) on rows ``s`` (..., n) given the solver's λ
    (..., 1) on the same rows, refined as described above.

    Only the entries at or above the largest one ≤ λ can be in the support
    (λ is the root to within its rounding), so the refinement runs on those,
    gathered by a partial sort, and p is scattered back.

    >>> import torch
    >>> s = torch.tensor([0.0, -0.21782390773296356])
    >>> lam = torch.tensor([-0.2178238])  # a float λ: p₂ would be 0 or ±1 % off
    >>> entmax_probs(5.0, s, lam, torch.tensor([True]))
    tensor([0.9661, 0.0339])
    """
    n = s.shape[-1]
    finite = s > float("-inf")
    below = torch.where(finite & (s <= lam), s, float("-inf")).amax(-1, keepdim=True)
    count = (finite & (s >= below)).sum(-1, keepdim=True) if n > 1 else None
    K = int(count.amax()) if count is not None and count.numel() else n
    if 0 < K < n // 2:
        vals, idx = torch.topk(s, K, dim=-1)
        p = _entmax_probs_dense(alpha, vals, lam, active)
        return torch.zeros_like(s).scatter_(-1, idx, p)
    return _entmax_probs_dense(alpha, s, lam, active)


def _entmax_probs_dense(alpha, s: Tensor, lam: Tensor, active: Tensor) -> Tensor:
    a = alpha - 1
    beta = 1 / a
    log_a = torch.log(torch.as_tensor(a, dtype=s.dtype))
    finite = s > float("-inf")
    inf = torch.tensor(float("inf"), dtype=s.dtype)
    top = torch.where(finite, s, float("-inf")).amax(-1, keepdim=True)
    near_one = torch.as_tensor(a, dtype=s.dtype) < NEAR_ONE
    # The anchor: first the largest entry at or below the solver's λ (λ is
    # only known to its grid, so that entry may be in the support), moving
    # up while it is not; the smallest entry when none is below λ.
    below = finite & (s <= lam)
    anchor = torch.where(below, s, float("-inf")).amax(-1, keepdim=True)
    bottom = torch.where(finite, s, inf).amin(-1, keepdim=True)
    anchor = torch.where(anchor > float("-inf"), anchor, bottom)
    anchor = torch.where(near_one, top, anchor)
    anchor = torch.where(active, anchor, 0.0)
    for _ in range(_ROUNDS):
        d = torch.where(finite, s - anchor, float("-inf"))
        pos = d > 0
        # G at p_j → 0: the entries above the anchor alone (w_i = a·d_i)
        g0 = torch.where(pos, torch.exp(beta * (log_a + torch.log(torch.where(pos, d, 1.0)))), 0.0)
        out = active & (g0.sum(-1, keepdim=True) >= 1) & pos.any(-1, keepdim=True)
        if not bool(out.any()):
            break
        nxt = torch.where(pos, s, inf).amin(-1, keepdim=True)
        anchor = torch.where(out, nxt, anchor)
    d = torch.where(finite, s - anchor, float("-inf"))
    # Start from the solver's own p_j; ℓ = 0 (p_j = 1, G ≥ 1) bounds the
    # root above, and −inf below (−log m, m finite entries, at the maximum:
    # every p_i ≤ p_j there).  Newton inside the bracket, bisection (on ℓ,
    # or halving towards −∞ while no lower end is known) when a step leaves
    # it: entries below the anchor that re-enter the support can break G's
    # convexity, and rounding can put the start just below 1.
    pj = torch.clamp((a * (anchor - lam)), min=0.0)
    ell = torch.where(pj > 0, beta * torch.log(torch.where(pj > 0, pj, 1.0)), -1.0)
    ell = torch.clamp(ell, max=0.0)
    hi = torch.zeros_like(ell)
    m = finite.sum(-1, keepdim=True).clamp(min=1).to(s.dtype)
    lo = torch.where(near_one, -torch.log(m), float("-inf"))
    ell = torch.where(near_one, torch.maximum(ell, lo), ell)
    eps = torch.finfo(s.dtype).eps
    n = s.shape[-1]
    for _ in range(_NEWTON):
        logp, slope = _log_terms(d, ell, a, beta, log_a)
        p = torch.exp(logp)
        g = p.sum(-1, keepdim=True)
        dg = (p * slope).sum(-1, keepdim=True)
        hi = torch.where(g >= 1, torch.minimum(hi, ell), hi)
        lo = torch.where(g < 1, torch.maximum(lo, ell), lo)
        raw = ell - (g - 1) / torch.where(dg > 0, dg, 1.0)
        # Converged where Σp is 1 to rounding, or where Newton's own step no
        # longer moves ℓ beyond its resolution (tested before the safeguard:
        # a step that rounds back onto a bracket end is convergence, not a
        # reason to bisect away from the root).
        step = torch.abs(raw - ell)
        settled = (g - 1).abs() <= eps
        settled = settled | (step == 0) | (
            (step <= 2 * eps * torch.clamp(torch.abs(ell), min=1.0)) & (torch.abs(g - 1) <= 2 * n * eps)
        )
        inside = (dg > 0) & (raw > lo) & (raw < hi)
        mid = torch.where(lo > float("-inf"), 0.5 * (lo + hi), 2 * hi - 1)
        new = torch.where(inside, raw, mid)
        # a settled row still takes its last (sub-resolution) Newton step
        exact = (g - 1).abs() <= eps
        new = torch.where(settled, torch.where(exact, ell, raw), new)
        new = torch.where(active, new, ell)
        done = settled | ~active
        ell = new
        if bool(done.all()):
            break
    logp, _ = _log_terms(d, ell, a, beta, log_a)
    return torch.exp(logp)
