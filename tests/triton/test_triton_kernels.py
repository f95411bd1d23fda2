"""Triton kernels (through the CPU interpreter) against the NumPy oracle:
forward and backward for every family, masks and NaN rows, half dtypes, any
dim, a row wider than 65,536, and dispatch through the public functions."""

import numpy as np
import pytest
import torch

import softk
from softk.triton import triton_threshold_map

from .. import oracle

ORACLE = {
    "softmax": lambda xn, k: oracle.softmax(xn),
    "sparsemax": lambda xn, k: oracle.sparsemax(xn),
    "entmax15": lambda xn, k: oracle.entmax(xn, 1.5),
    "entmax": lambda xn, k: oracle.entmax(xn, 1.3),
    "exp": lambda xn, k: oracle.soft_topk(xn, k, method="exp"),
    "sigmoid": lambda xn, k: oracle.soft_topk(xn, k, method="sigmoid"),
    "laplace": lambda xn, k: oracle.soft_topk(xn, k, method="laplace"),
    "sparse": lambda xn, k: oracle.soft_topk(xn, k, method="sparse"),
}
K1 = {"softmax", "sparsemax", "entmax15", "entmax"}


def _x(rng, r, n):
    xn = rng.normal(size=(r, n)) * 2
    xn[1, ::3] = -np.inf  # masked entries
    xn[2, :] = -np.inf
    xn[2, 4] = 0.5  # a single finite entry
    xn[3, 7] = np.nan  # a broken row
    return xn.astype(np.float32).astype(np.float64)  # exactly representable in float32


@pytest.mark.parametrize("fam", sorted(ORACLE))
def test_forward_matches_oracle(rng, fam):
    k = 1 if fam in K1 else 3
    xn = _x(rng, 6, 50)
    p = triton_threshold_map(torch.tensor(xn, dtype=torch.float32), fam, k, -1, 1.0, 1.3)
    ref = ORACLE[fam](xn, k)
    assert p.dtype == torch.float32
    np.testing.assert_array_equal(np.isnan(p.numpy()), np.isnan(ref))
    np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("fam", sorted(ORACLE))
def test_backward_matches_oracle_jacobian(rng, fam):
    k = 1 if fam in K1 else 3
    xn = rng.normal(size=12).astype(np.float32).astype(np.float64) * 2
    g = rng.normal(size=12)
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    triton_threshold_map(x, fam, k, -1, 1.0, 1.3).backward(torch.tensor(g, dtype=torch.float32))
    jac = oracle.numerical_jacobian(lambda r: ORACLE[fam](r[None], k)[0], xn, eps=1e-5)
    np.testing.assert_allclose(x.grad.double().numpy(), jac.T @ g, rtol=0, atol=5e-4)


def test_row_wider_than_65536(rng):
    n = 70_001
    xn = rng.normal(size=(1, n)).astype(np.float32).astype(np.float64) * 3
    x = torch.tensor(xn, dtype=torch.float32)
    np.testing.assert_allclose(triton_threshold_map(x, "sparsemax", 1, -1, 1.0).double().numpy(), oracle.sparsemax(xn), atol=2e-6)
    # float32 exp(z − λ) with |z − λ| ≈ 13 here: a few ulps of relative error.
    np.testing.assert_allclose(triton_threshold_map(x, "softmax", 1, -1, 1.0).double().numpy(), oracle.softmax(xn), rtol=4e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_in_half_out_float32_inside(rng, dtype):
    x = torch.tensor(rng.normal(size=(3, 40)) * 2).to(dtype)
    xr = x.double().numpy()
    p = triton_threshold_map(x, "entmax15", 1, -1, 1.0)
    assert p.dtype == dtype
    np.testing.assert_allclose(p.double().numpy(), oracle.entmax(xr, 1.5), rtol=0, atol=torch.finfo(dtype).eps)


def test_public_functions_dispatch_to_triton_and_keep_dim_and_tau(rng):
    xn = rng.normal(size=(5, 4, 3)).astype(np.float32).astype(np.float64)
    x = torch.tensor(xn, dtype=torch.float32)
    with softk.use_backend("triton"):
        p = softk.soft_topk(x, 2, dim=1, tau=0.5, method="laplace")
        q = softk.entmax(x, 1.7, dim=0)
    np.testing.assert_allclose(p.double().numpy(), oracle.soft_topk(xn, 2, 1, 0.5, "laplace"), atol=2e-6)
    np.testing.assert_allclose(q.double().numpy(), oracle.entmax(xn, 1.7, 0), atol=2e-6)
