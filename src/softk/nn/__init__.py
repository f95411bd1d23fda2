"""``torch.nn`` modules wrapping softk's functions (see each function for the maths).

Imported by :mod:`softk.integrations` and the experiments; imports the
public packages below it (maps, losses, attention).
"""

from .maps import Entmax, Entmax15, Softmax, Sparsemax, SoftTopK
from .topk import HardTopK, TopKSoftmax, TopKSum
from .cosine import CosineClassifier
from .losses import CrossEntropyLoss, Entmax15Loss, EntmaxLoss, SoftmaxLoss, SoftTopKLoss, SparsemaxLoss, TopKSoftmaxCrossEntropyLoss

from .fused_linear import FusedLinearLoss
from .attention import ScaledDotProductAttention

__all__ = ["Softmax", "Sparsemax", "Entmax15", "Entmax", "SoftTopK"]
__all__ += ["HardTopK", "TopKSoftmax", "TopKSum"]
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
__all__ += ["FusedLinearLoss"]
__all__ += ["ScaledDotProductAttention"]
