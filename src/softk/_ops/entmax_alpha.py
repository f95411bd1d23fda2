r"""The autograd contract of α-entmax with α a tensor (per row, learnable).

A custom op ``softk::entmax_alpha`` (fake kernel, vmap rule) for the forward,
the backward as differentiable tensor code (so double backward works), and
forward mode from the same derivatives (J_x is symmetric; ∂p/∂α is
:func:`softk.threshold.entmax_alpha.dp_dalpha`).  It runs on the PyTorch path
on every device (the kernels take one α per call); the maths is
:mod:`softk.threshold.entmax_alpha`'s.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from . import lean as _lean
from ..threshold.entmax_alpha import dp_dalpha, entmax_log_d, entmax_rows
from ..threshold.rows import compute_dtype
from .._backends.torch.threshold import vjp_from_log_slope


def _kernel(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    return entmax_rows(x, alpha, tau).to(x.dtype)


def _entmax_alpha(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """p of α-entmax along the last dimension, α shaped x.shape[:-1] + (1,)."""
    return _kernel(x, alpha, tau)


# softk::entmax_alpha, defined by _library(), which the library path runs before any forward below
entmax_alpha_op: Callable[..., Tensor] = None  # type: ignore[assignment]


@_lean.library
def _library():
    global entmax_alpha_op
    entmax_alpha_op = _lean.custom_op("softk::entmax_alpha", _entmax_alpha)


class EntmaxAlphaFunction(torch.autograd.Function):
    """x: (..., n), alpha: (..., 1) (already broadcast and checked), both along the last dim."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
        return entmax_alpha_op(x, alpha, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, alpha, tau = inputs
        ctx.save_for_backward(output, alpha)
        ctx.save_for_forward(output, alpha)
        ctx.tau = tau
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g: Tensor):
        if g is None:  # no gradient reached p (see op._Threshold.backward)
            return None, None, None
        out, alpha = ctx.saved_tensors
        ct = compute_dtype(out.dtype)
        p, a, g = out.to(ct), alpha.to(ct), g.to(ct)
        logd = entmax_log_d(p, a)
        gx = vjp_from_log_slope(logd, g, ctx.tau).to(out.dtype)
        ga = None
        if ctx.needs_input_grad[1]:
            ga = (g * dp_dalpha(p, a, logd)).sum(-1, keepdim=True).to(alpha.dtype)
        return gx, ga, None


class EntmaxAlphaFunctionJvp(EntmaxAlphaFunction):
    @staticmethod
    def jvp(ctx, vx, va, _):
        out, alpha = ctx.saved_tensors
        ct = compute_dtype(out.dtype)
        p, a = out.to(ct), alpha.to(ct)
        logd = entmax_log_d(p, a)
        t = vjp_from_log_slope(logd, vx.to(ct), ctx.tau) if vx is not None else torch.zeros_like(p)
        if va is not None:
            t = t + va.to(ct) * dp_dalpha(p, a, logd)
        return t.to(out.dtype)


_PATHS = _lean.Paths(EntmaxAlphaFunctionJvp, _kernel, lambda x, alpha, _: (x, alpha),
                       compiled=EntmaxAlphaFunction, register=_library)


def entmax_alpha(x: Tensor, alpha: Tensor, tau: float) -> Tensor:
    """The contract on rows (dim last), α shaped x.shape[:-1] + (1,)."""
    return _PATHS.apply(x, alpha, tau)
