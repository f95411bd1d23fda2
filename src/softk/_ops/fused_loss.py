r"""The fused Fenchel–Young loss as one op for every backend that has a
fused kernel: the compiled CPU kernels (:mod:`softk._backends.native.loss`) and Triton
(:mod:`softk._backends.triton.loss`).  :func:`softk.losses.fenchel_young_loss` takes
it when :func:`softk._backends.dispatch.fused_loss_backend` names one.

Liger-style: the forward kernel writes the loss and the gradient of the
(reduced) loss, s·(p − y) with s = 1/τ (times 1/#kept rows for the mean), in
the input's dtype; the backward only multiplies it by the incoming gradient
(nothing at all on the CPU when that is 1).  What PyTorch expects of it, and
how it is met:

* plain eager calls (:func:`softk._ops.lean.eager`): the kernel alone when
  autograd cannot see the result, else an old-style autograd.Function
  around it (:class:`softk._ops.lean.Paths`), never the torch.library layer;
* ``torch.compile(fullgraph=True)``: the kernel launch is inside the custom
  op ``softk::fenchel_young_fused`` (registered on first use, with a fake
  kernel), so Dynamo sees one opaque node;
* double backward (``create_graph=True``): the backward recomputes the
  gradient through the unfused differentiable path (p from the map's own
  contract, :func:`softk._ops.op.apply_rows`), so second derivatives
  are exact, not derivatives of the saved buffer;
* forward mode (``torch.autograd.forward_ad``): the tangent is ⟨G, v⟩ per
  row (G the saved gradient, which is then always written);
* ``torch.func`` transforms (vmap, grad, jvp): not served here;
  :func:`softk._backends.dispatch.fused_loss_backend` sends their wrapped
  tensors to the unfused loss.

Half inputs: Triton reads them as they are; the CPU kernels convert them to
float32 once (as the unfused CPU path does) and the saved gradient is
converted back to the input's dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import lean as _lean
from .._backends.native import loss as native_loss
from ..threshold.families import Family
from .family_keys import family_by_key, family_key
from ..threshold.rows import compute_dtype, scaled_rows
from .._validate import mean_of, mean_scale, sum_tolerance

_NO_GRAD = torch.empty(0)  # the gradient output when none is wanted (the lean path only; see _op_kernel)


# ---------------------------------------------------------------- the kernels
def _native(x, target, k_rows, family, k, tau, reduction, ignore_index, want_grad, check):
    """The compiled CPU kernel on the rows of ``x`` (half inputs in float32);
    ``check``: let the kernel check a dense target in its pass."""
    n = x.shape[-1]
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32  # the compute dtype
    z = x if tau == 1.0 and x.dtype == ct else scaled_rows(x, tau, family, k if k_rows is None else k_rows,
                                                           shift=tau != 1.0)
    if z.dim() != 2:
        z = z.reshape(-1, n)
    tol = -1.0
    if target.is_floating_point():
        if target.dim() != 2:
            target = target.reshape(-1, n)
        if target.dtype != ct:
            target = target.to(ct)  # checked by the caller in its own dtype
        elif check:
            tol = sum_tolerance(1.0, n, ct)
    else:
        if target.dim() != 1:
            target = target.reshape(-1)
        if target.dtype != torch.int64:
            target = target.long()
    kr = None if k_rows is None else k_rows.reshape(-1).to(ct).contiguous()
    out, grad = native_loss.fenchel_young_fused_rows(
        z if z.is_contiguous() else z.contiguous(), target if target.is_contiguous() else target.contiguous(),
        family, k, k_rows=kr, inv_tau=1.0 / tau, ignore_index=ignore_index, reduction=reduction,
        want_grad=want_grad, tol=tol)
    if reduction == "none" and x.dim() != 2:
        out = out.view(x.shape[:-1])
    if grad is None:
        grad = _NO_GRAD
    elif x.dim() != 2:
        grad = grad.view(x.shape)
    if x.dtype != ct:  # half input: computed in float32
        out, grad = out.to(x.dtype), grad.to(x.dtype)
    return out, grad


def _triton(x, target, family, k, tau, reduction, ignore_index, want_grad):
    from .._backends.triton.loss import fenchel_young_fused_rows

    n = x.shape[-1]
    dense = target.is_floating_point()
    rows_t = target.reshape(-1, n) if dense else torch.where(target != ignore_index, target, -1).reshape(-1)
    rows_t = rows_t.contiguous()
    kept = rows_t.shape[0]
    if not dense:  # no host sync: the count stays on the device
        kept = (rows_t >= 0).sum().float()
    scale = torch.ones(1, dtype=torch.float32, device=x.device)
    if reduction == "mean":  # 1/#kept, 0 with no kept row (the mean's zero gradients)
        scale = mean_scale(scale, torch.as_tensor(kept, dtype=torch.float32, device=x.device))
    loss, grad = fenchel_young_fused_rows(x.reshape(-1, n).contiguous(), rows_t, scale, family.kernel, k, tau,
                                          family.alpha_value, want_grad=want_grad)
    if want_grad:
        grad = grad.view(x.shape)
    # the reductions of softk._validate.reduce, on the same float32 rows
    if reduction == "none":
        out = loss.view(x.shape[:-1])
    else:
        out = loss.sum() if reduction == "sum" else mean_of(loss.sum(), kept)
    return out.to(x.dtype), grad


def _kernel(x, target, k_rows, family, k, tau, reduction, ignore_index, backend, want_grad, check=True):
    """(the reduced loss in x's dtype, the gradient s·(p − y) shaped like x or empty)."""
    if backend == "native":
        return _native(x, target, k_rows, family, k, tau, reduction, ignore_index, want_grad, check)
    return _triton(x, target, family, k, tau, reduction, ignore_index, want_grad)


def _op_kernel(x: Tensor, target: Tensor, k_rows: Optional[Tensor], name: str, alpha: float, k: int, tau: float,
               reduction: str, ignore_index: int, backend: str, want_grad: bool) -> tuple[Tensor, Tensor]:
    # On the library path the caller has checked the target in Python.
    out, grad = _kernel(x, target, k_rows, family_by_key(name, alpha), k, tau, reduction, ignore_index, backend,
                        want_grad, False)
    return out, grad if want_grad else x.new_empty(0)  # an op's outputs are its own


def _fake(x, target, k_rows, name, alpha, k, tau, reduction, ignore_index, backend, want_grad):
    out = x.new_empty(x.shape[:-1] if reduction == "none" else ())
    return out, torch.empty_like(x) if want_grad else x.new_empty(0)


fused_op = None  # softk::fenchel_young_fused, defined by _library()


@_lean.library
def _library():
    global fused_op
    fused_op = torch.library.custom_op("softk::fenchel_young_fused", _op_kernel, mutates_args=())
    fused_op.register_fake(_fake)  # no vmap rule: torch.func takes the unfused path


# ------------------------------------------------------- the autograd contract
def recomputed_grad(x, target, k_rows, family, k, tau, reduction, ignore_index, backend) -> Tensor:
    """s·(p − y) as differentiable tensor code through the map's contract
    (double backward: its derivative is the map's Jacobian)."""
    from .op import apply_rows

    xc = x.to(compute_dtype(x.dtype))
    p = apply_rows(xc, family, k if k_rows is None else k_rows.to(xc.dtype), tau, backend)
    if target.is_floating_point():
        diff = p - target.to(xc.dtype)
        kept = diff[..., 0].numel()
    else:
        keep = target != ignore_index
        y = torch.zeros_like(p).scatter_(-1, torch.where(keep, target, 0).long().unsqueeze(-1), 1.0)
        diff = torch.where(keep.unsqueeze(-1), p - y, 0.0)
        kept = keep.sum()
    return mean_scale(diff / tau, kept) if reduction == "mean" else diff / tau


class _FusedFenchelYoung(torch.autograd.Function):
    """L(x/τ; y) reduced as ``reduction`` says, in x's dtype, and its
    gradient (a second output, not differentiable); x holds rows (classes
    last), ``target`` class indices shaped like x's rows (``ignore_index``
    marks ignored rows) or dense rows shaped like x."""

    @staticmethod
    def forward(x, target, k_rows, family, k, tau, reduction, ignore_index, backend, want_grad):
        name, alpha = family_key(family)
        return fused_op(x, target, k_rows, name, alpha, k, tau, reduction, ignore_index, backend, want_grad)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, target, k_rows, family, k, tau, reduction, ignore_index, backend, _ = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # no zero buffer for the gradient output's (absent) gradient
        ctx.save_for_backward(x, target, k_rows, output[1])
        if forward_ad._current_level >= 0:
            ctx.save_for_forward(output[1])
        ctx.args = family, k, tau, reduction, ignore_index, backend

    @staticmethod
    def backward(ctx, g, _):
        nothing = (None,) * 9
        if g is None:
            return (None, *nothing)
        x, target, k_rows, grad = ctx.saved_tensors
        if torch.is_grad_enabled():
            # A graph is being built: the gradient as differentiable tensor
            # code, so that its derivative is the map's Jacobian.
            grad = recomputed_grad(x, target, k_rows, *ctx.args)
        elif ctx.args[3] != "none" and g.is_cpu and not torch.compiler.is_compiling() and float(g) == 1.0:
            return (grad, *nothing)  # the saved gradient is the answer (a CPU read, no device sync)
        if ctx.args[3] == "none":
            g = g.unsqueeze(-1)
        dx = grad * g
        return (dx if dx.dtype == x.dtype else dx.to(x.dtype), *nothing)


class _FusedFenchelYoungJvp(_FusedFenchelYoung):
    # Dynamo does not trace a Function with a custom jvp: the compiled path
    # uses the parent (forward-mode AD is not used under compile).
    @staticmethod
    def jvp(ctx, vx, *_):
        (grad,) = ctx.saved_tensors
        ct = compute_dtype(grad.dtype)
        t = grad.to(ct) * vx.to(ct)
        t = t.sum(-1) if ctx.args[3] == "none" else t.sum()
        return t.to(grad.dtype), None


_PATHS = _lean.Paths(_FusedFenchelYoungJvp, _kernel, lambda x, target, k_rows, *_: (x, target, k_rows),
                       compiled=_FusedFenchelYoung, register=_library)


def fused_fenchel_young(x: Tensor, target: Tensor, family: Family, k, tau: float, reduction: str,
                        ignore_index: int, backend: str, eager: bool | None = None) -> Tensor:
    """The reduced loss in x's dtype through the fused kernel of ``backend``
    (from :func:`softk._backends.dispatch.fused_loss_backend`).  ``x`` holds rows (classes last);
    ``target`` is dense (x's shape) or class indices (x's shape without the
    last dimension; ``ignore_index`` marks ignored rows); ``k`` an int or
    one integral k per row (shaped x.shape[:-1] + (1,)).  ``eager``: the
    caller's :func:`softk._ops.lean.eager` of these tensors, when it has it.  On
    the eager CPU path the kernel checks the target and raises
    :class:`softk._backends.native.loss.BadTarget`; elsewhere the caller has checked it."""
    k_rows = k if isinstance(k, Tensor) else None
    args = (x, target, k_rows, family, 1 if k_rows is not None else int(k), float(tau), reduction, ignore_index,
            backend)
    if eager is None:
        eager = _lean.eager(x, target, k_rows)
    if eager:  # the lean path of _PATHS.apply, without asking again
        if _lean.tracked(x):
            return _EAGER(*args, True)[0]
        return _kernel(*args, False)[0]
    want = torch.is_grad_enabled() and x.requires_grad if torch.compiler.is_compiling() else _lean.tracked(x)
    return _PATHS.apply(*args, want)[0]


_EAGER = _PATHS.eager_function.fast_apply
