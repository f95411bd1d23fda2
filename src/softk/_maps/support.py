r"""λ and the support size of a threshold map, for users who need them (the
entmax package's ``return_support_size``).

For p = f(x/τ − λ) with Σp = k, :func:`support` returns λ (in the units of
x/τ) and the number of non-zero entries of p, without autograd.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .._validate import check_alpha, check_choice, check_dim, check_input, check_k, check_k_rows, check_tau
from ..threshold.families import THRESHOLD_METHODS, by_name
from .._ops.op import threshold_map
from ..threshold.rows import compute_dtype, row_status, scaled_rows
from ..threshold.solve import lambda_reference, solve_relative

MAPS = ("softmax", "sparsemax", "entmax15", "entmax") + tuple(THRESHOLD_METHODS)


class Support(NamedTuple):
    """What ``softk.support`` returns: a named tuple ``(lam, size)``.

    Attributes:
        lam: the threshold λ, in the units of x/τ, shaped like ``x`` without
            ``dim`` (−inf on a row with at most k finite entries, NaN on a row
            with a NaN or +inf).
        size: the number of entries with p > 0 (int64), shaped like ``lam``.
    """

    lam: Tensor
    size: Tensor


@torch.no_grad()
def support(x: Tensor, method: str = "sparsemax", k: int = 1, dim: int = -1, tau: float = 1.0, alpha=None) -> Support:
    r"""λ and the support size of the map ``method`` on ``x`` along ``dim``.

    .. math:: p_i = f(x_i/\tau - \lambda), \quad \textstyle\sum_i p_i = k,
              \qquad \text{size} = \#\{i : p_i > 0\}.

    Args:
        x: scores, any shape, floating point.
        method: "softmax", "sparsemax", "entmax15", "entmax" (with ``alpha``),
            or a soft top-k threshold method ("exp", "sigmoid", "laplace", "sparse").
        k: the budget: 1 for the simplex maps; for the threshold methods a
            count, or a real budget in (0, n] (2.5), or one per row (a tensor
            with size 1 along ``dim``), as :func:`softk.soft_topk` takes it.
        dim: the dimension the map normalises.
        tau: temperature > 0.
        alpha: entmax's α (a float >= 1) for ``method="entmax"``.

    Returns:
        ``Support(lam, size)``, both shaped like ``x`` without ``dim``.  λ is
        exact for the piecewise families (closed form on the support) and at
        the working precision otherwise; it is −inf on a row with at most k
        finite entries (every one of them has p = 1) and NaN on a row with a
        NaN or +inf.

    Under ``torch.compile(fullgraph=True)`` and ``torch.func.vmap`` the
    families with a closed form on the support ("softmax", "sparsemax",
    "entmax15", "exp", "laplace", "sparse") run as traced tensor code;
    "entmax" and "sigmoid" find λ by Newton's method, whose stop reads the
    rows' residuals, so a compiled graph breaks there and vmap refuses them.

    >>> import torch, softk
    >>> s = softk.support(torch.tensor([0.1, 1.0, 1.5]), "sparsemax")
    >>> round(s.lam.item(), 6), s.size.item()
    (0.75, 2)
    """
    check_input(x)
    dim = check_dim(x, dim)
    check_choice(method, MAPS, "method")
    if alpha is not None and method != "entmax":
        raise ValueError(f"alpha applies to method='entmax' only, got method={method!r}")
    family = by_name(method, check_alpha(alpha if alpha is not None else 1.5, None, -1))
    if family.capped:  # a count, or a real budget in (0, n] for all rows or per row (moved last)
        k = check_k_rows(k, x, dim)
    elif check_k(k, x.shape[dim]) != 1:
        raise ValueError(f"method {method!r} maps onto the simplex (k = 1 only), got k={k}")
    tau = check_tau(tau, x=x)
    rows = x.movedim(dim, -1).to(compute_dtype(x.dtype))
    p = threshold_map(rows, family, k, -1, tau)
    ref = lambda_reference(rows, k, family.capped)
    s = scaled_rows(rows, tau, family, k)
    finite, active, broken = row_status(s, k)
    ref_s, lam_s = solve_relative(family, torch.where(active, s, 0.0), k, active)
    # s = (x − ref)/τ: λ in x/τ units adds the references back.
    lam = lam_s + ref_s + ref / tau
    lam = torch.where(active, lam, torch.where(broken, float("nan"), float("-inf")))
    return Support(lam.squeeze(-1), (p > 0).sum(-1))
