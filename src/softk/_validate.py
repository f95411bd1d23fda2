"""Argument checks shared by every public function.

Each check raises a TypeError or ValueError that names the parameter and says
what was expected, so that bad input never surfaces as a shape error from deep
inside torch.
"""

from __future__ import annotations

import math
import numbers

import torch

FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_input(x, name: str = "x") -> None:
    """``x`` must be a floating-point tensor with at least one dimension."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name} must be a floating-point tensor (float64, float32, float16 or "
            f"bfloat16), got dtype {x.dtype}; convert it first, e.g. {name}.float()"
        )
    if x.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension, got a 0-d tensor")


def check_dim(x: torch.Tensor, dim, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative index into ``x.shape``."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    nd = x.dim()
    if not -nd <= dim < nd:
        raise ValueError(
            f"{name}={dim} is out of range for a {nd}-D input (expected {-nd}..{nd - 1})"
        )
    return int(dim) % nd


def check_tau(tau, name: str = "tau") -> float:
    """Temperature: a finite number > 0."""
    return check_positive(tau, name)


def check_positive(tau, name: str) -> float:
    """A finite number > 0 (a Python number or a one-element tensor)."""
    if isinstance(tau, torch.Tensor):
        if tau.numel() != 1:
            raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(tau.shape)}")
        tau = tau.item()
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {type(tau).__name__}")
    tau = float(tau)
    if not (tau > 0 and math.isfinite(tau)):
        raise ValueError(f"{name} must be a finite number > 0, got {tau}")
    return tau


def check_k(k, n: int, name: str = "k") -> int:
    """Number of selected entries: an int in [1, n]."""
    if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point():
        k = k.item()
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(k).__name__}")
    if not 1 <= k <= n:
        raise ValueError(f"{name} must be in [1, n] = [1, {n}] for this input, got {k}")
    return int(k)


def check_choice(value, choices, name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_topk_args(x, k, dim, tau, method, methods):
    """The common prelude of the top-k functions: returns (dim, k, tau)."""
    check_input(x)
    dim = check_dim(x, dim)
    k = check_k(k, x.shape[dim])
    tau = check_tau(tau)
    check_choice(method, methods, "method")
    return dim, k, tau


def check_alpha(alpha, name: str = "alpha"):
    """entmax's α: a real number or a floating tensor, every value finite and
    >= 1 (1 is softmax, 2 sparsemax; α → ∞ tends to the argmax, which is
    ``softk.hard_topk(x, 1)``: inf itself is refused, as a float and as a
    tensor entry alike).  Returns α (a float for a number)."""
    if isinstance(alpha, torch.Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"{name} must be a float or a floating-point tensor, got dtype {alpha.dtype}")
        bad = torch.isnan(alpha) | (alpha < 1) | torch.isinf(alpha)
        if bool(bad.any()):
            raise ValueError(
                f"{name} must be finite and >= 1 everywhere (1 is softmax, 2 sparsemax; "
                f"for the alpha -> inf limit use softk.hard_topk(x, 1)), got {alpha[bad].flatten()[0].item()}"
            )
        return alpha
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"{name} must be a float >= 1 or a tensor, got {type(alpha).__name__}")
    alpha = float(alpha)
    if not (alpha >= 1 and math.isfinite(alpha)):
        raise ValueError(f"{name} must be a finite float >= 1, got {alpha}")
    return alpha
