r"""Which kernel runs :func:`softk.attention.scaled_dot_product_attention`.

The kernel is picked once per call (:func:`softk._backends.dispatch.pick`,
op "attention", :mod:`softk._backends.kernels`):

* ``"triton"`` (the setting "triton", and "auto" on CUDA): the fused kernels
  of :mod:`softk._backends.triton.attention`; float64 inputs, or a build
  without Triton, fall back to the next;
* ``"native"`` (the setting "native", and "auto" elsewhere): the blockwise
  kernel of :mod:`softk._backends.blockwise`, blocks of keys on any device;
* none (the setting "torch"): :mod:`.reference`, the scores materialised and
  softk's maps applied; autograd differentiates it, twice too
  (``gradgradcheck``).

The two kernels share one autograd rule and the ops ``softk::attention`` and
``softk::attention_backward`` (:mod:`softk._ops.attention`); double backward
(``create_graph=True``) raises NotImplementedError on them.  A call inside a
``torch.func`` transform (grad, vjp, jvp, jacrev, vmap), which those ops do
not support, runs the reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._backends import dispatch
from .._ops import attention as _op
from . import reference
from .checks import Call
from ..threshold.attention_maps import ENTMAX_ID


_PICK = object()


def attention(call: Call, kernel=_PICK) -> Tensor:
    """The attention output of a checked call, shaped ``call.out_shape``, by
    ``kernel``: by default the dispatcher's answer; tests pass a kernel of
    op "attention", or None for the reference."""
    if kernel is _PICK:
        kernel = dispatch.pick("attention", call.q, call.fam)
    # (an empty call runs the reference: its result is empty or zeros; so does a
    # call inside a torch.func transform, which the kernels' ops do not support:
    # the reference is plain tensor code, which every transform differentiates)
    if kernel is None or 0 in call.q.shape or 0 in call.k.shape or torch._C._are_functorch_transforms_active():
        out = reference.attention(call)
    else:
        alpha = call.alpha if call.fam == ENTMAX_ID else None
        out = _op.attention(call.q, call.k, call.v, call.mask, alpha, call.scale, call.causal, call.fam,
                            kernel.backend, call.softcap or 0.0)
    return out.reshape(call.out_shape)
