"""Losses: cross-entropy with torch's semantics, Fenchel–Young losses of every
threshold map (softmax, sparsemax, entmax, smooth top-k), sparse-softmax
cross-entropy, and the regularisers and bounds of normalised-feature heads.

All take scores (N, C, d1, ...) with classes on dim 1 (or (C,)), like
``torch.nn.functional.cross_entropy``.
"""

from .fenchel_young import fenchel_young_loss
from .simplex_losses import entmax15_loss, entmax_loss, softmax_loss, sparsemax_loss
from .topk_loss import soft_topk_loss

__all__ = [
    "fenchel_young_loss",
    "softmax_loss",
    "sparsemax_loss",
    "entmax15_loss",
    "entmax_loss",
    "soft_topk_loss",
]
