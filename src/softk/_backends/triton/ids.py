"""The family ids the Triton kernels branch on, named: the values of the one
table :data:`softk.threshold.families.KERNEL_IDS` (which the C kernels
mirror), as constexprs a kernel compares its ``FAM`` with, so that no kernel
holds an id of its own.  The kernels rely on the table's order in one place:
the simplex families (k = 1) come first and the top-k methods from ``EXP``
on (``FAM >= EXP``: a capped family), as the assertion below keeps."""

import triton.language as tl

from ...threshold.families import KERNEL_IDS

SOFTMAX = tl.constexpr(KERNEL_IDS["softmax"])
SPARSEMAX = tl.constexpr(KERNEL_IDS["sparsemax"])
ENTMAX15 = tl.constexpr(KERNEL_IDS["entmax15"])
ENTMAX = tl.constexpr(KERNEL_IDS["entmax"])
EXP = tl.constexpr(KERNEL_IDS["exp"])
SIGMOID = tl.constexpr(KERNEL_IDS["sigmoid"])
LAPLACE = tl.constexpr(KERNEL_IDS["laplace"])
SPARSE = tl.constexpr(KERNEL_IDS["sparse"])

_SIMPLEX, _TOPK = ("softmax", "sparsemax", "entmax15", "entmax"), ("exp", "sigmoid", "laplace", "sparse")
assert max(KERNEL_IDS[n] for n in _SIMPLEX) < KERNEL_IDS["exp"] == min(KERNEL_IDS[n] for n in _TOPK), KERNEL_IDS
