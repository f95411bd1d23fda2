r"""The one Fenchel–Young loss from which every named loss here is derived.

For a threshold map p(z) = argmax_{p ∈ C_k} ⟨z, p⟩ − Ω(p) with potential
Φ(z) = ⟨z, p(z)⟩ − Ω(p(z)) (:mod:`softk._ops.potential`) and
Ω(y) = Σ_i ψ(y_i) from the map's :class:`~softk.threshold.Family`,

.. math:: L(z; y) = \Phi(z) + \Omega(y) - \langle z, y\rangle \;\ge 0, \qquad
          \nabla_z L = p(z) - y,

(Blondel, Martins & Niculae, "Learning with Fenchel–Young losses", JMLR 2020).
L ≥ 0 is the Fenchel–Young inequality, with equality exactly when p(z) = y.
With a temperature, z = x/τ and the gradient with respect to x is (p − y)/τ,
exactly as for ``cross_entropy(x / tau, ...)``.

The map's output p comes from its own autograd rule
(:mod:`softk._ops.op`, through the one dispatch) and enters the value
(:mod:`softk._ops.fenchel_young`) as an input whose partial derivative is 0 (p maximises ⟨z, p⟩ − Ω(p): the
envelope theorem).  So the gradient is p − y with no second solve, and its
derivative, the Hessian, is the map's Jacobian (double backward, ``hessian``).
For a class-index target y = e_t the loss is Φ(z) − z_t + ψ(1) (ψ(0) = 0 for
every family), so no one-hot tensor is built.

Where a fused kernel serves the call (:func:`softk._backends.dispatch.pick`,
op "fenchel_young": the compiled CPU kernels ("native") or Triton, for
softmax, sparsemax, entmax15, entmax with 1.125 ≤ α ≤ 2 and soft top-k "exp"
on the CPU, every family with a float α from 1.125 on Triton: nearer 1 the
loss formed from λ ≈ −1/(α − 1) would keep eps/(α − 1) of its value) with an int k (on the CPU
also one integral k per row, e.g. multi-hot targets), the fused kernel
serves the call instead (:mod:`softk._ops.fused_loss`): one kernel per row
finds λ as the map's forward does and writes the loss and the gradient of
the reduced loss in the input's dtype, which the backward only scales
(double backward recomputes through the map's contract, so it stays
exact).  Everything else stays on the unfused loss above: entmax with α > 2 or a
per-row tensor α on the CPU, sigmoid/laplace/sparse top-k on the CPU, a
per-row k that is not integral or needs a gradient, and inputs wrapped by
``torch.func`` transforms (vmap, grad, jvp).  One difference: an ignored
row (``ignore_index``) holding NaN scores gets a zero gradient there, NaN
here.  On eager CPU calls the kernel checks the target values itself
(class indices in range, dense rows in the map's domain) in its one pass,
and softk's message is built only when a check fails.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._backends import dispatch
from .._validate import check_k_rows, reduce
from ..threshold.families import Family
from .._ops.fenchel_young import fenchel_young_rows
from ..threshold.rows import compute_dtype
from . import targets as tg
from .._ops.fused_loss import fused_fenchel_young


def fenchel_young_loss(
    input: Tensor,
    target: Tensor,
    family: Family,
    k: int = 1,
    ignore_index: int = -100,
    reduction: str = "mean",
    tau: float = 1.0,
) -> Tensor:
    r"""Fenchel–Young loss of the threshold map ``family`` with Σp = k.

    .. math:: L(x; y) = \Phi(x/\tau) + \Omega(y) - \langle x/\tau, y\rangle,
              \qquad \nabla_x L = (p(x/\tau) - y)/\tau.

    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: class indices (integer, ``input``'s shape without dim 1; only
            for k = 1) or a floating tensor shaped like ``input`` whose rows lie
            in the map's domain: entries >= 0 (<= 1 for capped maps) summing to k.
        family: a :class:`softk.families.Family` (e.g. ``softk.families.SPARSEMAX``).
        k: the map's Σp: an int, or for a capped family one k per row (a
            tensor broadcastable to ``input`` with size 1 along dim 1, e.g.
            ``target.sum(1, keepdim=True)`` for multi-hot targets).
        ignore_index: class index whose rows contribute 0 and are left out of
            the mean (class-index targets only).
        reduction: "mean" (over kept rows), "sum" or "none" (per row).
        tau: temperature > 0.

    Rows follow :mod:`softk.threshold.rows`: ``-inf`` scores are masked
    out, so a target with mass on a masked class has loss +inf; a row with NaN
    or +inf scores gives NaN.  ``target`` gets no gradient and must not require
    one.  Half-precision input is computed in float32; the result has
    ``input``'s dtype.

    >>> import torch, softk
    >>> fenchel_young_loss(torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([2]), softk.families.SPARSEMAX)
    tensor(0.)
    """
    tau, reduction, ignore_index = tg.check_loss_args(input, target, tau, reduction, ignore_index, k=k)
    cdim = 0 if input.dim() == 1 else 1
    if input.shape[cdim] == 0:
        raise ValueError(f"input must have at least one class along dim {cdim}, got shape {tuple(input.shape)}")
    if target.requires_grad:
        raise ValueError(
            "target requires grad, but Fenchel–Young losses give no gradient to the target; "
            "pass target.detach()"
        )
    if not isinstance(family, Family):
        raise TypeError(f"family must be a softk.families.Family (e.g. softk.families.SPARSEMAX), got {type(family).__name__}")
    if not (type(k) is int and 1 <= k <= input.shape[cdim]):  # the common case needs no check
        k = check_k_rows(k, input, cdim)
    row_k = isinstance(k, Tensor)
    if not family.capped and (row_k or k != 1):
        raise ValueError(f"family {family.name!r} maps onto the simplex (k = 1 only), got k={k}")
    by_index = not target.is_floating_point()
    if by_index:
        if row_k or k != 1:
            raise ValueError(
                f"target of class indices is only meaningful for k = 1, got k={k}; pass a "
                f"float target whose rows sum to k (e.g. a multi-hot label with k ones)"
            )
        tg.check_index_shape(input, target)
    else:
        if ignore_index != -100:
            raise ValueError(
                "ignore_index applies to class-index targets only; with a probability target, "
                "give ignored rows zero weight yourself (reduction='none')"
            )
        tg.check_distribution_shape(input, target)
    x = input if cdim == input.dim() - 1 else input.movedim(cdim, -1)
    if target.device != input.device:
        target = target.to(input.device)
    kernel = dispatch.pick("fenchel_young", x, family, k)
    if kernel is not None:
        t = target if by_index else target.movedim(cdim, -1)
        return fused_fenchel_young(x, t, family, k, tau, reduction, ignore_index, kernel.backend,
                                   lambda: _check_values(input, target, family, k, ignore_index, index=False))
    index, keep, y = _check_values(input, target, family, k, ignore_index)
    if x.numel() == 0:
        loss = x.to(compute_dtype(x.dtype)).sum(-1) * 0
    else:
        loss = fenchel_young_rows(x, y, None if index is None else index.unsqueeze(-1), family, k, tau).squeeze(-1)
    if keep is not None:
        loss = torch.where(keep, loss, 0.0)
    return reduce(loss, keep, reduction).to(input.dtype)


def _check_values(input: Tensor, target: Tensor, family: Family, k, ignore_index: int, index: bool = True):
    """The value checks of the target (shapes already checked): (index, keep, None)
    for class indices (``index`` False: only the checks, (None, keep, None)),
    (None, None, y with classes last) for a dense target."""
    if not target.is_floating_point():
        if not index:
            return None, tg.check_index_values(input, target, ignore_index), None
        idx, keep = tg.index_target(input, target, ignore_index)
        return idx, keep, None
    row_k = isinstance(k, Tensor)
    y = tg.distribution_target(input, target, k.squeeze(-1) if row_k else k, family.capped)
    return None, None, y.movedim(0 if input.dim() == 1 else 1, -1)
