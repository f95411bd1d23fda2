r"""log_softmax and logsumexp along a dimension: the op, its kernel and its tensor code.

:func:`log_softmax` and :func:`logsumexp` ask the dispatcher (op
"log_softmax", :mod:`softk._backends.kernels`).  Where a kernel serves (the
Triton kernels of :mod:`softk._backends.triton.softmax`: a CUDA tensor, or
the interpreter) it runs under the autograd functions below: directly in
plain eager mode, and through custom ops (fake kernels, so
torch.compile(fullgraph=True) sees one opaque node per direction; vmap
rules: the ops act on the last dimension, so a batch dimension leads)
otherwise (:mod:`.lean`).  Everywhere else the op is its tensor code,
which autograd differentiates: torch's own fused ops on plain eager CPU
calls whose rows are all ordinary, and otherwise the shifted form with
softk's row conventions (a fully masked row gives ``-inf`` with a zero
gradient, a NaN stays in its row).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import lean as _lean
from .._backends import dispatch, kernels
from ..threshold import SOFTMAX
from ..threshold.rows import compute_dtype, empty_like_result, shift_over_tau
from .op import threshold_map


def _rows(x: Tensor) -> Tensor:
    return x.contiguous().view(-1, x.shape[-1])


def _impl(backend: str):
    return kernels.get("log_softmax", backend).impl


def _log_softmax_kernel(x: Tensor, tau: float, backend: str) -> Tensor:
    return _impl(backend).softmax_rows(_rows(x), tau, log=True).view(x.shape)


def _log_softmax_bwd_kernel(y: Tensor, g: Tensor, tau: float, backend: str) -> Tensor:
    return _impl(backend).softmax_backward_rows(_rows(y), _rows(g.to(y.dtype)), tau, log=True).view(y.shape)


def _logsumexp_kernel(x: Tensor, tau: float, backend: str) -> Tensor:
    return _impl(backend).logsumexp_rows(_rows(x), tau).view(x.shape[:-1])


def _logsumexp_bwd_kernel(x: Tensor, g: Tensor, tau: float, backend: str) -> Tensor:
    return _impl(backend).logsumexp_backward_rows(_rows(x), g.to(x.dtype).reshape(-1), tau).view(x.shape)


_log_softmax_op = _log_softmax_bwd_op = _logsumexp_op = _logsumexp_bwd_op = None  # see _library()


@_lean.library
def _library():
    global _log_softmax_op, _log_softmax_bwd_op, _logsumexp_op, _logsumexp_bwd_op
    _log_softmax_op = _lean.custom_op("softk::log_softmax_rows", _log_softmax_kernel)
    _log_softmax_bwd_op = _lean.custom_op("softk::log_softmax_rows_backward", _log_softmax_bwd_kernel)
    _logsumexp_op = _lean.custom_op("softk::logsumexp_rows", _logsumexp_kernel,
                                    fake=lambda x, tau, backend: x.new_empty(x.shape[:-1]))
    _logsumexp_bwd_op = _lean.custom_op("softk::logsumexp_rows_backward", _logsumexp_bwd_kernel)


def _log_softmax_bwd_library(y, g, tau, backend):
    return _log_softmax_bwd_op(y, g, tau, backend)


def _logsumexp_bwd_library(x, g, tau, backend):
    return _logsumexp_bwd_op(x, g, tau, backend)


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
    def forward(x, tau, backend):
        return _log_softmax_op(x, tau, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.tau, ctx.backend = inputs[1], inputs[2]
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            return _log_softmax_vjp(y, g, ctx.tau), None, None
        dx = _lean.call((y, g), _log_softmax_bwd_kernel, _log_softmax_bwd_library, _library, y, g, ctx.tau,
                        ctx.backend)
        return dx, None, None


class _LogSoftmaxJvp(_LogSoftmax):
    # Dynamo does not trace a Function with a custom jvp: compiled calls use the parent
    @staticmethod
    def jvp(ctx, v, *_):
        (y,) = ctx.saved_tensors
        y32, v32 = y.float(), v.float()
        empty = (y32 == float("-inf")).all(-1, keepdim=True)
        t = (v32 - (y32.exp() * v32).sum(-1, keepdim=True)) / ctx.tau
        return torch.where(empty, 0.0, t).to(y.dtype)


class _LogSumExp(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, tau, backend):
        return _logsumexp_op(x, tau, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.tau, ctx.backend = inputs[1], inputs[2]
        ctx.save_for_backward(inputs[0])
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            # d(τ lse(x/τ))/dx = softmax(x/τ), whose own backward is then tensor code
            return (g.unsqueeze(-1) * _softmax_rows(x, ctx.tau)).to(x.dtype), None, None
        dx = _lean.call((x, g), _logsumexp_bwd_kernel, _logsumexp_bwd_library, _library, x, g, ctx.tau, ctx.backend)
        return dx, None, None


class _LogSumExpJvp(_LogSumExp):
    @staticmethod
    def jvp(ctx, v, *_):
        (x,) = ctx.saved_tensors
        return (_softmax_rows(x, ctx.tau).float() * v.float()).sum(-1).to(x.dtype)


_LOG_SOFTMAX = _lean.Paths(_LogSoftmaxJvp, _log_softmax_kernel, lambda x, *_: (x,), compiled=_LogSoftmax,
                            register=_library)
_LOGSUMEXP = _lean.Paths(_LogSumExpJvp, _logsumexp_kernel, lambda x, *_: (x,), compiled=_LogSumExp,
                          register=_library)


# ------------------------------------------------------------ the tensor code
def _log_normaliser(x: Tensor, dim: int, tau):
    """(s, m, lse, empty): s = (x − m)/τ with m the finite row max (so x/τ
    never overflows), lse = logsumexp(s), and the fully masked rows, whose s
    is replaced by zeros so that neither lse nor its gradient is NaN there.
    Plain tensor code (no data-dependent branch), so vmap, compile and double
    backward see ordinary ops."""
    z = x.to(compute_dtype(x.dtype))
    m = z.detach().amax(dim, keepdim=True)
    empty = m == float("-inf")
    # a row holding NaN or +inf is NaN (the row convention), its gradient too:
    # NaN is added, so the gradient flows into the NaN it meets
    broken = torch.where((m != m) | (m == float("inf")), float("nan"), 0.0)
    m = torch.where(torch.isfinite(m), m, 0.0)
    s = torch.where(empty, 0.0, shift_over_tau(z, m, tau, check=False) + broken)
    return s, m, torch.logsumexp(s, dim, keepdim=True), empty


# The fast path of log_softmax/logsumexp: torch's own fused ops, which shift
# by the row max themselves (so τ = 1 needs no shift of ours), with one check
# that every row was ordinary.  A row that is fully masked, or holds NaN or
# +inf, follows softk's row conventions, which torch's ops do not (they give
# NaN, or a NaN gradient): such calls take the general tensor code above.
# Eager CPU calls only: the check reads a value (a data-dependent branch that
# vmap and compile cannot take, and a host sync on a device).
def _eager_cpu(x: Tensor, tau) -> bool:
    return not isinstance(tau, Tensor) and x.is_cpu and _lean.eager(x)


def _shifted(x: Tensor, dim: int, tau: float):
    """(z, m): z = x − m (m the row max, τ = 1: None, no shift needed) over τ,
    in the compute dtype; None where a row max is not finite."""
    ct = compute_dtype(x.dtype)
    if tau == 1.0:
        return (x if x.dtype == ct else x.to(ct)), None
    m = x.detach().amax(dim, keepdim=True).to(ct)
    if not bool(torch.isfinite(m).all()):
        return None
    return shift_over_tau(x.to(ct), m, tau), m


def _torch_log_softmax(x: Tensor, dim: int, tau: float):
    zm = _shifted(x, dim, tau)
    if zm is None:
        return None
    y = torch.log_softmax(zm[0], dim)
    if math.isnan(y.detach().amax().item()):  # NaN iff some row is not ordinary
        return None
    return y if y.dtype == x.dtype else y.to(x.dtype)


def _torch_logsumexp(x: Tensor, dim: int, tau: float, keepdim: bool):
    zm = _shifted(x, dim, tau)
    if zm is None:
        return None
    z, m = zm
    out = torch.logsumexp(z, dim, keepdim=True)
    if not bool(torch.isfinite(out.detach()).all()):
        return None
    if m is not None:
        out = m + out * tau
    if not keepdim:
        out = out.squeeze(dim)
    return out if out.dtype == x.dtype else out.to(x.dtype)


# ------------------------------------------------------------------- the op
def log_softmax(x: Tensor, dim: int, tau) -> Tensor:
    """log softmax(x/τ) along ``dim`` (arguments validated)."""
    if x.numel() == 0:
        return empty_like_result(x)
    kernel = dispatch.pick("log_softmax", x, tau)
    if kernel is not None:
        return _LOG_SOFTMAX.apply(x.movedim(dim, -1), tau, kernel.backend).movedim(-1, dim)
    if _eager_cpu(x, tau):
        y = _torch_log_softmax(x, dim, tau)
        if y is not None:
            return y
    s, _, lse, empty = _log_normaliser(x, dim, tau)
    return torch.where(empty, float("-inf"), s - lse).to(x.dtype)


def logsumexp(x: Tensor, dim: int, tau, keepdim: bool) -> Tensor:
    """τ logsumexp(x/τ) along ``dim`` (arguments validated)."""
    if x.numel() == 0:  # the log of an empty sum is -inf; an empty batch stays empty
        return torch.logsumexp(x, dim, keepdim=keepdim)
    kernel = dispatch.pick("log_softmax", x, tau)
    if kernel is not None:
        out = _LOGSUMEXP.apply(x.movedim(dim, -1), tau, kernel.backend)
        return out.unsqueeze(dim) if keepdim else out
    if _eager_cpu(x, tau):
        out = _torch_logsumexp(x, dim, tau, keepdim)
        if out is not None:
            return out
    _, m, lse, empty = _log_normaliser(x, dim, tau)
    out = torch.where(empty, float("-inf"), m + lse * tau)
    if not keepdim:
        out = out.squeeze(dim)
    return out.to(x.dtype)
