"""Which threshold family a vocab-parallel map or loss name stands for, and what is refused."""

from __future__ import annotations

import zlib

from .._validate import check_alpha
from ..losses._options import LossOptions
from ..threshold.families import ENTMAX15, EXP, SOFTMAX, SPARSE, SPARSEMAX, Family, entmax_by_alpha

MAPS = ("softmax", "sparsemax", "entmax15", "entmax", "sparse", "exp")

_REFUSED = (
    "{what} is not available vocab-parallel; {fix}, or gather the logits and use the single-device one.  "
    "Its map gives every class a positive share, so λ depends on every entry non-linearly and no fixed number "
    "of collectives over a bounded set of candidates finds it exactly.  Supported: softmax/cross_entropy, "
    "sparsemax, entmax15, entmax (any alpha), soft top-k 'sparse' (any k) and 'exp' with k = 1 (= softmax)"
)


def map_family(name, k, alpha) -> Family:
    """The family of ``vocab_parallel_map(map=name)``."""
    if name not in MAPS:
        raise ValueError(f"map must be one of {list(MAPS)}, got {name!r}")
    if name == "entmax":
        if alpha is None:
            raise ValueError("alpha must be a float >= 1 for entmax, got None")
        fam = entmax_by_alpha(check_alpha(alpha, None, -1))
    elif alpha is not None:
        raise ValueError(f"alpha applies to map='entmax' only, got alpha={alpha!r} with map={name!r}")
    else:
        fam = {"softmax": SOFTMAX, "sparsemax": SPARSEMAX, "entmax15": ENTMAX15, "sparse": SPARSE, "exp": SOFTMAX}[name]
    if name == "exp" and k != 1:
        raise ValueError(_REFUSED.format(what=f"map='exp' with k={k}", fix='use map="sparse" (any k)'))
    if not fam.capped and k != 1:
        raise ValueError(f"map={name!r} maps onto the simplex (k = 1 only), got k={k}")
    return fam


def loss_family(o: LossOptions) -> Family | None:
    """The family whose λ ``vocab_parallel_loss`` finds for the loss of ``o`` (checked):
    the loss's own (None for a loss without a threshold map, topk_softmax_ce),
    where the vocab-parallel forward can solve it."""
    family = o.kind.family(o)
    if family is None or family is SOFTMAX or family.zero_below:
        return family  # softmax: a max and a sum; f = 0 below 0: the candidates above max_r λ_r
    if family is EXP and o.k == 1:
        return SOFTMAX  # min(1, e^u) at k = 1: λ ≥ max z, so p is the softmax
    raise ValueError(_REFUSED.format(what=f"loss={o.loss!r} with method={o.method!r}, k={o.k}",
                                     fix='pass method="sparse" (any k)'))


def what_code(*parts) -> int:
    """A number that is equal on two ranks when their loss/map arguments are (for the agreement check)."""
    return zlib.crc32("|".join(map(repr, parts)).encode()) & 0x7FFFFFFF
