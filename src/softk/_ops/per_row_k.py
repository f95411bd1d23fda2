r"""The autograd contract with a per-row budget k (a tensor): p = f(x/τ − λ), Σp = k_row.

Same contract as :mod:`.op` (custom op with a fake kernel and vmap rule,
reverse mode from the saved output, double backward, jvp), plus the
derivative in k, which makes the budget learnable: differentiating
Σ_i f(z_i − λ) = k gives ∂λ/∂k = −1/Σd, so

.. math:: \partial p_i / \partial k = d_i / \textstyle\sum_j d_j, \qquad d = f'(z - \lambda)

(0 where Σd = 0).  Any real k in (0, n] is feasible for the capped families
(f ≤ 1: the soft top-k methods), so k need not be an integer.  The compiled
and Triton kernels take one k per call, so a per-row k runs on the PyTorch
path on every device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import lean as _lean
from .._backends import dispatch
from .family_keys import family_by_key, family_key
from ..threshold.rows import compute_dtype, scaled_rows
from .._backends.torch.threshold import map_rows, output, row_slope, vjp
from .saved import save, saved


def _kernel(x: Tensor, k: Tensor, family, tau: float) -> Tensor:
    kc = k.to(compute_dtype(x.dtype))
    return output(family, map_rows(family, scaled_rows(x, tau, family, kc), kc), x.dtype)


def _rowk(x: Tensor, k: Tensor, name: str, alpha: float, tau: float) -> Tensor:
    """p along the last dimension of ``x`` with Σp = k (k shaped x.shape[:-1] + (1,))."""
    return _kernel(x, k, family_by_key(name, alpha), tau)


threshold_rowk_op = None  # softk::threshold_rowk, defined by _library()


@_lean.library
def _library():
    global threshold_rowk_op
    threshold_rowk_op = _lean.custom_op("softk::threshold_rowk", _rowk)


def _dp_dk(family, p: Tensor, x, tau: float, k) -> Tensor:
    d = row_slope(family, p, x, tau, k)
    sd = d.sum(-1, keepdim=True)
    return torch.where(sd > 0, d / torch.where(sd > 0, sd, 1.0), 0.0).to(p.dtype)


class _ThresholdRowK(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, k, family, tau):
        name, alpha = family_key(family)
        return threshold_rowk_op(x, k, name, alpha, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, k, family, tau = inputs
        save(ctx, family, x, output)
        ctx.family, ctx.k, ctx.tau = family, k, tau
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        if g is None:  # no gradient reached p (see op._Threshold.backward)
            return None, None, None, None
        p, x = saved(ctx)
        g = g.to(p.dtype)
        dx = vjp(ctx.family, p, g, ctx.tau, x, ctx.k)
        dk = None
        if ctx.needs_input_grad[1]:
            dk = (g * _dp_dk(ctx.family, p, x, ctx.tau, ctx.k)).sum(-1, keepdim=True)
        return dx, dk, None, None


class _ThresholdRowKJvp(_ThresholdRowK):
    @staticmethod
    def jvp(ctx, vx, vk, *_):
        p, x = saved(ctx)
        out = vjp(ctx.family, p, vx.to(p.dtype), ctx.tau, x, ctx.k) if vx is not None else torch.zeros_like(p)
        if vk is not None:
            out = out + vk.to(p.dtype) * _dp_dk(ctx.family, p, x, ctx.tau, ctx.k)
        return out


_PATHS = _lean.Paths(_ThresholdRowKJvp, _kernel, lambda x, k, *_: (x, k), compiled=_ThresholdRowK,
                       register=_library)


def apply_rows_k(x: Tensor, k: Tensor, family, tau: float) -> Tensor:
    """The contract on rows (dim last) with k shaped x.shape[:-1] + (1,)."""
    # one k per row runs the torch kernel (the general solver); a named
    # backend must still be able to run x at all
    dispatch.order("threshold", x)
    return _PATHS.apply(x, k.to(compute_dtype(x.dtype)), family, tau)
