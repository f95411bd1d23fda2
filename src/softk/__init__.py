"""softk: differentiable maps from scores to the probability simplex and its top-k generalisation.

Every map is p = f(x/τ − λ) with Σp = k (see :mod:`softk.threshold`).
"""

from ._backends.registry import backend, use_backend
from ._backends.dispatch import explain
from ._maps.simplex import entmax, entmax15, log_softmax, logsumexp, softmax, sparsemax
from ._maps.soft_topk import soft_topk
from ._maps.hard import hard_topk, topk_softmax
from ._maps.topk_sum import topk_sum
from ._maps.normmax import normmax
from ._maps.budget import budget_sparsemax
from ._maps.support import Support, support
from ._maps.routing import Route, route
from ._maps.properties import properties, property_violations
from .attention import scaled_dot_product_attention
from . import _dtensor, families, losses, nn  # noqa: F401  (softk.families, softk.losses and softk.nn after a plain `import softk`)

__version__ = "0.1.0"


def _load_distributed() -> None:
    from . import distributed  # noqa: F401  (its import registers the DTensor entry of the maps and losses)


_dtensor.set_loader(_load_distributed)

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "sparsemax",
    "entmax15",
    "entmax",
    "normmax",
    "budget_sparsemax",
    "soft_topk",
    "hard_topk",
    "topk_softmax",
    "topk_sum",
    "support",
    "route",
    "scaled_dot_product_attention",
    "Route",
    "Support",
    "properties",
    "property_violations",
    "backend",
    "use_backend",
    "explain",
]
