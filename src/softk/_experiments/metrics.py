r"""Multi-label F1 scores, with the paper's macro-F1 kept apart from scikit-learn's.

All take boolean (or 0/1) arrays ``y_true`` and ``y_pred`` of shape
(n_samples, n_labels) and return a fraction in [0, 1]; every 0/0 counts as 0.

* :func:`micro_f1` pools the counts over all labels:
  :math:`F = 2\,TP / (2\,TP + FP + FN)`.
* :func:`macro_f1` is the definition used by Martins & Astudillo (2016), the
  harmonic mean of the macro-averaged precision and recall,
  :math:`F = 2 \bar P \bar R / (\bar P + \bar R)` with
  :math:`\bar P = \frac1K\sum_j TP_j/(TP_j+FP_j)`, :math:`\bar R = \frac1K\sum_j TP_j/(TP_j+FN_j)`.
* :func:`macro_f1_per_label_mean` is the mean of the per-label F1 scores,
  scikit-learn's ``f1_score(average="macro", zero_division=0)``.  Neither
  bounds the other in general, so both are reported, labelled.

Example: two labels, label 0 predicted perfectly, label 1 never predicted.

>>> import numpy as np
>>> t = np.array([[1, 1], [1, 0]], bool); p = np.array([[1, 0], [1, 0]], bool)
>>> micro_f1(t, p)            # TP=2, FP=0, FN=1: 4/5
0.8
>>> macro_f1(t, p)            # P̄ = (1+0)/2, R̄ = (1+0)/2: 0.5
0.5
>>> macro_f1_per_label_mean(t, p)   # (1 + 0)/2
0.5
"""

from __future__ import annotations

import numpy as np


def _counts(y_true, y_pred, axis):
    t = np.asarray(y_true, dtype=bool)
    p = np.asarray(y_pred, dtype=bool)
    if t.shape != p.shape or t.ndim != 2:
        raise ValueError(f"y_true and y_pred must be 2-D arrays of the same shape, got {t.shape} and {p.shape}")
    tp = (t & p).sum(axis)
    fp = (~t & p).sum(axis)
    fn = (t & ~p).sum(axis)
    return tp.astype(np.float64), fp.astype(np.float64), fn.astype(np.float64)


def _ratio(num, den):
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def micro_f1(y_true, y_pred) -> float:
    """F1 of the counts pooled over all labels and samples."""
    tp, fp, fn = _counts(y_true, y_pred, axis=None)
    return float(_ratio(2 * tp, 2 * tp + fp + fn))


def macro_precision_recall(y_true, y_pred) -> tuple:
    """(mean over labels of precision, mean over labels of recall), 0/0 as 0."""
    tp, fp, fn = _counts(y_true, y_pred, axis=0)
    return float(_ratio(tp, tp + fp).mean()), float(_ratio(tp, tp + fn).mean())


def macro_f1(y_true, y_pred) -> float:
    """The paper's macro-F1: harmonic mean of macro-precision and macro-recall."""
    p, r = macro_precision_recall(y_true, y_pred)
    return float(_ratio(2 * p * r, p + r))


def macro_f1_per_label_mean(y_true, y_pred) -> float:
    """Mean over labels of the per-label F1 (scikit-learn's macro average)."""
    tp, fp, fn = _counts(y_true, y_pred, axis=0)
    return float(_ratio(2 * tp, 2 * tp + fp + fn).mean())
