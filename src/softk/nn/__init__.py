"""``torch.nn`` modules wrapping softk's functions (see each function for the maths)."""

from .maps import Entmax, Entmax15, Sparsemax, SoftTopK
from .cosine import CosineClassifier
from .losses import (
    CrossEntropyLoss,
    Entmax15Loss,
    EntmaxLoss,
    SoftmaxLoss,
    SoftTopKLoss,
    SparsemaxLoss,
    TopKSoftmaxCrossEntropyLoss,
)

__all__ = ["Sparsemax", "Entmax15", "Entmax", "SoftTopK"]
__all__ += [
    "CosineClassifier",
    "CrossEntropyLoss",
    "TopKSoftmaxCrossEntropyLoss",
    "SoftmaxLoss",
    "SparsemaxLoss",
    "Entmax15Loss",
    "EntmaxLoss",
    "SoftTopKLoss",
]
