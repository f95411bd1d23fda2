r"""α-entmax outside [1.125, 2] on the Triton kernels (through the
interpreter): p from the anchor form (softk._backends.triton.anchor) and, for α > 2,
the log-slope backward, at α = 3, 10, 50 and 1e6 and near 1, on chip and
looped, against mpmath (tests/oracle_mp.py) on the rounded float32 input;
the fused loss at α = 10; which α the kernels serve
(softk._backends.triton.function.serves) and the launcher's refusal of the others.

The first Triton kernels had entmax(x, alpha=10) off by 0.065 in p (Σp = 1.06) and a
support-2 row with gradient 0 where the exact value is −2.39: the kernels
formed p = f(z − λ) from a float λ and d = p^(2−α) directly.

Forward tolerance: the anchor form keeps each p_i to its own relative
precision, eps·(β + |log p_i|) per rounding (the torch backend's κ), so
|Δp_i| ≤ 64·eps·(1 + β + |log p_i|)·p_i, zeros exact, |Σp − 1| ≤ 8·n·eps.
Backward: the exact vjp d⊙(g − ḡ)/τ, d = p^(2−α), ḡ = Σdg/Σd, evaluated in
mpmath on the oracle's p; its first-order error from p's relative errors is
at most (α − 2)·δ·d_i·Σ_j w_j(|g_i| + |g_j|)/τ with w = d/Σd and δ the
relative error of p (the bound above, with 1 + max|log p|): allowed 16×.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

import softk
from softk._backends import dispatch
from softk._backends.triton.function import ALPHA_MAX, FAMILY_IDS, backward_rows, forward_rows, serves
from softk._backends.triton.loss import fenchel_young_fused_rows

from ...oracle import losses as oracle_losses, mp as oracle_mp

EPS = float(np.finfo(np.float32).eps)
ENT = FAMILY_IDS["entmax"]
VARIANTS = (dict(onchip=True), dict(onchip=False, block=8))


def _rows(n=20):
    rng = np.random.default_rng(3)
    r = [rng.normal(size=n), rng.normal(size=n) + 1e4]
    two = np.full(n, -3.0) - rng.random(n)
    two[[2, 7]] = [0.0, -0.05]  # support 2 at α = 10
    r.append(two)
    ties = rng.normal(size=n) - 2
    ties[[1, 5, 9]] = 1.0  # three-way tie at the top
    r.append(ties)
    return np.stack(r).astype(np.float32)


ROWS = _rows()


def _oracle(x, alpha, tau):
    if alpha >= 1e6:
        # mpmath at 400 bits cannot resolve w = p^(α−1) = 3^-1e6 (a tie at the
        # top); the exact answer there is uniform on the row's maximum, since
        # every other entry is 1e-3 or more below it (a gap g leaves the
        # support once (α−1)·g/τ ≥ w_max, which is ≤ 1)
        top = x.max(1, keepdims=True)
        gap = np.sort(x, axis=1)[:, ::-1]
        assert all(((r[r < t] <= t - 1e-3).all()) for r, t in zip(gap, top[:, 0]))
        on = x == top
        return on / on.sum(1, keepdims=True)
    return np.stack([oracle_mp.threshold_row("entmax", r.astype(np.float64), 1, tau=tau, alpha=alpha) for r in x])


def _check_p(p, ref, alpha):
    beta = 1.0 / (alpha - 1.0)
    with np.errstate(divide="ignore"):
        logp = np.where(ref > 0, np.abs(np.log(np.where(ref > 0, ref, 1.0))), 0.0)
    tol = 64 * EPS * (1 + beta + logp) * ref
    bad = ~(np.abs(p - ref) <= tol)
    assert not bad.any(), (alpha, p[bad], ref[bad])
    assert np.all(np.abs(p.sum(1) - 1) <= 8 * p.shape[1] * EPS)


def _vjp_reference(ref, g, alpha, tau):
    """(dx, its tolerance) from the oracle's p, in mpmath (module docstring)."""
    dx, tol = np.zeros_like(ref), np.zeros_like(ref)
    with mp.workdps(60):
        for i, (prow, grow) in enumerate(zip(ref, g)):
            sup = [j for j in range(len(prow)) if prow[j] > 0]
            d = {j: mp.mpf(prow[j]) ** (2 - mp.mpf(alpha)) for j in sup}
            sd = mp.fsum(d.values())
            gbar = mp.fsum(d[j] * grow[j] for j in sup) / sd
            L = max(abs(math.log(prow[j])) for j in sup)
            for j in sup:
                dx[i, j] = float(d[j] * (grow[j] - gbar) / tau)
                spread = mp.fsum(d[m] * (abs(grow[j]) + abs(grow[m])) for m in sup) / sd
                tol[i, j] = float(16 * (alpha - 1) * 64 * EPS * (1 + L) * d[j] * spread / tau)
    return dx, tol


@pytest.mark.parametrize("alpha", [3.0, 10.0, 50.0, 1e6])
def test_large_alpha_forward_and_backward_are_exact(alpha):
    tau = 0.5
    x = torch.from_numpy(ROWS)
    ref = _oracle(ROWS, alpha, tau)
    g = np.random.default_rng(4).normal(size=ROWS.shape)
    for kw in VARIANTS:
        p = forward_rows(x, ENT, 1, tau, alpha, out=torch.full_like(x, float("nan")), **kw)
        _check_p(p.double().numpy(), ref, alpha)
        dx = backward_rows(p, torch.tensor(g, dtype=torch.float32), ENT, tau, alpha,
                           out=torch.full_like(x, float("nan")), **kw).double().numpy()
        if alpha == 1e6:
            # the support is the argmax (a tie on row 3, where the exact
            # Jacobian, p^(2−α) ≈ 3^1e6, is beyond any float): dx = 0 elsewhere
            assert (ref[:3].max(1) == 1).all() and np.all(dx[:3] == 0)
            continue
        want, tol = _vjp_reference(ref, g, alpha, tau)
        bad = ~(np.abs(dx - want) <= tol)
        assert not bad.any(), (alpha, kw, dx[bad], want[bad], tol[bad])
    if alpha == 10.0:  # the support-2 row: a gradient of 0 there before
        assert np.count_nonzero(ref[2]) == 2 and np.abs(want[2]).max() > 1


def test_alpha_near_one_is_exact():
    # β = 1/(α − 1) = 1e4 multiplies the rounding of w in p = w^β: the anchor
    # form keeps p (float32 α = 1.0001 took zeros(5) to 0.2001 each on the
    # torch backend before its anchor)
    x = np.concatenate([ROWS[:2], np.zeros((1, ROWS.shape[1]), np.float32)])
    for alpha in (1.0001, 1.05):
        ref = _oracle(x, alpha, 1.0)
        for kw in VARIANTS:
            p = forward_rows(torch.from_numpy(x), ENT, 1, 1.0, alpha, out=torch.full((3, x.shape[1]), float("nan")), **kw)
            _check_p(p.double().numpy(), ref, alpha)


def test_fused_loss_at_large_alpha_matches_oracle():
    # the fused Fenchel–Young loss kernel takes the same anchor form
    alpha, tau = 10.0, 0.5
    xn = ROWS[:3].astype(np.float64)
    t = np.array([2, 0, 7])
    y = np.eye(xn.shape[1])[t]
    want = oracle_losses.fy_loss("entmax", xn, y, tau=tau, alpha=alpha)
    p = _oracle(ROWS[:3], alpha, tau)
    for kw in VARIANTS:
        loss, grad = fenchel_young_fused_rows(torch.from_numpy(ROWS[:3]), torch.tensor(t), torch.ones(1),
                                              ENT, 1, tau, alpha, **kw)
        np.testing.assert_allclose(loss.double().numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(grad.double().numpy(), (p - y) / tau, rtol=0, atol=1e-6)


def test_which_alpha_the_kernels_serve():
    assert all(serves(i, 1.5) for i in FAMILY_IDS.values())
    assert serves(ENT, 1.0001) and serves(ENT, 3.0) and serves(ENT, 1e6) and serves(ENT, ALPHA_MAX)
    for alpha in (1.0, 0.5, 2 * ALPHA_MAX, float("inf"), float("nan")):
        assert not serves(ENT, alpha)
        with pytest.raises(ValueError, match="alpha"):
            forward_rows(torch.zeros(1, 4), ENT, 1, 1.0, alpha)
    assert not serves(99, 1.5)


def test_public_entmax_on_triton_at_alpha_10():
    # through softk.entmax on the "triton" backend, forward and backward
    x = torch.from_numpy(ROWS[2:3].copy()).requires_grad_()
    with softk.use_backend("triton"):
        p = softk.entmax(x, alpha=10.0)
        p[0, 2].backward()
    ref = _oracle(ROWS[2:3], 10.0, 1.0)
    _check_p(p.detach().double().numpy(), ref, 10.0)
    want, tol = _vjp_reference(ref, np.eye(ROWS.shape[1])[2:3], 10.0, 1.0)
    assert np.all(np.abs(x.grad.double().numpy() - want) <= tol) and np.abs(want).max() > 1


def test_dispatch_sends_an_alpha_the_kernels_cannot_serve_to_torch():
    # the "triton" setting keeps what serves() takes and routes the rest, never a wrong result
    x = torch.from_numpy(ROWS[2:3].copy())
    with softk.use_backend("triton"):
        assert dispatch.pick("threshold", x, softk.families.entmax(10.0)).backend == "triton"
        assert dispatch.pick("threshold", x, softk.families.entmax(2 * ALPHA_MAX)).backend == "torch"
        assert dispatch.pick("threshold", x.double(), softk.families.entmax(10.0)).backend == "torch"  # float64: the torch path
        p = softk.entmax(x, alpha=2 * ALPHA_MAX)
    with softk.use_backend("torch"):
        assert torch.equal(p, softk.entmax(x, alpha=2 * ALPHA_MAX))
