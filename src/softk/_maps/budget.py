r"""Budget sparsemax: the Euclidean projection onto the capped simplex.

.. math:: p = \arg\max_{0 \le p \le 1,\ \sum_i p_i = B} \langle z, p\rangle - \tfrac12\|p\|^2
            = \arg\min_{0 \le p \le 1,\ \sum_i p_i = B} \|p - z\|^2,
          \qquad p_i = \operatorname{clip}(z_i - \lambda, 0, 1),\quad z = x/\tau,

the entmax package's ``budget_bisect`` ("k-subsets"; Santos, Niculae,
McNamee & Martins, "Sparse and Structured Hopfield Networks", ICML 2024).
It is the threshold map of the ``SPARSE`` family with Σp = B, i.e.
``softk.soft_topk(x, k=B, method="sparse")``: λ exact (closed form on the
active set 0 < p < 1), Jacobian (diag(a) − a aᵀ/|a|)/τ with a the indicator
of that set, ∂p/∂B = a/|a|.  This module adds what the top-k spelling does
not take: any real budget 0 ≤ B ≤ n (B = 0 gives zeros, B = 1 is sparsemax,
B = n all ones) as a number or one per row, learnable.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .. import _dtensor

from .._validate import check_dim, check_input, check_tau, finite, per_row, require, unwrapped
from ..threshold.families import SPARSE
from .._ops.op import threshold_map
from ..threshold.host import readable
from ..threshold.rows import compute_dtype

__all__ = ["budget_sparsemax"]


def check_budget(budget, x: Tensor, dim: int):
    """An int in [1, n] (the compiled kernels take it), or a per-row tensor in
    the compute dtype shaped like the rows (``dim`` moved last) with values in [0, n]."""
    n = x.shape[dim]
    where = f"[0, n] = [0, {n}] (n = x.shape[{dim}], the entries a row can fill with 1s)"
    if isinstance(budget, Tensor):
        if budget.is_complex() or budget.dtype == torch.bool:
            raise TypeError(f"budget must be a number or a real tensor, got dtype {budget.dtype}")
        if budget.requires_grad and not budget.is_floating_point():
            raise TypeError("budget must be a floating tensor to receive a gradient")
        if budget.numel() == 1 and not budget.requires_grad and readable(budget):  # (vmap's per-row one stays)
            budget = budget.item()
        else:
            b = unwrapped(budget.detach()).double()
            require(torch.isfinite(b) & (b >= 0) & (b <= n),
                    lambda: f"budget must lie in {where} in every row, got values from "
                            f"{float(b.min())} to {float(b.max())}")
            return per_row(budget, x, dim, "budget").to(compute_dtype(x.dtype))
    if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
        raise TypeError(f"budget must be a number or a tensor, got {type(budget).__name__}")
    if not (finite(budget) and 0 <= budget <= n):  # type: ignore[operator]  # a numbers.Real compares with an int
        raise ValueError(f"budget must lie in {where}, got {budget}")
    if budget >= 1 and float(budget).is_integer():  # type: ignore[operator]
        return int(budget)  # type: ignore[call-overload]  # int() takes a numbers.Real
    shape = x.movedim(dim, -1).shape[:-1] + (1,)
    return torch.full(shape, float(budget), dtype=compute_dtype(x.dtype), device=x.device)


@_dtensor.entry("local map", "budget_sparsemax")
def budget_sparsemax(x: Tensor, budget, dim: int = -1, tau=1.0) -> Tensor:
    r"""Budget sparsemax: :math:`p = \operatorname{clip}(x/\tau - \lambda, 0, 1)` summing to ``budget`` along ``dim``.

    The closest point to x/τ in the capped simplex
    :math:`\{p : 0 \le p_i \le 1,\ \sum_i p_i = B\}`: exact zeros and exact
    ones, piecewise linear in x.

    Args:
        x: scores, any shape, floating point (half computed in float32).
        budget: B, a real number in [0, n] (n = x.shape[dim]; fractional is
            fine), or one budget per row: a real tensor broadcastable to ``x``
            with size 1 along ``dim``, values in [0, n]; a floating one that
            requires grad gets :math:`\partial p/\partial B = a/|a|` (a: entries strictly inside (0, 1)).
        dim: the dimension that sums to B.
        tau: temperature > 0 (a float, or a one-element tensor that may require grad).

    Returns:
        p shaped like ``x``.  B = 0 gives zeros; a row with at most B finite
        entries gets 1 on each (so its sum is below B) with a zero gradient;
        -inf entries get 0; a NaN or +inf makes its row NaN.

    An integer B runs on every backend's kernels (it is ``soft_topk(x, B,
    method="sparse")``); a fractional or per-row B on the PyTorch path.

    >>> import torch
    >>> budget_sparsemax(torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]), 2)
    tensor([0.0000, 0.1250, 0.3750, 0.6250, 0.8750])
    >>> budget_sparsemax(torch.tensor([0.0, 0.5, 1.5, 2.0]), 2.5)
    tensor([0.0000, 0.5000, 1.0000, 1.0000])
    """
    check_input(x)
    dim = check_dim(x, dim)
    tau = check_tau(tau, allow_grad=True, x=x)
    k = check_budget(budget, x, dim)
    if isinstance(k, int):
        return threshold_map(x, SPARSE, k, dim, tau)
    empty = k == 0  # Σp = 0: every p is 0 (the solver needs k > 0)
    p = threshold_map(x, SPARSE, torch.where(empty, 1.0, k), dim, tau)
    return torch.where(empty.movedim(-1, dim), p * 0, p)
