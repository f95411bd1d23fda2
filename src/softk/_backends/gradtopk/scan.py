r"""GradTopK by a sequential scan over the row (the O(n)-step algorithm).

Prefix and suffix tables of log elementary symmetric polynomials, every update
a sum of two non-negative terms (see :mod:`softk._ops.gradtopk` for the quantity):

* prefix tables  A[i, j] = log e_j(w_1..w_i)  by
  A[i, j] = logaddexp(A[i−1, j], z_i + A[i−1, j−1]), truncated at j ≤ k;
* suffix tables  B[i, j] = log e_j(w_{i+1}..w_n)  by the same recurrence run
  backwards (the prefix table of the reversed row, run as extra rows);
* marginals (forward–backward):
  log p_i = z_i + logsumexp_a(A[i−1, a] + B[i, k−1−a]) − A[n, k].

The Hessian–vector product pushes forward-mode tangents through the same two
recurrences (their weights exp(A[i−1, j] − A[i, j]) are read off the stored
tables), so there is no double backward through logaddexp (NaN at −inf
entries, and slow).

Work O(n·k) per row in n steps of small ops over all rows at once: cheap when
the rows × k of a step fill the vector units, launch-bound otherwise (a GPU,
few rows); memory a few float64 tables of (n+1)·R·(k+1) entries.
"""

from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")


def _table(zt: Tensor, k: int) -> Tensor:
    """Log elementary symmetric polynomials of prefixes.

    zt is (n, R).  Returns T of shape (n + 1, R, k + 1) with
    T[i, :, j] = log e_j(w_1..w_i), j = 0..k (truncated at k: higher degrees
    never feed e_k).
    """
    n, r = zt.shape
    t = torch.full((n + 1, r, k + 1), NEG_INF, dtype=zt.dtype, device=zt.device)
    t[:, :, 0] = 0.0
    rows, zs = t.unbind(0), zt.unbind(0)
    for i in range(n):
        # e_j(.., w) = e_j(..) + w e_{j-1}(..): two non-negative terms.
        torch.logaddexp(rows[i][:, 1:], zs[i][:, None] + rows[i][:, :-1], out=rows[i + 1][:, 1:])
    return t


# Positions whose recurrence weights are materialised at once in _tangent: big
# enough to vectorise, small enough to stay in cache.
_BLOCK = 128


def _tangent(t: Tensor, zt: Tensor, gt: Tensor) -> Tensor:
    """Forward-mode tangent dT of a table from :func:`_table` along gt (n, R).

    T[i+1, j] = log(e^{T[i, j]} + e^{z_i + T[i, j−1]}), so
    dT[i+1, j] = (1 − β) dT[i, j] + β (g_i + dT[i, j−1]) with
    β = exp(z_i + T[i, j−1] − T[i+1, j]) ∈ [0, 1] the second term's share.
    Where e_j = 0 (T = −inf) β is NaN; it is set to 0 and dT stays 0 there.
    """
    n = zt.shape[0]
    dt = torch.zeros_like(t)
    drows = dt.unbind(0)
    for b0 in range(0, n, _BLOCK):
        b1 = min(n, b0 + _BLOCK)
        beta = zt[b0:b1, :, None] + t[b0:b1, :, :-1]
        beta.sub_(t[b0 + 1 : b1 + 1, :, 1:]).exp_().nan_to_num_(nan=0.0)
        alpha = (1 - beta).unbind(0)
        bg = (beta * gt[b0:b1, :, None]).unbind(0)
        beta = beta.unbind(0)  # type: ignore[assignment]  # a tuple of its rows from here on
        for s in range(b1 - b0):
            src, out = drows[b0 + s], drows[b0 + s + 1][:, 1:]
            torch.addcmul(bg[s], alpha[s], src[:, 1:], out=out)
            out.addcmul_(beta[s], src[:, :-1])
    return dt


def _log_pairs(t: Tensor, r: int, k: int) -> Tensor:
    """P[i, :, a] = A[i, a] + B[i+1, k−1−a] (a = 0..k−1, i = 0..n−1): the
    log-terms of e_{k−1}(w_{−i}) split between the items before and after i.

    ``t`` stacks the prefix table A (rows :r) and the prefix table of the
    reversed sequence (rows r:), so B[i] (suffix after i) is that table's row n − i.
    """
    n = t.shape[0] - 1
    return t[:-1, :r, :k] + t[:n, r:, :k].flip(0, -1)


def solve_scan(z: Tensor, k: int, g: Tensor | None = None):
    """For finite-or-(−inf) rows z (R, n) with more than k finite entries:
    (log e_k (R,), p (R, n), H g (R, n) or None), all in float64."""
    # log e_k(w) shifts by k·c when z shifts by c and p does not: work with
    # z − max z so the tables hold numbers of moderate size.
    top = z.amax(-1, keepdim=True)
    r = z.shape[0]
    zt = (z - top).t()  # (n, R): one position per step
    # Prefix and suffix tables in one pass: the suffix table is the prefix
    # table of the reversed sequence, run as R extra rows.
    zz = torch.cat([zt, zt.flip(0)], dim=1).contiguous()
    t = _table(zz, k)
    log_ek = t[-1, :r, k]
    pairs = _log_pairs(t, r, k)
    # c_i = log e_{k−1}(w_{−i}) is finite: a row here has > k finite entries.
    c = torch.logsumexp(pairs, -1)  # (n, R)
    # 0 < p < 1 exactly; the exponent's rounding (~1e-13 at |z| ~ 100) can
    # put a saturated p a few ulps above 1, which would break log(1 − p).
    p = torch.exp(zt + c - log_ek).clamp(max=1.0).t()
    if g is None:
        return log_ek + k * top.squeeze(-1), p, None
    gt = g.t()
    dt = _tangent(t, zz, torch.cat([gt, gt.flip(0)], dim=1))
    share = pairs.sub_(c[:, :, None]).exp_()  # softmax weights of the log-terms
    dc = (share * _log_pairs(dt, r, k)).sum(-1)  # tangent of c
    mean = (p * g).sum(-1, keepdim=True)  # tangent of log e_k is <p, g>
    hg = p * (g + dc.t() - mean)
    return log_ek + k * top.squeeze(-1), p, hg
