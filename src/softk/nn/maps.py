"""Module forms of the maps.  Each documents itself by pointing to its function."""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import simplex, topk
from .._validate import check_tau


class Sparsemax(nn.Module):
    """``softk.sparsemax(x, dim, tau)`` as a module."""

    def __init__(self, dim: int = -1, tau: float = 1.0):
        super().__init__()
        self.dim, self.tau = dim, check_tau(tau)

    def forward(self, x):
        return simplex.sparsemax(x, self.dim, self.tau)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, tau={self.tau}"


class Entmax15(Sparsemax):
    """``softk.entmax15(x, dim, tau)`` as a module."""

    def forward(self, x):
        return simplex.entmax15(x, self.dim, self.tau)


class Entmax(nn.Module):
    """``softk.entmax(x, alpha, dim, tau)`` as a module.

    With ``learnable=True`` α is a parameter, kept above 1 by the
    parametrisation α = 1 + softplus(ρ) (ρ is the stored parameter ``alpha_raw``);
    the initial α must then be > 1.  Otherwise α is a fixed float >= 1.
    """

    def __init__(self, alpha: float = 1.5, dim: int = -1, tau: float = 1.0, learnable: bool = False):
        super().__init__()
        alpha = float(alpha)
        if learnable and not alpha > 1:
            raise ValueError(f"alpha must be > 1 when learnable=True, got {alpha}")
        if not alpha >= 1:
            raise ValueError(f"alpha must be >= 1, got {alpha}")
        self.dim, self.tau, self.learnable = dim, check_tau(tau), learnable
        if learnable:
            # inverse softplus of α − 1
            self.alpha_raw = nn.Parameter(torch.tensor(math.log(math.expm1(alpha - 1))))
        else:
            self._alpha = alpha

    @property
    def alpha(self):
        if self.learnable:
            return 1 + nn.functional.softplus(self.alpha_raw)
        return self._alpha

    def forward(self, x):
        alpha = self.alpha
        if isinstance(alpha, torch.Tensor):
            alpha = alpha.to(x.dtype if x.dtype == torch.float64 else torch.float32)
        return simplex.entmax(x, alpha, self.dim, self.tau)

    def extra_repr(self) -> str:
        alpha = self.alpha.item() if self.learnable else self.alpha
        return f"alpha={alpha:.4g}, dim={self.dim}, tau={self.tau}, learnable={self.learnable}"


class SoftTopK(nn.Module):
    """``softk.soft_topk(x, k, dim, tau, method)`` as a module."""

    def __init__(self, k: int, method: str = "exp", tau: float = 1.0, dim: int = -1):
        super().__init__()
        if method not in topk.METHODS:
            raise ValueError(f"method must be one of {sorted(topk.METHODS)}, got {method!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.k, self.method, self.tau, self.dim = k, method, check_tau(tau), dim

    def forward(self, x):
        return topk.soft_topk(x, self.k, self.dim, self.tau, self.method)

    def extra_repr(self) -> str:
        return f"k={self.k}, method={self.method!r}, tau={self.tau}, dim={self.dim}"
