"""Triton kernels for the threshold maps (several narrow rows per program, any width).

Importing this package needs ``triton``; :func:`softk._backends.registry` only selects it
when triton imports and can run (a CUDA tensor, or ``TRITON_INTERPRET=1`` set
before triton is imported, which runs the kernels on CPU tensors — how CI
checks them without a GPU).  Imported by :mod:`softk._backends.dispatch`
and the ops of :mod:`softk._ops`; imports only :mod:`softk.threshold`.
"""

from .function import FAMILY_IDS, backward_rows, forward_rows

__all__ = ["FAMILY_IDS", "forward_rows", "backward_rows"]
