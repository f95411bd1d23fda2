r"""Which map an attention call runs: the family id shared with the Triton
kernels, and the :class:`softk.threshold.Family` the memory-efficient backend
solves with.

Attention rows are k = 1 maps, p_j = f(s_j − λ), Σ_j p_j = 1:

=========  ====  ============================  =======================
map        id    f(u)                          c with f(c) = 1
=========  ====  ============================  =======================
softmax    0     e^u                           0
sparsemax  1     max(u, 0)                     1
entmax15   2     (u/2)₊²                       2
entmax     3     [(α−1)u]₊^{1/(α−1)}           1/(α−1)
=========  ====  ============================  =======================

(α-entmax with α = 1.5 or 2 as a plain number runs the exact closed forms of
ids 2 and 1; a tensor α, one per head, always runs id 3 so that it can get
its gradient.)

>>> family_id("entmax", 2.0, learnable=False), family_id("entmax", 2.0, learnable=True)
(1, 3)
"""

from __future__ import annotations

from torch import Tensor

from .families import ENTMAX15, SOFTMAX, SPARSEMAX, Family, entmax_family

MAPS = ("softmax", "sparsemax", "entmax15", "entmax")
SOFTMAX_ID, SPARSEMAX_ID, ENTMAX15_ID, ENTMAX_ID = 0, 1, 2, 3


def family_id(name: str, alpha, learnable: bool) -> int:
    """The kernel id of ``name`` (``alpha``: entmax's α as a float, or None)."""
    if name != "entmax":
        return MAPS.index(name)
    if not learnable and alpha in (1.5, 2.0):
        return ENTMAX15_ID if alpha == 1.5 else SPARSEMAX_ID
    return ENTMAX_ID


def family(fam: int, alpha_rows: Tensor | None = None) -> Family:
    """The threshold family of id ``fam``; for id 3, α per row (a tensor
    broadcastable to the rows, size 1 in the last dimension)."""
    if fam == ENTMAX_ID:
        return entmax_family(alpha_rows)
    return (SOFTMAX, SPARSEMAX, ENTMAX15)[fam]


def unit_offset(fam: int, alpha_rows: Tensor | None = None):
    """c with f(c) = 1: a row with a single key that takes part has
    λ = s − c, so that key gets p = 1."""
    if fam == ENTMAX_ID:
        return 1.0 / (alpha_rows - 1)
    return (0.0, 1.0, 2.0)[fam]
