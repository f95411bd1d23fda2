"""The Triton kernels of the threshold maps, in the interface every threshold
kernel has (:mod:`softk._backends.kernels`): ``forward(family, x, k, tau)``
and ``backward(family, p, g, tau)`` on rows, float32 arithmetic inside.
Softmax (kernel id 0) with k = 1 takes its dedicated kernels
(:mod:`.softmax`: an online max and sum, several rows per program); every
other family the λ search of :mod:`.function`."""

from __future__ import annotations

from torch import Tensor

from ...threshold.families import Family
from . import function, softmax


def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
    rows = x.contiguous().view(-1, x.shape[-1])
    if family.kernel == 0 and k == 1:
        return softmax.softmax_rows(rows, tau).view(x.shape)
    # family.kernel is not None: the dispatcher gives this kernel only the families with an id
    return function.forward_rows(rows, family.kernel, k, tau, family.alpha_value).view(x.shape)  # type: ignore[arg-type]


def backward(family: Family, p: Tensor, g: Tensor, tau: float) -> Tensor:
    n = p.shape[-1]
    p_rows, g_rows = p.contiguous().view(-1, n), g.to(p.dtype).contiguous().view(-1, n)
    if family.kernel == 0:  # softmax (k = 1 always)
        return softmax.softmax_backward_rows(p_rows, g_rows, tau).view(p.shape)
    return function.backward_rows(p_rows, g_rows, family.kernel, tau, family.alpha_value).view(p.shape)  # type: ignore[arg-type]
