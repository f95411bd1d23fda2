r"""Hard selections: the k-hot mask of the top k, and softmax restricted to it.

Ties are broken by position: among equal scores the entry with the *lower
index* along ``dim`` is kept (a stable descending sort), so exactly k entries
are selected on every row with at least k finite entries.  ``-inf`` entries are
never selected: a row with m ≤ k finite entries selects those m (the row
convention of :mod:`softk.threshold.rows`).  A row holding NaN or +inf is
NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _dtensor

from .._validate import check_dim, check_input, check_k, check_tau
from ..threshold.rows import broken_rows
from .simplex import softmax


def _mask_last(x: Tensor, k: int) -> Tensor:
    """Boolean k-hot mask of the last dimension (ties → lower index first)."""
    order = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    # out of place, so that torch.func.vmap can batch it
    mask = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter(-1, order, True)
    return mask & (x > float("-inf"))


def topk_mask(x: Tensor, k: int, dim: int) -> Tensor:
    """Boolean mask of the selected entries (arguments already validated)."""
    return _mask_last(x.detach().movedim(dim, -1), k).movedim(-1, dim)


@_dtensor.entry("local map", "hard_topk")
def hard_topk(x: Tensor, k: int, dim: int = -1) -> Tensor:
    r"""The k-hot indicator of the k largest entries along ``dim``.

    .. math:: h = \arg\max_{h \in \{0,1\}^n,\ \sum h = k} \langle x, h\rangle

    Piecewise constant, so it carries no gradient (the result does not require
    grad); use :func:`softk.soft_topk` for a differentiable relaxation, which
    tends to this mask as τ → 0.

    Args:
        x: scores, any shape, floating point.
        k: an int in [1, n], n = x.shape[dim].
        dim: the dimension to select along.

    Returns:
        0/1 tensor shaped like ``x`` in ``x.dtype``.  Ties go to the lower
        index; ``-inf`` entries are never selected (a row with fewer than k
        finite entries has fewer than k ones); a NaN/+inf row is NaN.

    >>> import torch, softk
    >>> softk.hard_topk(torch.tensor([1.0, 3.0, 3.0, 2.0]), k=2)
    tensor([0., 1., 1., 0.])
    >>> softk.hard_topk(torch.tensor([2.0, 1.0, 2.0, 2.0]), k=2)
    tensor([1., 0., 1., 0.])
    """
    check_input(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim])
    xl = x.detach().movedim(dim, -1)
    out = _mask_last(xl, k).to(x.dtype)
    out = torch.where(broken_rows(xl), float("nan"), out)
    return out.movedim(-1, dim)


@_dtensor.entry("local map", "topk_softmax")
def topk_softmax(x: Tensor, k: int, dim: int = -1, tau: float = 1.0) -> Tensor:
    r"""Sparse (top-k) softmax: softmax over the k largest entries, 0 elsewhere.

    .. math:: p_i = \frac{e^{x_i/\tau}\,[i \in T_k]}{\sum_{j \in T_k} e^{x_j/\tau}},
              \qquad T_k = \text{indices of the k largest } x

    (Su Jianlin's "sparse softmax").  Σp = 1; k = n is exactly softmax.  The
    selection T_k is treated as a constant, so the gradient flows only through
    the kept entries (it is the softmax Jacobian on T_k, and 0 for the rest);
    the map jumps where the k-th and (k+1)-th scores cross.

    Args:
        x: scores, any shape, floating point (half computed in float32).
        k: an int in [1, n], n = x.shape[dim].
        dim: the dimension to select along.
        tau: temperature > 0.

    Returns:
        ``p`` shaped like ``x``.  Ties at the k-th place go to the lower index
        (as in :func:`hard_topk`); ``-inf`` entries get 0; a fully masked row
        is 0 with a zero gradient; a NaN/+inf row is NaN.

    Reference: Su Jianlin's sparse softmax (kexue.fm).

    >>> import torch, softk
    >>> softk.topk_softmax(torch.tensor([1.0, 2.0, 3.0, 4.0]), k=2)
    tensor([0.0000, 0.0000, 0.2689, 0.7311])
    """
    check_input(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim])
    tau = check_tau(tau, allow_grad=True, x=x)
    keep = topk_mask(x, k, dim)
    p = softmax(torch.where(keep, x, float("-inf")), dim, tau)
    broken = broken_rows(x.detach().movedim(dim, -1)).movedim(-1, dim)
    return torch.where(broken, float("nan"), p)
