r"""Cosine logits of normalised features and weights (NormFace) and their loss floor.

NormFace (Wang, Xiang, Cheng & Yuille, "NormFace: L2 hypersphere embedding for
face verification", ACM MM 2017) normalises both the feature f and each class
weight w_c and scores with a scale s:

.. math:: \text{logit}_c = s \cos(f, w_c) \in [-s, s].

Bounded logits bound the loss from below.  NormFace's Proposition: with n
classes, softmax cross-entropy of such logits is at least

.. math:: \log\bigl(1 + (n-1)\, e^{-s\,n/(n-1)}\bigr),

attained when the n class vectors form a regular simplex (pairwise cosine
−1/(n−1)) and every feature equals its class vector.  So s must grow like
log n to let the loss approach 0: :func:`normface_min_scale` inverts the bound
(the score range is s·n/(n−1), cf. :func:`cross_entropy_margin`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validate import check_input
from ..threshold.rows import compute_dtype
from .._validate import check_positive
from .margins import _check_n, cross_entropy_floor, cross_entropy_margin


def normface_loss_bound(scale: float, num_classes: int) -> float:
    r"""NormFace's lower bound :math:`\log(1 + (n-1)\, e^{-s n/(n-1)})` on the cross-entropy
    of logits :math:`s \cos(f, w_c)` over n classes.

    >>> round(normface_loss_bound(1.0, 2), 6)  # log(1 + e^-2)
    0.126928
    """
    n = _check_n(num_classes)
    s = check_positive(scale, "scale")
    return cross_entropy_floor(n, s * n / (n - 1))


def normface_min_scale(num_classes: int, loss: float = 0.01) -> float:
    r"""Smallest scale s whose NormFace bound is ``loss``:
    :math:`s = \frac{n-1}{n} \bigl(\log(n-1) - \log(e^\varepsilon - 1)\bigr)`, floored at a tiny positive value
    when ε >= log n (any scale then suffices).

    >>> s = normface_min_scale(10, 0.01)
    >>> round(s, 4), round(normface_loss_bound(s, 10), 6)
    (6.1177, 0.01)
    """
    n = _check_n(num_classes)
    eps = check_positive(loss, "loss")
    return max(cross_entropy_margin(n, eps) * (n - 1) / n, torch.finfo(torch.float64).tiny)


def cosine_logits(features: Tensor, weight: Tensor, scale, eps: float = 1e-12) -> Tensor:
    r"""``scale · cos(features, weight_c)`` for every class c.

    Args:
        features: (..., d).
        weight: (C, d), one row per class (like ``nn.Linear.weight``).
        scale: a float or a 0-d tensor (learnable scales pass a parameter).
        eps: norms are clamped below at eps (a zero vector gets cosine 0).

    Returns (..., C) in ``features``' dtype (half computed in float32).

    >>> import torch
    >>> cosine_logits(torch.tensor([[3.0, 4.0]]), torch.tensor([[1.0, 0.0], [0.0, -2.0]]), 10.0)
    tensor([[ 6., -8.]])
    """
    check_input(features, "features")
    check_input(weight, "weight")
    if weight.dim() != 2 or weight.shape[1] != features.shape[-1]:
        raise ValueError(
            f"weight must have shape (num_classes, {features.shape[-1]}) to match features' last "
            f"dimension, got {tuple(weight.shape)}"
        )
    ct = compute_dtype(features.dtype)
    cos = F.linear(F.normalize(features.to(ct), dim=-1, eps=eps), F.normalize(weight.to(ct), dim=-1, eps=eps))
    return (cos * scale).to(features.dtype)
