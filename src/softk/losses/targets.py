"""Validation and layout of loss targets (class indices or distributions).

Losses follow ``torch.nn.functional.cross_entropy``'s layout: ``input`` is
(N, C, d1, ...) with the classes on dim 1, or (C,) for a single unbatched row.
A target is either

* class indices: an integer tensor shaped like ``input`` without dim 1 (a 0-d
  tensor for a 1-D input), each in [0, C) or equal to ``ignore_index``; or
* a distribution: a floating tensor shaped like ``input`` whose rows (along
  the class dimension) lie in the map's domain, e.g. the simplex for k = 1.

Every check raises a ValueError/TypeError that names ``target`` and says what
was expected, so a bad target never surfaces as an index error from deep
inside torch.  Nothing is renormalised for the user.

Checks on *values* (a class index in range, a row in the map's domain) follow
one convention, so that no call waits for a device in the hot path:

* on CPU tensors they raise softk's ValueError, before any arithmetic, or,
  on the fused CPU path (:mod:`softk._ops.fused_loss`), from the kernel's
  own pass over the target (the message is then built by the same checks);
  :func:`softk.losses.cross_entropy` leaves the class indices to torch's
  kernel and turns its IndexError into the same message;
* on any other device (CUDA) they are device-side assertions
  (:func:`softk._validate.require`, ``torch._assert_async``): a bad value
  stops the program when the device reaches it, without softk's message (run
  the same call on CPU tensors to read it), as torch's own cross-entropy does
  with a bad class index; under ``torch.compile`` likewise, inside the graph.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .._validate import TAU_FLOOR, check_input, check_tau, require, sum_tolerance, unwrapped

REDUCTIONS = ("mean", "sum", "none")


def class_dim(input: Tensor) -> int:
    """The class dimension: 1, or 0 for a 1-D (unbatched) input."""
    return 0 if input.dim() == 1 else 1


def check_reduction(reduction) -> str:
    if reduction == "mean" or reduction == "sum" or reduction == "none":  # the common case
        return reduction
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {list(REDUCTIONS)}, got {reduction!r}")
    return reduction


def check_ignore_index(ignore_index) -> int:
    if type(ignore_index) is int:  # the common case skips the ABC checks below
        return ignore_index
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    return int(ignore_index)


ACCEPTS = ("index or distribution", "index", "distribution")
_ORDINARY = frozenset((torch.int64, torch.int32, torch.float32, torch.float64, torch.float16, torch.bfloat16))
_INF = float("inf")
_FLOATS = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))


def check_target_tensor(target, name: str = "target", *, input=None, accepts: str = "index or distribution", k=1) -> None:
    """``target`` must be a real tensor; a bool one is refused with a hint that works.

    ``accepts`` says which targets the calling loss takes ("index", "distribution"
    or both) and ``k`` its Σp, so that the suggested conversion of a bool target
    is one the same loss then accepts (see :func:`bool_target_hint`).
    """
    if not isinstance(target, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(target).__name__}")
    if target.dtype in _ORDINARY:  # the common case
        return
    if target.dtype == torch.bool:
        raise TypeError(f"{name} is a bool tensor; {bool_target_hint(target, input, accepts, k, name)}")
    if target.is_complex():
        raise TypeError(f"{name} must be an integer or real floating tensor, got dtype {target.dtype}")


def _multi_hot_advice(input: Tensor, cdim: int, lo: int, name: str) -> str:
    """The loss that takes a multi-hot label with a varying number of ones per row."""
    t = f"{name}.float()"
    advice = f"softk.losses.softmax_loss(input, {t} / {t}.sum(dim={cdim}, keepdim=True))"
    if lo == 0:
        advice += f" after dropping the rows with no label (keep = {name}.any(dim={cdim}); they have no distribution)"
    return advice


def bool_target_hint(target: Tensor, input, accepts: str, k, name: str = "target") -> str:
    """What to pass instead of a bool ``target``, for a loss taking ``accepts`` targets with Σp = ``k``.

    Each suggestion is one the loss accepts (tests/test_loss_targets.py follows
    every one): a bool tensor shaped like the class indices becomes
    ``target.long()``; a bool multi-hot label shaped like ``input`` becomes
    floats (normalised for k = 1, as they are for k ones per row), the class
    index of its single label, or a pointer to the loss that takes it.
    """
    if accepts not in ACCEPTS:
        raise ValueError(f"accepts must be one of {list(ACCEPTS)}, got {accepts!r}")
    if not isinstance(input, Tensor) or input.dim() == 0:
        return "pass class indices as an integer tensor (target.long()) or a float target (target.float())"
    cdim = class_dim(input)
    n = input.shape[cdim]
    index_shape = input.shape[:cdim] + input.shape[cdim + 1 :]
    k_int = int(k) if isinstance(k, numbers.Integral) and not isinstance(k, bool) else None
    takes_index = accepts == "index" or (accepts == "index or distribution" and k_int == 1)
    if target.shape == index_shape and target.shape != input.shape:
        if takes_index:
            return f"as class indices (False = 0, True = 1) pass {name}.long()"
        if k_int == 1:
            return (f"this loss takes a float target shaped like input; as a one-hot of class indices pass "
                    f"torch.nn.functional.one_hot({name}.long(), {n}).movedim(-1, {cdim}).float()")
        return f"this loss takes a float target shaped like input whose rows hold k={k} ones (a multi-hot label)"
    if target.shape != input.shape or target.numel() == 0:
        return (f"targets are class indices of shape {tuple(index_shape)} (an integer tensor) or floats of "
                f"input's shape {tuple(input.shape)}, got shape {tuple(target.shape)}")
    counts = target.sum(cdim)
    lo, hi = int(counts.min()), int(counts.max())
    labels = f"{lo} label{'s' * (lo != 1)} per row" if lo == hi else f"{lo} to {hi} labels per row"
    if accepts == "index":
        if lo == hi == 1:
            return f"it holds one label per row; this loss takes class indices: pass {name}.float().argmax(dim={cdim})"
        other = (f"softk.losses.soft_topk_loss(input, {name}.float(), k={lo})" if lo == hi and 1 <= lo <= n
                 else _multi_hot_advice(input, cdim, lo, name))
        return f"it holds {labels}, and this loss takes one class index per row; for the multi-hot label use {other}"
    if takes_index and accepts == "index or distribution":
        if lo == hi == 1:
            return f"it holds one label per row: pass {name}.float() (or the class indices {name}.float().argmax(dim={cdim}))"
        t = f"{name}.float()"
        fix = f"{t} / {t}.sum(dim={cdim}, keepdim=True)"
        if lo == 0:
            return (f"it holds {labels}; normalise each row to sum 1, {fix}, after dropping the rows with no "
                    f"label (keep = {name}.any(dim={cdim}); they have no distribution)")
        return f"it holds {labels}; pass the rows normalised to sum 1: {fix}"
    # a loss whose rows sum to k (the capped simplex)
    if lo == hi and k_int is not None and lo == k_int:
        return f"pass the multi-hot label as floats: {name}.float()"
    if lo == hi and 1 <= lo <= n:
        return f"it holds {labels}, not k={k}: pass {name}.float() with k={lo}"
    return (f"it holds {labels}, and this loss needs exactly k={k} ones per row; for a varying number "
            f"of labels use {_multi_hot_advice(input, cdim, lo, name)}")


def check_loss_args(input, target, tau, reduction, ignore_index, *, accepts: str = "index or distribution", k=1):
    """The common prelude of the class losses: returns (tau, reduction, ignore_index).

    ``accepts`` and ``k`` describe the calling loss, for the hint given with a
    bool target (:func:`bool_target_hint`).
    """
    if (type(tau) is float and 0.0 < tau < _INF and type(ignore_index) is int
            and (reduction == "mean" or reduction == "sum" or reduction == "none")
            and isinstance(input, Tensor) and input.dtype in _FLOATS and input.dim()
            and tau >= TAU_FLOOR[input.dtype]
            and isinstance(target, Tensor) and target.dtype in _ORDINARY):
        return tau, reduction, ignore_index  # the common case: every check below passes
    check_input(input, "input")
    tau = check_tau(tau, x=input)
    reduction = check_reduction(reduction)
    ignore_index = check_ignore_index(ignore_index)
    check_target_tensor(target, input=input, accepts=accepts, k=k)
    return tau, reduction, ignore_index


def is_index_target(target: Tensor) -> bool:
    return not target.is_floating_point()


def check_index_shape(input: Tensor, target: Tensor, name: str = "target") -> None:
    """Class indices must be shaped like ``input`` without its class dimension."""
    shape, got = input.shape, target.shape
    if len(shape) == 2 and len(got) == 1 and got[0] == shape[0]:  # the common case: (N, C) and (N,)
        return
    cdim = 0 if input.dim() == 1 else 1
    expected = input.shape[:cdim] + input.shape[cdim + 1 :]
    if target.shape != expected:
        raise ValueError(
            f"{name} of class indices must have shape {tuple(expected)} (input's shape "
            f"{tuple(input.shape)} without the class dimension {cdim}), got {tuple(target.shape)}"
        )


def index_target(input: Tensor, target: Tensor, ignore_index: int, name: str = "target"):
    """Validate class indices.

    Returns ``(index, keep)``: both shaped like ``target``; ``index`` has the
    ignored positions replaced by 0 (so it can be used with ``gather``) and
    ``keep`` is False there.  The range check reads values: on the CPU a
    ValueError, on another device a device-side assertion
    (:func:`softk._validate.require`, no host sync).
    """
    target = target.to(input.device)
    keep = check_index_values(input, target, ignore_index, name)
    return torch.where(keep, target, 0).long(), keep


def check_index_values(input: Tensor, target: Tensor, ignore_index: int, name: str = "target") -> Tensor:
    """The checks of :func:`index_target` (``target`` on ``input``'s device)
    without the index it builds; returns ``keep``."""
    check_index_shape(input, target, name)
    n_classes = input.shape[class_dim(input)]
    keep = target != ignore_index
    bad = keep & ((target < 0) | (target >= n_classes))
    require(~bad, lambda: (
        f"{name} holds class index {int(target[bad].reshape(-1)[0])}, outside [0, {n_classes}) "
        f"for an input with {n_classes} classes (and not ignore_index={ignore_index})"
    ))
    return keep


def check_distribution_shape(input: Tensor, target: Tensor, name: str = "target") -> None:
    """A floating target must have the input's shape."""
    if target.shape != input.shape:
        raise ValueError(
            f"{name} of probabilities must have the input's shape {tuple(input.shape)}, got "
            f"{tuple(target.shape)} (class-index targets must be an integer tensor)"
        )


def distribution_target(
    input: Tensor, target: Tensor, k: int, capped: bool, name: str = "target"
) -> Tensor:
    """Validate a floating target whose rows lie in the map's domain.

    Rows must be finite, >= 0 (and <= 1 when the map is capped, as every top-k
    map is) and sum to k along the class dimension, up to rounding in the
    target's own dtype.  Returns ``target`` on ``input``'s device.  One
    comparison pass covers the entry checks (NaN fails both comparisons);
    the separate checks run only to say which one failed.  Off the CPU the
    checks are device-side assertions (:func:`softk._validate.require`).
    """
    check_distribution_shape(input, target, name)
    target = target.to(input.device)
    ok = (target >= 0) & ((target <= 1) if capped else (target < float("inf")))
    if not target.is_cpu or torch.compiler.is_compiling():
        require(ok, f"{name} entries must be finite, >= 0{' and <= 1' if capped else ''}")  # an assertion
    elif not bool(unwrapped(ok).all()):
        require(torch.isfinite(target), f"{name} must be finite, got NaN or inf entries")
        require(target >= 0, lambda: f"{name} must be >= 0 everywhere, got {float(target.min())}")
        if capped:
            require(target <= 1, lambda: (
                f"{name} entries must lie in [0, 1] for a top-k loss (a point of the capped simplex), "
                f"got {float(target.max())}"
            ))
    cdim = class_dim(input)
    n = input.shape[cdim]
    # Summed in the target's dtype (torch sums pairwise: error O(log n) ulps,
    # far inside the tolerance; a float64 sum would first copy the target to
    # float64); half targets in float32.
    sums = target.sum(cdim) if target.dtype in (torch.float32, torch.float64) else target.sum(cdim, dtype=torch.float32)
    tol = sum_tolerance(k, n, target.dtype)
    require((sums - k).abs() <= tol,
            lambda: _sum_message(sums, _k_text(k), n, cdim, name, capped))
    return target


def _k_text(k):
    """k as the message names it: "k=2.5" for a number or for a tensor k with
    one value (a float k reaches here as a per-row tensor), else "each row's k"."""
    if isinstance(k, (int, float)):
        return f"k={k:g}"
    if k.numel() and bool((k == k.flatten()[0]).all()):
        return f"k={float(k.flatten()[0]):g}"
    return "each row's k"


def _sum_message(sums: Tensor, k: str, n: int, cdim: int, name: str, capped: bool) -> str:
    """Why a target's rows do not sum to k, and what to pass instead."""
    lo, hi = float(sums.min()), float(sums.max())
    normalise = f"{name} / {name}.sum(dim={cdim}, keepdim=True)"
    if lo <= 0:
        normalise += f" after dropping the rows that sum to 0 (keep = {name}.sum(dim={cdim}) > 0)"
    if k == "k=1":
        hint = (
            f"rows must be probability distributions summing to 1; normalise multi-hot "
            f"labels first: {normalise}"
        )
    elif lo == hi and lo == round(lo) and 1 <= lo <= n:
        hint = (
            f"rows must sum to {k}: every row sums to {lo:g}, so pass k={int(lo)}, or give "
            f"each row exactly k ones (a point of the capped simplex: entries in [0, 1] summing to k)"
        )
    elif capped:
        hint = (
            f"rows must sum to {k}: a multi-hot label needs exactly k ones (or a point of the "
            f"capped simplex: entries in [0, 1] summing to k); for a varying number of labels "
            f"pass one k per row, k={name}.sum(dim={cdim}, keepdim=True)"
        )
    else:
        hint = (
            f"rows must sum to {k}; for a varying number of labels use "
            f"softk.losses.softmax_loss(input, {normalise})"
        )
    return f"{name} row sums lie in [{lo:.6g}, {hi:.6g}]; {hint}"

