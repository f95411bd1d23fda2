r"""The one autograd contract of every threshold map, on every backend.

``threshold_map(x, family, k, dim, tau)`` runs p = f(x/τ − λ), Σp = k along
``dim``.  The backend is resolved once (:func:`softk.dispatch.resolve`) and
travels with the call, so the backward runs where the forward ran.

What PyTorch expects of a library op, and how it is met:

* ``torch.compile(fullgraph=True)``: the kernels are the custom ops
  ``softk::threshold`` and ``softk::threshold_backward``
  (``torch.library.custom_op``) with fake kernels, so Dynamo and Inductor see
  one opaque node per direction, never the ctypes call or the Triton launch
  (Inductor therefore never re-types a Triton kernel's scalars).
* reverse mode: the backward is d ⊙ (g − Σ(d⊙g)/Σd)/τ from the saved output
  (the backend's kernel when no graph is being built);
* double backward: when a graph is being built (``create_graph=True``) the
  backward is the same formula written as differentiable tensor code
  (:func:`softk.threshold.torch_path.vjp`), whose inputs p and g are tracked,
  so second derivatives (Hessians, ``gradgradcheck``) are exact;
* forward mode (``jvp``, ``jacfwd``): the Jacobian
  J = (diag(d) − d dᵀ/Σd)/τ is symmetric, so J·v is the backward applied to v;
* ``torch.func.vmap``: the custom ops carry vmap rules (the maps act on the
  last dimension, so a batch dimension just moves to the front), and the
  autograd function's vmap rule is generated from them.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .. import dispatch
from .families import Family, by_name, entmax_family
from .rows import empty_like_result
from .torch_path import vjp


@functools.lru_cache(maxsize=None)
def family_by_key(name: str, alpha: float) -> Family:
    """The family called ``name`` (entmax: with this α).  Custom ops take
    plain values, so a family crosses them as (name, α)."""
    return entmax_family(alpha) if name == "entmax" else by_name(name)


def family_key(family: Family):
    return family.name, family.alpha_value


# ------------------------------------------------------------- the custom ops
@torch.library.custom_op("softk::threshold", mutates_args=())
def threshold_op(x: Tensor, name: str, alpha: float, k: int, tau: float, backend: str) -> Tensor:
    """p along the last dimension of ``x`` on ``backend`` (arguments validated)."""
    return dispatch.get(backend).forward(family_by_key(name, alpha), x, k, tau)


@threshold_op.register_fake
def _(x, name, alpha, k, tau, backend):
    return torch.empty_like(x)


@torch.library.custom_op("softk::threshold_backward", mutates_args=())
def threshold_backward_op(p: Tensor, g: Tensor, name: str, alpha: float, tau: float, backend: str) -> Tensor:
    """∂L/∂x from the saved output ``p`` and the incoming gradient ``g``."""
    return dispatch.get(backend).backward(family_by_key(name, alpha), p, g.to(p.dtype), tau)


@threshold_backward_op.register_fake
def _(p, g, name, alpha, tau, backend):
    return torch.empty_like(p)


def _front(t: Tensor, bdim):
    return t if bdim is None else t.movedim(bdim, 0)


def _fwd_vmap(info, in_dims, x, name, alpha, k, tau, backend):
    # The map acts on the last logical dimension: any batch dim can lead.
    return threshold_op(_front(x, in_dims[0]), name, alpha, k, tau, backend), 0


def _bwd_vmap(info, in_dims, p, g, name, alpha, tau, backend):
    p, g = _front(p, in_dims[0]), _front(g, in_dims[1])
    if in_dims[0] is None:
        p = p.expand(info.batch_size, *p.shape)
    if in_dims[1] is None:
        g = g.expand(info.batch_size, *g.shape)
    return threshold_backward_op(p, g, name, alpha, tau, backend), 0


threshold_op.register_vmap(_fwd_vmap)
threshold_backward_op.register_vmap(_bwd_vmap)


# -------------------------------------------------------- the autograd contract
class _Threshold(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, family, k, tau, backend):
        name, alpha = family_key(family)
        return threshold_op(x, name, alpha, k, tau, backend)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, family, _, tau, backend = inputs
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.family, ctx.tau, ctx.backend = family, tau, backend

    @staticmethod
    def backward(ctx, g):
        (p,) = ctx.saved_tensors
        if torch.is_grad_enabled():
            # A graph is being built: differentiable tensor code (double backward).
            dx = vjp(ctx.family, p, g.to(p.dtype), ctx.tau)
        else:
            name, alpha = family_key(ctx.family)
            dx = threshold_backward_op(p, g, name, alpha, ctx.tau, ctx.backend)
        return dx, None, None, None, None


class _ThresholdJvp(_Threshold):
    # Dynamo does not trace a Function with a custom jvp, so the compiled
    # route uses the parent (forward-mode AD is not used under compile).
    @staticmethod
    def jvp(ctx, v, *_):
        (p,) = ctx.saved_tensors
        return vjp(ctx.family, p, v.to(p.dtype), ctx.tau)


def apply_rows(x: Tensor, family: Family, k, tau: float, backend: str) -> Tensor:
    """The contract on rows (dim last), backend already resolved; ``k`` an
    int, or a tensor shaped x.shape[:-1] + (1,) (see :mod:`.op_rowk`)."""
    if isinstance(k, Tensor):
        from .op_rowk import apply_rows_k

        return apply_rows_k(x, k, family, tau)
    fn = _Threshold if torch.compiler.is_compiling() else _ThresholdJvp
    return fn.apply(x, family, k, tau, backend)


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
        x, tau = x / tau.to(x.dtype), 1.0
    backend = dispatch.resolve(x, family)
    return apply_rows(x.movedim(dim, -1), family, k, tau, backend).movedim(-1, dim)
