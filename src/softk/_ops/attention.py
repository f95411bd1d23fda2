r"""Attention's autograd rule and its ``softk::attention`` ops, for the kernels
of op "attention" (:mod:`softk._backends.kernels`): ``"native"`` (the
blockwise kernel of :mod:`softk._backends.blockwise`, blocks of keys, any
device) and ``"triton"`` (the fused kernels of
:mod:`softk._backends.triton.attention`).  Each has ``forward`` → (out, m, λ,
tiles) and ``backward`` → (dq, dk, dv, dα); ``tiles`` is the forward's mask
of the (query block, key block) tiles where p is not zero everywhere (int8;
empty where a kernel keeps none), which its backward reads instead of
finding the live tiles again.  Which one runs a call is
:func:`softk._backends.dispatch.pick`'s answer; where none does (the setting
"torch") the attention is its reference, :mod:`softk.attention.reference`
(the scores materialised, plain autograd).

* plain eager calls (:func:`softk._ops.lean.eager`) run the kernels directly,
  under an old-style ``torch.autograd.Function`` only when autograd can see
  the result;
* everything else (``torch.compile``, subclasses, modes) calls the custom
  ops ``softk::attention`` and ``softk::attention_backward`` (fake kernels,
  ``register_autograd``), registered on first use
  (:func:`softk._ops.lean.library`), so that ``torch.compile(fullgraph=True)``
  sees one opaque node per direction;
* double backward (``create_graph=True``) raises NotImplementedError on
  these two backends: use the reference one (``softk.use_backend("torch")``).

The ops are defined with ``torch.library.custom_op`` and ``register_autograd``
rather than :class:`softk._ops.lean.Paths`: the op has four outputs, three
of them not differentiable, and no vmap rule, which ``lean.custom_op``'s
generated rule would change.  ``torch.func`` transforms do not reach them:
:func:`softk.attention.op.attention` gives such calls to the reference.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import lean as _lean
from .._backends import kernels
from ..threshold.rows import compute_dtype


# ------------------------------------------------------------------ the kernels
def _forward(q, k, v, mask, alpha, scale, causal, fam, backend, softcap=0.0):
    return kernels.get("attention", backend).impl.forward(q, k, v, mask, alpha, scale, causal, fam, softcap)


def _backward(q, k, v, out, dout, m, lam, tiles, mask, alpha, scale, causal, fam, backend, need_dalpha,
              softcap=0.0):
    return kernels.get("attention", backend).impl.backward(q, k, v, out, dout, m, lam, tiles, mask, alpha, scale,
                                                           causal, fam, need_dalpha, softcap)


def _no_double_backward():
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        raise NotImplementedError(
            "double backward (create_graph=True) through softk's attention runs only on the reference backend; "
            "use `with softk.use_backend('torch'):` for second derivatives"
        )


def _grads(saved, args, dout, needs, kernel):
    q, k, v, out, m, lam, tiles, mask, alpha = saved
    scale, causal, fam, backend, softcap = args
    need_dalpha = bool(needs[4]) and alpha is not None
    dq, dk, dv, da = kernel(q, k, v, out, dout.contiguous(), m, lam, tiles, mask, alpha, scale, causal, fam, backend,
                            need_dalpha, softcap)
    da = da.to(alpha.dtype) if need_dalpha else None
    return dq, dk, dv, None, da, None, None, None, None, None


# ------------------------------------------------------- the eager (lean) path
class _EagerAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, alpha, scale, causal, fam, backend, softcap):
        out, m, lam, tiles = _forward(q, k, v, mask, alpha, scale, causal, fam, backend, softcap)
        ctx.save_for_backward(q, k, v, out, m, lam, tiles, mask, alpha)
        ctx.args = (scale, causal, fam, backend, softcap)
        ctx.mark_non_differentiable(m, lam, tiles)
        return out, m, lam, tiles

    @staticmethod
    def backward(ctx, dout, _dm, _dlam, _dtiles):
        _no_double_backward()
        return _grads(ctx.saved_tensors, ctx.args, dout, ctx.needs_input_grad, _backward)


# ------------------------------------------------------- the library path
attention_op = attention_backward_op = None


def _fake_forward(q, k, v, mask, alpha, scale, causal, fam, backend, softcap):
    B, H, L, _ = q.shape
    ct = compute_dtype(q.dtype)
    tiles = q.new_empty(kernels.get("attention", backend).impl.tiles_numel(q, k, fam), dtype=torch.int8)
    return (q.new_empty(B, H, L, v.shape[-1]), q.new_empty(B, H, L, dtype=ct), q.new_empty(B, H, L, dtype=ct), tiles)


def _fake_backward(q, k, v, out, dout, m, lam, tiles, mask, alpha, scale, causal, fam, backend, need_dalpha,
                   softcap):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty(q.shape[1], dtype=compute_dtype(q.dtype)))


def _setup_context(ctx, inputs, output):
    q, k, v, mask, alpha, scale, causal, fam, backend, softcap = inputs
    out, m, lam, tiles = output
    ctx.save_for_backward(q, k, v, out, m, lam, tiles, mask, alpha)
    ctx.args = (scale, causal, fam, backend, softcap)


def _library_backward(ctx, dout, _dm, _dlam, _dtiles):
    _no_double_backward()
    return _grads(ctx.saved_tensors, ctx.args, dout, ctx.needs_input_grad, attention_backward_op)


def _op_forward(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], alpha: Optional[Tensor], scale: float,
                causal: bool, fam: int, backend: str, softcap: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    out, m, lam, tiles = _forward(q, k, v, mask, alpha, scale, causal, fam, backend, softcap)
    return out.contiguous(), m.contiguous(), lam.contiguous(), tiles  # the fake kernel's layout


def _op_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, m: Tensor, lam: Tensor,
                 tiles: Tensor, mask: Optional[Tensor], alpha: Optional[Tensor], scale: float, causal: bool, fam: int,
                 backend: str, need_dalpha: bool, softcap: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv, da = _backward(q, k, v, out, dout, m, lam, tiles, mask, alpha, scale, causal, fam, backend,
                               need_dalpha, softcap)
    if da is None:
        da = q.new_zeros(q.shape[1], dtype=compute_dtype(q.dtype))
    return dq.contiguous(), dk.contiguous(), dv.contiguous(), da.to(compute_dtype(q.dtype))


@_lean.library
def _library():
    """Define the custom ops (once, on the first call that needs them)."""
    global attention_op, attention_backward_op
    attention_op = torch.library.custom_op("softk::attention", _op_forward, mutates_args=())
    attention_op.register_fake(_fake_forward)
    attention_op.register_autograd(_library_backward, setup_context=_setup_context)
    attention_backward_op = torch.library.custom_op("softk::attention_backward", _op_backward, mutates_args=())
    attention_backward_op.register_fake(_fake_backward)


# ------------------------------------------------------------------ one call
def attention(q: Tensor, k: Tensor, v: Tensor, mask, alpha, scale: float, causal: bool, fam: int,
              backend: str, softcap: float = 0.0) -> Tensor:
    """The attention output (B, H, L, Ev) of checked tensors on ``backend``
    (a kernel of op "attention"); ``alpha`` None unless the map is α-entmax;
    ``softcap`` c > 0 caps the scores to c·tanh(s/c) (0: none)."""
    args = (q, k, v, mask, alpha, scale, causal, fam, backend, float(softcap))
    return _lean.route((q, k, v, alpha, mask), _EagerAttention.apply, _forward, _library_forward, _library, *args)[0]


def _library_forward(*args):
    return attention_op(*args)
