r"""The backends of :func:`softk.attention.scaled_dot_product_attention`.

The backend is chosen once per call from the configured one by
:func:`softk._backends.dispatch.attention_backend`:

* ``"reference"`` (setting "torch"): :mod:`.reference`, the scores
  materialised and softk's maps applied; autograd differentiates it, twice
  too (``gradgradcheck``);
* ``"blockwise"`` ("native", and "auto" on any device without Triton):
  :mod:`softk._backends.blockwise`, blocks of keys;
* ``"triton"`` ("triton", and "auto" on CUDA): the fused kernels of
  :mod:`softk._backends.triton.attention`; float64 inputs, or a build
  without triton, run "blockwise".

The last two share one autograd rule and the ops ``softk::attention`` and
``softk::attention_backward`` (:mod:`softk._ops.attention`); double backward
(``create_graph=True``) raises NotImplementedError on them.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from .._backends import dispatch
from .._ops import attention as _op
from . import reference
from .checks import Call
from ..threshold.attention_maps import ENTMAX_ID

BACKENDS = dispatch.ATTENTION_BACKENDS


def attention(call: Call, backend: Optional[str] = None) -> Tensor:
    """The attention output of a checked call, shaped ``call.out_shape``;
    ``backend`` None picks :func:`softk._backends.dispatch.attention_backend`
    (tests name one)."""
    if backend is None:
        backend = dispatch.attention_backend(call.q)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "triton" and dispatch.triton_attention() is None:
        backend = "blockwise"  # a build without triton
    if backend == "reference" or 0 in call.q.shape or 0 in call.k.shape:
        out = reference.attention(call)  # (an empty call runs here: its result is empty or zeros)
    else:
        alpha = call.alpha if call.fam == ENTMAX_ID else None
        out = _op.attention(call.q, call.k, call.v, call.mask, alpha, call.scale, call.causal, call.fam, backend,
                            call.softcap or 0.0)
    return out.reshape(call.out_shape)
