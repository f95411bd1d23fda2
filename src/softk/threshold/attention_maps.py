r"""Which map an attention call runs: a :class:`softk.threshold.Family`, and its kernel id.

Attention rows are k = 1 maps, p_j = f(s_j − λ), Σ_j p_j = 1.  The maps
attention takes are the simplex families below, and each one's id is the
family's own kernel id (:data:`softk.threshold.families.KERNEL_IDS`, the one
table the C and Triton kernels read), never a position in a list:

=========  ====  ============================  ==========================
map        id    f(u)                          ``Family.unit``: f(u) = 1
=========  ====  ============================  ==========================
softmax    0     e^u                           0
sparsemax  1     max(u, 0)                     1
entmax15   2     (u/2)₊²                       2
entmax     3     [(α−1)u]₊^{1/(α−1)}           1/(α−1)
=========  ====  ============================  ==========================

(α-entmax with α = 1.5 or 2 as a plain number runs the exact closed forms of
ids 2 and 1; a tensor α, one per head, always runs id 3 so that it can get
its gradient.)

>>> family_id("entmax", 2.0, learnable=False), family_id("entmax", 2.0, learnable=True)
(1, 3)
>>> [family_id(name, 1.3, False) for name in MAPS] == [KERNEL_IDS[name] for name in MAPS]
True
"""

from __future__ import annotations

from torch import Tensor

from .families import ENTMAX15, KERNEL_IDS, SOFTMAX, SPARSEMAX, Family, entmax_family

# The maps with one fixed family, by name; "entmax" takes its α per call.
_FIXED = {f.name: f for f in (SOFTMAX, SPARSEMAX, ENTMAX15)}
MAPS = (*_FIXED, "entmax")
SOFTMAX_ID, SPARSEMAX_ID, ENTMAX15_ID, ENTMAX_ID = (KERNEL_IDS[name] for name in MAPS)
_BY_ID = {KERNEL_IDS[name]: f for name, f in _FIXED.items()}
# The ids the memory-efficient attention kernels (blockwise, Triton) have the
# row maths of; a map without one runs the reference (scores materialised).
KERNEL_MAPS = frozenset(KERNEL_IDS[name] for name in MAPS)


def family_id(name: str, alpha, learnable: bool) -> int:
    """The kernel id of ``name`` (``alpha``: entmax's α as a float, or None)."""
    if name != "entmax":
        return KERNEL_IDS[name]
    if not learnable and alpha in (1.5, 2.0):
        return ENTMAX15_ID if alpha == 1.5 else SPARSEMAX_ID
    return ENTMAX_ID


def family(fam: int, alpha_rows: Tensor | None = None) -> Family:
    """The threshold family of id ``fam``; for α-entmax, α per row (a tensor
    broadcastable to the rows, size 1 in the last dimension)."""
    if fam == ENTMAX_ID:
        return entmax_family(alpha_rows)
    return _BY_ID[fam]


def unit_offset(fam: int, alpha_rows: Tensor | None = None):
    """c with f(c) = 1 (:attr:`Family.unit`): a row with a single key that
    takes part has λ = s − c, so that key gets p = 1."""
    return family(fam, alpha_rows).unit
