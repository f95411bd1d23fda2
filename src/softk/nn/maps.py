"""Module forms of the maps.  Each takes its function's arguments in the
function's order (after the input), checks them at construction with the
function's own checks, and documents itself by pointing to its function."""

from __future__ import annotations

import math

import torch
from torch import nn

from .._maps import simplex, soft_topk as topk
from .._validate import check_alpha, check_choice, check_dim, check_module_k, check_tau


class Softmax(nn.Module):
    """``softk.softmax(x, dim, tau)`` as a module (a fully masked row gives zeros)."""

    def __init__(self, dim: int = -1, tau: float = 1.0):
        super().__init__()
        self.dim, self.tau = check_dim(None, dim), check_tau(tau)

    def forward(self, x):
        return simplex.softmax(x, self.dim, self.tau)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, tau={self.tau}"


class Sparsemax(Softmax):
    """``softk.sparsemax(x, dim, tau)`` as a module."""

    def forward(self, x):
        return simplex.sparsemax(x, self.dim, self.tau)


class Entmax15(Softmax):
    """``softk.entmax15(x, dim, tau)`` as a module."""

    def forward(self, x):
        return simplex.entmax15(x, self.dim, self.tau)


def _inverse_softplus(y: float) -> float:
    # log(e^y − 1) without overflow: y + log(1 − e^−y).
    return y + math.log(-math.expm1(-y))


class Entmax(nn.Module):
    """``softk.entmax(x, alpha, dim, tau)`` as a module.

    With ``learnable=True`` α is a parameter, kept above 1 by the
    parametrisation α = 1 + softplus(ρ) (ρ is the stored parameter ``alpha_raw``);
    the initial α must then be > 1.  Otherwise α is a fixed float >= 1.
    """

    def __init__(self, alpha: float = 1.5, dim: int = -1, tau: float = 1.0, learnable: bool = False):
        super().__init__()
        alpha = check_alpha(alpha, None, dim)
        if learnable and not alpha > 1:
            raise ValueError(f"alpha must be > 1 when learnable=True, got {alpha}")
        self.dim, self.tau, self.learnable = check_dim(None, dim), check_tau(tau), bool(learnable)
        if learnable:
            raw = torch.tensor(_inverse_softplus(alpha - 1))  # float32, as a module's parameters are by default
            if not bool(torch.isfinite(raw)):
                raise ValueError(f"alpha={alpha!r} is beyond float32, which holds the learnable α's parameter")
            self.alpha_raw = nn.Parameter(raw)
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
        # every digit the value holds (float32's 7 for the parameter): 4 printed 1.00001 as 1, softmax
        alpha = f"{self.alpha.item():.7g}" if self.learnable else f"{self.alpha!r}"
        return f"alpha={alpha}, dim={self.dim}, tau={self.tau}, learnable={self.learnable}"


class SoftTopK(nn.Module):
    """``softk.soft_topk(x, k, dim, tau, method)`` as a module."""

    def __init__(self, k: float, dim: int = -1, tau: float = 1.0, method: str = "exp"):
        super().__init__()
        self.dim, self.tau = check_dim(None, dim), check_tau(tau)
        self.method = check_choice(method, topk.METHODS, "method")
        self.k = check_module_k(k, self.method)

    def forward(self, x):
        return topk.soft_topk(x, self.k, self.dim, self.tau, self.method)

    def extra_repr(self) -> str:
        return f"k={self.k}, dim={self.dim}, tau={self.tau}, method={self.method!r}"
