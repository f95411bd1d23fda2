r"""Feature Incay (Yuan, Yang & Zhang, "Feature Incay for Representation
Regularization", ICLR 2018 workshop, arXiv:1705.10284).

The reciprocal-norm regulariser

.. math:: R(F) = \frac{1}{N}\sum_{i=1}^N \frac{1}{\|f_i\|_2^2}

grows as features shrink, so adding λ·R to the softmax loss pushes feature
norms up, faster for small ones (∂R/∂f = −2f/‖f‖⁴).  Softmax cross-entropy
itself rewards large norms only until a sample is confidently right; the
paper applies R to correctly classified samples (select them before calling).
"""

from __future__ import annotations

from torch import Tensor

from .._validate import check_dim, check_input
from ..threshold.rows import compute_dtype
from .._validate import reduce
from .targets import check_reduction


def feature_incay(features: Tensor, dim: int = -1, reduction: str = "mean") -> Tensor:
    r"""Reciprocal squared norm 1/‖f‖² of each feature vector along ``dim``.

    Args:
        features: (N, d) or any shape, the vector along ``dim``.
        dim: the feature dimension.
        reduction: "mean" (the paper's R), "sum" or "none".

    A zero feature vector gives +inf (there is no finite penalty for it);
    an empty feature dimension is refused (it holds no vector).

    >>> import torch
    >>> feature_incay(torch.tensor([[3.0, 4.0], [1.0, 0.0]]), reduction="none")
    tensor([0.0400, 1.0000])
    """
    check_input(features, "features")
    dim = check_dim(features, dim)
    reduction = check_reduction(reduction)
    if features.shape[dim] == 0:
        raise ValueError(f"features must have at least one entry along dim {dim}, got shape {tuple(features.shape)}")
    f = features.to(compute_dtype(features.dtype))
    out = 1.0 / (f * f).sum(dim)
    return reduce(out, None, reduction).to(features.dtype)
