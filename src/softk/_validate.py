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


def check_dim(x, dim, name: str = "dim") -> int:
    """Return ``dim`` as a non-negative index into ``x.shape`` (x None: only
    the type is checked, for modules, which learn the rank at call time)."""
    if type(dim) is not int:  # the common case skips the ABC checks below
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
        dim = int(dim)
    if x is None:
        return dim
    nd = x.dim()
    if not -nd <= dim < nd:
        raise ValueError(
            f"{name}={dim} is out of range for a {nd}-D input (expected {-nd}..{nd - 1})"
        )
    return dim % nd


# The smallest τ of a float input's compute dtype (half: float32): the
# kernels form x/τ as x·(1/τ), and below 1/max that factor is not a float of
# the dtype (inf), nor is τ itself one below the subnormals (0), and either
# turns the row's maximum into 0·inf = NaN
TAU_FLOOR = {torch.float64: 1 / torch.finfo(torch.float64).max,
              **{t: 1 / torch.finfo(torch.float32).max for t in (torch.float32, torch.float16, torch.bfloat16)}}


def check_tau(tau, name: str = "tau", allow_grad: bool = False, x=None):
    """Temperature: a finite number > 0; with the input ``x``, at least
    1/max of its compute dtype (2.9e-39 for float32 and half inputs).

    With ``allow_grad``, a one-element tensor that carries a derivative (it
    requires grad, holds a forward-mode tangent, or is an input of a
    torch.func transform: grad, jvp, vmap) is returned as a 0-d tensor (after
    the same value check), so that the caller forms x/τ with autograd and τ
    gets its derivative; elsewhere such a τ is refused, never silently
    detached (read as a number, a tangent would be dropped: jvp gave 0)."""
    if type(tau) is float and 0.0 < tau < math.inf:  # the common case
        if x is not None and tau < TAU_FLOOR.get(x.dtype, 0.0):
            ct = "float64" if x.dtype == torch.float64 else "float32"
            raise ValueError(f"{name}={tau!r} is below {TAU_FLOOR[x.dtype]:.3g}, 1/max of {ct} (the dtype "
                             f"{str(x.dtype).replace('torch.', '')} input is computed in), where x/{name} is "
                             f"formed as x·(1/{name})" + ("" if ct == "float64" else
                                                          f"; pass float64 input for a smaller {name}"))
        return tau
    if isinstance(tau, torch.Tensor) and carries_derivative(tau):
        if not allow_grad:
            raise ValueError(
                f"{name} is a tensor that requires grad (or that torch.func or forward-mode AD differentiates "
                f"or batches), but this function takes {name} as a constant; pass {name}.detach(), or divide "
                f"the scores by {name} yourself and use {name}=1"
            )
        if tau.numel() != 1 or not tau.is_floating_point():
            raise TypeError(f"{name} must be a number or a one-element floating tensor, got shape {tuple(tau.shape)}")
        t = unwrapped(tau).detach()  # under vmap: every τ of the batch
        if t.is_cpu and not torch.compiler.is_compiling():
            for v in t.reshape(-1).tolist():
                v = check_positive(v, name)
                if x is not None:
                    check_tau(v, name, False, x)  # the floor, on its value
        else:  # no host read: an assertion in the graph or on the device (see require)
            require((t > 0) & torch.isfinite(t), f"{name} must be a finite number > 0")
        return tau.reshape(())
    tau = check_positive(tau, name)
    return tau if x is None else check_tau(tau, name, allow_grad, x)


def carries_derivative(t: torch.Tensor) -> bool:
    """Whether a tensor carries a derivative that reading its value would
    drop: it requires grad, holds a forward-mode tangent, or is wrapped by a
    torch.func transform (grad, jvp, vmap).  While compiling, where those
    questions cannot be traced, every tensor is taken as one (its value is
    then only asserted in the graph)."""
    if torch.compiler.is_compiling() or t.requires_grad or torch._C._functorch.is_functorch_wrapped_tensor(t):
        return True
    return torch.autograd.forward_ad.unpack_dual(t).tangent is not None


def finite(v) -> bool:
    """Whether the number ``v`` is finite (NaN is not), by comparisons alone:
    torch.compile traces a float argument that changes between calls (an
    annealed τ or α) as a symbolic float, which ``math.isfinite`` cannot take."""
    return -math.inf < v < math.inf


def check_positive(tau, name: str) -> float:
    """A finite number > 0 (a Python number or a one-element tensor)."""
    if type(tau) is float and 0.0 < tau < math.inf:  # the common case
        return tau
    if isinstance(tau, torch.Tensor):
        if tau.numel() != 1:
            raise TypeError(f"{name} must be a number, got a tensor of shape {tuple(tau.shape)}")
        tau = tau.item()
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {type(tau).__name__}")
    tau = float(tau)
    if not (tau > 0 and finite(tau)):
        raise ValueError(f"{name} must be a finite number > 0, got {tau}")
    return tau


def check_k(k, n=None, name: str = "k") -> int:
    """Number of selected entries: an int in [1, n] (n None: only k >= 1,
    for modules, which learn n at call time).  A whole float (3.0) counts as
    its int; a fractional one is refused here, where only a count makes
    sense (``soft_topk``'s threshold methods take it: see :func:`check_k_rows`)."""
    if isinstance(k, torch.Tensor) and k.numel() == 1 and not k.is_floating_point():
        k = k.item()
    k = _whole(k, name)
    if n is None:
        if k < 1:
            raise ValueError(f"{name} must be an int >= 1, got {k}")
        return k
    if not 1 <= k <= n:
        raise ValueError(f"{name} must be in [1, n] = [1, {n}] for this input, got {k}")
    return k


def _whole(k, name: str) -> int:
    """An int, or a float with a whole value, as an int; anything else refused."""
    if isinstance(k, bool) or not isinstance(k, numbers.Real):
        raise TypeError(f"{name} must be an int, got {type(k).__name__}")
    if isinstance(k, numbers.Integral):
        return int(k)
    k = float(k)
    if not finite(k):
        raise ValueError(f"{name} must be a finite whole number, got {k}")
    if not k.is_integer():
        raise ValueError(
            f"{name} must be a whole number here (it counts entries), got {k}; a fractional k "
            f"is taken by softk.soft_topk and softk.losses.soft_topk_loss with a threshold method "
            f"(exp, sigmoid, laplace, sparse)"
        )
    return int(k)


_FRACTIONAL_K_METHODS = ("exp", "sigmoid", "laplace", "sparse")


def check_module_k(k, method: str, name: str = "k"):
    """A module's k, checked once at construction (n is learnt at call time):
    a count >= 1, or with a threshold method also a fractional k > 0, as the
    functional ``soft_topk`` / ``topk_sum`` / ``soft_topk_loss`` take it."""
    if is_fractional(k) and method in _FRACTIONAL_K_METHODS:
        if not float(k) > 0:
            raise ValueError(f"{name} must be > 0, got {k}")
        return float(k)
    if is_fractional(k):
        raise ValueError(
            f"a fractional {name} ({float(k)}) needs a threshold method (exp, sigmoid, laplace, "
            f"sparse), got method={method!r}; pass a whole {name}"
        )
    return check_k(k, name=name)


def is_fractional(k) -> bool:
    """True for a Python (or NumPy) real k that is not a whole number."""
    return (isinstance(k, numbers.Real) and not isinstance(k, (bool, numbers.Integral))
            and finite(k) and k != math.floor(k))  # (comparisons: a symbolic float under compile)


def check_choice(value, choices, name: str) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")
    return value


def check_topk_args(x, k, dim, tau, method, methods):
    """The common prelude of the top-k functions: returns (dim, k, tau)."""
    check_input(x)
    dim = check_dim(x, dim)
    fractional = float(k) if is_fractional(k) else None
    k = check_k_rows(k, x, dim)
    tau = check_tau(tau, allow_grad=True, x=x)
    check_choice(method, methods, "method")
    if isinstance(k, torch.Tensor) and method not in ("exp", "sigmoid", "laplace", "sparse"):
        if fractional:
            raise ValueError(
                f"a fractional k ({fractional}) needs a threshold method (exp, sigmoid, laplace, "
                f"sparse), got method={method!r}; pass a whole k"
            )
        raise ValueError(
            f"a per-row k (a tensor) needs a threshold method (exp, sigmoid, laplace, sparse), "
            f"got method={method!r}; pass an int k"
        )
    return dim, k, tau


def per_row(t: torch.Tensor, x: torch.Tensor, dim: int, name: str) -> torch.Tensor:
    """A per-row parameter: ``t`` broadcastable to x's shape with size 1 along
    ``dim``, returned broadcast with ``dim`` moved last (x.shape[:-1] + (1,))."""
    if t.dim() > x.dim():
        raise ValueError(f"{name} has more dimensions ({t.dim()}) than x ({x.dim()})")
    shape = (1,) * (x.dim() - t.dim()) + tuple(t.shape)
    target = list(x.shape)
    target[dim] = 1
    if any(a not in (1, b) for a, b in zip(shape, target)) or shape[dim] != 1:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} must broadcast to x's shape {tuple(x.shape)} "
            f"with size 1 along dim={dim}, e.g. shape {tuple(target)}"
        )
    return t.reshape(shape).expand(target).movedim(dim, -1)


def check_alpha(alpha, x, dim: int):
    """entmax's α: a finite float >= 1, or a floating tensor >= 1 (finite)
    broadcastable to ``x`` with size 1 along ``dim``; a tensor comes back
    broadcast to x's shape with ``dim`` moved last (one α per row).  With
    ``x`` None (a module, before it sees an input) only floats are taken."""
    if isinstance(alpha, torch.Tensor) and x is not None:
        if not alpha.is_floating_point():
            raise TypeError(f"alpha must be a float or a floating-point tensor, got dtype {alpha.dtype}")
        a = unwrapped(alpha.detach())
        bad = ~torch.isfinite(a) | (a < 1)
        require(~bad, lambda: (
            "alpha must be finite and >= 1 everywhere (1 is softmax, 2 sparsemax; for the alpha -> inf "
            f"limit, the argmax, use softk.hard_topk(x, 1)), got {a[bad].flatten()[0].item()}"
        ))
        return per_row(alpha, x, dim, "alpha")
    if isinstance(alpha, torch.Tensor) and alpha.numel() == 1 and not alpha.requires_grad:
        alpha = alpha.item()  # a one-element tensor where a number is taken: its value
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        what = "a float >= 1" if x is None else "a float >= 1 or a tensor"
        raise TypeError(f"alpha must be {what} here, got {type(alpha).__name__}"
                        + (" of shape " + str(tuple(alpha.shape)) if isinstance(alpha, torch.Tensor) else ""))
    alpha = float(alpha)
    if not (alpha >= 1 and finite(alpha)):
        raise ValueError(
            f"alpha must be a finite float >= 1 (1 is softmax, 2 sparsemax; for the alpha -> inf limit, "
            f"the argmax, use softk.hard_topk(x, 1)), got {alpha}"
        )
    return alpha


def is_row_k(k) -> bool:
    """True for a per-row budget: a floating tensor, or one with several entries
    (a one-element integer tensor is an ordinary int k)."""
    return isinstance(k, torch.Tensor) and (k.is_floating_point() or k.numel() != 1)


def check_k_rows(k, x: torch.Tensor, dim: int, name: str = "k"):
    """k as an int in [1, n] (see :func:`check_k`; a whole float counts as
    its int), or one budget per row: a real or integer tensor broadcastable to
    x with size 1 along ``dim``, each value in (0, n] (the capped families take
    any real k there), returned like :func:`per_row` in x's compute dtype.  A
    fractional Python float is the same budget for every row."""
    n = x.shape[dim]
    if isinstance(k, float) and not finite(k):
        raise ValueError(f"{name} must be a finite number in (0, n] = (0, {n}] for this input, got {k}")
    if is_fractional(k):  # one budget for every row: the per-row path, broadcast
        if not 0 < k <= n:
            raise ValueError(f"{name} must lie in (0, n] = (0, {n}] for this input, got {float(k)}")
        ct = torch.float64 if x.dtype == torch.float64 else torch.float32
        return per_row(torch.tensor(float(k), dtype=ct, device=x.device), x, dim, name)
    if not is_row_k(k):
        return check_k(k, n, name)
    if k.requires_grad and not k.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor to receive a gradient")
    if k.is_complex() or k.dtype == torch.bool:
        raise TypeError(f"{name} must be an int or a real tensor, got dtype {k.dtype}")
    kd = unwrapped(k.detach())
    require((kd > 0) & (kd <= n) & torch.isfinite(kd.double()),
            lambda: f"{name} must lie in (0, n] = (0, {n}] in every row, got values from "
                    f"{float(kd.min())} to {float(kd.max())}")
    ct = torch.float64 if x.dtype == torch.float64 else torch.float32
    return per_row(k.to(ct), x, dim, name)


def require(ok: torch.Tensor, message) -> None:
    """A check on tensor *values* (a class index in range, a target row that
    sums to k): a ValueError with ``message()`` in eager mode.  Under
    torch.compile a value is not known while the graph is captured, so the
    check becomes an assertion inside the graph (``torch._assert_async``,
    which raises when it runs) instead of a graph break; under torch.func
    transforms the check reads the unwrapped batch.

    On a device other than the CPU (CUDA) reading the answer would wait for
    the device, so the check is a device-side assertion there too
    (``torch._assert_async``): a bad value stops the program when the
    device gets to it, without the detailed message; run the same call on
    CPU tensors to read it.  That is the documented convention for every
    value check of softk."""
    if torch.compiler.is_compiling():
        torch._assert_async(ok.all(), "softk: invalid input values (run eagerly for the full message)")
        return
    if not ok.is_cpu:
        torch._assert_async(ok.all(), "softk: invalid input values (run on CPU tensors for the full message)")
        return
    if not bool(unwrapped(ok).all()):
        raise ValueError(message() if callable(message) else message)


def unwrapped(t: torch.Tensor) -> torch.Tensor:
    """Under torch.func transforms (vmap, grad): the whole batch underneath,
    so that a value check (and its message) can read it."""
    if torch.compiler.is_compiling():  # fake tensors: nothing to read (require asserts in-graph)
        return t
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t


def check_chunk_size(chunk_size):
    """None, or rows per chunk: an int >= 1."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ValueError(f"chunk_size must be None or an int >= 1 (rows per chunk), got {chunk_size!r}")
    return int(chunk_size)


def check_smoothing(label_smoothing) -> float:
    """A label smoothing in [0, 1], as a float."""
    if type(label_smoothing) is float and 0.0 <= label_smoothing <= 1.0:  # the common case
        return label_smoothing
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real):
        raise TypeError(f"label_smoothing must be a float in [0, 1], got {type(label_smoothing).__name__}")
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    return float(label_smoothing)


_EPS = {dt: torch.finfo(dt).eps for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16)}


def sum_tolerance(k, n: int, dtype: torch.dtype):
    """How far a target row's sum may be from k: rounding only.

    A row normalised in its own dtype is off by at most ~n/2 ulps, and a map's
    own output (λ solved to a few ulps, e.g. by Newton) by far less than
    sqrt(eps).  The floor is float32's rounding, n ulps of it: a target
    normalised in float32 and then cast to float64 (the usual way a float64
    model gets its labels) is off by float32 rounding, not float64's.  A
    multi-hot row that was not normalised is off by at least 1, and one
    normalised over the wrong dimension by far more than n·2⁻²³ for any n
    below millions."""
    eps = _EPS.get(dtype) or torch.finfo(dtype).eps
    return k * max(eps**0.5, 2 * n * eps, n * _EPS[torch.float32])


def mean_of(total: torch.Tensor, count) -> torch.Tensor:
    """``total / count``, torch's mean over the kept rows (``count`` their number,
    or the sum of their class weights), a tensor or a number.

    With ``count`` exactly 0 (no kept row, or no kept weight) the value is NaN,
    as in torch, and the gradient is ``total``'s own (0 from rows that are all
    ignored), never ``total``'s times 1/0: the divisor is 1 there and the NaN
    an added constant.  Any other count, above or below 1, divides both the
    value and its gradient, with no host read of a count on the device."""
    if not isinstance(count, torch.Tensor):
        return total / count if count else total + math.nan
    empty = count == 0
    count = count.to(total.dtype)
    return total / torch.where(empty, 1.0, count) + torch.where(empty, math.nan, 0.0)


def mean_scale(go: torch.Tensor, count) -> torch.Tensor:
    """The backward of :func:`mean_of` for an incoming gradient ``go``:
    ``go / count``, and 0 where ``count`` is exactly 0."""
    if not isinstance(count, torch.Tensor):
        return go / count if count else go * 0
    empty = count == 0
    return torch.where(empty, 0.0, go / torch.where(empty, 1.0, count.to(go.dtype)))


def reduce(loss: torch.Tensor, keep, reduction: str) -> torch.Tensor:
    """torch's reductions of a per-row loss (checked by the caller): "mean"
    divides by the number of kept rows (``keep`` None: all of them) by
    :func:`mean_of`, NaN with the rows' own (zero) gradients when none is kept."""
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if keep is None:
        return loss.mean()
    return mean_of(loss.sum(), keep.sum())
