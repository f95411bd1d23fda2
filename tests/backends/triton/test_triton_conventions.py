r"""Conventions the Triton backend shares with the torch backend (through the
interpreter): the one-sided derivative at the saturation kink of the
capped families, and outputs written in full (NaN-prefilled buffers) on
every path the kernels take — the lane-maxima start and the moved frame of
the looped variant, the anchor form and the log-slope backward.

The kink.  f = min(e^u, 1) (exp) has f′ = 1 on the left of u = 0 and 0 on
the right.  Every backend reads d = f′ off the saved p with
``Family.d_from_p``: d = p where p < 1 and 0 where p = 1, the saturated
side.  So every backend writes p = 1 only where u > 0, and an entry at
u ≤ 0 as at most the largest float below 1 (``Family.written``): an entry
1.5e-9 left of the kink, p = 1 − 3e-9, which rounding to nearest makes 1.0
in float32, takes the left side (d = p) in float32 as in float64.  (It was
read as saturated in float32, where dx then differed from float64's by the
whole of its scale, and the top entry of a k = 1 row whose others lie far
below, which never saturates, zeroed its row's gradient.)  The backends
agree; that is checked here, with the values written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import softk
from softk._backends.triton.function import FAMILY_IDS, backward_rows, forward_rows
from softk._backends.triton.loss import fenchel_young_fused_rows


def _grad(x, g, k, tau, backend):
    xx = x.clone().requires_grad_()
    with softk.use_backend(backend):
        p = softk.soft_topk(xx, k, tau=tau)
        p.backward(g)
    return p.detach(), xx.grad


def test_integer_ties_at_the_kink_match_the_torch_backend_in_float32():
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.integers(-3, 4, size=(6, 9)).astype(np.float32))
    g = torch.tensor(rng.normal(size=(6, 9)).astype(np.float32))
    for k, tau in ((2, 0.05), (3, 0.05), (4, 1.0)):
            pt, dt = _grad(x, g, k, tau, "torch")
            pk, dk = _grad(x, g, k, tau, "triton")
            # the same side of the kink wherever p rounds to 1 (d = 0 there)
            assert torch.equal(pt == 1, pk == 1), (k, tau)
            scale = dt.abs().amax(-1, keepdim=True) + 1e-30
            assert ((dk - dt).abs() <= 4e-6 * scale).all(), (k, tau)


@pytest.mark.parametrize("backend", ["triton", "torch", "native"])
def test_the_sides_of_the_kink_by_hand(backend):
    # exp, k = 3, τ = 0.05 on [2, 0, 1, 3, 2]: the 3 is saturated (u = 20),
    # the two 2's sit 1.5e-9 left of the kink (p = 1 − 3e-9 in float64),
    # written as float32's largest float below 1: d = p there, as for the 0
    # and the 1, and d = 0 on the 3 alone
    x = torch.tensor([[2.0, 0.0, 1.0, 3.0, 2.0]])
    g = torch.tensor([[0.5, 1.0, -2.0, 0.25, 1.5]])
    p, dx = _grad(x, g, 3, 0.05, backend)
    below_one = 1 - np.finfo(np.float32).eps / 2
    assert p[0, [0, 3, 4]].tolist() == [below_one, 1.0, below_one]
    d = np.array([p[0, 0].item(), p[0, 1].item(), p[0, 2].item(), 0.0, p[0, 4].item()])
    gbar = (d * g.numpy()[0]).sum() / d.sum()
    want = d * (g.numpy()[0] - gbar) / 0.05
    # float32 rounding of g − ḡ; 0 exactly on the saturated entry (d = 0)
    tol = 4 * np.finfo(np.float32).eps * d * (np.abs(g.numpy()[0]) + abs(gbar)) / 0.05
    assert np.all(np.abs(dx[0].numpy() - want) <= tol)
    assert dx[0, 3] == 0 and abs(dx[0, 0]) > 9  # (0.5 − 1)/τ and (1.5 − 1)/τ: ±10
    # the float64 map's own gradient, p = 1 − 3e-9 on the 2's
    p64, dx64 = _grad(x.double(), g.double(), 3, 0.05, "torch")
    assert np.allclose(dx[0].numpy(), dx64[0].numpy(), rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("backend", ["triton", "torch", "native"])
@pytest.mark.parametrize("x, k, tau", [([200.0, 400.0, 0.0, 0.0, -200.0], 4, 1.0), ([2.0, 0.0, 0.0, -2.0], 3, 1e-3),
                                       ([2.0, 0.0, 0.0, -2.0] + [-3.0] * 300, 3, 1e-3)])
def test_ties_at_the_kth_place_with_a_gap_below_are_not_saturated(backend, x, k, tau):
    # the tied entries sit just left of the kink (p = 1 − e^{−gap}·…, slope
    # 1): fewer than k entries saturate on a row with more than k.  In
    # float32, Σp = k all along a flat of λ below them, where a search may
    # stop; they are written below 1 and keep the gradient ±½/τ
    xt = torch.tensor([x])
    g = torch.zeros_like(xt)
    g[0, 2] = 1.0
    p, dx = _grad(xt, g, k, tau, backend)
    below_one = 1 - np.finfo(np.float32).eps / 2
    assert p[0, 2].item() == p[0, 1 if x[1] == 0.0 else 3].item() == below_one
    assert (p[0] == 1.0).sum() == k - 2
    tied = [2, 1] if x[1] == 0.0 else [2, 3]
    want = 0.5 / tau
    assert abs(dx[0, tied[0]].item() - want) <= 4e-6 * want and abs(dx[0, tied[1]].item() + want) <= 4e-6 * want

# ------------------------------------------------------ NaN-prefilled outputs
def _nan(like):
    return torch.full_like(like, float("nan"))


@pytest.mark.parametrize("fam, k, alpha", [("exp", 3, 1.5), ("entmax", 1, 4.0), ("entmax", 1, 1.01)])
def test_every_output_is_written(fam, k, alpha):
    # 5 rows of 24 (looped in blocks of 8: lanes, moved frames), normal,
    # offset, an outlier, a masked and a fully masked row (the other
    # families' paths: test_triton_rows.py's prefilled outputs)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 24)) * 2
    x[1] += 1e4
    x[2, 5] = 1e7
    x[3, ::2] = -np.inf
    x[4] = -np.inf
    x = torch.tensor(x, dtype=torch.float32)
    g = torch.tensor(rng.normal(size=(5, 24)), dtype=torch.float32)
    fid = FAMILY_IDS[fam]
    for kw in (dict(onchip=True), dict(onchip=False, block=8)):
        p = forward_rows(x, fid, k, 0.3, alpha, out=_nan(x), **kw)
        dx = backward_rows(p, g, fid, 0.3, alpha, out=_nan(x), **kw)
        assert not torch.isnan(p).any() and not torch.isnan(dx).any(), kw
        assert torch.allclose(p[:4].sum(1), torch.full((4,), float(k)), atol=1e-5)
        assert (p[4] == 0).all() and (dx[4] == 0).all()
        loss, grad = fenchel_young_fused_rows(x[:4], torch.tensor([0, 1, 2, 1]) if k == 1 else p[:4].contiguous(),
                                              torch.ones(1), fid, k, 0.3, alpha, **kw)
        assert torch.isfinite(loss).all() and not torch.isnan(grad).any()
