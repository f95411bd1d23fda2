r"""Sparse attention: ``torch.nn.functional.scaled_dot_product_attention`` with
softmax, sparsemax, 1.5-entmax or α-entmax (a learnable α per head) for the
attention weights, at any length.

See :func:`scaled_dot_product_attention`, and :func:`varlen_attn` for packed
variable-length sequences (torch's ``varlen_attn`` signature).  Here live the public functions
(``_sdpa``, ``_varlen``),
its argument checks (``checks``), the backend choice of one call (``op``) and
the reference backend (``reference``); the autograd rule and the
``softk::attention`` ops are :mod:`softk._ops.attention`, the kernels
:mod:`softk._backends.blockwise` and :mod:`softk._backends.triton.attention`.
Imported by ``softk/__init__``, ``softk.nn`` and ``softk.integrations``;
imports the maps, :mod:`softk._ops` and below.
"""

from __future__ import annotations

from ..threshold.attention_maps import MAPS
from ._sdpa import scaled_dot_product_attention
from ._varlen import varlen_attn

__all__ = ["scaled_dot_product_attention", "varlen_attn", "MAPS"]
