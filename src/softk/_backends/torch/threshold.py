r"""The torch kernel of the threshold maps: the reference forward and backward on rows.

Forward:  p = f(z − λ) with Σ p = k along the last dimension
(:func:`map_rows`, z already scaled and shifted by
:func:`softk.threshold.rows.scaled_rows`; :func:`forward` does both for the
dispatcher).  Backward (implicit function theorem), with d = f'(z − λ) read
off the saved output (for sigmoid and laplace, formed from the input as well:
:func:`anchored_slope`) and g the incoming gradient:

.. math::  \partial L/\partial x = \bigl(d\odot g - d\,\textstyle\sum(d\odot g)/\sum d\bigr)/\tau

and 0 where Σd = 0 (every entry exactly at 0 or 1: the map is locally constant).
Both are plain differentiable tensor code: :func:`vjp` is also what the
autograd contract differentiates for second derivatives.  It serves every
family on every device, and is the one the other kernels are checked against.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..call_mode import eager
from ...threshold.families import EXP, SOFTMAX, SPARSE, Family, below_one
from ...threshold.rows import compute_dtype, fill_rows, row_status, scaled_rows, shift_over_tau
from ...threshold.entmax_anchor import entmax_probs, needs_anchor
from ...threshold.fast_paths import solve_exp_pooled, solve_exp_topk, solve_on_candidates
from ...threshold.solve import settled_probs, solve_probs

# Rows narrower than this go through the general solver: a partial sort saves
# nothing there and the general path is the one the fast paths are checked against.
_FAST_MIN_WIDTH = 64


def _softmax(z: Tensor, k: int) -> Tensor:
    # torch's own kernel; rows with no finite entry are filled (torch gives NaN).
    _, active, broken = row_status(z, k)
    p = torch.softmax(torch.where(active, z, 0.0), -1)
    return fill_rows(z, p if k == 1 else k * p, active, broken)


def _on_candidates(family: Family, z: Tensor, k: int):
    lam, active, broken, idx, valid = solve_on_candidates(family, z, k)
    if family.name == "entmax" and needs_anchor(family.alpha):
        # λ's float grid is too coarse for p at large α or α near 1 (entmax_anchor.py);
        # z is shifted by its maximum, so λ here is already relative to it.
        return fill_rows(z, entmax_probs(family.alpha, torch.where(active, z, 0.0), lam, active), active, broken)
    if idx is not None:
        # f(z − λ) = 0 off the candidates: write only the candidates.
        vals, _ = settled_probs(family, z.gather(-1, idx) - lam, k, valid)
        vals = torch.where(valid, vals, 0.0)
        p = torch.zeros_like(z).scatter_add_(-1, idx, vals)  # padding slots add 0
        return fill_rows(z, p, active, broken)
    zs = z if bool(active.all()) else torch.where(active, z, 0.0)
    return fill_rows(z, settled_probs(family, zs - lam, k)[0], active, broken)


def _general(family: Family, z: Tensor, k) -> Tensor:
    # The general solver: sorted knots + closed form, or safeguarded Newton,
    # λ carried relative to the k-th largest entry (solve.lambda_reference).
    finite, active, broken = row_status(z, k)
    zs = torch.where(active, z, 0.0)  # rows filled below get harmless values
    p, _ = solve_probs(family, zs, k, active)  # p on the row shifted by λ's reference entry
    filled = torch.where(broken, float("nan"), finite.to(z.dtype))
    return torch.where(active, p, filled)


def map_rows(family: Family, z: Tensor, k) -> Tensor:
    """p = f(z − λ), Σp = k, on the last dimension (no autograd); ``k`` an
    int or a tensor of one k per row (shaped z.shape[:-1] + (1,)), which the
    general solver takes (the fast paths take one k for every row)."""
    n = z.shape[-1]
    if isinstance(k, Tensor):
        return _general(family, z, k)
    if family is SOFTMAX:
        return _softmax(z, k)
    if family.zero_below and n >= _FAST_MIN_WIDTH and k + 2 <= n:
        return _on_candidates(family, z, k)
    if family is EXP and n >= _FAST_MIN_WIDTH and 4 * (k + 1) <= n:
        found = solve_exp_pooled(z, k) or solve_exp_topk(z, k)
        # z is shifted by its k-th largest entry (rows.scaled_rows), so λ here
        # is O(log n) whatever the outliers, and f(z − λ) keeps p's precision.
        if found is not None:
            lam, active, broken = found
            zs = z if bool(active.all()) else torch.where(active, z, 0.0)
            return fill_rows(z, family.p(zs - lam), active, broken)
    return _general(family, z, k)


def slope(family: Family, p: Tensor) -> Tensor:
    """d = f′(z − λ) read off p, 0 where p = 0 (outside the support every
    family has f′ = 0), evaluated so that its own derivative is finite there
    too (√p at 0 would give an infinite slope and a NaN second derivative)."""
    pos = p > 0
    # NaN (a row with a NaN or +inf score) passes through, so that row's
    # gradient is NaN, as torch.softmax's and the native kernels' are.
    return torch.where(pos, family.d_from_p(torch.where(pos, p, 0.5)), torch.where(p != p, p, 0.0))


def anchored_slope(family: Family, p: Tensor, x: Tensor, tau: float, stored: torch.dtype | None = None, k=None) -> Tensor:
    r"""d = f′(u) for the families whose slope p cannot give near p = 1
    (``Family.slope_from_x``): u from the input ``x`` (on p's rows, in p's
    dtype), anchored at an entry j of the row,

    .. math:: u_i = (x_i - x_j)/\tau + f^{-1}(p_j).

    j is the entry whose p_j gives u to the most digits (an error δ in p_j
    moves u by δ/p_j below ½ and by δ/(1 − p_j) above): the largest p ≤ ½
    of the normal floats, whose relative error is an ulp; else the best of
    the entries above ½, which keep (1 − p)/ulp of their digits, and the
    subnormal ones, which keep p/tiny of them (tiny: the smallest normal
    float of ``stored``, the dtype p was stored in; default p's).  On a row
    whose every p rounded to 0 or 1, j is the lowest entry that rounded to
    1, with u_j = −f⁻¹(ε/4) (ε: ``stored``'s machine epsilon), where
    rounding to 1 begins: a lower bound of u_j; unless the row has at most
    k finite entries, whose p = 1 is exact and d = 0.  Where no normal p ≤ ½ is
    left to anchor on (every p above ½: k > n/2), u is refined by two Newton
    steps on Σf(u) = k (``Family.residual``, which sums the tails 1 − p
    apart) when the budget ``k`` is given.  Without ``k`` a row with no p
    strictly between 0 and 1 has d = 0 (the map is locally constant as far
    as the dtype can tell); NaN where p is NaN.  Differentiable in p and x
    with the exact second derivative: through p_j, u_i moves by λ's own
    derivative (and a Newton step at its root moves by that too)."""
    fi = torch.finfo(p.dtype if stored is None else stored)
    key = torch.where(p > 0.5, 1 - p, torch.where(p >= fi.tiny, 1 + p, p / fi.tiny))
    key = torch.where((p > 0) & (p < 1), key, -1.0)  # 0, 1 and NaN are never the anchor
    j = key.argmax(-1, keepdim=True)
    inside = key.gather(-1, j) > 0
    u0 = family.f_inv(torch.where(inside, p.gather(-1, j), 0.5))  # type: ignore[misc]  # set where slope_from_x is
    refine = inside & (key.gather(-1, j) < 1)  # the anchor is not a normal p ≤ ½
    if k is not None and family.residual is not None and (not eager(p) or not bool(inside.all())):
        # a row of 0s and 1s: the lowest entry that rounded to 1, at the u
        # where rounding to 1 begins, then the Newton steps; not on a row of
        # at most k finite entries, which p = 1 fills exactly (constant in x
        # and k: d = 0)
        one = p == 1
        short = (x > float("-inf")).sum(-1, keepdim=True) <= k
        alone = ~inside & one.any(-1, keepdim=True) & ~short
        j = torch.where(inside, j, torch.where(one, x, float("inf")).argmin(-1, keepdim=True))
        u0 = torch.where(alone, -family.f_inv(torch.tensor(fi.eps / 4, dtype=p.dtype)), u0)  # type: ignore[misc]
        refine = refine | alone
        inside = inside | alone
    # (the where: no NaN from −inf − −inf in its derivative)
    u = torch.where(inside, shift_over_tau(x, x.gather(-1, j), tau, check=eager(p)) + u0, 0.0)
    # (the steps are skipped where no row needs them in plain eager calls
    # only: a transform or a compiler cannot branch on the data)
    if k is not None and family.residual is not None and (not eager(p) or bool(refine.any())):
        for _ in range(2):
            r, slope, _ = family.residual(u, k)
            lost = refine & ~torch.isfinite(r)  # a tail underflowed: summed as logs (Family.residual)
            if not eager(p) or bool(lost.any()):
                rl, sl, _ = family.residual(u, k, logspace=True)
                r, slope = torch.where(lost, rl, r), torch.where(lost, sl, slope)
            # (r and the slope masked before the quotient too: the branch not
            # taken still meets the double backward, as 0·∞ = NaN)
            ok = refine & (slope > 0) & torch.isfinite(r)
            u = u - torch.where(ok, torch.where(ok, r, 0.0) / torch.where(ok, slope, 1.0), 0.0)
    return torch.where(p != p, p, torch.where(inside, family.df(u), 0.0))


def row_slope(family: Family, p: Tensor, x: Tensor | None, tau: float, k=None) -> Tensor:
    """d = f′(z − λ) on p's rows in the compute dtype (half p: float32): read
    off p (:func:`slope`), or formed from the input ``x`` for the families
    with ``Family.slope_from_x`` (:func:`anchored_slope`; ``k``, the budget,
    for its rows whose every p lies above ½)."""
    ct = compute_dtype(p.dtype)
    if not family.slope_from_x:
        return slope(family, p.to(ct))
    assert x is not None, f"the {family.name} map's backward reads its input"
    kc = k.to(ct) if isinstance(k, Tensor) else k
    return anchored_slope(family, p.to(ct), x.to(ct), tau, p.dtype, kc)


def vjp_from_slope(d: Tensor, g: Tensor, tau: float) -> Tensor:
    """d⊙(g − Σ(d⊙g)/Σd)/τ on the last dimension, 0 where Σd = 0."""
    sd = d.sum(-1, keepdim=True)
    sdg = (d * g).sum(-1, keepdim=True)
    coef = torch.where(sd > 0, sdg / torch.where(sd > 0, sd, 1.0), 0.0)
    out = (g - coef) * d
    return out if tau == 1.0 else out / tau


def vjp_from_log_slope(logd: Tensor, g: Tensor, tau) -> Tensor:
    """The same vjp from log d (−inf off the support), for slopes that span
    more than the dtype's range (α-entmax at large α: d = p^(2−α) is 1e58 at
    p = 0.06, α = 50, where g − Σ(d⊙g)/Σd cancels to nothing).

    With w = d/Σd and m the entry of largest d,
    g_i − ḡ = (g_i − g_m) − Σ_j w_j (g_j − g_m) has no cancellation, and the
    dominant entry's d_m (g_m − ḡ) = Σ_j (d_m d_j/Σd)(g_m − g_j) is summed
    in log space.  Exact where d overflows only because the Jacobian itself
    does (several entries near the support's edge)."""
    lse = torch.logsumexp(logd, -1, keepdim=True)
    ok = torch.isfinite(lse)
    nan_row = lse != lse
    lse = torch.where(ok, lse, 0.0)
    m = logd.argmax(-1, keepdim=True)
    gm = g.gather(-1, m)
    w = torch.exp(logd - lse)
    r = (g - gm) - (w * (g - gm)).sum(-1, keepdim=True)
    # an exact 0 of r or of g_m − g_j adds 0, also where its slope overflows
    # (inf·0): a zero cotangent (a loss that gives p no gradient, as the
    # Fenchel–Young value does, once a compiler makes it a tensor of zeros)
    # then gives a zero gradient, not NaN
    out = torch.where((logd > float("-inf")) & (r != 0), torch.exp(logd) * r, 0.0)
    others = torch.arange(logd.shape[-1], device=logd.device) != m  # j = m adds 0 (and inf·0 in float32)
    dm = torch.where(others & (gm != g), torch.exp(logd.gather(-1, m) + logd - lse) * (gm - g), 0.0).sum(-1, keepdim=True)
    out = torch.where(ok, out.scatter(-1, m, dm), torch.where(nan_row, float("nan"), 0.0))  # NaN rows stay NaN
    return out if isinstance(tau, float) and tau == 1.0 else out / tau


def vjp(family: Family, p: Tensor, g: Tensor, tau: float, x: Tensor | None = None, k=None) -> Tensor:
    """The backward of every threshold map, in the compute dtype (half p:
    float32) and returned in p's dtype (differentiable in p, g and ``x``,
    the input, which the families with ``slope_from_x`` need and the others
    ignore, as they do ``k``, the budget: :func:`row_slope`)."""
    ct = compute_dtype(p.dtype)
    gc = g if g.dtype == ct else g.to(ct)
    if family.name == "entmax" and bool(torch.any(torch.as_tensor(family.alpha) > 2)):
        pc = p.to(ct)
        logp = torch.log(torch.where(pc > 0, pc, 1.0))
        a = family.alpha.to(ct) if isinstance(family.alpha, Tensor) else family.alpha
        logd = torch.where(pc > 0, (2 - a) * logp, torch.where(pc != pc, pc, float("-inf")))  # type: ignore[operator]  # α: a number or tensor
        return vjp_from_log_slope(logd, gc, tau).to(p.dtype)
    return vjp_from_slope(row_slope(family, p, x, tau, k), gc, tau).to(p.dtype)


# ----------------------------------------------------------- the kernel's interface
def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
    """p = f((x − max)/τ − λ), Σp = k, on the rows of ``x`` (the map's
    dimension last), in ``x.dtype``: every kernel's forward."""
    return output(family, map_rows(family, scaled_rows(x, tau, family, k), k), x.dtype)


def output(family: Family, p: Tensor, dtype: torch.dtype) -> Tensor:
    """p (compute dtype) in ``dtype``; the entries below 1 of the families
    whose backward reads saturation off p (exp, sparse: f′ = 0 at p = 1)
    stay below 1 (rounding to nearest may give 1, which reads as saturated,
    a zero gradient for the whole row: bfloat16 rounds every p above
    1 − 2⁻⁹ to 1; see ``Family.written``, which keeps the exp family's below
    1 in the compute dtype)."""
    out = p.to(dtype)
    if family in (EXP, SPARSE) and out.dtype != p.dtype:
        out = torch.where((p < 1) & (out == 1), below_one(dtype), out)
    return out


def backward(family: Family, p: Tensor, g: Tensor, tau: float, x: Tensor | None = None, k=None) -> Tensor:
    """d ⊙ (g − Σ(d⊙g)/Σd)/τ from the saved output (and, for the families
    with ``slope_from_x``, the input ``x`` and the budget ``k``), in the
    compute dtype (half inputs: float32), returned in p's dtype: every
    kernel's backward."""
    return vjp(family, p, g, tau, x, k)
