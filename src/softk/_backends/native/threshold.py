"""The compiled CPU kernel of the threshold maps, in the interface every
threshold kernel has (:mod:`softk._backends.kernels`): ``forward(family, x,
k, tau)`` and ``backward(family, p, g, tau, x=None)`` on rows of float32/float64 CPU
tensors, and :func:`serves`, what it runs."""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.families import Family
from ...threshold.rows import ROUNDS_TO_ONE, scaled_rows
from .. import registry
from . import backward as _backward
from . import forward as _forward

_WIDE = (torch.float32, torch.float64)
# The longest row of a family with f = 0 below 0 the kernels take: they index
# a row's candidates with int32 (kernels.c, cidx_t).
ROW_MAX = 2**31 - 1


def too_long(family: Family, n: int):
    """Why rows of ``n`` entries of ``family`` are not the kernels', or None."""
    if family.zero_below and n > ROW_MAX:
        return f"rows of {n} entries (the CPU kernels take at most 2**31 - 1)"
    return None


def serves(x: Tensor, family: Family):
    """None when the kernel runs ``family`` on ``x``, else why not."""
    if not family.native:
        return f"family {family.name!r} has no CPU kernel"
    if not x.is_cpu:
        return f"a tensor on {x.device}"
    if x.dtype not in _WIDE:
        return f"{x.dtype} (the CPU kernels take float32 and float64)"
    a = family.alpha_value
    if a is not None and 1 < a <= ROUNDS_TO_ONE and x.dtype == torch.float32:
        return f"alpha={a!r} (1 in float32, the kernels' α)"
    why = too_long(family, x.shape[-1]) if x.dim() else None
    if why:
        return why
    return None if registry.native_available() else "the CPU kernels are not built here (no C compiler)"


def forward(family: Family, x: Tensor, k: int, tau: float, out: Tensor | None = None) -> Tensor:
    """p on the rows of ``x``: the kernel finds λ relative to the row itself;
    x/τ is formed after the shift (τ ≠ 1), as on every path.  ``out``: where
    to write p (:func:`softk._backends.native.forward`)."""
    return _forward(family, x if tau == 1.0 else scaled_rows(x, tau, family, k), k, out=out)


def backward(family: Family, p: Tensor, g: Tensor, tau: float, out: Tensor | None = None, *,
             x: Tensor | None = None, k=None) -> Tensor:
    """d ⊙ (g − Σ(d⊙g)/Σd)/τ from the saved output ``p``; ``out`` as in
    :func:`forward`.  ``x`` and ``k`` (the input and the budget, which the
    families with ``Family.slope_from_x`` read) are never needed: none of
    them is served here."""
    assert not family.slope_from_x, family.name
    return _backward(family, p, g, tau, out=out)
