"""softk.compat.entmax.losses does what entmax's loss tests check — values,
non-negativity, gradcheck of every loss module under each reduction with and
without ignore_index, the ignored index lowering the sum — with entmax's
_GenericLoss semantics (not torch's) checked exactly, against NumPy float64
references."""

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import softk.compat.entmax as entmax

from ..oracle import losses as oracle_losses, normmax as oracle_normmax
from .test_entmax import dense_entmax_row

LOSSES = [entmax.SparsemaxLoss, lambda **kw: entmax.SparsemaxLoss(k=5, **kw), entmax.Entmax15Loss,
          entmax.SparsemaxBisectLoss, entmax.EntmaxBisectLoss, entmax.NormmaxBisectLoss,
          lambda **kw: entmax.EntmaxBisectLoss(alpha=0.6, **kw)]


def _data(rng, n=4, c=6):
    X = torch.tensor(rng.normal(size=(n, c)), requires_grad=True)
    return X, torch.tensor(rng.integers(0, c, size=n))


def _dense_loss_row(z, t, alpha):
    p = dense_entmax_row(z, alpha)
    omega = lambda v: (np.sum(v**alpha) - 1) / (alpha * (alpha - 1))  # noqa: E731
    return z @ p - omega(p) + omega(np.eye(z.size)[t]) - z[t]


def test_functional_values_match_references(rng):
    X, y = _data(rng)
    x, t = X.detach().numpy(), y.numpy()
    onehot = np.eye(6)[t]
    cases = [
        (entmax.sparsemax_loss(X, y), oracle_losses.fy_loss("sparsemax", x, onehot)),
        (entmax.sparsemax_bisect_loss(X, y), oracle_losses.fy_loss("sparsemax", x, onehot)),
        (entmax.entmax15_loss(X, y, k=2), oracle_losses.fy_loss("entmax", x, onehot, alpha=1.5)),
        (entmax.entmax_bisect_loss(X, y, 2.5), oracle_losses.fy_loss("entmax", x, onehot, alpha=2.5)),
        (entmax.entmax_bisect_loss(X, y, 1.0), oracle_losses.fy_loss("softmax", x, onehot)),
        (entmax.entmax_bisect_loss(X, y, 0.4), [_dense_loss_row(x[i], t[i], 0.4) for i in range(4)]),
        (entmax.normmax_bisect_loss(X, y, 3), [oracle_normmax.normmax_loss_row(x[i], onehot[i], 3.0) for i in range(4)]),
    ]
    for got, ref in cases:
        assert got.shape == (4,)
        np.testing.assert_allclose(got.detach().numpy(), ref, atol=1e-12)
    # normmax with α <= 1: the argmax's loss, max x − x_y
    np.testing.assert_allclose(entmax.normmax_bisect_loss(X, y, 0.5).detach().numpy(), x.max(1) - x[np.arange(4), t],
                               atol=1e-12)


@pytest.mark.parametrize("make", LOSSES)
def test_non_negative_and_gradients_under_every_reduction(rng, make):
    X, y = _data(rng)
    assert (make(reduction="none")(X, y) >= 0).all()
    for ignore in (False, True):
        for reduction in ("sum", "elementwise_mean"):
            loss = make(ignore_index=y[0] if ignore else -100, reduction=reduction)  # a 0-d tensor, as entmax's tests pass
            assert gradcheck(loss, (X, y))


def test_reduction_and_ignore_index_semantics(rng):
    X, y = _data(rng, n=6)
    per = entmax.sparsemax_loss(X, y).detach()
    ignore = int(y[2])
    kept = y != ignore
    summed = entmax.SparsemaxLoss(ignore_index=ignore, reduction="sum")(X, y)
    torch.testing.assert_close(summed, per[kept].sum())
    mean = entmax.SparsemaxLoss(ignore_index=ignore)(X, y)  # "elementwise_mean": over the kept rows
    torch.testing.assert_close(mean, per[kept].sum() / kept.sum())
    none = entmax.SparsemaxLoss(ignore_index=ignore, reduction="none")(X, y)
    torch.testing.assert_close(none, torch.where(kept, per, 0.0))
    assert entmax.SparsemaxLoss(ignore_index=ignore, reduction="sum")(X, y) < entmax.SparsemaxLoss(reduction="sum")(X, y)
    # a negative ignore_index ignores nothing (entmax), unlike torch's -100 default
    torch.testing.assert_close(entmax.SparsemaxLoss(ignore_index=-1)(X, y), per.mean())
    # the gradient of ignored rows is 0; of the others p − e_y over the kept count
    (g,) = torch.autograd.grad(mean, X)
    p = entmax.sparsemax(X.detach())
    expected = (p - torch.nn.functional.one_hot(y, 6).double()) * kept[:, None] / kept.sum()
    torch.testing.assert_close(g, expected, atol=1e-15, rtol=0)
    # ignored rows may hold an index that is no class; every row ignored: the mean is 0/0
    padded = torch.where(kept, y, 6)
    torch.testing.assert_close(entmax.SparsemaxLoss(ignore_index=6)(X, padded), mean)
    assert torch.isnan(entmax.SparsemaxLoss(ignore_index=3)(X, torch.full((6,), 3)))


def test_return_support_size(rng):
    X, y = _data(rng)
    loss, support = entmax.SparsemaxLoss(reduction="sum", return_support_size=True)(X, y)
    assert support.shape == (4, 1) and torch.equal(support, (entmax.sparsemax(X) > 0).sum(1, keepdim=True))
    torch.testing.assert_close(loss, entmax.sparsemax_loss(X, y).sum())
    per, s15 = entmax.entmax15_loss(X, y, return_support_size=True)
    assert per.shape == (4,) and torch.equal(s15, (entmax.entmax15(X) > 0).sum(1, keepdim=True))


def test_alpha_gradients_and_second_derivatives(rng):
    X, y = _data(rng, n=3, c=4)
    alpha = torch.tensor([[0.5], [1.2], [1.8]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u, a: entmax.entmax_bisect_loss(u, y, a), (X, alpha))
    below = torch.tensor([[0.3], [0.6], [0.9]], dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda u, a: entmax.entmax_bisect_loss(u, y, a), (X, below))
    assert gradgradcheck(lambda u, a: entmax.normmax_bisect_loss(u, y, a), (X, below + 1))
    a2 = torch.tensor([[1.5], [2.0], [4.0]], dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda u, a: entmax.normmax_bisect_loss(u, y, a), (X, a2))
    module = entmax.EntmaxBisectLoss(alpha=torch.nn.Parameter(torch.tensor(1.3, dtype=torch.float64)))
    module(X, y).backward()
    assert module.alpha.grad is not None and torch.isfinite(module.alpha.grad)


def test_alpha_gradient_at_exactly_one_is_the_limit(rng):
    X, y = _data(rng, n=1, c=4)
    a = torch.tensor([[1.0]], dtype=torch.float64, requires_grad=True)
    entmax.entmax_bisect_loss(X.detach(), y, a).backward()
    # the one-sided second-order difference on α >= 1 (softk.losses.entmax_loss's
    # own domain; below 1 the compat layer's dense map is a different code path)
    h = 1e-4
    f = [entmax.entmax_bisect_loss(X, y, 1 + j * h).item() for j in range(3)]
    one_sided = (-3 * f[0] + 4 * f[1] - f[2]) / (2 * h)
    np.testing.assert_allclose(a.grad.item(), one_sided, atol=1e-6)


def test_mixed_second_derivative_above_one(rng):
    X, y = _data(rng, n=2, c=4)
    alpha = torch.tensor([[1.2], [1.8]], dtype=torch.float64, requires_grad=True)
    assert gradgradcheck(lambda u, a: entmax.entmax_bisect_loss(u, y, a), (X, alpha))


def test_errors_keep_entmax_types():
    X, y = torch.randn(3, 4), torch.tensor([0, 1, 2])
    with pytest.raises(AssertionError, match="elementwise_mean") as err:
        entmax.SparsemaxLoss(reduction="mean")
    assert isinstance(err.value, ValueError)
    with pytest.raises(AssertionError, match="rows") as err:
        entmax.sparsemax_loss(X, torch.tensor([0, 1]))
    assert isinstance(err.value, ValueError)
    with pytest.raises(RuntimeError, match="class index 4") as err:
        entmax.entmax15_loss(X, torch.tensor([0, 1, 4]))
    assert isinstance(err.value, ValueError)
    with pytest.raises(RuntimeError, match="class index -100"):
        entmax.SparsemaxLoss()(X, torch.tensor([0, -100, 1]))  # -100 ignores nothing in entmax
    # entmax asserts the batch sizes first, then its scatter along dim 1 fails
    with pytest.raises(AssertionError, match="rows") as err:
        entmax.sparsemax_loss(X[0], y[:1])
    assert isinstance(err.value, ValueError)
    with pytest.raises(IndexError, match="2-D") as err:
        entmax.sparsemax_loss(X[:, 0], y)
    assert isinstance(err.value, ValueError)
    with pytest.raises(RuntimeError, match="2-D"):
        entmax.entmax15_loss(X[..., None], y)
    with pytest.raises(IndexError, match="0-d") as err:
        entmax.SparsemaxLoss()(X, y[0])
    assert isinstance(err.value, ValueError)
    with pytest.raises(RuntimeError, match="1-D"):
        entmax.normmax_bisect_loss(X, y[:, None])
    with pytest.raises(AttributeError, match="torch.Tensor") as err:
        entmax.sparsemax_loss(X, [0, 1, 2])
    assert isinstance(err.value, TypeError)
    with pytest.raises(RuntimeError, match="integer"):
        entmax.sparsemax_loss(X, y.float())
    with pytest.raises(ValueError, match="alpha"):
        entmax.EntmaxBisectLoss(alpha=-1.0)
    with pytest.raises(TypeError, match="ignore_index"):
        entmax.NormmaxBisectLoss(ignore_index=1.5)
