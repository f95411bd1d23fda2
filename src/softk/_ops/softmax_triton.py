"""log_softmax and logsumexp on the Triton kernels of :mod:`softk._backends.triton.softmax`.

Where dispatch picks "triton" (a CUDA tensor, or the interpreter), the two
run the kernels under the autograd functions below: directly in plain eager
mode, and through custom ops (fake kernels, so torch.compile(fullgraph=True)
sees one opaque node per direction; vmap rules: the ops act on the last
dimension, so a batch dimension leads) otherwise (:mod:`.lean`).
:mod:`softk._maps.simplex` calls :func:`log_softmax_rows` and
:func:`logsumexp_rows` where :func:`softk._backends.dispatch.log_softmax_backend`
names "triton"; everywhere else it keeps its tensor code.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import lean as _lean
from ..threshold import SOFTMAX
from .op import threshold_map


def _rows(x: Tensor) -> Tensor:
    return x.contiguous().view(-1, x.shape[-1])


def _log_softmax_kernel(x: Tensor, tau: float) -> Tensor:
    from .._backends.triton.softmax import softmax_rows

    return softmax_rows(_rows(x), tau, log=True).view(x.shape)


def _log_softmax_bwd_kernel(y: Tensor, g: Tensor, tau: float) -> Tensor:
    from .._backends.triton.softmax import softmax_backward_rows

    return softmax_backward_rows(_rows(y), _rows(g.to(y.dtype)), tau, log=True).view(y.shape)


def _logsumexp_kernel(x: Tensor, tau: float) -> Tensor:
    from .._backends.triton.softmax import logsumexp_rows

    return logsumexp_rows(_rows(x), tau).view(x.shape[:-1])


def _logsumexp_bwd_kernel(x: Tensor, g: Tensor, tau: float) -> Tensor:
    from .._backends.triton.softmax import logsumexp_backward_rows

    return logsumexp_backward_rows(_rows(x), g.to(x.dtype).reshape(-1), tau).view(x.shape)


_log_softmax_op = _log_softmax_bwd_op = _logsumexp_op = _logsumexp_bwd_op = None  # see _library()


@_lean.library
def _library():
    global _log_softmax_op, _log_softmax_bwd_op, _logsumexp_op, _logsumexp_bwd_op
    _log_softmax_op = _lean.custom_op("softk::log_softmax_rows", _log_softmax_kernel)
    _log_softmax_bwd_op = _lean.custom_op("softk::log_softmax_rows_backward", _log_softmax_bwd_kernel)
    _logsumexp_op = _lean.custom_op("softk::logsumexp_rows", _logsumexp_kernel,
                                    fake=lambda x, tau: x.new_empty(x.shape[:-1]))
    _logsumexp_bwd_op = _lean.custom_op("softk::logsumexp_rows_backward", _logsumexp_bwd_kernel)


def _log_softmax_vjp(y: Tensor, g: Tensor, tau: float) -> Tensor:
    """(g − p Σg)/τ with p = e^y, 0 on fully masked rows: the kernel's
    formula as differentiable tensor code (double backward)."""
    y32, g32 = y.float(), g.float()
    empty = (y32 == float("-inf")).all(-1, keepdim=True)
    dx = (g32 - y32.exp() * g32.sum(-1, keepdim=True)) / tau
    return torch.where(empty, 0.0, dx).to(y.dtype)


def _softmax_rows(x: Tensor, tau: float) -> Tensor:
    # p = softmax(x/τ) on rows, through the threshold contract (differentiable)
    return threshold_map(x, SOFTMAX, 1, -1, tau)


# The autograd functions (as in softk._ops.op): the kernels' backward
# when no graph is being built, tensor code when one is (exact double
# backward); forward mode through jvp (J v = (v − Σ p v)/τ for log p, Σ p v
# for the smooth max); vmap rules generated from the custom ops' rules.
class _LogSoftmax(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, tau):
        return _log_softmax_op(x, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.tau = inputs[1]
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _log_softmax_vjp(y, g, ctx.tau), None
        if _lean.eager(y, g):
            return _log_softmax_bwd_kernel(y, g, ctx.tau), None
        _library()
        return _log_softmax_bwd_op(y, g, ctx.tau), None


class _LogSoftmaxJvp(_LogSoftmax):
    # Dynamo does not trace a Function with a custom jvp: compiled calls use the parent
    @staticmethod
    def jvp(ctx, v, _):
        (y,) = ctx.saved_tensors
        y32, v32 = y.float(), v.float()
        empty = (y32 == float("-inf")).all(-1, keepdim=True)
        t = (v32 - (y32.exp() * v32).sum(-1, keepdim=True)) / ctx.tau
        return torch.where(empty, 0.0, t).to(y.dtype)


class _LogSumExp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, tau):
        return _logsumexp_op(x, tau)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.tau = inputs[1]
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            # d(τ lse(x/τ))/dx = softmax(x/τ), whose own backward is then tensor code
            return (g.unsqueeze(-1) * _softmax_rows(x, ctx.tau)).to(x.dtype), None
        if _lean.eager(x, g):
            return _logsumexp_bwd_kernel(x, g, ctx.tau), None
        _library()
        return _logsumexp_bwd_op(x, g, ctx.tau), None


class _LogSumExpJvp(_LogSumExp):
    @staticmethod
    def jvp(ctx, v, _):
        (x,) = ctx.saved_tensors
        return (_softmax_rows(x, ctx.tau).float() * v.float()).sum(-1).to(x.dtype)


_LOG_SOFTMAX = _lean.Paths(_LogSoftmaxJvp, _log_softmax_kernel, lambda x, _: (x,), compiled=_LogSoftmax,
                            register=_library)
_LOGSUMEXP = _lean.Paths(_LogSumExpJvp, _logsumexp_kernel, lambda x, _: (x,), compiled=_LogSumExp, register=_library)


def log_softmax_rows(x: Tensor, tau: float) -> Tensor:
    """log softmax(x/τ) on the last dimension, through the kernels."""
    return _LOG_SOFTMAX.apply(x, tau)


def logsumexp_rows(x: Tensor, tau: float) -> Tensor:
    """τ logsumexp(x/τ) over the last dimension (reduced), through the kernels."""
    return _LOGSUMEXP.apply(x, tau)

