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

The map's output p comes from its own autograd contract
(:mod:`softk._ops.op`, through the one dispatch) and enters the value as
an input whose partial derivative is 0 (p maximises ⟨z, p⟩ − Ω(p): the
envelope theorem).  So the gradient is p − y with no second solve, and its
derivative, the Hessian, is the map's Jacobian (double backward, ``hessian``).
For a class-index target y = e_t the loss is Φ(z) − z_t + ψ(1) (ψ(0) = 0 for
every family), so no one-hot tensor is built.

Where the dispatch picks the compiled CPU kernels ("native") or Triton and
the family has a fused kernel there (:func:`softk._ops.fused_loss.fused_backend`:
softmax, sparsemax, entmax15, entmax with 1 < α ≤ 2 and soft top-k "exp" on
the CPU, every family with a float α on Triton) with an int k (on the CPU
also one integral k per row, e.g. multi-hot targets), the fused route
serves the call instead (:mod:`softk._ops.fused_loss`): one kernel per row
finds λ as the map's forward does and writes the loss and the gradient of
the reduced loss in the input's dtype, which the backward only scales
(double backward recomputes through the map's contract, so it stays
exact).  Everything else stays on the route below: entmax with α > 2 or a
per-row tensor α on the CPU, sigmoid/laplace/sparse top-k on the CPU, a
per-row k that is not integral or needs a gradient, and inputs wrapped by
``torch.func`` transforms (vmap, grad, jvp).  One difference: an ignored
row (``ignore_index``) holding NaN scores gets a zero gradient there, NaN
here.  On the eager CPU route the kernel checks the target values itself
(class indices in range, dense rows in the map's domain) in its one pass,
and softk's message is built only when a check fails.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._ops import lean as _lean
from .._backends import dispatch
from .._validate import check_k_rows
from .._backends.native.loss import BadTarget
from ..threshold.families import SOFTMAX, Family
from .._ops.op import apply_rows
from .._ops.potential import value_at
from ..threshold.rows import compute_dtype, finite_max
from . import targets as tg
from .._ops.fused_loss import fused_backend, fused_fenchel_young


def _diff(p: Tensor, y, index) -> Tensor:
    """p − y, with y = e_index for class-index targets."""
    if index is None:
        return p - y
    return p.scatter_add(-1, index, torch.full(index.shape, -1.0, dtype=p.dtype, device=p.device))


class _FenchelYoungValue(torch.autograd.Function):
    """L(x/τ; y) on the last dimension (keepdim) given p = map(x/τ), in p's dtype.

    Exactly one of ``y`` (a dense target shaped like ``x``) and ``index`` (class
    indices shaped ``x.shape[:-1] + (1,)``) is given.  ``alpha``, a tensor α
    per row, replaces ``family`` by that entmax family: it travels as a tensor
    input, not inside the family, so that torch.func transforms unwrap it
    with the other inputs (a wrapped α held by the family broke
    vmap(grad(...)) with an internal assert).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, p: Tensor, y, index, family: Family, tau: float, alpha) -> Tensor:
        if alpha is not None:
            from ..threshold.families import entmax_family

            family = entmax_family(alpha)
        # L is invariant to a per-row shift of z (Φ(z + c) = Φ(z) + ck and
        # ⟨z + c, y⟩ = ⟨z, y⟩ + ck).  Shifting the row max to 0 keeps the terms
        # z_i·p_i of the entries that carry the mass near 0, so their rounding
        # does not scale with |z|.
        z = (x - finite_max(x)) / tau
        phi = value_at(family, z, p)
        if index is None:
            loss = phi - value_at(family, z, y)
        else:
            z_t = z.gather(-1, index)
            loss = phi - (z_t - family.psi(torch.ones_like(z_t)))
        # Exact L is >= 0; only rounding of the two nearly equal terms can make
        # it negative.  A row with NaN/+inf scores has p = NaN, but ψ may read
        # NaN as 0 (sigmoid's x log x does), so say NaN explicitly.
        loss = torch.clamp(loss, min=0.0)
        return torch.where(torch.isnan(p).any(-1, keepdim=True), float("nan"), loss)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, p, y, index, _, tau, _ = inputs
        ctx.save_for_backward(p, y, index)
        ctx.save_for_forward(p, y, index)
        ctx.tau = tau

    @staticmethod
    def backward(ctx, g: Tensor):
        p, y, index = ctx.saved_tensors
        return g * _diff(p, y, index) / ctx.tau, None, None, None, None, None, None


class _FenchelYoungValueJvp(_FenchelYoungValue):
    @staticmethod
    def jvp(ctx, vx, *_):
        p, y, index = ctx.saved_tensors
        return (_diff(p, y, index) * vx).sum(-1, keepdim=True) / ctx.tau


def _tsallis_alpha_term(v: Tensor, a: Tensor) -> Tensor:
    """Σ_i (v_i^α − v_i)/(α(α−1)) on the last dimension: Ω_α(v) up to a
    constant in v (Σv = 1 for both arguments of the loss), written so that it
    is finite at α = 1 (→ Σ v log v) and differentiable in α."""
    am1 = a - 1
    logv = torch.log(torch.where(v > 0, v, 1.0))
    safe = torch.where(am1 == 0, 1.0, am1)
    # at α = 1 the series of expm1(εL)/ε = L + εL²/2 + ε²L³/6: the value and its
    # first two derivatives in α at the limit (ε = α − 1 is 0 there)
    series = v * logv * (1 + am1 * logv * (0.5 + am1 * logv / 6))
    term = torch.where(am1 == 0, series, v * torch.expm1(am1 * logv) / safe)
    return torch.where(v > 0, term, 0.0).sum(-1, keepdim=True) / a


def _tsallis_alpha_partial(v: Tensor, a: Tensor) -> Tensor:
    """∂/∂α of :func:`_tsallis_alpha_term` at fixed v, as tensor code in (v, α).

    With L = log v_i and ε = α − 1, t_i = v_i expm1(εL)/ε has
    ∂t_i/∂α = v_i (εL e^{εL} − expm1(εL))/ε², whose series near εL = 0 is
    v_i (L²/2 + εL³/3 + ε²L⁴/8); then ∂(Σt/α)/∂α = Σ∂t/∂α / α − Σt / α²."""
    am1 = a - 1
    logv = torch.log(torch.where(v > 0, v, 1.0))
    u = am1 * logv
    small = u.abs() < 1e-3
    safe = torch.where(small, 1.0, am1)
    direct = v * (u * torch.exp(u) - torch.expm1(u)) / (safe * safe)
    series = v * logv * logv * (0.5 + u / 3 + u * u / 8)
    dt = torch.where(v > 0, torch.where(small, series, direct), 0.0).sum(-1, keepdim=True)
    return dt / a - _tsallis_alpha_term(v, a) / a


class _AlphaTerm(torch.autograd.Function):
    """Zero in value, with ∂/∂α = ∂Ω_α(y)/∂α − ∂Ω_α(p)/∂α and ∂/∂p = 0.

    The envelope theorem: L's own dependence on α through p vanishes, so the
    first derivatives are (p − y)/τ in x (from the value op) and this in α.
    The α-gradient is tensor code in the saved (live) p and α, so a second
    backward differentiates it: its x-derivative is the Hessian's α-row,
    −∂²Ω/∂p∂α · ∂p/∂x, and its α-derivative includes ∂p/∂α.  The zero
    p-gradient leaves the x-row to the value op alone."""

    generate_vmap_rule = True

    @staticmethod
    def forward(p, y, a):
        return torch.zeros_like(a)

    @staticmethod
    def setup_context(ctx, inputs, output):
        p, y, a = inputs
        ctx.save_for_backward(p, y, a)

    @staticmethod
    def backward(ctx, g):
        p, y, a = ctx.saved_tensors
        return None, None, g * (_tsallis_alpha_partial(y, a) - _tsallis_alpha_partial(p, a))


def _alpha_correction(p: Tensor, y, index, a: Tensor) -> Tensor:
    """Zero in value; its gradient in α is ∂L/∂α = ∂Ω_α(y)/∂α − ∂Ω_α(p)/∂α
    at fixed p (the envelope theorem: Φ_α's own dependence through p vanishes)."""
    if y is None:
        y = torch.zeros_like(p).scatter(-1, index, 1.0)  # out of place: vmap has a batching rule for it
    return _AlphaTerm.apply(p, y, a)


def fenchel_young_rows(x: Tensor, y, index, family: Family, k: int, tau: float) -> Tensor:
    """L(x/τ; y) per row (keepdim) on rows (classes last), in the compute dtype.

    An entmax family with a per-row tensor α (shaped like the rows' first
    dimensions + (1,)) takes p from the tensor-α map and gives α its gradient."""
    xc = x.to(compute_dtype(x.dtype))
    yc = None if y is None else y.to(xc.dtype)
    fn = _FenchelYoungValue if torch.compiler.is_compiling() else _FenchelYoungValueJvp
    if isinstance(family.alpha, Tensor):
        from .._ops.entmax_alpha import entmax_alpha

        a = family.alpha.to(xc.dtype)
        p = entmax_alpha(xc, a, tau)
        loss = fn.apply(xc, p, yc, index, None, tau, torch.where(a == 1, 2.0, a.detach()))
        # ψ of α = 1 rows: the softmax loss's Shannon term (off the CPU always
        # formed and selected: asking whether any row has α = 1 would wait for the device)
        if not a.is_cpu or bool((a == 1).any()):
            loss = torch.where(a.detach() == 1, fn.apply(xc, p, yc, index, SOFTMAX, tau, None), loss)
        return loss + _alpha_correction(p, yc, index, a)
    p = apply_rows(xc, family, k, tau, dispatch.resolve(xc, family))
    return fn.apply(xc, p, yc, index, family, tau, None)


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
    backend = fused_backend(x, family, k)
    eager = backend == "native" and _lean.eager(input, target, k if row_k else None)
    if eager and (by_index or target.dtype == compute_dtype(x.dtype)):  # (the kernel reads rows in it)
        # The kernel checks the target values in its pass; softk's message
        # is built (by the Python checks below) only when one fails.
        try:
            return fused_fenchel_young(x, target if by_index else target.movedim(cdim, -1), family, k, tau,
                                       reduction, ignore_index, backend, eager=True)
        except BadTarget:
            _check_values(input, target, family, k, ignore_index)
            raise
    index, keep, y = _check_values(input, target, family, k, ignore_index)
    if backend is not None:
        t = target if by_index else y
        return fused_fenchel_young(x, t, family, k, tau, reduction, ignore_index, backend)
    if x.numel() == 0:
        loss = x.to(compute_dtype(x.dtype)).sum(-1) * 0
    else:
        loss = fenchel_young_rows(x, y, None if index is None else index.unsqueeze(-1), family, k, tau).squeeze(-1)
    if keep is not None:
        loss = torch.where(keep, loss, 0.0)
    return tg.reduce(loss, keep, reduction).to(input.dtype)


def _check_values(input: Tensor, target: Tensor, family: Family, k, ignore_index: int):
    """The value checks of the target (shapes already checked): (index, keep, None)
    for class indices, (None, None, y with classes last) for a dense target."""
    if not target.is_floating_point():
        index, keep = tg.index_target(input, target, ignore_index)
        return index, keep, None
    row_k = isinstance(k, Tensor)
    y = tg.distribution_target(input, target, k.squeeze(-1) if row_k else k, family.capped)
    return None, None, y.movedim(0 if input.dim() == 1 else 1, -1)
