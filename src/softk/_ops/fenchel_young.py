r"""The Fenchel–Young value's autograd rule: L(x/τ; y) given the map's output p.

With Φ the map's potential (:mod:`softk._ops.potential`) and Ω(y) = Σψ(y_i),

.. math:: L(z; y) = \Phi(z) + \Omega(y) - \langle z, y\rangle, \qquad \nabla_z L = p(z) - y.

p comes from the map's own autograd rule (:mod:`softk._ops.op`) and enters
the value as an input whose partial derivative is 0 (the envelope theorem),
so the gradient is p − y with no second solve and the Hessian is the map's
Jacobian.  A tensor α per row gets ∂Ω_α(y)/∂α − ∂Ω_α(p)/∂α from
:class:`_AlphaTerm`.  :func:`softk.losses.fenchel_young_loss` validates
its arguments and calls :func:`fenchel_young_rows` (or the fused kernel of
:mod:`softk._ops.fused_loss`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import lean as _lean
from .._backends import dispatch
from ..threshold.families import SOFTMAX, Family
from ..threshold.host import readable
from .op import apply_rows
from .potential import value_at
from ..threshold.rows import compute_dtype, finite_max, shift_over_tau


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
        z = shift_over_tau(x, finite_max(x), tau, check=False)
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


def tsallis_alpha_term(v: Tensor, a: Tensor) -> Tensor:
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


def tsallis_alpha_partial(v: Tensor, a: Tensor) -> Tensor:
    """∂/∂α of :func:`tsallis_alpha_term` at fixed v, as tensor code in (v, α).

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
    return dt / a - tsallis_alpha_term(v, a) / a


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
        ctx.save_for_forward(p, y, a)

    @staticmethod
    def backward(ctx, g):
        p, y, a = ctx.saved_tensors
        return None, None, g * (tsallis_alpha_partial(y, a) - tsallis_alpha_partial(p, a))


class _AlphaTermJvp(_AlphaTerm):
    """_AlphaTerm with its forward-mode rule (Dynamo traces no Function with a
    custom jvp: :func:`softk._ops.lean.function` picks)."""

    @staticmethod
    def jvp(ctx, dp, dy, da):
        # the same first derivatives forward: 0 in p and y, ∂L/∂α in α
        p, y, a = ctx.saved_tensors
        if da is None:
            return torch.zeros_like(a)
        return da * (tsallis_alpha_partial(y, a) - tsallis_alpha_partial(p, a))


def _alpha_correction(p: Tensor, y, index, a: Tensor) -> Tensor:
    """Zero in value; its gradient in α is ∂L/∂α = ∂Ω_α(y)/∂α − ∂Ω_α(p)/∂α
    at fixed p (the envelope theorem: Φ_α's own dependence through p vanishes)."""
    if y is None:
        y = torch.zeros_like(p).scatter(-1, index, 1.0)  # out of place: vmap has a batching rule for it
    return _lean.function(_AlphaTermJvp, _AlphaTerm).apply(p, y, a)


def fenchel_young_rows(x: Tensor, y, index, family: Family, k: int, tau: float) -> Tensor:
    """L(x/τ; y) per row (keepdim) on rows (classes last), in the compute dtype.

    An entmax family with a per-row tensor α (shaped like the rows' first
    dimensions + (1,)) takes p from the tensor-α map and gives α its gradient."""
    xc = x.to(compute_dtype(x.dtype))
    yc = None if y is None else y.to(xc.dtype)
    fn = _lean.function(_FenchelYoungValueJvp, _FenchelYoungValue)
    if isinstance(family.alpha, Tensor):
        from .entmax_alpha import entmax_alpha

        a = family.alpha.to(xc.dtype)
        p = entmax_alpha(xc, a, tau)
        loss = fn.apply(xc, p, yc, index, None, tau, torch.where(a == 1, 2.0, a.detach()))
        # ψ of α = 1 rows: the softmax loss's Shannon term (off the CPU, and
        # where α cannot be read, always formed and selected: asking whether
        # any row has α = 1 would wait for the device)
        if not a.is_cpu or not readable(a) or bool((a == 1).any()):
            loss = torch.where(a.detach() == 1, fn.apply(xc, p, yc, index, SOFTMAX, tau, None), loss)
        return loss + _alpha_correction(p, yc, index, a)
    p = apply_rows(xc, family, k, tau, dispatch.pick("threshold", xc, family).backend)  # type: ignore[union-attr]
    return fn.apply(xc, p, yc, index, family, tau, None)
