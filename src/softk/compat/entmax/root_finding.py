"""entmax.root_finding on softk's exact solvers (no bisection).

``entmax_bisect``, ``sparsemax_bisect``, ``normmax_bisect``, ``budget_bisect``
and their modules, with entmax's names, arguments and defaults.  ``n_iter``
(the number of bisection steps) and ``ensure_sum_one`` are accepted and
unused: λ is exact (closed form on the support) or found by safeguarded
Newton to the dtype's precision, so the result sums to 1 (or to the budget)
to rounding.  Parameters may be floats or tensors in entmax's layout (X's
shape with size 1 along ``dim``, broadcast as ``expand`` does); a tensor α
or budget that requires grad gets its gradient (entmax gives none to the
budget and to normmax's α).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

from ..._maps.budget import budget_sparsemax
from ..._maps.normmax import normmax
from ..._maps.simplex import sparsemax as _sparsemax
from ..._validate import per_row
from ._alpha import entmax_any_alpha
from ._checks import check_module_dim, check_n_iter, check_positive_param, check_x_dim, raising_as

__all__ = [
    "entmax_bisect", "sparsemax_bisect", "normmax_bisect", "budget_bisect",
    "EntmaxBisect", "SparsemaxBisect", "NormmaxBisect", "BudgetBisect",
]


def entmax_bisect(X, alpha=1.5, dim=-1, n_iter=50, ensure_sum_one=True):
    """alpha-entmax: max_p ⟨x, p⟩ − H_α(p) s.t. p >= 0, sum(p) == 1 (Tsallis H_α).

    Args:
        X: the input tensor.
        alpha: α > 0, a float or a tensor broadcastable to X's shape with size 1
            along ``dim`` (one α per row; it receives a gradient).  α >= 1 runs
            on ``softk.entmax`` (α = 1 is softmax, α = 2 sparsemax); 0 < α < 1
            is the dense Tsallis map (every entry > 0), as entmax computes it.
        dim: the dimension along which to apply alpha-entmax.
        n_iter: accepted, unused (the solver is exact).
        ensure_sum_one: accepted, unused (P sums to 1 to rounding).

    >>> import torch
    >>> entmax_bisect(torch.tensor([-2.0, 0.0, 0.5]), alpha=1.5, dim=0)
    tensor([0.0000, 0.3260, 0.6740])
    """
    dim = check_x_dim(X, dim)
    check_n_iter(n_iter)
    alpha = check_positive_param(alpha, X, dim, "alpha", 0.0, "> 0")
    return entmax_any_alpha(X, alpha, dim)


def sparsemax_bisect(X, dim=-1, n_iter=50, ensure_sum_one=True):
    """sparsemax: min_p ||x − p||² s.t. p >= 0, sum(p) == 1, i.e. ``softk.sparsemax(X, dim)``.

    ``n_iter`` and ``ensure_sum_one`` are accepted and unused.

    >>> import torch
    >>> sparsemax_bisect(torch.tensor([-2.0, 0.0, 0.5]), dim=0)
    tensor([0.0000, 0.2500, 0.7500])
    """
    dim = check_x_dim(X, dim)
    check_n_iter(n_iter)
    return _sparsemax(X, dim)


def normmax_bisect(X, alpha=2, dim=-1, n_iter=50):
    """alpha-normmax: max_p ⟨x, p⟩ − ||p||_α s.t. p >= 0, sum(p) == 1, i.e. ``softk.normmax``.

    Args:
        X: the input tensor.
        alpha: α > 0, a float or a tensor in entmax's layout (it receives a
            gradient).  α <= 1 gives the argmax (uniform on ties): for α < 1
            ||p||_α >= 1 with equality only at the vertices, so the argmax vertex
            is the problem's maximiser, and α = 1 is the α → 1⁺ limit (entmax's
            bisection returns NaN or an unrelated dense vector there).
        dim: the dimension along which to apply alpha-normmax.
        n_iter: accepted, unused.

    >>> import torch
    >>> normmax_bisect(torch.tensor([-2.0, 0.0, 0.5]), alpha=2, dim=0)
    tensor([0.0000, 0.3110, 0.6890])
    """
    dim = check_x_dim(X, dim)
    check_n_iter(n_iter)
    alpha = check_positive_param(alpha, X, dim, "alpha", 0.0, "> 0")
    alpha = torch.clamp(alpha, min=1.0) if isinstance(alpha, Tensor) else max(alpha, 1.0)
    return normmax(X, alpha, dim)


def budget_bisect(X, budget=2, dim=-1, n_iter=50):
    """budget-sparsemax: max_p ⟨x, p⟩ − ||p||²/2 s.t. 0 <= p <= 1, sum(p) == budget.

    ``softk.budget_sparsemax(X, budget, dim)``: ``budget`` a number or a
    tensor in entmax's layout with values in [0, n] (n = X.shape[dim]; a
    floating tensor that requires grad receives ∂p/∂budget).  A budget above n
    is refused (no p <= 1 sums to it; entmax returns all ones).  ``n_iter`` is
    accepted and unused.

    >>> import torch
    >>> budget_bisect(torch.tensor([-2.0, 0.0, 0.5]), budget=2, dim=0)
    tensor([0., 1., 1.])
    """
    dim = check_x_dim(X, dim)
    check_n_iter(n_iter)
    if isinstance(budget, Tensor):
        with raising_as(RuntimeError):  # entmax's expand fails on a bad shape
            per_row(budget, X, dim, "budget")
    return budget_sparsemax(X, budget, dim)


class SparsemaxBisect(nn.Module):
    """:func:`sparsemax_bisect` as a module (``n_iter`` unused; default None as in entmax)."""

    def __init__(self, dim=-1, n_iter=None):
        super().__init__()
        check_n_iter(n_iter)
        self.dim, self.n_iter = check_module_dim(dim), n_iter

    def forward(self, X):
        return sparsemax_bisect(X, dim=self.dim, n_iter=self.n_iter)


class _AlphaModule(nn.Module):
    def __init__(self, alpha, dim, n_iter):
        super().__init__()
        check_n_iter(n_iter)
        if not isinstance(alpha, Tensor):
            alpha = check_positive_param(alpha, None, dim, "alpha", 0.0, "> 0")
        self.dim, self.n_iter, self.alpha = check_module_dim(dim), n_iter, alpha


class EntmaxBisect(_AlphaModule):
    """:func:`entmax_bisect` as a module; ``alpha`` may be a float, a tensor or an
    ``nn.Parameter`` (learnt with the gradient of :func:`entmax_bisect`)."""

    def __init__(self, alpha=1.5, dim=-1, n_iter=50):
        super().__init__(alpha, dim, n_iter)

    def forward(self, X):
        return entmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class NormmaxBisect(_AlphaModule):
    """:func:`normmax_bisect` as a module (``alpha`` as in :class:`EntmaxBisect`)."""

    def __init__(self, alpha=2, dim=-1, n_iter=50):
        super().__init__(alpha, dim, n_iter)

    def forward(self, X):
        return normmax_bisect(X, alpha=self.alpha, dim=self.dim, n_iter=self.n_iter)


class BudgetBisect(nn.Module):
    """:func:`budget_bisect` as a module (``budget`` a number >= 0 or a tensor)."""

    def __init__(self, budget=2, dim=-1, n_iter=50):
        super().__init__()
        check_n_iter(n_iter)
        if not isinstance(budget, Tensor):
            if isinstance(budget, bool) or not isinstance(budget, numbers.Real):
                raise TypeError(f"budget must be a number or a tensor, got {type(budget).__name__}")
            if not (math.isfinite(budget) and budget >= 0):
                raise ValueError(f"budget must be a finite number >= 0, got {budget}")
        self.dim, self.n_iter, self.budget = check_module_dim(dim), n_iter, budget

    def forward(self, X):
        return budget_bisect(X, budget=self.budget, dim=self.dim, n_iter=self.n_iter)
