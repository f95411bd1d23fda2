"""A per-row budget k (a tensor) for soft_topk, topk_sum and soft_topk_loss,
against the NumPy float64 oracle row by row; its derivative ∂p/∂k = d/Σd
against central differences of the oracle in k."""

import numpy as np
import pytest
import torch

import softk

from ..oracle import maps as oracle, topk as oracle_topk

pytestmark = pytest.mark.usefixtures("each_cpu_backend")
METHODS = ["exp", "sigmoid", "laplace", "sparse"]


def _rows(rng):
    x = rng.normal(size=(5, 9)) * 2
    x[3, :6] = -np.inf  # 3 finite entries, below the budget 4.5: the row convention
    k = np.array([1.0, 2.5, 7.25, 4.5, 3.0])
    return x, k


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_oracle_row_by_row(rng, method, dtype):
    x, k = _rows(rng)
    xt = torch.tensor(x, dtype=dtype)
    p = softk.soft_topk(xt, torch.tensor(k)[:, None], method=method)
    xr = xt.double().numpy()
    ref = np.stack([oracle.soft_topk(xr[i], k[i], method=method) for i in range(len(k))])
    tol = 1e-12 if dtype == torch.float64 else 4e-6
    np.testing.assert_allclose(p.double().numpy(), ref, atol=tol)
    np.testing.assert_allclose(p.double().sum(-1).numpy(), np.minimum(k, np.isfinite(x).sum(-1)), atol=8 * tol)


def test_any_dim_and_broadcast(rng):
    x = torch.tensor(rng.normal(size=(3, 7, 2)))
    k = torch.tensor([1.5, 3.0])  # one k per column of the last dim, broadcast over dim 0
    p = softk.soft_topk(x, k[None, None, :], dim=1, method="laplace")
    for b in range(3):
        for c in range(2):
            np.testing.assert_allclose(p[b, :, c].numpy(), oracle.soft_topk(x[b, :, c].numpy(), float(k[c]), method="laplace"), atol=1e-12)


@pytest.mark.parametrize("method", ["exp", "sigmoid", "laplace", "sparse"])
def test_derivative_in_k_matches_oracle(rng, method):
    x = rng.normal(size=6)
    k0 = 2.3  # away from integers: "sparse" has kinks where k crosses a vertex
    kt = torch.tensor([k0], dtype=torch.float64, requires_grad=True)
    p = softk.soft_topk(torch.tensor(x), kt, method=method)
    w = rng.normal(size=6)
    (p * torch.tensor(w)).sum().backward()
    h = 1e-6
    num = (oracle.soft_topk(x, k0 + h, method=method) - oracle.soft_topk(x, k0 - h, method=method)) @ w / (2 * h)
    np.testing.assert_allclose(kt.grad.item(), num, atol=1e-6)


def test_gradcheck_x_and_k_and_double_backward(rng):
    x = torch.tensor(rng.normal(size=(3, 6)), requires_grad=True)
    k = torch.tensor([[1.5], [2.5], [3.25]], dtype=torch.float64, requires_grad=True)
    for m in ("exp", "sigmoid", "laplace"):
        assert torch.autograd.gradcheck(lambda t, kk: softk.soft_topk(t, kk, method=m), (x, k))
        assert torch.autograd.gradgradcheck(lambda t, kk: softk.soft_topk(t, kk, method=m), (x, k))


def test_vmap_and_jacfwd_in_k(rng):
    x = torch.tensor(rng.normal(size=(3, 6)))
    k = torch.tensor([[1.5], [2.5], [3.25]], dtype=torch.float64)
    out = torch.func.vmap(lambda r, kk: softk.soft_topk(r, kk))(x, k)
    np.testing.assert_allclose(out.sum(-1).numpy(), k[:, 0].numpy(), atol=1e-12)
    J = torch.func.jacfwd(lambda kk: softk.soft_topk(x[0], kk))(k[0])
    h = 1e-6
    num = (oracle.soft_topk(x[0].numpy(), 1.5 + h) - oracle.soft_topk(x[0].numpy(), 1.5 - h)) / (2 * h)
    np.testing.assert_allclose(J[:, 0].numpy(), num, atol=1e-6)


def test_topk_sum_per_row(rng):
    x, k = _rows(rng)
    out = softk.topk_sum(torch.tensor(x), torch.tensor(k)[:, None], method="exp")
    ref = [oracle_topk.topk_sum(x[i], k[i], method="exp") for i in range(len(k))]
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-12)
    with pytest.raises(ValueError, match="no gradient to a per-row k"):
        softk.topk_sum(torch.tensor(x), torch.tensor(k)[:, None].requires_grad_())


def test_loss_with_a_k_per_row_equals_each_row_alone(rng):
    x = torch.tensor(rng.normal(size=(4, 6)))
    y = torch.zeros(4, 6, dtype=torch.float64)
    for i, m in enumerate((1, 2, 3, 5)):
        y[i, rng.permutation(6)[:m]] = 1
    loss = softk.losses.soft_topk_loss(x, y, k=y.sum(1, keepdim=True), method="sparse", reduction="none")
    for i in range(4):
        one = softk.losses.soft_topk_loss(x[i : i + 1], y[i : i + 1], k=int(y[i].sum()), method="sparse", reduction="none")
        np.testing.assert_allclose(loss[i].item(), one.item(), rtol=1e-12)


@pytest.mark.parametrize(
    "k,method,match",
    [
        (torch.tensor([[0.0], [1.0]]), "exp", r"k must lie in \(0, n\]"),
        (torch.tensor([[1.0], [9.0]]), "exp", r"k must lie in \(0, n\]"),
        (torch.tensor([[1.0], [float("nan")]]), "exp", r"k must lie in \(0, n\]"),
        (torch.tensor([[1.0], [2.0]]), "grad", "needs a threshold method"),
        (torch.tensor([1.0, 2.0, 3.0]), "exp", "must broadcast"),
    ],
)
def test_bad_budgets_are_refused(k, method, match):
    with pytest.raises(ValueError, match=match):
        softk.soft_topk(torch.zeros(2, 5), k, method=method)
