"""Module forms of :mod:`softk.losses`.  Each documents itself by pointing to its function."""

from __future__ import annotations

import torch
from torch import nn

from .. import losses as L
from .._validate import check_alpha, check_choice, check_k, check_module_k, check_tau
from ..threshold.families import THRESHOLD_METHODS
from .._validate import check_smoothing
from ..losses.targets import check_ignore_index, check_reduction


class _ClassLoss(nn.Module):
    """Shared arguments of the class-target losses, checked at construction."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0):
        super().__init__()
        self.ignore_index = check_ignore_index(ignore_index)
        self.reduction = check_reduction(reduction)
        self.tau = check_tau(tau)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, tau={self.tau}"


class SoftmaxLoss(_ClassLoss):
    """``softk.losses.softmax_loss(input, target, ignore_index, reduction, tau)`` as a module."""

    def forward(self, input, target):
        return L.softmax_loss(input, target, self.ignore_index, self.reduction, self.tau)


class SparsemaxLoss(_ClassLoss):
    """``softk.losses.sparsemax_loss(input, target, ignore_index, reduction, tau)`` as a module."""

    def forward(self, input, target):
        return L.sparsemax_loss(input, target, self.ignore_index, self.reduction, self.tau)


class Entmax15Loss(_ClassLoss):
    """``softk.losses.entmax15_loss(input, target, ignore_index, reduction, tau)`` as a module."""

    def forward(self, input, target):
        return L.entmax15_loss(input, target, self.ignore_index, self.reduction, self.tau)


class EntmaxLoss(_ClassLoss):
    """``softk.losses.entmax_loss(input, target, alpha, ignore_index, reduction, tau)`` as a module."""

    def __init__(self, alpha: float = 1.5, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0):
        super().__init__(ignore_index, reduction, tau)
        self.alpha = check_alpha(alpha, None, -1)

    def forward(self, input, target):
        return L.entmax_loss(input, target, self.alpha, self.ignore_index, self.reduction, self.tau)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, " + super().extra_repr()


class CrossEntropyLoss(_ClassLoss):
    """``softk.losses.cross_entropy(input, target, weight, ignore_index, reduction, label_smoothing, tau)``
    as a module; ``weight`` is a buffer (moves with ``.to()``)."""

    def __init__(self, weight=None, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0, tau: float = 1.0):
        super().__init__(ignore_index, reduction, tau)
        self.label_smoothing = check_smoothing(label_smoothing)
        if weight is not None and not isinstance(weight, torch.Tensor):
            raise TypeError(f"weight must be a 1-D floating tensor or None, got {type(weight).__name__}")
        self.register_buffer("weight", weight)

    def forward(self, input, target):
        return L.cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing, self.tau)

    def extra_repr(self) -> str:
        return f"label_smoothing={self.label_smoothing}, " + super().extra_repr()


class TopKSoftmaxCrossEntropyLoss(_ClassLoss):
    """``softk.losses.topk_softmax_cross_entropy(input, target, k, ignore_index, reduction, tau)`` as a module."""

    def __init__(self, k: int, ignore_index: int = -100, reduction: str = "mean", tau: float = 1.0):
        super().__init__(ignore_index, reduction, tau)
        self.k = check_k(k)

    def forward(self, input, target):
        return L.topk_softmax_cross_entropy(input, target, self.k, self.ignore_index, self.reduction, self.tau)

    def extra_repr(self) -> str:
        return f"k={self.k}, " + super().extra_repr()


class SoftTopKLoss(nn.Module):
    """``softk.losses.soft_topk_loss(input, target, k, method, tau, reduction)`` as a module."""

    def __init__(self, k: float, method: str = "exp", tau: float = 1.0, reduction: str = "mean"):
        super().__init__()
        self.method = check_choice(method, tuple(THRESHOLD_METHODS), "method")
        self.k = check_module_k(k, self.method)
        self.tau = check_tau(tau)
        self.reduction = check_reduction(reduction)

    def forward(self, input, target):
        return L.soft_topk_loss(input, target, self.k, self.method, self.tau, self.reduction)

    def extra_repr(self) -> str:
        return f"k={self.k}, method={self.method!r}, tau={self.tau}, reduction={self.reduction!r}"
