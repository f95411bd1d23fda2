"""softk: differentiable maps from scores to the probability simplex and its top-k generalisation.

Every map is p = f(x/τ − λ) with Σp = k (see :mod:`softk.threshold`).
"""

from ._backend import backend, use_backend
from .simplex import entmax, entmax15, log_softmax, logsumexp, softmax, sparsemax
from .topk import soft_topk
from . import losses

__version__ = "0.1.0"

__all__ = [
    "softmax",
    "log_softmax",
    "logsumexp",
    "sparsemax",
    "entmax15",
    "entmax",
    "soft_topk",
    "backend",
    "use_backend",
]
