r"""α-normmax: the argmax regularised by the α-norm, exactly.

.. math:: p = \arg\max_{p\in\Delta} \langle z, p\rangle - \|p\|_\alpha, \qquad z = x/\tau,\ \alpha \ge 1

(Santos, Niculae, McNamee & Martins, "Sparse and Structured Hopfield
Networks", ICML 2024; the entmax package's ``normmax_bisect``).  Sparse like
sparsemax; α = 2 puts more mass on the runner-up than sparsemax does, a large
α spreads it nearly evenly over the support, α → 1 is the argmax.

**Threshold form.**  On the support S the KKT conditions read
z_i − ‖p‖_α^{1−α} p_i^{α−1} = μ, so p_i = ‖p‖_α (z_i − μ)_+^β with β = 1/(α−1).
Writing q_i = (z_i − μ)_+^β, Σp = 1 gives p = q/Σq, and ‖p‖_α = ‖q‖_α/Σq
then forces ‖q‖_α = 1:

.. math:: \sum_i (z_i - \mu)_+^{\gamma} = 1, \quad \gamma = \frac{\alpha}{\alpha-1},
          \qquad p_i = \frac{(z_i-\mu)_+^{\beta}}{\sum_j (z_j-\mu)_+^{\beta}}.

The threshold equation is α'-entmax's with α' = 2 − 1/α ∈ (1, 2) on the rows
scaled by γ (f(u) = [(α'−1)u]_+^γ and (α'−1)(γ z − λ) = z − μ), so μ comes from
softk's own solver: the closed form of entmax15 at α = 2 (α' = 1.5), safeguarded
Newton otherwise.  p itself is *not* a threshold map Σf(z − μ) = 1 (the
normalisation by Σq), hence this module with its own autograd rather than a
:class:`~softk.threshold.Family`.

**Derivatives** (implicit differentiation of the two equations; all from p):

.. math:: J = \beta\,\|p\|_\alpha^{\alpha-1}\,(I - p\mathbf 1^\top)\,\mathrm{diag}(p^{2-\alpha})\,(I - \mathbf 1 p^\top),

symmetric (so forward mode is the same formula), 0 off the support; with
ℓ_i = log(p_i/‖p‖_α) and r_i = e^{αℓ_i} (Σr = 1),
∂p_i/∂α = p_i (w_i − Σ_j p_j w_j), w_i = −βℓ_i + (β‖p‖_α/α)(Σ_j r_jℓ_j) e^{(1−α)ℓ_i}.
Both are differentiable tensor code, so double backward is exact; the map
on rows and this autograd rule are :mod:`softk._ops.normmax`'s.

α = 1 is the argmax (uniform on tied maxima, zero gradient), the α → 1⁺ limit.  μ is at the dtype's
precision; p's relative error is about β·eps (α near 1 magnifies the rounding of z − μ).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .. import _dtensor

from .._ops.normmax import normmax_apply
from .._validate import check_dim, check_input, check_tau, finite, per_row, require, unwrapped

__all__ = ["normmax"]


# ------------------------------------------------------------------ arguments
def check_normmax_alpha(alpha, x, dim: int):
    """α: a finite float >= 1, or a floating tensor >= 1 broadcastable to ``x``
    with size 1 along ``dim`` (returned per row, ``dim`` moved last)."""
    msg = "alpha must be finite and >= 1 (1 is the argmax, 2 the default; normmax is defined by the alpha-norm)"
    if isinstance(alpha, Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"alpha must be a float or a floating-point tensor, got dtype {alpha.dtype}")
        a = unwrapped(alpha.detach())
        bad = ~torch.isfinite(a) | (a < 1)
        require(~bad, lambda: f"{msg}, got {a[bad].flatten()[0].item()}")
        return per_row(alpha, x, dim, "alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real):
        raise TypeError(f"alpha must be a float >= 1 or a tensor, got {type(alpha).__name__}")
    if not (alpha >= 1 and finite(alpha)):  # type: ignore[operator]  # a numbers.Real compares with an int
        raise ValueError(f"{msg}, got {alpha}")
    return float(alpha)


@_dtensor.entry("local map", "normmax")
def normmax(x: Tensor, alpha=2.0, dim: int = -1, tau=1.0) -> Tensor:
    r"""α-normmax: :math:`\arg\max_{p\in\Delta}\ \langle x/\tau, p\rangle - \|p\|_\alpha`, exactly.

    .. math:: p_i = \frac{(z_i-\mu)_+^{1/(\alpha-1)}}{\sum_j (z_j-\mu)_+^{1/(\alpha-1)}},
              \qquad \sum_i (z_i-\mu)_+^{\alpha/(\alpha-1)} = 1, \qquad z = x/\tau,

    from the KKT conditions on the support; μ is α'-entmax's threshold with
    α' = 2 − 1/α on the rows scaled by α/(α−1), found by softk's solver.
    Sparse, with exact zeros.

    Args:
        x: scores, any shape, floating point (half computed in float32).
        alpha: α >= 1, finite: a float, or a floating tensor broadcastable to
            ``x`` with size 1 along ``dim`` (one α per row), which receives a
            gradient if it requires one.  α = 1 is the argmax (uniform on
            ties), α = 2 (default) uses entmax15's closed form for μ.
        dim: the dimension that sums to 1.
        tau: temperature > 0 (a float, or a one-element tensor that may require grad).

    Returns:
        p, shaped like ``x``.  -inf entries get 0, a fully masked row gives zeros,
        a row with one finite entry gives 1 there (all with zero gradient), a
        NaN or +inf makes its row NaN.

    Reference: Santos, Niculae, McNamee & Martins, "Sparse and Structured
    Hopfield Networks", ICML 2024.

    >>> import torch
    >>> normmax(torch.tensor([-2.0, 0.0, 0.5]))
    tensor([0.0000, 0.3110, 0.6890])
    >>> normmax(torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]), alpha=1000.0)
    tensor([0.0000, 0.0000, 0.3330, 0.3334, 0.3336])
    """
    check_input(x)
    dim = check_dim(x, dim)
    tau = check_tau(tau, allow_grad=True, x=x)
    alpha = check_normmax_alpha(alpha, x, dim)
    return normmax_apply(x.movedim(dim, -1), alpha, tau).movedim(-1, dim)
