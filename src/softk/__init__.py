"""softk: differentiable maps from scores to the probability simplex and its top-k generalisation.

Every map is p = f(x/τ − λ) with Σp = k (see :mod:`softk.threshold`).
"""

from ._backend import backend, use_backend
from .simplex import entmax, entmax15, log_softmax, logsumexp, softmax, sparsemax
from .topk import soft_topk
from .hard import hard_topk, topk_softmax
from .topk_smooth_sum import topk_sum
from .support_info import Support, support
from .routing import Route, route
from .seed_properties import properties, property_violations
from .attention import scaled_dot_product_attention
from . import families, losses, nn

__version__ = "0.1.0"

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "sparsemax",
    "entmax15",
    "entmax",
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
]
