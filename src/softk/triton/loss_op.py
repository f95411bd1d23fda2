r"""The fused Fenchel–Young loss as a library op: the kernel of
:mod:`.loss_kernel` behind the custom op ``softk::fenchel_young_fused`` and
one autograd function (the route :func:`softk.losses.fenchel_young_loss`
takes on the "triton" backend, see :func:`fused_serves`).

Liger-style: the forward kernel writes the gradient of the (reduced) loss,
scale·(p − y)/τ with scale = 1/#kept rows for the mean and 1 otherwise, in
the input's dtype, and the backward only multiplies it by the incoming
gradient (a 0-d tensor for "mean"/"sum": one rounding in the input's dtype,
none when it is 1).  What PyTorch expects of it, and how it is met:

* ``torch.compile(fullgraph=True)``: the kernel launch is inside the custom
  op (with a fake kernel), so Dynamo sees one opaque node;
* double backward (``create_graph=True``): the backward recomputes the
  gradient through the unfused differentiable route (p from the map's own
  contract, :func:`softk.threshold.op.apply_rows`), so second derivatives
  are exact, not derivatives of the saved buffer;
* forward mode (``torch.autograd.forward_ad``): the tangent is ⟨G, v⟩ per
  row (G the saved gradient, which is then always written);
* ``torch.func`` transforms (vmap, grad, jvp): not served here; the caller
  keeps the unfused route for their wrapped tensors (:func:`fused_serves`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..threshold.families import Family
from ..threshold.op import apply_rows, family_by_key, family_key
from ..threshold.rows import compute_dtype


@torch.library.custom_op("softk::fenchel_young_fused", mutates_args=())
def fenchel_young_fused_op(x: Tensor, target: Tensor, scale: Tensor, name: str, alpha: float, k: int,
                           tau: float, want_grad: bool) -> tuple[Tensor, Tensor]:
    """(loss per row in float32, gradient scale·(p − y)/τ in x's dtype) for
    contiguous (rows, n) ``x``; ``target`` (rows, n) floats or (rows,) class
    indices with −1 for ignored rows."""
    from .loss import fenchel_young_fused_rows

    return fenchel_young_fused_rows(x, target, scale, family_by_key(name, alpha).kernel, k, tau, alpha,
                                    want_grad=want_grad)


@fenchel_young_fused_op.register_fake
def _(x, target, scale, name, alpha, k, tau, want_grad):
    grad = torch.empty_like(x) if want_grad else x.new_empty(0)
    return x.new_empty(x.shape[0], dtype=torch.float32), grad


def _recomputed_grad(x: Tensor, target: Tensor, scale: Tensor, family: Family, k: int, tau: float) -> Tensor:
    """scale·(p − y)/τ through the unfused differentiable route (double backward)."""
    xc = x.to(compute_dtype(x.dtype))
    p = apply_rows(xc, family, k, tau, "triton")
    if target.is_floating_point():
        diff = p - target.to(xc.dtype)
    else:
        keep = (target >= 0).unsqueeze(-1)
        diff = p - torch.zeros_like(p).scatter_(-1, target.clamp(min=0).unsqueeze(-1), 1.0)
        diff = torch.where(keep, diff, 0.0)
    return diff * (scale.to(xc.dtype) / tau)  # scale: one element


class _FusedFenchelYoung(torch.autograd.Function):
    """L(x/τ; y) reduced as ``reduction`` says, in x's dtype; x holds rows
    (classes last), ``target`` is shaped like x (dense) or like its rows
    (class indices, −1 for ignored rows)."""

    @staticmethod
    def forward(x, target, family, k, tau, reduction, want_grad):
        n = x.shape[-1]
        dense = target.is_floating_point()
        rows_t = (target.reshape(-1, n) if dense else target.reshape(-1)).contiguous()
        if reduction == "mean":
            count = torch.tensor(float(rows_t.shape[0]), device=x.device) if dense else (rows_t >= 0).sum().float()
            scale = (1.0 / count).reshape(1)
        else:
            scale = torch.ones(1, dtype=torch.float32, device=x.device)
        name, alpha = family_key(family)
        loss, grad = fenchel_young_fused_op(x.reshape(-1, n).contiguous(), rows_t, scale, name, alpha, k, tau, want_grad)
        # the reductions of softk.losses.targets.reduce, on the same float32 rows
        if reduction == "none":
            out = loss.view(x.shape[:-1])
        elif reduction == "sum":
            out = loss.sum()
        elif dense:
            out = loss.mean()
        else:
            out = loss.sum() / count
        return out.to(x.dtype), grad.view(x.shape) if want_grad else grad, scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, target, family, k, tau, reduction, _ = inputs
        ctx.mark_non_differentiable(output[1], output[2])
        ctx.set_materialize_grads(False)  # no zero buffer for the gradient output's (absent) gradient
        ctx.save_for_backward(x, target, output[1], output[2])
        ctx.save_for_forward(output[1])
        ctx.family, ctx.k, ctx.tau, ctx.reduction = family, k, tau, reduction

    @staticmethod
    def backward(ctx, g, *_):
        x, target, grad, scale = ctx.saved_tensors
        if g is None:
            return None, None, None, None, None, None, None
        if torch.is_grad_enabled():
            # A graph is being built: the gradient as differentiable tensor
            # code, so that its derivative is the map's Jacobian.
            grad = _recomputed_grad(x, target, scale, ctx.family, ctx.k, ctx.tau)
        g = g if ctx.reduction != "none" else g.unsqueeze(-1)
        return (grad * g).to(x.dtype), None, None, None, None, None, None


class _FusedFenchelYoungJvp(_FusedFenchelYoung):
    # Dynamo does not trace a Function with a custom jvp: the compiled route
    # uses the parent (forward-mode AD is not used under compile).
    @staticmethod
    def jvp(ctx, vx, *_):
        (grad,) = ctx.saved_tensors
        t = grad.float() * vx.float()
        t = t.sum(-1) if ctx.reduction == "none" else t.sum()
        return t.to(grad.dtype), None, None


def _has_tangent(x: Tensor) -> bool:
    from torch.autograd import forward_ad

    return forward_ad.unpack_dual(x).tangent is not None


def fused_serves(x: Tensor, target: Tensor, family: Family, k) -> bool:
    """True when the fused kernel serves this call (the "triton" backend
    already resolved by the caller): a family with a kernel (a float α), an
    int k, and no ``torch.func`` transform wrapping ``x`` or ``target``."""
    if isinstance(k, Tensor) or family.kernel is None or x.numel() == 0:
        return False
    if torch.compiler.is_compiling():
        return True
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    return not (wrapped(x) or wrapped(target))


def fused_fenchel_young(x: Tensor, target: Tensor, family: Family, k: int, tau: float, reduction: str) -> Tensor:
    """The reduced loss in x's dtype through the fused kernel; ``x`` holds
    rows (classes last), ``target`` is dense (x's shape) or class indices
    (x's shape without the last dimension, −1 for ignored rows)."""
    compiling = torch.compiler.is_compiling()
    want = (torch.is_grad_enabled() and x.requires_grad) or (not compiling and _has_tangent(x))
    fn = _FusedFenchelYoung if compiling else _FusedFenchelYoungJvp
    return fn.apply(x, target, family, int(k), float(tau), reduction, want)[0]
