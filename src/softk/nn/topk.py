"""Module forms of the hard and sparse top-k maps and the smooth top-k sum.
Each documents itself by pointing to its function."""

from __future__ import annotations

from torch import nn

from .._maps import hard
from .._maps.topk_sum import SUM_METHODS, topk_sum
from .._validate import check_choice, check_dim, check_k, check_module_k, check_tau


class HardTopK(nn.Module):
    """``softk.hard_topk(x, k, dim)`` as a module (no gradient)."""

    def __init__(self, k: int, dim: int = -1):
        super().__init__()
        self.k, self.dim = check_k(k), check_dim(None, dim)

    def forward(self, x):
        return hard.hard_topk(x, self.k, self.dim)

    def extra_repr(self) -> str:
        return f"k={self.k}, dim={self.dim}"


class TopKSoftmax(nn.Module):
    """``softk.topk_softmax(x, k, dim, tau)`` as a module."""

    def __init__(self, k: int, dim: int = -1, tau: float = 1.0):
        super().__init__()
        self.k, self.dim, self.tau = check_k(k), check_dim(None, dim), check_tau(tau)

    def forward(self, x):
        return hard.topk_softmax(x, self.k, self.dim, self.tau)

    def extra_repr(self) -> str:
        return f"k={self.k}, dim={self.dim}, tau={self.tau}"


class TopKSum(nn.Module):
    """``softk.topk_sum(x, k, dim, tau, method, keepdim)`` as a module."""

    def __init__(self, k: float, dim: int = -1, tau: float = 1.0, method: str = "exp", keepdim: bool = False):
        super().__init__()
        check_choice(method, SUM_METHODS, "method")
        self.k, self.dim, self.tau = check_module_k(k, method), check_dim(None, dim), check_tau(tau)
        self.method, self.keepdim = method, bool(keepdim)

    def forward(self, x):
        return topk_sum(x, self.k, self.dim, self.tau, self.method, self.keepdim)

    def extra_repr(self) -> str:
        return f"k={self.k}, method={self.method!r}, tau={self.tau}, dim={self.dim}, keepdim={self.keepdim}"
