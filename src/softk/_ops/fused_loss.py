r"""The fused Fenchel–Young loss as one op for every backend that has a
fused kernel: the compiled CPU kernels (:mod:`softk._backends.native.loss`) and Triton
(:mod:`softk._backends.triton.loss`), the kernels of op "fenchel_young"
(:mod:`softk._backends.kernels`).  :func:`softk.losses.fenchel_young_loss`
takes it when :func:`softk._backends.dispatch.pick` names one.

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
* ``torch.func`` transforms (vmap, grad, jvp): not served here; no fused
  kernel serves their wrapped tensors, which take the unfused loss.

Half inputs: Triton reads them as they are; the CPU kernels convert them to
float32 once (as the unfused CPU path does) and the saved gradient is
converted back to the input's dtype.

:func:`softk.losses.cross_entropy` takes this op too, for half scores with
class indices on Triton (softmax's loss with a one-hot target is
cross-entropy), with ``ce_rows``: torch's conventions for rows with no
finite score and for ignored NaN rows, in the kernel and in the double
backward's recomputed gradient.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torch.autograd import forward_ad

from . import lean as _lean
from .._backends import kernels
from .._backends.native.loss import BadTarget
from ..threshold.families import Family
from .family_keys import family_by_key, family_key
from ..threshold.rows import compute_dtype
from .._validate import mean_scale

# ---------------------------------------------------------------- the kernels
def _kernel(x, target, k_rows, family, k, tau, reduction, ignore_index, ce_rows, backend, want_grad, check=True):
    """(the reduced loss in x's dtype, the gradient s·(p − y) shaped like x or empty)."""
    return kernels.get("fenchel_young", backend).impl.fenchel_young(x, target, k_rows, family, k, tau, reduction,
                                                                    ignore_index, want_grad, check, ce_rows)


def _op_kernel(x: Tensor, target: Tensor, k_rows: Optional[Tensor], name: str, alpha: float, k: int, tau: float,
               reduction: str, ignore_index: int, ce_rows: bool, backend: str,
               want_grad: bool) -> tuple[Tensor, Tensor]:
    # On the library path the caller has checked the target in Python.
    out, grad = _kernel(x, target, k_rows, family_by_key(name, alpha), k, tau, reduction, ignore_index, ce_rows,
                        backend, want_grad, False)
    return out, grad if want_grad else x.new_empty(0)  # an op's outputs are its own


def _fake(x, target, k_rows, name, alpha, k, tau, reduction, ignore_index, ce_rows, backend, want_grad):
    out = x.new_empty(x.shape[:-1] if reduction == "none" else ())
    return out, torch.empty_like(x) if want_grad else x.new_empty(0)


fused_op = None  # softk::fenchel_young_fused, defined by _library()


@_lean.library
def _library():
    global fused_op
    fused_op = torch.library.custom_op("softk::fenchel_young_fused", _op_kernel, mutates_args=())
    fused_op.register_fake(_fake)  # no vmap rule: torch.func takes the unfused path


# ------------------------------------------------------- the autograd contract
def recomputed_grad(x, target, k_rows, family, k, tau, reduction, ignore_index, ce_rows, backend) -> Tensor:
    """s·(p − y) as differentiable tensor code through the map's contract
    (double backward: its derivative is the map's Jacobian); with
    ``ce_rows``, torch's cross-entropy's: p = torch.softmax (NaN on a row
    with no finite score), and an ignored row's p − y times 0 (NaN on a NaN
    row), as torch's log-softmax backward gives them."""
    from .op import apply_rows

    xc = x.to(compute_dtype(x.dtype))
    if ce_rows:
        p = torch.softmax(xc / tau, -1)
    else:
        p = apply_rows(xc, family, k if k_rows is None else k_rows.to(xc.dtype), tau, backend)
    if target.is_floating_point():
        diff = p - target.to(xc.dtype)
        kept = diff[..., 0].numel()
    else:
        keep = target != ignore_index
        y = torch.zeros_like(p).scatter_(-1, torch.where(keep, target, 0).long().unsqueeze(-1), 1.0)
        diff = (p - y) * keep.unsqueeze(-1) if ce_rows else torch.where(keep.unsqueeze(-1), p - y, 0.0)
        kept = keep.sum()
    return mean_scale(diff / tau, kept) if reduction == "mean" else diff / tau


class _FusedFenchelYoung(torch.autograd.Function):
    """L(x/τ; y) reduced as ``reduction`` says, in x's dtype, and its
    gradient (a second output, not differentiable); x holds rows (classes
    last), ``target`` class indices shaped like x's rows (``ignore_index``
    marks ignored rows) or dense rows shaped like x."""

    @staticmethod
    def forward(x, target, k_rows, family, k, tau, reduction, ignore_index, ce_rows, backend, want_grad):
        name, alpha = family_key(family)
        return fused_op(x, target, k_rows, name, alpha, k, tau, reduction, ignore_index, ce_rows, backend, want_grad)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, target, k_rows, family, k, tau, reduction, ignore_index, ce_rows, backend, _ = inputs
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # no zero buffer for the gradient output's (absent) gradient
        ctx.save_for_backward(x, target, k_rows, output[1])
        if forward_ad._current_level >= 0:
            ctx.save_for_forward(output[1])
        ctx.args = family, k, tau, reduction, ignore_index, ce_rows, backend

    @staticmethod
    def backward(ctx, g, _):
        nothing = (None,) * 10
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
                        ignore_index: int, backend: str, check_target, ce_rows: bool = False) -> Tensor:
    """The reduced loss in x's dtype through the fused kernel on ``backend``
    (the one :func:`softk._backends.dispatch.pick` gave for op
    "fenchel_young").  ``x`` holds rows (classes last); ``target`` is dense
    (x's shape) or class indices (x's shape without the last dimension;
    ``ignore_index`` marks ignored rows); ``k`` an int or one integral k per
    row (shaped x.shape[:-1] + (1,)).

    ``check_target()`` is the caller's check of the target's values, which
    raises its message for a bad one.  A kernel that checks the target in its
    own pass (``CHECKS_TARGET``: the CPU kernel, on the eager path, for
    class indices or a dense target in the rows' compute dtype) calls it only
    once it has found a bad one (:class:`BadTarget`); every other call checks
    first.  ``ce_rows``: the rows of torch's cross-entropy (softmax with
    class indices, on a kernel whose module says ``CROSS_ENTROPY``): a row
    with no finite score is NaN, and a NaN row's gradient NaN even where
    its class index is ignored."""
    k_rows = k if isinstance(k, Tensor) else None
    args = (x, target, k_rows, family, 1 if k_rows is not None else int(k), float(tau), reduction, ignore_index,
            ce_rows, backend)
    if not _lean.eager(x, target, k_rows):
        check_target()
        want = torch.is_grad_enabled() and x.requires_grad if _lean.compiling() else _lean.tracked(x)
        return _PATHS.apply(*args, want)[0]
    own = kernels.get("fenchel_young", backend).impl.CHECKS_TARGET and (
        not target.is_floating_point() or target.dtype == compute_dtype(x.dtype))
    if not own:
        check_target()
    try:  # the lean path of _PATHS.apply, without asking again
        return (_EAGER(*args, True) if _lean.tracked(x) else _kernel(*args, False))[0]
    except BadTarget:
        check_target()
        raise


_EAGER = _PATHS.eager_function.fast_apply  # type: ignore[attr-defined]  # set by _lean.twin
