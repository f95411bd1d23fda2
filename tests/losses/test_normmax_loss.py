"""The Fenchel–Young loss of α-normmax (softk.losses.normmax_loss) against
the NumPy oracle: values, gradient p − y, second derivatives in x and α,
targets, ignore_index, reductions, masks."""

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from softk.losses import normmax_loss
from softk import normmax

from ..oracle import normmax as on


def _t(a, dtype=torch.float64, grad=False):
    return torch.tensor(np.asarray(a), dtype=dtype, requires_grad=grad)


@pytest.mark.parametrize("alpha", [1.3, 2.0, 6.0])
def test_value_matches_oracle_index_and_dense_targets(rng, alpha):
    x = rng.normal(size=(5, 6)) * 2
    t = rng.integers(0, 6, size=5)
    eye = np.eye(6)
    ref = np.array([on.normmax_loss_row(x[i], eye[t[i]], alpha) for i in range(5)])
    np.testing.assert_allclose(normmax_loss(_t(x), torch.tensor(t), alpha, reduction="none").numpy(), ref, atol=1e-12)
    y = rng.dirichlet(np.ones(6), size=5)
    ref_y = np.array([on.normmax_loss_row(x[i], y[i], alpha) for i in range(5)])
    np.testing.assert_allclose(normmax_loss(_t(x), _t(y), alpha, reduction="none").numpy(), ref_y, atol=1e-12)
    assert (ref_y >= 0).all()


def test_zero_exactly_at_the_target_and_hand_value():
    assert normmax_loss(torch.tensor([[0.0, 1.0, 3.0]]), torch.tensor([2])).item() == 0.0
    x = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    assert abs(normmax_loss(x, torch.tensor([0])).item() - (1 - 0.5**0.5)) < 1e-15  # 1 − ||(½, ½)||₂
    # y = p(x) gives 0: the Fenchel–Young equality case
    z = torch.randn(3, 5, dtype=torch.float64)
    assert normmax_loss(z, normmax(z, 1.8, dim=1), 1.8, reduction="none").abs().max() < 1e-12


def test_gradient_is_p_minus_y_and_second_derivatives(rng):
    x = _t(rng.normal(size=(4, 5)), grad=True)
    t = torch.tensor(rng.integers(0, 5, size=4))
    loss = normmax_loss(x, t, 2.5, reduction="sum")
    (g,) = torch.autograd.grad(loss, x)
    expected = normmax(x.detach(), 2.5, dim=1) - torch.nn.functional.one_hot(t, 5).double()
    torch.testing.assert_close(g, expected, atol=1e-14, rtol=0)
    x, t = x[:3, :4].detach().requires_grad_(), t[:3].clamp(max=3)
    alpha = _t(1.2 + 3 * rng.random(size=(3, 1)), grad=True)
    f = lambda u, a: normmax_loss(u, t, a, reduction="none")  # noqa: E731
    assert gradcheck(f, (x, alpha), check_forward_ad=True)
    assert gradgradcheck(f, (x, alpha))  # Hessian = the map's Jacobian; mixed terms = ∂p/∂α
    y = _t(rng.dirichlet(np.ones(4), size=3))
    assert gradgradcheck(lambda u: normmax_loss(u, y, 3.0, tau=0.5), (x,))


def test_alpha_gradient_matches_oracle_difference(rng):
    z = rng.normal(size=5)
    y = rng.dirichlet(np.ones(5))
    alpha, h = 2.3, 1e-6
    a = _t(alpha, grad=True)
    normmax_loss(_t(z[None]), _t(y[None]), a).backward()
    num = (on.normmax_loss_row(z, y, alpha + h) - on.normmax_loss_row(z, y, alpha - h)) / (2 * h)
    np.testing.assert_allclose(a.grad.item(), num, atol=1e-7)


def test_ignore_index_reductions_and_layout(rng):
    x = _t(rng.normal(size=(6, 4, 3)))  # (N, C, d1): classes on dim 1
    t = torch.tensor(rng.integers(0, 4, size=(6, 3)))
    t[0, 1] = -100
    per = normmax_loss(x, t, reduction="none")
    assert per.shape == (6, 3) and per[0, 1] == 0
    rows = x.movedim(1, -1).reshape(-1, 4).numpy()
    ref = np.array([0.0 if ti == -100 else on.normmax_loss_row(r, np.eye(4)[ti], 2.0)
                    for r, ti in zip(rows, t.reshape(-1).tolist())]).reshape(6, 3)
    np.testing.assert_allclose(per.numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(normmax_loss(x, t, reduction="sum").item(), ref.sum(), atol=1e-11)
    np.testing.assert_allclose(normmax_loss(x, t).item(), ref.sum() / 17, atol=1e-12)  # mean over kept
    one = normmax_loss(x[0, :, 0], t[0, 0])  # a single (C,) row and a 0-d target
    np.testing.assert_allclose(one.item(), ref[0, 0], atol=1e-12)


def test_masked_classes_and_half_precision():
    inf = float("inf")
    x = torch.tensor([[0.0, -inf, 1.0], [0.0, -inf, 1.0]], dtype=torch.float64)
    loss = normmax_loss(x, torch.tensor([2, 1]), reduction="none")
    assert torch.isfinite(loss[0]) and loss[1] == inf  # a target on a masked class costs +inf
    np.testing.assert_allclose(loss[0].item(), on.normmax_loss_row(np.array([0.0, 1.0]), np.array([0.0, 1.0]), 2.0))
    h = torch.tensor([[0.5, 1.0, -1.0]], dtype=torch.float16)
    assert normmax_loss(h, torch.tensor([1])).dtype == torch.float16


def test_bad_arguments():
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="alpha"):
        normmax_loss(x, torch.tensor([0, 1, 2]), alpha=0.5)
    with pytest.raises(ValueError, match="target"):
        normmax_loss(x, torch.tensor([0, 1, 4]))
    with pytest.raises(ValueError, match="reduction"):
        normmax_loss(x, torch.tensor([0, 1, 2]), reduction="avg")
    with pytest.raises(ValueError, match="sum"):
        normmax_loss(x, torch.ones(3, 4))  # rows must be distributions
    with pytest.raises(ValueError, match="grad"):
        normmax_loss(x, torch.softmax(torch.randn(3, 4, requires_grad=True), 1))
