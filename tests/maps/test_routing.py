"""softk.route against a NumPy float64 reference: the chosen experts are the
top-k scores (ties to the lower index), the weights are the oracle map's
values there, and the gradient is the oracle Jacobian gathered."""

import numpy as np
import pytest
import torch

import softk

from ..oracle import maps as oracle

ORACLE = {
    "softmax": lambda r, k, tau: oracle.softmax(r, tau=tau),
    "sparsemax": lambda r, k, tau: oracle.sparsemax(r, tau=tau),
    "entmax15": lambda r, k, tau: oracle.entmax(r, 1.5, tau=tau),
    "entmax": lambda r, k, tau: oracle.entmax(r, 1.3, tau=tau),
    **{m: (lambda m: lambda r, k, tau: oracle.soft_topk(r, k, tau=tau, method=m))(m)
       for m in ("exp", "sigmoid", "laplace", "sparse")},
}


def _ref_route(x: np.ndarray, k: int, method: str, tau: float, normalize: bool):
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]  # ties: lower index first
    p = np.stack([ORACLE[method](row, k, tau) for row in x.reshape(-1, x.shape[-1])]).reshape(x.shape)
    w = np.take_along_axis(p, idx, -1)
    if normalize:
        s = w.sum(-1, keepdims=True)
        w = w / np.where(s > 0, s, 1.0)
    return w, idx


def _kw(method):
    return {"alpha": 1.3} if method == "entmax" else {}


@pytest.mark.parametrize("method", list(ORACLE))
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("n,k", [(1, 1), (8, 1), (8, 2), (64, 8), (16, 16)])
def test_weights_and_indices_match_the_oracle(method, normalize, n, k):
    g = torch.Generator().manual_seed(n * 31 + k)
    x = torch.randn(5, n, dtype=torch.float64, generator=g) * 2 + 1e4  # far from 0 too
    x[0, : min(n, 3)] = x[0, 0]  # a tie
    r = softk.route(x, k, method, tau=0.7, normalize=normalize, **_kw(method))
    w, idx = _ref_route(x.numpy(), k, method, 0.7, normalize)
    np.testing.assert_array_equal(r.indices.numpy(), idx)
    np.testing.assert_allclose(r.weights.numpy(), w, rtol=1e-9, atol=1e-12)
    assert r.weights.dtype == x.dtype and r.indices.dtype == torch.int64


def test_mixtral_router_is_softmax_over_the_topk_logits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 8, dtype=torch.float64, generator=g)
    r = softk.route(x, 2, "softmax", normalize=True)
    top = x.topk(2, -1)
    torch.testing.assert_close(r.weights, torch.softmax(top.values, -1), rtol=1e-14, atol=0)


def test_sparse_router_gives_zero_weight_beyond_the_support():
    x = torch.tensor([[0.0, 3.0, 1.0, -1.0], [0.0, 1.0, 0.9, 0.8]])
    r = softk.route(x, 3, "sparsemax")
    # row 0: support {1} (3 - 1 >= 1), so the 2nd and 3rd experts get exactly 0
    assert r.weights[0].tolist() == [1.0, 0.0, 0.0]
    assert (r.weights[1] > 0).all()


@pytest.mark.parametrize("method", ["softmax", "sparsemax", "exp", "sparse"])
def test_gradient_is_the_oracle_jacobian_gathered(method):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, dtype=torch.float64, generator=g)
    v = torch.randn(2, dtype=torch.float64, generator=g)
    xr = x.clone().requires_grad_(True)
    r = softk.route(xr, 2, method)
    (gx,) = torch.autograd.grad((r.weights * v).sum(), xr)
    J = oracle.numerical_jacobian(lambda row: ORACLE[method](row, 2, 1.0), x.numpy())
    np.testing.assert_allclose(gx.numpy(), v.numpy() @ J[r.indices.numpy()], rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_half_and_single_precision(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, generator=g).to(dtype)
    r = softk.route(x, 4, "entmax15")
    w, idx = _ref_route(x.double().numpy(), 4, "entmax15", 1.0, False)
    assert r.weights.dtype == dtype
    # ties created by rounding to dtype are broken the same way (stable order of the rounded scores)
    np.testing.assert_array_equal(r.indices.numpy(), idx)
    np.testing.assert_allclose(r.weights.double().numpy(), w, rtol=torch.finfo(dtype).eps * 4, atol=1e-3 * (dtype != torch.float32) + 1e-6)


def test_dim_and_masks():
    x = torch.tensor([[[0.0, float("-inf")], [1.0, float("-inf")], [2.0, float("-inf")]]])  # experts on dim 1
    r = softk.route(x, 2, "softmax", dim=1)
    assert r.indices.shape == (1, 2, 2)
    assert r.indices[0, :, 0].tolist() == [2, 1]
    p = torch.softmax(x[0, :, 0], 0)
    torch.testing.assert_close(r.weights[0, :, 0], p[[2, 1]])
    # the fully masked column: weights 0 (and not NaN), also when normalised
    assert r.weights[0, :, 1].tolist() == [0.0, 0.0]
    assert softk.route(x, 2, "softmax", dim=1, normalize=True).weights[0, :, 1].tolist() == [0.0, 0.0]


def test_fewer_finite_scores_than_k_list_masked_experts_with_weight_zero():
    x = torch.tensor([1.0, float("-inf"), 2.0, float("-inf")])
    r = softk.route(x, 3, "sparsemax")
    assert r.indices[:2].tolist() == [2, 0] and r.weights[2].item() == 0.0


def test_nan_row_gives_nan_weights():
    r = softk.route(torch.tensor([[1.0, float("nan"), 0.0], [1.0, 2.0, 0.0]]), 2, "sparsemax")
    assert torch.isnan(r.weights[0]).all() and not torch.isnan(r.weights[1]).any()


def test_vmap_and_compile():
    x = torch.randn(3, 5, 8)
    ref = softk.route(x, 2, "entmax15").weights
    torch.testing.assert_close(torch.func.vmap(lambda t: softk.route(t, 2, "entmax15").weights)(x), ref)
    compiled = torch.compile(lambda t: softk.route(t, 2, "sparsemax", normalize=True).weights, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), softk.route(x, 2, "sparsemax", normalize=True).weights)


@pytest.mark.parametrize("call,exc,match", [
    (lambda x: softk.route(x, 0), ValueError, "k must be in"),
    (lambda x: softk.route(x, 9), ValueError, "k must be in"),
    (lambda x: softk.route(x, 2.5), ValueError, "k must be a whole number"),
    (lambda x: softk.route(x, "2"), TypeError, "k must be an int"),
    (lambda x: softk.route(x, 2, "top2"), ValueError, "method must be one of"),
    (lambda x: softk.route(x, 2, "sparsemax", alpha=1.5), ValueError, "alpha applies to method='entmax'"),
    (lambda x: softk.route(x, 2, "entmax", alpha=0.5), ValueError, "alpha"),
    (lambda x: softk.route(x, 2, tau=0.0), ValueError, "tau"),
    (lambda x: softk.route(x, 2, dim=3), (ValueError, IndexError), "dim"),
    (lambda x: softk.route(x, 2, normalize="yes"), TypeError, "normalize must be a bool"),
    (lambda x: softk.route(x.long(), 2), TypeError, "scores"),
])
def test_bad_arguments_are_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call(torch.randn(2, 8))
