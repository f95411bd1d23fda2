"""Triton kernels (through the CPU interpreter) against the NumPy oracle:
forward and backward for every family, masks and NaN rows, half dtypes, any
dim, a row wider than 65,536, and dispatch through the public functions."""

import numpy as np
import pytest
import torch

import softk
from ...oracle import maps as oracle

PUBLIC = {
    "softmax": lambda x, k: softk.softmax(x),
    "sparsemax": lambda x, k: softk.sparsemax(x),
    "entmax15": lambda x, k: softk.entmax15(x),
    "entmax": lambda x, k: softk.entmax(x, 1.3),
    "exp": lambda x, k: softk.soft_topk(x, k),
    "sigmoid": lambda x, k: softk.soft_topk(x, k, method="sigmoid"),
    "laplace": lambda x, k: softk.soft_topk(x, k, method="laplace"),
    "sparse": lambda x, k: softk.soft_topk(x, k, method="sparse"),
}


def triton_map(x, fam, k):
    """The public function of ``fam`` on the "triton" backend (its kernels in the interpreter)."""
    with softk.use_backend("triton"):
        return PUBLIC[fam](x, k)

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
    p = triton_map(torch.tensor(xn, dtype=torch.float32), fam, k)
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
    triton_map(x, fam, k).backward(torch.tensor(g, dtype=torch.float32))
    jac = oracle.numerical_jacobian(lambda r: ORACLE[fam](r[None], k)[0], xn, eps=1e-5)
    np.testing.assert_allclose(x.grad.double().numpy(), jac.T @ g, rtol=0, atol=5e-4)


def test_row_wider_than_65536(rng):
    n = 70_001
    xn = rng.normal(size=(1, n)).astype(np.float32).astype(np.float64) * 3
    x = torch.tensor(xn, dtype=torch.float32)
    np.testing.assert_allclose(triton_map(x, "sparsemax", 1).double().numpy(), oracle.sparsemax(xn), atol=2e-6)
    # float32 exp(z − λ) with |z − λ| ≈ 13 here: a few ulps of relative error.
    np.testing.assert_allclose(triton_map(x, "softmax", 1).double().numpy(), oracle.softmax(xn), rtol=4e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_in_half_out_float32_inside(rng, dtype):
    x = torch.tensor(rng.normal(size=(3, 40)) * 2).to(dtype)
    xr = x.double().numpy()
    p = triton_map(x, "entmax15", 1)
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


def test_losses_and_topk_sum_reach_the_triton_kernels(rng, monkeypatch):
    from softk._backends import kernels

    calls = []
    threshold = kernels.get("threshold", "triton").impl
    fwd = threshold.forward

    def spy(family, x, k, tau):
        calls.append(family.name)
        return fwd(family, x, k, tau)

    monkeypatch.setattr(threshold, "forward", spy)
    xn = rng.normal(size=(4, 9)).astype(np.float32).astype(np.float64)
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    y = torch.tensor([0, 3, 8, 2])
    with softk.use_backend("triton"):
        loss = softk.losses.sparsemax_loss(x, y) + softk.losses.softmax_loss(x, y) + softk.topk_sum(x, 2).sum()
    assert calls == ["exp"]  # the losses take the fused loss kernel (softk._ops.fused_loss)
    loss.backward()
    expect = (oracle.sparsemax(xn) - np.eye(9)[y.numpy()]) / 4 + (oracle.softmax(xn) - np.eye(9)[y.numpy()]) / 4
    expect += oracle.soft_topk(xn, 2)
    np.testing.assert_allclose(x.grad.double().numpy(), expect, atol=3e-6)


def test_compiled_graph_runs_the_triton_kernels(rng):
    """torch.compile(fullgraph=True) keeps the kernel launch inside the custom
    op: Inductor never re-types the kernel's scalars (the fp32/fp64
    loop-carried failure seen on an H100 with triton 3.6)."""
    torch._dynamo.reset()
    xn = rng.normal(size=(3, 20)).astype(np.float32).astype(np.float64)
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    with softk.use_backend("triton"):
        f = torch.compile(lambda t: softk.entmax15(t, tau=0.5) * 2, fullgraph=True)
        out = f(x)
    np.testing.assert_allclose(out.detach().double().numpy(), 2 * oracle.entmax(xn, 1.5, tau=0.5), atol=4e-6)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("method", ["exp", "sigmoid"])
@pytest.mark.parametrize("layout", ["dim0", "transposed"])
def test_compiled_graph_along_a_dimension_not_last(rng, method, layout):
    """The kernels write contiguous rows; along dim 0 (or on a transposed
    input) the rows are a permuted view, whose layout the op's fake kernel
    (``empty_like``) keeps: the compiled graph reads the output by the fake's
    strides, and got it transposed until the op laid it out so."""
    torch._dynamo.reset()
    xn = rng.normal(size=(17, 3)).astype(np.float32).astype(np.float64)
    g = torch.tensor(rng.normal(size=(17, 3)), dtype=torch.float32)

    def fn(t):
        return softk.soft_topk(t, 2, dim=0, method=method) if layout == "dim0" else \
            softk.soft_topk(t.t(), 2, method=method).t()

    outs = []
    for compiled in (False, True):
        x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
        with softk.use_backend("triton"):
            out = (torch.compile(fn, fullgraph=True) if compiled else fn)(x)
            out.backward(g)
        outs.append((out.detach(), x.grad))
    want = oracle.soft_topk(xn.T, 2, method=method).T
    np.testing.assert_allclose(outs[1][0].double().numpy(), want, atol=2e-6)
    assert torch.equal(outs[1][0], outs[0][0]) and torch.equal(outs[1][1], outs[0][1])


def test_jvp_and_vmap_on_triton(rng):
    xn = rng.normal(size=(3, 7)).astype(np.float32).astype(np.float64)
    v = rng.normal(size=7)
    x = torch.tensor(xn, dtype=torch.float32)
    with softk.use_backend("triton"):
        out = torch.func.vmap(softk.sparsemax)(x)
        _, t = torch.func.jvp(softk.entmax15, (x[0],), (torch.tensor(v, dtype=torch.float32),))
    np.testing.assert_allclose(out.double().numpy(), oracle.sparsemax(xn), atol=2e-6)
    jac = oracle.numerical_jacobian(lambda r: oracle.entmax(r, 1.5), xn[0], eps=1e-6)
    np.testing.assert_allclose(t.double().numpy(), jac @ v, atol=2e-5)
