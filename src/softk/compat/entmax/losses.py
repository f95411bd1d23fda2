"""entmax.losses on softk's Fenchel–Young losses.

Functional forms take entmax's layout — X (n_samples, n_classes), target
(n_samples,) of class indices — and return the per-sample losses (shape
(n_samples,)), or ``(losses, support_size)`` with ``return_support_size=True``
(master's argument; support_size is (n_samples, 1), int64).  Their gradient
is p − e_target (p the map's output); second derivatives are exact.

The modules follow entmax's ``_GenericLoss`` semantics, which differ from
torch's:

* ``reduction`` is "elementwise_mean" (default), "sum" or "none"; torch's
  "mean" is refused, as entmax does (its assertion);
* ``ignore_index`` only acts when it is >= 0 (the default -100 ignores
  nothing, and a target of -100 is then an error, not a skipped row); ignored
  rows give 0 and "elementwise_mean" divides by the number of rows kept;
* ``return_support_size=True`` (SparsemaxLoss, Entmax15Loss) returns
  ``(loss, support_size)``.

A subclass of :class:`_GenericLoss` that defines ``loss(X, target)`` works as
it does with entmax.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ...losses import entmax15_loss as _entmax15_loss
from ...losses import sparsemax_loss as _sparsemax_loss
from ...losses.normmax_fy import normmax_loss as _normmax_loss
from ..._maps.simplex import entmax15 as _entmax15
from ..._maps.simplex import sparsemax as _sparsemax
from ._alpha import entmax_loss_any_alpha
from ._checks import check_k_hint, check_loss_pair, check_n_iter, check_positive_param, check_reduction, ignore_value, support_size
# entmax.losses imports the maps it projects with, so ``from entmax.losses
# import sparsemax`` works there; it works here too (not in __all__, as there).
from .activations import entmax15, sparsemax  # noqa: F401
from .root_finding import entmax_bisect, normmax_bisect, sparsemax_bisect  # noqa: F401

__all__ = [
    "sparsemax_loss", "entmax15_loss", "sparsemax_bisect_loss", "entmax_bisect_loss", "normmax_bisect_loss",
    "SparsemaxLoss", "Entmax15Loss", "SparsemaxBisectLoss", "EntmaxBisectLoss", "NormmaxBisectLoss",
]


def sparsemax_loss(X, target, k=None, return_support_size=False):
    """sparsemax loss (Martins & Astudillo, 2016), per sample: ⟨p − e_y, x⟩ + (1 − ||p||²)/2.

    Args:
        X: (n_samples, n_classes) scores.
        target: (n_samples,) class indices, 0 <= target < n_classes.
        k: entmax's partial-sort hint; accepted, no effect.
        return_support_size: also return sparsemax's support size per sample, (n_samples, 1).

    >>> import torch
    >>> sparsemax_loss(torch.tensor([[0.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1]))
    tensor([0.2500, 0.0000])
    """
    check_loss_pair(X, target)
    check_k_hint(k)
    loss = _sparsemax_loss(X, target, reduction="none")
    return (loss, support_size(_sparsemax(X.detach(), -1), -1)) if return_support_size else loss


def entmax15_loss(X, target, k=None, return_support_size=False):
    r"""1.5-entmax loss (Peters et al., 2019), per sample: :math:`\langle p - e_y, x\rangle + (1 - \sum_i p_i^{1.5})/0.75`.

    Arguments as :func:`sparsemax_loss`.

    >>> import torch
    >>> entmax15_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]))
    tensor([0.3905])
    """
    check_loss_pair(X, target)
    check_k_hint(k)
    loss = _entmax15_loss(X, target, reduction="none")
    return (loss, support_size(_entmax15(X.detach(), -1), -1)) if return_support_size else loss


def sparsemax_bisect_loss(X, target, n_iter=50):
    """:func:`sparsemax_loss` (``n_iter`` accepted, unused)."""
    check_n_iter(n_iter)
    return sparsemax_loss(X, target)


def entmax_bisect_loss(X, target, alpha=1.5, n_iter=50):
    r"""alpha-entmax loss per sample, :math:`\langle p - e_y, x\rangle + (1 - \sum_i p_i^\alpha)/(\alpha(\alpha-1))` (softmax's at α = 1).

    ``alpha``: α > 0, a float or a tensor broadcastable to (n_samples, 1) (one
    α per row; it receives ∂L/∂α, which entmax does not give).  ``n_iter`` is
    accepted and unused.

    >>> import torch
    >>> x, y = torch.tensor([[0.0, 0.5, 2.0]]), torch.tensor([1])
    >>> bool(entmax_bisect_loss(x, y, alpha=2.0) == sparsemax_loss(x, y))
    True
    """
    check_loss_pair(X, target)
    check_n_iter(n_iter)
    alpha = check_positive_param(alpha, X, 1, "alpha", 0.0, "> 0")
    return entmax_loss_any_alpha(X, target, alpha)


def normmax_bisect_loss(X, target, alpha=2, n_iter=50):
    """alpha-normmax loss per sample: ⟨p − e_y, x⟩ + 1 − ||p||_α (``softk.losses.normmax_loss``).

    ``alpha`` as in ``normmax_bisect`` (α <= 1 is the argmax's loss, max x − x_y);
    ``n_iter`` accepted and unused.

    >>> import torch
    >>> normmax_bisect_loss(torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([2]))
    tensor([0.])
    """
    check_loss_pair(X, target)
    check_n_iter(n_iter)
    alpha = check_positive_param(alpha, X, 1, "alpha", 0.0, "> 0")
    alpha = torch.clamp(alpha, min=1.0) if isinstance(alpha, Tensor) else max(alpha, 1.0)
    return _normmax_loss(X, target, alpha, reduction="none")


class _GenericLoss(nn.Module):
    """entmax's loss module: ``forward(X, target)`` reduces ``self.loss(X, target)``."""

    def __init__(self, ignore_index=-100, reduction="elementwise_mean", return_support_size=False):
        super().__init__()
        self.reduction = check_reduction(reduction)
        self.ignore_index = ignore_index
        ignore_value(ignore_index)
        self.return_support_size = return_support_size

    def forward(self, X, target):
        ignore = ignore_value(self.ignore_index)
        ignored = None
        if ignore >= 0 and isinstance(target, Tensor):
            ignored = target == ignore
            target = torch.where(ignored, 0, target)  # any class: the row's loss is dropped
        loss = self.loss(X, target)
        support = None
        if isinstance(loss, tuple):
            loss, support = loss
        if ignored is not None:
            loss = torch.where(ignored, 0.0, loss)
            size = float(target.shape[0] - int(ignored.sum()))
        else:
            size = float(target.shape[0])
        if self.reduction == "sum":
            loss = loss.sum()
        elif self.reduction == "elementwise_mean":
            loss = loss.sum() / size  # 0/0 = NaN when every row is ignored, as in entmax
        return (loss, support) if self.return_support_size else loss

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class SparsemaxLoss(_GenericLoss):
    """:func:`sparsemax_loss` reduced as entmax's modules reduce: "elementwise_mean"
    (default), "sum" or "none", and ``ignore_index`` acting only when >= 0."""

    def __init__(self, k=None, ignore_index=-100, reduction="elementwise_mean", return_support_size=False):
        check_k_hint(k)
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k

    def loss(self, X, target):
        return sparsemax_loss(X, target, self.k, self.return_support_size)


class Entmax15Loss(_GenericLoss):
    """:func:`entmax15_loss` reduced as entmax's modules are (``k`` defaults to 100, unused)."""

    def __init__(self, k=100, ignore_index=-100, reduction="elementwise_mean", return_support_size=False):
        check_k_hint(k)
        super().__init__(ignore_index, reduction, return_support_size)
        self.k = k

    def loss(self, X, target):
        return entmax15_loss(X, target, self.k, self.return_support_size)


class SparsemaxBisectLoss(_GenericLoss):
    """:func:`sparsemax_bisect_loss` reduced as entmax's modules are."""

    def __init__(self, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        check_n_iter(n_iter)
        super().__init__(ignore_index, reduction)
        self.n_iter = n_iter

    def loss(self, X, target):
        return sparsemax_bisect_loss(X, target, self.n_iter)


class _AlphaLoss(_GenericLoss):
    def __init__(self, alpha, n_iter, ignore_index, reduction):
        check_n_iter(n_iter)
        if not isinstance(alpha, Tensor):
            alpha = check_positive_param(alpha, None, 1, "alpha", 0.0, "> 0")
        super().__init__(ignore_index, reduction)
        self.alpha, self.n_iter = alpha, n_iter


class EntmaxBisectLoss(_AlphaLoss):
    """:func:`entmax_bisect_loss` reduced as entmax's modules are (``alpha`` may be a Parameter)."""

    def __init__(self, alpha=1.5, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(alpha, n_iter, ignore_index, reduction)

    def loss(self, X, target):
        return entmax_bisect_loss(X, target, self.alpha, self.n_iter)


class NormmaxBisectLoss(_AlphaLoss):
    """:func:`normmax_bisect_loss` reduced as entmax's modules are (``alpha`` may be a Parameter)."""

    def __init__(self, alpha=2, n_iter=50, ignore_index=-100, reduction="elementwise_mean"):
        super().__init__(alpha, n_iter, ignore_index, reduction)

    def loss(self, X, target):
        return normmax_bisect_loss(X, target, self.alpha, self.n_iter)
