"""Validation and layout of loss targets (class indices or distributions).

Losses follow ``torch.nn.functional.cross_entropy``'s layout: ``input`` is
(N, C, d1, ...) with the classes on dim 1, or (C,) for a single unbatched row.
A target is either

* class indices: an integer tensor shaped like ``input`` without dim 1 (a 0-d
  tensor for a 1-D input), each in [0, C) or equal to ``ignore_index``; or
* a distribution: a floating tensor shaped like ``input`` whose rows (along
  the class dimension) lie in the map's domain, e.g. the simplex for k = 1.

Every check raises a ValueError/TypeError that names ``target`` and says what
was expected, before any arithmetic, so a bad target never surfaces as an
index error from deep inside torch.  Nothing is renormalised for the user.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .._validate import check_input, check_tau

REDUCTIONS = ("mean", "sum", "none")


def class_dim(input: Tensor) -> int:
    """The class dimension: 1, or 0 for a 1-D (unbatched) input."""
    return 0 if input.dim() == 1 else 1


def check_reduction(reduction) -> str:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")
    return reduction


def check_ignore_index(ignore_index) -> int:
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    return int(ignore_index)


def check_target_tensor(target, name: str = "target") -> None:
    if not isinstance(target, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype == torch.bool:
        raise TypeError(
            f"{name} is a bool tensor; pass class indices as an integer tensor, or a multi-hot "
            f"label as floats normalised by the caller, e.g. {name}.float() / "
            f"{name}.float().sum(1, keepdim=True)"
        )
    if target.is_complex():
        raise TypeError(f"{name} must be an integer or real floating tensor, got dtype {target.dtype}")


def check_loss_args(input, target, tau, reduction, ignore_index):
    """The common prelude of the class losses: returns (tau, reduction, ignore_index)."""
    check_input(input, "input")
    tau = check_tau(tau)
    reduction = check_reduction(reduction)
    ignore_index = check_ignore_index(ignore_index)
    check_target_tensor(target)
    return tau, reduction, ignore_index


def is_index_target(target: Tensor) -> bool:
    return not target.is_floating_point()


def index_target(input: Tensor, target: Tensor, ignore_index: int, name: str = "target"):
    """Validate class indices.

    Returns ``(index, keep)``: both shaped like ``target``; ``index`` has the
    ignored positions replaced by 0 (so it can be used with ``gather``) and
    ``keep`` is False there.
    """
    cdim = class_dim(input)
    n_classes = input.shape[cdim]
    expected = input.shape[:cdim] + input.shape[cdim + 1 :]
    if target.shape != expected:
        raise ValueError(
            f"{name} of class indices must have shape {tuple(expected)} (input's shape "
            f"{tuple(input.shape)} without the class dimension {cdim}), got {tuple(target.shape)}"
        )
    target = target.to(input.device)
    keep = target != ignore_index
    bad = keep & ((target < 0) | (target >= n_classes))
    if bool(bad.any()):
        raise ValueError(
            f"{name} holds class index {int(target[bad].reshape(-1)[0])}, outside [0, {n_classes}) "
            f"for an input with {n_classes} classes (and not ignore_index={ignore_index})"
        )
    return torch.where(keep, target, 0).long(), keep


def distribution_target(
    input: Tensor, target: Tensor, k: int, capped: bool, name: str = "target"
) -> Tensor:
    """Validate a floating target whose rows lie in the map's domain.

    Rows must be finite, >= 0 (and <= 1 when the map is capped, as every top-k
    map is) and sum to k along the class dimension, up to rounding in the
    target's own dtype.  Returns ``target`` on ``input``'s device.
    """
    if target.shape != input.shape:
        raise ValueError(
            f"{name} of probabilities must have the input's shape {tuple(input.shape)}, got "
            f"{tuple(target.shape)} (class-index targets must be an integer tensor)"
        )
    target = target.to(input.device)
    if not bool(torch.isfinite(target).all()):
        raise ValueError(f"{name} must be finite, got NaN or inf entries")
    if bool((target < 0).any()):
        raise ValueError(f"{name} must be >= 0 everywhere, got {float(target.min())}")
    if capped and bool((target > 1).any()):
        raise ValueError(
            f"{name} entries must lie in [0, 1] for a top-k loss (a point of the capped simplex), "
            f"got {float(target.max())}"
        )
    cdim = class_dim(input)
    n = input.shape[cdim]
    sums = target.double().sum(cdim)
    # Allow rounding only: a row normalised in the target's own dtype is off by
    # at most ~n/2 ulps, and a map's own output (λ solved to a few ulps, e.g. by
    # Newton) by far less than sqrt(eps).  A multi-hot row that was not
    # normalised is off by at least 1.
    eps = torch.finfo(target.dtype).eps
    tol = k * max(eps**0.5, 2 * n * eps)
    off = (sums - k).abs() > tol
    if bool(off.any()):
        lo, hi = float(sums.min()), float(sums.max())
        if k == 1:
            hint = (
                f"rows must be probability distributions summing to 1; normalise multi-hot "
                f"labels first: {name} / {name}.sum(dim={cdim}, keepdim=True)"
            )
        else:
            hint = (
                f"rows must sum to k={k}: a multi-hot label needs exactly k ones, or use a "
                f"point of the capped simplex (entries in [0, 1] summing to k)"
            )
        raise ValueError(f"{name} row sums lie in [{lo:.6g}, {hi:.6g}]; {hint}")
    return target


def reduce(loss: Tensor, keep, reduction: str) -> Tensor:
    """torch's reductions: "mean" divides by the number of kept rows."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if keep is None:
        return loss.mean()
    return loss.sum() / keep.sum().to(loss.dtype)
