r"""The TS² loss: train with sparsemax plus a penalty on the softmax mass off its support, test with softmax.

Xu et al. (ICLR 2026), "Training with Sparsemax+, Testing with Softmax",
fine-tune language models with the sparsemax loss, whose gradient is zero
outside the sparsemax support, and add a term that pushes down the softmax
probability the model gives to the classes sparsemax has ruled out, so that
the softmax of the trained logits (used at test time) is calibrated too.  In
softk's conventions (the paper's temperature T is 1/τ here), for one row z
with target class y,

.. math:: p = \operatorname{sparsemax}(z/\tau),\quad s = \operatorname{softmax}(z),\quad
          m = \sum_{j:\ p_j = 0,\ j \ne y} s_j,

.. math:: L = L_{\text{sparsemax}}(z/\tau;\, y) + a\,\bigl(-\log(1 - \min(0.99,\ m))\bigr),

with a the ``suppression``.  The clamp at 0.99 (the authors') bounds the
penalty by log 100 and stops its gradient on rows whose off-support mass is
above 0.99.  With ``adaptive`` the penalty is weighted by 1 − p_y, p_y
detached (the authors' ``ts2_adaptive``): a row that sparsemax already fits
(p_y = 1) pays no penalty.  The support mask {p_j = 0} is a constant of the
gradient (it is piecewise constant in z).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from .. import _dtensor
from .._validate import reduce
from .._maps.simplex import sparsemax
from . import targets as tg
from ..threshold.families import SPARSEMAX
from ._one_pass import exp_, support_rows
from .simplex_losses import sparsemax_loss

CLAMP = 0.99
GATHER_ON_CPU = True  # ts2_in_place's support entries gathered on the CPU (False: the device's dense form)


def check_suppression(suppression) -> float:
    """TS²'s weight a of the penalty: a finite number >= 0."""
    if isinstance(suppression, bool) or not isinstance(suppression, numbers.Real):
        raise TypeError(f"suppression must be a number >= 0, got {type(suppression).__name__}")
    a = float(suppression)
    if not (a >= 0 and a < float("inf")):
        raise ValueError(f"suppression must be a finite number >= 0, got {suppression!r}")
    return a


def ts2_rows(z: Tensor, t: Tensor, keep: Tensor, suppression: float, tau: float, adaptive: bool) -> Tensor:
    """TS²'s loss per row of z (M, V) in a float compute dtype, t (M,) valid
    indices (0 at ignored rows), keep (M,) the rows that count (0 elsewhere)."""
    fit = sparsemax_loss(z, torch.where(keep, t, -100), -100, "none", tau)
    with torch.no_grad():  # (detached too: no_grad stops reverse mode, not forward-mode tangents)
        p = sparsemax((z / tau if tau != 1.0 else z).detach())
        off = (p == 0) & (z > float("-inf"))  # masked classes have no softmax mass either
        off.scatter_(-1, t.unsqueeze(-1), False)
        py = p.gather(-1, t.unsqueeze(-1)).squeeze(-1)
    # ignored rows add no penalty: their scores are left out of it, so that
    # one with no finite score (a padding row masked with −inf) cannot send
    # log_softmax's NaN into the gradient
    logp = torch.log_softmax(torch.where(keep.unsqueeze(-1), z, 0.0), -1)
    # m = Σ_{off} s_j, a sum of non-negative terms (no cancellation); summed
    # directly rather than as exp(logsumexp), whose gradient is NaN on a row
    # with no off-support class left (every other class masked)
    m = torch.where(off, logp.exp(), 0.0).sum(-1)
    penalty = -torch.log1p(-torch.clamp(m, max=CLAMP))
    if adaptive:
        penalty = penalty * (1 - py)
    return fit + torch.where(keep, suppression * penalty, 0.0)


def ts2_in_place(ignore_index: int, tau: float, suppression: float, adaptive: bool):
    r"""TS²'s rows and gradient in one pass over a chunk's logits, for the fused
    loss: ``f(z, t, w) -> rows`` overwrites z (C, V), float32/float64, with
    G = w·∂L/∂z (0 on ignored rows), the gradient of Σ w_i L_i.  With the
    support mask constant, ∂m/∂z = s ⊙ 1_off − m·s, so

    .. math:: G_j = a\,c\,s_j\,(1 - m) \ (j \text{ off}), \qquad
              G_j = -a\,c\,s_j\,m + (p_j - [j = y])/\tau \ (j \in \operatorname{supp} p \cup \{y\}),

    c = [m ≤ 0.99]·(1 − p_y if adaptive, else 1)/(1 − m): one scaling of the
    softmax s over the row, then a write of the few support entries.  The
    sparsemax loss at z/τ is Σ_supp p_j (z_j − z_y)/τ + ½(1 − ‖p‖²) (Σp = 1;
    differences to z_y keep far-from-origin logits exact) and m is Σ s
    minus the mass on the support and the target.  Beside the logits it holds
    p and, on the CPU, O(support) numbers (elsewhere the same sums run as
    dense masked sums, with no wait for the device): no autograd graph."""

    def f(z, t, w):
        idx, keep = tg.index_target(z, t, ignore_index)
        idx1 = idx.unsqueeze(1)
        p = sparsemax(z, tau=tau) if tau != 1.0 else sparsemax(z)
        py = p.gather(1, idx1).squeeze(1)
        zy = z.gather(1, idx1).squeeze(1)
        zero = torch.zeros_like(zy)
        # on the CPU the support's entries are gathered; elsewhere dense masked
        # sums (nonzero() would wait for the device)
        sup = p.nonzero(as_tuple=True) if z.is_cpu and GATHER_ON_CPU else None
        if sup is not None:
            r, j = sup
            pj = p[r, j]
            fit = support_rows(z, zy, p, r, j, tau, SPARSEMAX.psi)
        else:  # the same sum, dense: ψ(t) = t²/2
            lin = (p * (z - zy.unsqueeze(1))).sum(1)
            fit = torch.clamp(lin / tau + 0.5 * (1 - (p * p).sum(1)), min=0.0)
        torch.log_softmax(z, 1, out=z)
        exp_(z)  # s = softmax(z)
        sy = z.gather(1, idx1).squeeze(1)
        if sup is not None:
            sj = z[r, j]
            on = zero.index_add(0, r, sj)
        else:
            on = torch.where(p > 0, z, 0.0).sum(1)
        on = on + torch.where(py == 0, sy, 0.0)  # the mass on supp p ∪ {y}
        m = torch.clamp(z.sum(1) - on, min=0.0)
        weight = 1.0 - py if adaptive else torch.ones_like(m)
        mc = torch.clamp(m, max=CLAMP)
        rows = torch.where(keep, fit - suppression * torch.log1p(-mc) * weight, 0.0)
        c = torch.where(m <= CLAMP, suppression * weight / (1 - mc), 0.0)
        scale = torch.where(keep, w.to(z.dtype) if w is not None else torch.ones_like(m), 0.0)
        off, on_sup = c * (1 - m) * scale, -c * m * scale  # G/s off the support and on it
        if sup is not None:
            z.mul_(off.unsqueeze(1))  # every class as if off the support
            z[r, j] = sj * on_sup[r] + pj * (scale[r] / tau)
        else:
            z.mul_(torch.where(p > 0, on_sup.unsqueeze(1), off.unsqueeze(1))).add_(p * (scale / tau).unsqueeze(1))
        z[torch.arange(z.shape[0], device=z.device), idx] = sy * on_sup + (py - 1) * (scale / tau)
        return rows

    return f


@_dtensor.entry("loss", "ts2_loss")
def ts2_loss(
    input: Tensor,
    target: Tensor,
    *,
    suppression: float = 1.0,
    tau: float = 1.0,
    adaptive: bool = False,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
    r"""TS² (Xu et al., ICLR 2026): the sparsemax loss at z/τ plus ``suppression`` × −log(1 − min(0.99, m)).

    m is the softmax mass of z on the classes outside sparsemax(z/τ)'s support,
    the target excepted (see the module's formula); ``adaptive`` weights that
    term by 1 − p_y (p_y detached).

    Args:
        input: scores (N, C, d1, ...) with classes on dim 1, or (C,).
        target: class indices shaped like ``input`` without dim 1 (TS² is
            defined for class-index targets only).
        suppression: the penalty's weight a >= 0 (0 gives the sparsemax loss).
        tau: temperature > 0 of the sparsemax term (the paper's T is 1/τ);
            the softmax term takes the scores as they are.
        adaptive: weight the penalty by 1 − p_y, p_y detached.
        ignore_index: class index whose rows give 0 and are left out of "mean".
        reduction: "mean", "sum" or "none".

    Returns the loss (a 0-d tensor, or ``target``'s shape for "none") in
    ``input``'s dtype (computed in float32 for half inputs).

    >>> import torch
    >>> z, y = torch.tensor([[3.0, 0.0, 2.5, -1.0]]), torch.tensor([0])
    >>> p = torch.tensor([[0.75, 0.0, 0.25, 0.0]])  # sparsemax(z): classes 1 and 3 are off its support
    >>> s = torch.softmax(z, -1)
    >>> ref = sparsemax_loss(z, y) - torch.log(1 - (s[0, 1] + s[0, 3]))
    >>> bool(torch.isclose(ts2_loss(z, y), ref))
    True
    >>> bool(torch.isclose(ts2_loss(z, y, suppression=0.0), sparsemax_loss(z, y)))
    True
    """
    tau, reduction, ignore_index = tg.check_loss_args(input, target, tau, reduction, ignore_index, accepts="index")
    if target.is_floating_point():
        raise TypeError(f"ts2_loss takes class-index targets only, got a {target.dtype} target")
    a = check_suppression(suppression)
    if not isinstance(adaptive, bool):
        raise TypeError(f"adaptive must be a bool, got {type(adaptive).__name__}")
    index, keep = tg.index_target(input, target, ignore_index)
    cdim = tg.class_dim(input)
    dtype = input.dtype
    ct = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    z = input.to(ct).movedim(cdim, -1)
    lead = z.shape[:-1]
    z = z.reshape(-1, z.shape[-1])
    rows = ts2_rows(z, index.reshape(-1), keep.reshape(-1), a, tau, adaptive).reshape(lead)
    return reduce(rows, keep, reduction).to(dtype)
