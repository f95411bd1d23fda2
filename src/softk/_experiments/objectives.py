r"""The five training losses and their prediction rules, on score matrices Z (N, K).

Each loss returns ``(sum over rows of the loss, dL/dZ)`` as float64 tensors;
the trainer adds the mean and the ridge term.  The distributional losses are
Fenchel–Young losses  L(z; ỹ) = Φ(z) + Ω(ỹ) − ⟨z, ỹ⟩, evaluated by the public
:mod:`softk.losses` functions with dense targets (``reduction="sum"``) and
differentiated by autograd, so dL/dz = p − ỹ (no second implementation here):

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
from .. import losses as _losses
from .. import soft_topk as _soft_topk
from .. import softmax as _softmax
from .. import sparsemax as _sparsemax

LOSSES = ("sigmoid", "softmax", "sparsemax", "entmax15", "soft_topk")
T_GRID = tuple(1.0 + 0.5 * i for i in range(9))  # 1.0, 1.5, ..., 5.0
DELTA_GRID = tuple(round(0.05 * i, 2) for i in range(1, 11))  # 0.05, ..., 0.50


def _value_and_grad(loss_of, z: Tensor):
    """(loss_of(z), d loss_of / dz) by autograd, both detached."""
    with torch.enable_grad():
        zz = z.detach().clone().requires_grad_(True)
        total = loss_of(zz)
        (grad,) = torch.autograd.grad(total, zz)
    return total.detach(), grad


def _normalised(y: Tensor) -> Tensor:
    return y / y.sum(-1, keepdim=True)


def sigmoid_loss(z: Tensor, y: Tensor):
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum")
    return loss, torch.sigmoid(z) - y


def softmax_loss(z, y):
    return _value_and_grad(lambda v: _losses.softmax_loss(v, _normalised(y), reduction="sum"), z)


def sparsemax_loss(z, y):
    return _value_and_grad(lambda v: _losses.sparsemax_loss(v, _normalised(y), reduction="sum"), z)


def entmax15_loss(z, y):
    return _value_and_grad(lambda v: _losses.entmax15_loss(v, _normalised(y), reduction="sum"), z)


def soft_topk_loss(z, y):
    card = y.sum(-1).round().long()
    groups = [(card == k, int(k)) for k in torch.unique(card).tolist()]

    def total(v):
        return sum(_losses.soft_topk_loss(v[rows], y[rows], k=k, method="sparse", reduction="sum")
                   for rows, k in groups)

    return _value_and_grad(total, z)


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
