"""The compiled CPU kernel of the threshold maps, in the interface every
threshold kernel has (:mod:`softk._backends.kernels`): ``forward(family, x,
k, tau)`` and ``backward(family, p, g, tau)`` on rows of float32/float64 CPU
tensors (what the kernel serves)."""

from __future__ import annotations

from torch import Tensor

from ...threshold.families import Family
from ...threshold.rows import scaled_rows
from . import backward as _backward
from . import forward as _forward


def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
    """p on the rows of ``x``: the kernel finds λ relative to the row itself;
    x/τ is formed after the shift (τ ≠ 1), as on every path."""
    return _forward(family, x if tau == 1.0 else scaled_rows(x, tau, family, k), k)


def backward(family: Family, p: Tensor, g: Tensor, tau: float) -> Tensor:
    """d ⊙ (g − Σ(d⊙g)/Σd)/τ from the saved output ``p``."""
    return _backward(family, p, g, tau)
