"""Arguments of softk.compat.entmax: entmax's conventions, softk's checks.

Errors.  Where the entmax package raises (its own ``assert`` statements, or
torch failing inside it), the compat layer raises an exception that is *both*
softk's type — a ValueError or TypeError whose message names the parameter —
and the type entmax raised there (AssertionError, IndexError, RuntimeError),
so an ``except`` clause written against either keeps working.  Where entmax
raises nothing and returns a wrong or NaN result, the compat layer raises
softk's plain ValueError/TypeError.
"""

from __future__ import annotations

import contextlib
import math
import numbers

import torch
from torch import Tensor

from ..._validate import check_dim, check_input, per_row, require, unwrapped

_DUAL: dict = {}


def dual(base: type, entmax_type: type) -> type:
    """The exception class that is both ``base`` (softk's) and ``entmax_type`` (entmax's)."""
    if issubclass(base, entmax_type):
        return base
    key = (base, entmax_type)
    if key not in _DUAL:
        _DUAL[key] = type(base.__name__, (base, entmax_type), {
            "__module__": __name__,
            "__doc__": f"softk's {base.__name__}, also an {entmax_type.__name__} as the entmax package raises here.",
        })
    return _DUAL[key]


@contextlib.contextmanager
def raising_as(entmax_type: type):
    """Re-raise softk's ValueError/TypeError from the block as :func:`dual` of it and ``entmax_type``."""
    try:
        yield
    except (ValueError, TypeError) as err:
        if isinstance(err, entmax_type):
            raise
        base = ValueError if isinstance(err, ValueError) else TypeError
        raise dual(base, entmax_type)(*err.args) from None


def check_is_tensor(value, name: str) -> None:
    """A torch.Tensor (entmax reads ``.shape``/``.dim()`` of anything else: AttributeError)."""
    if not isinstance(value, Tensor):
        raise dual(TypeError, AttributeError)(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def check_x_dim(X, dim) -> int:
    """X a floating tensor (entmax fails inside torch: RuntimeError), ``dim`` in range (IndexError)."""
    check_is_tensor(X, "X")
    with raising_as(RuntimeError):
        check_input(X, "X")
    with raising_as(IndexError):
        return check_dim(X, dim)


def check_module_dim(dim) -> int:
    with raising_as(IndexError):
        return check_dim(None, dim)


def check_k_hint(k) -> None:
    """entmax's partial-sort hint: None or an int >= 1 (it never changes the result here)."""
    if k is None:
        return
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"k (entmax's partial-sort hint) must be None or an int >= 1, got {type(k).__name__}")
    if k < 1:
        raise dual(ValueError, RuntimeError)(f"k (entmax's partial-sort hint) must be None or an int >= 1, got {k}")


def check_n_iter(n_iter) -> None:
    """entmax's bisection steps: None or an int >= 0, accepted and unused (the solvers are exact)."""
    if n_iter is None:
        return
    if isinstance(n_iter, bool) or not isinstance(n_iter, numbers.Integral):
        raise TypeError(f"n_iter must be None or an int (it is unused: softk's solvers are exact), "
                        f"got {type(n_iter).__name__}")
    if n_iter < 0:
        raise ValueError(f"n_iter must be None or an int >= 0 (it is unused: softk's solvers are exact), got {n_iter}")


def check_positive_param(value, X, dim, name: str, low: float, low_text: str):
    """A float > ``low`` (finite), or a real tensor broadcastable like entmax's
    (X's shape with 1 along ``dim``; a bad shape is entmax's RuntimeError),
    whose values are finite and > ``low``.  A tensor comes back in X's dtype with
    its own shape (entmax's layout), after the shape check."""
    if isinstance(value, Tensor):
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must be a number or a real tensor, got dtype {value.dtype}")
        if not value.is_floating_point():
            value = value.to(X.dtype)
        with raising_as(RuntimeError):
            per_row(value, X, dim, name)
        v = unwrapped(value.detach())
        require(torch.isfinite(v) & (v > low),
                lambda: f"{name} must be finite and {low_text} everywhere, got {float(v[~(torch.isfinite(v) & (v > low))].flatten()[0])}")
        return value
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number or a tensor, got {type(value).__name__}")
    if not (math.isfinite(value) and value > low):  # type: ignore[operator]  # a numbers.Real compares with a float
        raise ValueError(f"{name} must be finite and {low_text}, got {value}")
    return float(value)


def check_loss_pair(X, target) -> None:
    """entmax's loss layout: X (n, C) floating, target (n,) integer class indices in [0, C).

    The checks run in the order entmax fails, so that each error is also of
    entmax's type: its first statement asserts X.shape[0] == target.shape[0]
    (IndexError on a 0-d tensor, AssertionError on a mismatch); its scatter
    along dim 1 then fails on a 1-D X (IndexError) or on any other layout
    (RuntimeError)."""
    check_is_tensor(X, "X")
    check_is_tensor(target, "target")
    if X.dim() == 0 or target.dim() == 0:
        which = "X" if X.dim() == 0 else "target"
        raise dual(ValueError, IndexError)(f"{which} must have a first (sample) dimension, got a 0-d tensor; "
                                           f"entmax's losses take X (n_samples, n_classes) and target (n_samples,)")
    if X.shape[0] != target.shape[0]:
        raise dual(ValueError, AssertionError)(
            f"X has {X.shape[0]} rows but target has {target.shape[0]} entries (entmax asserts they match)")
    with raising_as(RuntimeError):
        check_input(X, "X")
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TypeError(f"target must be an integer tensor of class indices (entmax's LongTensor), got dtype {target.dtype}")
    with raising_as(IndexError if X.dim() == 1 else RuntimeError):
        if X.dim() != 2:
            raise ValueError(f"X must be 2-D (n_samples, n_classes) as in entmax's losses, got shape {tuple(X.shape)}")
    with raising_as(RuntimeError):
        if target.dim() != 1:
            raise ValueError(f"target must be 1-D (n_samples,), got shape {tuple(target.shape)}")
    n = X.shape[1]
    bad = (target < 0) | (target >= n)
    with raising_as(RuntimeError):
        require(~bad, lambda: f"target holds class index {int(target[bad][0])}, outside [0, {n}) for X with {n} classes")


REDUCTIONS = ("elementwise_mean", "sum", "none")


def check_reduction(reduction) -> str:
    """entmax's reductions (it asserts): "elementwise_mean" (over kept rows), "sum", "none"."""
    if reduction not in REDUCTIONS:
        hint = ' (entmax spells the mean "elementwise_mean")' if reduction == "mean" else ""
        raise dual(ValueError, AssertionError)(f"reduction must be one of {list(REDUCTIONS)}{hint}, got {reduction!r}")
    return reduction


def ignore_value(ignore_index) -> int:
    """entmax's ignore_index as an int (it may be a one-element tensor); < 0 ignores nothing."""
    if isinstance(ignore_index, Tensor) and ignore_index.numel() == 1 and not ignore_index.is_floating_point():
        ignore_index = ignore_index.item()
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    return int(ignore_index)


def support_size(P: Tensor, dim: int) -> Tensor:
    """entmax's ``return_support_size``: the number of non-zeros along ``dim`` (kept, int64)."""
    return (P.detach() > 0).sum(dim, keepdim=True)
