"""The Triton kernels of the threshold maps, in the interface every threshold
kernel has (:mod:`softk._backends.kernels`): ``forward(family, x, k, tau)``
and ``backward(family, p, g, tau, x)`` on rows, float32 arithmetic inside.
Softmax (kernel id 0) with k = 1 takes its dedicated kernels
(:mod:`.softmax`: an online max and sum, several rows per program); every
other family the λ search of :mod:`.function`."""

from __future__ import annotations

from torch import Tensor

from ...threshold.families import Family
from . import function, softmax
from .launch import rows


def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
    x_rows = rows(x)
    if family.kernel == 0 and k == 1:
        out = softmax.softmax_rows(x_rows, tau)
    else:  # family.kernel is not None: the dispatcher gives this kernel only the families with an id
        out = function.forward_rows(x_rows, family.kernel, k, tau, family.alpha_value)  # type: ignore[arg-type]
    return out if x.dim() == 2 else out.view(x.shape)


def backward(family: Family, p: Tensor, g: Tensor, tau: float, x: Tensor | None = None, k=None) -> Tensor:
    p_rows, g_rows = rows(p), rows(g if g.dtype == p.dtype else g.to(p.dtype))
    if family.kernel == 0:  # softmax (k = 1 always)
        dx = softmax.softmax_backward_rows(p_rows, g_rows, tau)
    else:
        x_rows = None
        if family.slope_from_x:  # the input, which these families' backward reads
            assert x is not None, f"the {family.name} map's backward reads its input"
            x_rows = rows(x if x.dtype == p.dtype else x.to(p.dtype))
        dx = function.backward_rows(p_rows, g_rows, family.kernel, tau, family.alpha_value, x=x_rows,  # type: ignore[arg-type]
                                    k=k if x_rows is not None else None)
    return dx if p.dim() == 2 else dx.view(p.shape)
