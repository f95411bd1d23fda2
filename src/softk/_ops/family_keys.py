"""How a family crosses a custom op: as the plain values (name, α).

``torch.library`` ops take tensors, numbers and strings, not a
:class:`~softk.threshold.families.Family`, so every op of the contract
(:mod:`.op`, :mod:`.per_row_k`, the fused losses) passes ``family_key(family)``
and rebuilds the family with ``family_by_key``.
"""

from __future__ import annotations

import functools

from ..threshold.families import Family, by_name, entmax_family


@functools.lru_cache(maxsize=None)
def family_by_key(name: str, alpha: float) -> Family:
    """The family called ``name`` (entmax: with this α)."""
    return entmax_family(alpha) if name == "entmax" else by_name(name)


def family_key(family: Family):
    """(name, α as a float) of ``family``."""
    return family.name, family.alpha_value
