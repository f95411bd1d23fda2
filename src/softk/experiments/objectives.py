r"""The five training losses and their prediction rules, on score matrices Z (N, K).

Each loss returns ``(sum over rows of the loss, dL/dZ)`` as float64 tensors;
the trainer adds the mean and the ridge term.  The distributional losses are
Fenchel–Young losses  L(z; ỹ) = Φ(z) + Ω(ỹ) − ⟨z, ỹ⟩  of a softk threshold
family, evaluated with the shared core (:func:`~softk.threshold.threshold_forward`
and the potential's :func:`~softk.threshold.potential.value_at`), so dL/dz = p − ỹ:

============  ================================  ====================================
loss          target                            map p
============  ================================  ====================================
sigmoid       y ∈ {0,1}^K, independent BCE       σ(z) (per label)
softmax       ỹ = y/|y|                          softmax(z)   (Ω = negative entropy;
                                                 the loss differs from the paper's
                                                 cross-entropy by the constant H(ỹ))
sparsemax     ỹ = y/|y|                          sparsemax(z) (the paper's loss)
entmax15      ỹ = y/|y|                          entmax15(z)
soft_topk     y itself, with k = |y| per row     soft_topk(z, k, method="sparse"),
                                                 the projection onto the capped
                                                 simplex {0 ≤ p ≤ 1, Σp = k}
============  ================================  ====================================

soft_topk: a multi-hot row with |y| labels is a vertex of the capped simplex
with k = |y|, so the loss is zero exactly when the map reproduces y.  k varies
between rows while the map takes one integer k, so rows are grouped by |y| and
each group uses its own k (a row with |y| = K has p = y and zero loss).
``method="sparse"`` is used because k = 1 then is exactly sparsemax: this is
the direct top-k generalisation of the paper's sparsemax loss.

Prediction rules, each with a grid tuned on the training data:

* sigmoid: σ(z_j) > δ, δ ∈ {0.05, 0.10, …, 0.50};
* softmax: p_j > p₀, p₀ ∈ {1/K, 2/K, …, 10/K};
* sparsemax, entmax15: the support of map(t·z), t ∈ {1.0, 1.5, …, 5.0};
* soft_topk: the support of soft_topk(t·z, k̂, "sparse") for (k̂, t), k̂ from 1 to
  the largest |y| of the training file (at most K−1) and t as above.  The test
  rows' |y| is unknown, so k̂ is tuned like a threshold; the support always
  holds at least k̂ labels.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .. import entmax15 as _entmax15
from .. import soft_topk as _soft_topk
from .. import softmax as _softmax
from .. import sparsemax as _sparsemax
from ..threshold import ENTMAX15, SOFTMAX, SPARSE, SPARSEMAX, threshold_forward
from ..threshold.potential import value_at

LOSSES = ("sigmoid", "softmax", "sparsemax", "entmax15", "soft_topk")
T_GRID = tuple(1.0 + 0.5 * i for i in range(9))  # 1.0, 1.5, ..., 5.0
DELTA_GRID = tuple(round(0.05 * i, 2) for i in range(1, 11))  # 0.05, ..., 0.50


def _fy(family, z: Tensor, target: Tensor, k: int):
    """Σ_rows Φ(z) + Ω(target) − ⟨z, target⟩ and its gradient p − target."""
    p = threshold_forward(family, z, k)
    omega_y = family.psi(target).sum(-1, keepdim=True)
    loss = value_at(family, z, p) + omega_y - (z * target).sum(-1, keepdim=True)
    return loss.sum(), p - target


def _normalised(y: Tensor) -> Tensor:
    return y / y.sum(-1, keepdim=True)


def sigmoid_loss(z: Tensor, y: Tensor):
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum")
    return loss, torch.sigmoid(z) - y


def softmax_loss(z, y):
    return _fy(SOFTMAX, z, _normalised(y), 1)


def sparsemax_loss(z, y):
    return _fy(SPARSEMAX, z, _normalised(y), 1)


def entmax15_loss(z, y):
    return _fy(ENTMAX15, z, _normalised(y), 1)


def soft_topk_loss(z, y):
    card = y.sum(-1).round().long()
    total = z.new_zeros(())
    grad = torch.empty_like(z)
    for k in torch.unique(card).tolist():
        rows = card == k
        loss_k, grad_k = _fy(SPARSE, z[rows], y[rows], int(k))
        total = total + loss_k
        grad[rows] = grad_k
    return total, grad


LOSS_FUNCTIONS = {
    "sigmoid": sigmoid_loss,
    "softmax": softmax_loss,
    "sparsemax": sparsemax_loss,
    "entmax15": entmax15_loss,
    "soft_topk": soft_topk_loss,
}


def threshold_grid(loss: str, n_labels: int, max_cardinality: int) -> list:
    """The prediction-rule parameters tried for ``loss`` (floats, or (k̂, t) for soft_topk)."""
    if loss == "sigmoid":
        return list(DELTA_GRID)
    if loss == "softmax":
        return [i / n_labels for i in range(1, 11)]
    if loss in ("sparsemax", "entmax15"):
        return list(T_GRID)
    kmax = max(1, min(max_cardinality, n_labels - 1))
    return [(k, t) for k in range(1, kmax + 1) for t in T_GRID]


def predict(loss: str, z: np.ndarray, threshold) -> np.ndarray:
    """Boolean (N, K) predictions of the rule for ``loss`` at ``threshold``."""
    zt = torch.from_numpy(np.ascontiguousarray(z, dtype=np.float64))
    if loss == "sigmoid":
        return (torch.sigmoid(zt) > threshold).numpy()
    if loss == "softmax":
        return (_softmax(zt) > threshold).numpy()
    if loss == "sparsemax":
        return (_sparsemax(threshold * zt) > 0).numpy()
    if loss == "entmax15":
        return (_entmax15(threshold * zt) > 0).numpy()
    if loss == "soft_topk":
        k, t = threshold
        return (_soft_topk(t * zt, int(k), method="sparse") > 0).numpy()
    raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}")
