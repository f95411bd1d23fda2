r"""The one autograd contract of every threshold map, on every backend.

``threshold_map(x, family, k, dim, tau)`` runs p = f(x/τ − λ), Σp = k along
``dim``.  The kernel is picked once (:func:`softk._backends.dispatch.pick`,
op "threshold") and its backend name travels with the call, so the backward
runs where the forward ran: the kernel's ``forward(family, x, k, τ)`` and
``backward(family, p, g, τ, x)`` (:mod:`softk._backends.kernels`; x, the
input, for the families with ``Family.slope_from_x``, else None).

What PyTorch expects of a library op, and how it is met:

* eager calls cost what a torch op costs: a plain tensor in plain eager mode
  (:func:`softk._ops.lean.eager`) runs the backend's kernel directly, under an
  old-style autograd.Function only when autograd can see the result, and
  never enters torch.library (whose per-call layers cost more than a small
  map, and whose first call imports torch._dynamo and triton);
* ``torch.compile(fullgraph=True)``: the kernels are the custom ops
  ``softk::threshold`` and ``softk::threshold_backward``
  (``torch.library.custom_op``, registered on the first call that needs
  them) with fake kernels, so Dynamo and Inductor see one opaque node per
  direction, never the ctypes call or the Triton launch (Inductor therefore
  never re-types a Triton kernel's scalars).
* reverse mode: the backward is d ⊙ (g − Σ(d⊙g)/Σd)/τ from the saved output
  (the backend's kernel when no graph is being built); the families whose
  slope p cannot give near p = 1 (``Family.slope_from_x``: sigmoid,
  laplace) save their input too, and the backward forms d from it;
* double backward: when a graph is being built (``create_graph=True``) the
  backward is the same formula written as differentiable tensor code
  (:func:`softk._backends.torch.threshold.vjp`), whose inputs p and g are tracked,
  so second derivatives (Hessians, ``gradgradcheck``) are exact;
* forward mode (``jvp``, ``jacfwd``): the Jacobian
  J = (diag(d) − d dᵀ/Σd)/τ is symmetric, so J·v is the backward applied to v;
* ``torch.func.vmap``: the custom ops carry vmap rules (the maps act on the
  last dimension, so a batch dimension just moves to the front), and the
  autograd function's vmap rule is generated from them.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import lean as _lean
from .._backends import dispatch, kernels
from .._backends.torch.threshold import vjp
from ..threshold.families import Family
from .family_keys import family_by_key, family_key
from .per_row_k import apply_rows_k
from .saved import save, saved
from ..threshold.rows import empty_like_result, over_tau


# ------------------------------------------------------------- the custom ops
def _threshold(x: Tensor, name: str, alpha: float, k: int, tau: float, backend: str) -> Tensor:
    """p along the last dimension of ``x`` by the kernel on ``backend`` (arguments validated)."""
    return kernels.get("threshold", backend).impl.forward(family_by_key(name, alpha), x, k, tau)


def _threshold_backward(p: Tensor, g: Tensor, name: str, alpha: float, tau: float, backend: str,
                        x: Optional[Tensor] = None, k: Optional[float] = None) -> Tensor:
    """∂L/∂x from the saved output ``p``, the incoming gradient ``g`` and,
    for the families with ``slope_from_x``, the saved input ``x`` and the
    budget ``k``."""
    return kernels.get("threshold", backend).impl.backward(family_by_key(name, alpha), p, g, tau, x=x, k=k)


threshold_op = threshold_backward_op = None  # softk::threshold(_backward), defined by _library()


@_lean.library
def _library():
    global threshold_op, threshold_backward_op
    threshold_op = _lean.custom_op("softk::threshold", _threshold)
    threshold_backward_op = _lean.custom_op("softk::threshold_backward", _threshold_backward)


# -------------------------------------------------------- the autograd contract
def _kernel(x, family, k, tau, backend):
    return kernels.get("threshold", backend).impl.forward(family, x, k, tau)


def _backward_kernel(p, g, family, tau, backend, x, k):
    return kernels.get("threshold", backend).impl.backward(family, p, g, tau, x=x, k=k)


def _backward_library(p, g, family, tau, backend, x, k):
    name, alpha = family_key(family)
    return threshold_backward_op(p, g, name, alpha, tau, backend, x, None if k is None else float(k))


class _Threshold(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, family, k, tau, backend):
        name, alpha = family_key(family)
        return threshold_op(x, name, alpha, k, tau, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, family, k, tau, backend = inputs
        save(ctx, family, x, output)
        ctx.family, ctx.k, ctx.tau, ctx.backend = family, k, tau, backend
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, g):
        if g is None:
            # p reached the loss only through a rule that gives it no gradient
            # (a Fenchel–Young value): J·0 is NaN where the slope overflows
            # (entmax at large α on ties), and needs no work anyway
            return None, None, None, None, None
        p, x = saved(ctx)
        if torch.is_grad_enabled():
            # A graph is being built: differentiable tensor code (double backward).
            dx = vjp(ctx.family, p, g.to(p.dtype), ctx.tau, x, ctx.k)
        else:
            dx = _lean.call((p, g), _backward_kernel, _backward_library, _library, p, g, ctx.family, ctx.tau,
                            ctx.backend, x, ctx.k)
        return dx, None, None, None, None


class _ThresholdJvp(_Threshold):
    # Dynamo does not trace a Function with a custom jvp, so the compiled
    # path uses the parent (forward-mode AD is not used under compile).
    @staticmethod
    def jvp(ctx, v, *_):
        p, x = saved(ctx)
        return vjp(ctx.family, p, v.to(p.dtype), ctx.tau, x, ctx.k)


_PATHS = _lean.Paths(_ThresholdJvp, _kernel, lambda x, *_: (x,), compiled=_Threshold, register=_library)


def apply_rows(x: Tensor, family: Family, k, tau: float, backend: str) -> Tensor:
    """The contract on rows (dim last), the kernel's backend already picked;
    ``k`` an int, or a tensor shaped x.shape[:-1] + (1,) (see :mod:`.per_row_k`)."""
    if isinstance(k, Tensor):
        return apply_rows_k(x, k, family, tau)
    # _PATHS runs _kernel (above) on its eager path and the op softk::threshold
    # otherwise; both call kernels.get("threshold", backend).impl.forward, the
    # kernel the dispatcher picked (_backends/kernels.py names its module).
    return _PATHS.apply(x, family, k, tau, backend)


def threshold_map(x: Tensor, family: Family, k, dim: int, tau) -> Tensor:
    """p = f(x/τ − λ), Σp = k along ``dim`` (arguments already validated).

    ``tau`` is a float, or a one-element tensor that requires grad: then x/τ
    is formed with autograd (so τ gets its gradient) and the map runs at τ = 1.
    ``k`` is an int, or a per-row tensor already shaped like the rows
    (``dim`` moved last, size 1 there).
    """
    if x.numel() == 0:
        return empty_like_result(x)
    if isinstance(tau, Tensor):
        return threshold_map(over_tau(x, tau, dim, k, family.capped), family, k, dim, 1.0).to(x.dtype)
    backend = dispatch.pick("threshold", x, family).backend  # type: ignore[union-attr]  # its torch kernel serves every call
    if dim == x.dim() - 1:
        return apply_rows(x, family, k, tau, backend)
    return apply_rows(x.movedim(dim, -1), family, k, tau, backend).movedim(-1, dim)
