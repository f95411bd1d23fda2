r"""The routes of :func:`softk.attention.scaled_dot_product_attention` and their
autograd contract.

The route is chosen once per call from the configured backend
(:func:`softk._backends.registry.resolve`, see :func:`route`):

* ``"reference"`` (backend "torch"): :mod:`.reference`, the scores
  materialised and softk's maps applied; autograd differentiates it, twice
  too (``gradgradcheck``);
* ``"blockwise"`` ("native", and "auto" on any device without Triton):
  :mod:`softk._backends.blockwise`, blocks of keys;
* ``"triton"`` ("triton", and "auto" on CUDA): the fused kernels of
  :mod:`softk._backends.triton.attention`; float64 inputs, or a build
  without triton, run "blockwise".

The last two share one interface, ``attention_forward`` → (out, m, lam) and
``attention_backward`` → (dq, dk, dv, dα), and one autograd contract:

* plain eager calls (:func:`softk._ops.lean.eager`) run the kernels directly,
  under an old-style ``torch.autograd.Function`` only when autograd can see
  the result;
* everything else (``torch.compile``, ``torch.func``, subclasses, modes)
  calls the custom ops ``softk::attention`` and ``softk::attention_backward``
  (fake kernels, ``register_autograd``), registered on first use, so that
  ``torch.compile(fullgraph=True)`` sees one opaque node per direction;
* double backward (``create_graph=True``) raises NotImplementedError on
  these two routes: use the reference route (``softk.use_backend("torch")``).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

from .._backends import registry as _backend
from .._ops import lean as _lean
from ..threshold.rows import compute_dtype
from .._backends.blockwise import backward as blockwise_backward, forward as blockwise
from . import reference
from .checks import Call
from ..threshold.attention_maps import ENTMAX_ID

ROUTES = ("reference", "blockwise", "triton")


@functools.lru_cache(maxsize=None)
def _triton_module():
    """softk._backends.triton.attention, or None where it is not built (read once)."""
    try:
        from .._backends.triton import attention as module
    except ImportError:
        return None
    return module


def _triton_ready() -> bool:
    return _triton_module() is not None


_triton_ready._dynamo_marked_constant = True  # read once when a graph is captured


def route(q: Tensor) -> str:
    """The route that runs a call on ``q`` under the configured backend."""
    configured = _backend.backend()
    name = _backend.resolve(q, native_ok=lambda: True)  # the blockwise route needs no C compiler
    if name == "torch" and configured == "torch":
        return "reference"
    if name == "triton" and q.dtype != torch.float64 and _triton_ready():
        return "triton"
    return "blockwise"


# ------------------------------------------------------------------ the kernels
def _forward(q, k, v, mask, alpha, scale, causal, fam, route_name):
    if route_name == "triton":
        a = alpha.detach().float() if alpha is not None else q.new_full((q.shape[1],), 1.5, dtype=torch.float32)
        return _triton_module().attention_forward(q, k, v, scale=scale, causal=causal, mask=mask, fam=fam, alpha=a)
    a = alpha.detach() if alpha is not None else None
    return blockwise.attention_forward(q, k, v, scale=scale, causal=causal, mask=mask, fam=fam, alpha=a)


def _backward(q, k, v, out, dout, m, lam, mask, alpha, scale, causal, fam, route_name, need_dalpha):
    kw = dict(scale=scale, causal=causal, mask=mask, fam=fam, need_dalpha=need_dalpha)
    if route_name == "triton":
        a = alpha.detach().float() if alpha is not None else q.new_full((q.shape[1],), 1.5, dtype=torch.float32)
        return _triton_module().attention_backward(q, k, v, out, dout, m, lam, alpha=a, **kw)
    a = alpha.detach() if alpha is not None else None
    return blockwise_backward.attention_backward(q, k, v, out, dout, m, lam, alpha=a, **kw)


def _no_double_backward():
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise NotImplementedError(
            "double backward (create_graph=True) through softk's attention runs only on the reference route; "
            "use `with softk.use_backend('torch'):` for second derivatives"
        )


def _grads(saved, args, dout, needs, kernel):
    q, k, v, out, m, lam, mask, alpha = saved
    scale, causal, fam, route_name = args
    need_dalpha = bool(needs[4]) and alpha is not None
    dq, dk, dv, da = kernel(q, k, v, out, dout.contiguous(), m, lam, mask, alpha, scale, causal, fam, route_name,
                            need_dalpha)
    da = da.to(alpha.dtype) if need_dalpha else None
    return dq, dk, dv, None, da, None, None, None, None


# ------------------------------------------------------- the eager (lean) route
class _EagerAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, alpha, scale, causal, fam, route_name):
        out, m, lam = _forward(q, k, v, mask, alpha, scale, causal, fam, route_name)
        ctx.save_for_backward(q, k, v, out, m, lam, mask, alpha)
        ctx.args = (scale, causal, fam, route_name)
        ctx.mark_non_differentiable(m, lam)
        return out, m, lam

    @staticmethod
    def backward(ctx, dout, _dm, _dlam):
        _no_double_backward()
        return _grads(ctx.saved_tensors, ctx.args, dout, ctx.needs_input_grad, _backward)


# ------------------------------------------------------- the library route
attention_op = attention_backward_op = None


def _fake_forward(q, k, v, mask, alpha, scale, causal, fam, route_name):
    B, H, L, _ = q.shape
    ct = compute_dtype(q.dtype)
    return (q.new_empty(B, H, L, v.shape[-1]), q.new_empty(B, H, L, dtype=ct), q.new_empty(B, H, L, dtype=ct))


def _fake_backward(q, k, v, out, dout, m, lam, mask, alpha, scale, causal, fam, route_name, need_dalpha):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(q.shape[1], dtype=compute_dtype(q.dtype)))


def _setup_context(ctx, inputs, output):
    q, k, v, mask, alpha, scale, causal, fam, route_name = inputs
    out, m, lam = output
    ctx.save_for_backward(q, k, v, out, m, lam, mask, alpha)
    ctx.args = (scale, causal, fam, route_name)


def _library_backward(ctx, dout, _dm, _dlam):
    _no_double_backward()
    return _grads(ctx.saved_tensors, ctx.args, dout, ctx.needs_input_grad, attention_backward_op)


def _register() -> bool:
    """Define the custom ops (once, on the first call that needs them)."""
    global attention_op, attention_backward_op
    if attention_op is not None:
        return True

    def forward(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], alpha: Optional[Tensor], scale: float,
                causal: bool, fam: int, route_name: str) -> tuple[Tensor, Tensor, Tensor]:
        out, m, lam = _forward(q, k, v, mask, alpha, scale, causal, fam, route_name)
        return out.contiguous(), m.contiguous(), lam.contiguous()  # the fake kernel's layout

    def backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, m: Tensor, lam: Tensor,
                 mask: Optional[Tensor], alpha: Optional[Tensor], scale: float, causal: bool, fam: int,
                 route_name: str, need_dalpha: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        dq, dk, dv, da = _backward(q, k, v, out, dout, m, lam, mask, alpha, scale, causal, fam, route_name,
                                   need_dalpha)
        if da is None:
            da = q.new_zeros(q.shape[1], dtype=compute_dtype(q.dtype))
        return dq.contiguous(), dk.contiguous(), dv.contiguous(), da.to(compute_dtype(q.dtype))

    attention_op = torch.library.custom_op("softk::attention", forward, mutates_args=())
    attention_op.register_fake(_fake_forward)
    attention_op.register_autograd(_library_backward, setup_context=_setup_context)
    attention_backward_op = torch.library.custom_op("softk::attention_backward", backward, mutates_args=())
    attention_backward_op.register_fake(_fake_backward)
    return True


_register._dynamo_marked_constant = True  # Dynamo runs it for real (registering the ops) instead of tracing it


# ------------------------------------------------------------------ one call
def _fused(call: Call, route_name: str) -> Tensor:
    q, k, v, alpha = call.q, call.k, call.v, call.alpha if call.fam == ENTMAX_ID else None
    args = (q, k, v, call.mask, alpha, call.scale, call.causal, call.fam, route_name)
    if _lean.eager(q, k, v, alpha, call.mask):
        if any(t is not None and _lean.tracked(t) for t in (q, k, v, alpha)):
            return _EagerAttention.apply(*args)[0]
        return _forward(*args)[0]
    _register()
    return attention_op(*args)[0]


def attention(call: Call, route_name: Optional[str] = None) -> Tensor:
    """The attention output of a checked call, shaped ``call.out_shape``;
    ``route_name`` None picks :func:`route` (tests name one)."""
    if route_name is None:
        route_name = route(call.q)
    if route_name not in ROUTES:
        raise ValueError(f"route must be one of {list(ROUTES)}, got {route_name!r}")
    if route_name == "triton" and not _triton_ready():
        route_name = "blockwise"
    if route_name == "reference" or 0 in call.q.shape or 0 in call.k.shape:
        out = reference.attention(call)  # (an empty call runs here: its result is empty or zeros)
    else:
        out = _fused(call, route_name)
    return out.reshape(call.out_shape)
