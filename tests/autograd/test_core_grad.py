"""Gradients: gradcheck, Jacobians against finite differences of the oracle,
zero gradients at vertices and on masked rows, and dα for entmax."""

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

import softk

from ..oracle import maps as oracle

# Every test here runs on both CPU paths: the PyTorch one and the compiled kernels.
pytestmark = pytest.mark.usefixtures("each_cpu_backend")

METHODS = ["exp", "sigmoid", "laplace", "sparse"]


def _x(shape, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).requires_grad_()


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("tau", [1.0, 0.5])
@pytest.mark.slow
def test_gradcheck_k1_maps(dim, tau):
    x = _x((3, 4, 5))
    fns = [
        lambda x: softk.softmax(x, dim, tau),
        lambda x: softk.log_softmax(x, dim, tau),
        lambda x: softk.logsumexp(x, dim, tau),
        lambda x: softk.sparsemax(x, dim, tau),
        lambda x: softk.entmax15(x, dim, tau),
        lambda x: softk.entmax(x, 1.3, dim, tau),
        lambda x: softk.entmax(x, 2.5, dim, tau),
    ]
    for fn in fns:
        assert gradcheck(fn, (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dim", [0, -1])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_gradcheck_soft_topk(method, dim, k):
    x = _x((4, 5))
    assert gradcheck(lambda x: softk.soft_topk(x, k, dim, 0.7, method), (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "name,fn,ref",
    [
        ("softmax", lambda x: softk.softmax(x, tau=0.8), lambda r: oracle.softmax(r, tau=0.8)),
        ("sparsemax", softk.sparsemax, oracle.sparsemax),
        ("entmax15", softk.entmax15, lambda r: oracle.entmax(r, 1.5)),
        ("entmax1.7", lambda x: softk.entmax(x, 1.7), lambda r: oracle.entmax(r, 1.7)),
    ]
    + [
        (f"{m}-k{k}", (lambda m, k: lambda x: softk.soft_topk(x, k, method=m, tau=0.65))(m, k),
         (lambda m, k: lambda r: oracle.soft_topk(r, k, method=m, tau=0.65))(m, k))
        for m in METHODS
        for k in (1, 3)
    ],
)
def test_jacobian_matches_oracle_finite_differences(name, fn, ref):
    """The analytic backward against central differences of the *oracle* map."""
    x = torch.tensor([0.3, -1.2, 2.0, 0.9, 1.4, -0.4], dtype=torch.float64)
    J = torch.autograd.functional.jacobian(fn, x).numpy()
    J_fd = oracle.numerical_jacobian(ref, x.numpy())
    np.testing.assert_allclose(J, J_fd, atol=1e-7)
    # Each row of the Jacobian sums to 0 (Σp is constant) and J is symmetric.
    np.testing.assert_allclose(J.sum(0), 0, atol=1e-12)
    np.testing.assert_allclose(J, J.T, atol=1e-12)


def test_vjp_matches_jacobian_transpose():
    x = _x((6,))
    g = torch.randn(6, dtype=torch.float64)
    for fn in (softk.sparsemax, lambda x: softk.soft_topk(x, 2, method="laplace")):
        (vjp,) = torch.autograd.grad(fn(x), x, g)
        J = torch.autograd.functional.jacobian(fn, x.detach())
        torch.testing.assert_close(vjp, J.T @ g, rtol=0, atol=1e-12)


def test_zero_gradient_at_vertex_not_nan():
    # Every entry exactly 0 or 1: Σd = 0, the map is locally constant.
    x = torch.tensor([5.0, 5.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    for method in ("sparse", "exp"):
        p = softk.soft_topk(x, 2, method=method) if method == "sparse" else softk.soft_topk(x[:2], 2, method=method)
        assert set(p.tolist()) <= {0.0, 1.0}
        (g,) = torch.autograd.grad((p * torch.arange(1.0, p.numel() + 1, dtype=torch.float64)).sum(), x)
        assert torch.equal(g, torch.zeros_like(g))


def test_masked_entries_and_rows_have_zero_gradient():
    x = torch.tensor(
        [[0.5, float("-inf"), 1.0, 2.0], [float("-inf")] * 4, [float("-inf"), 3.0, float("-inf"), float("-inf")]],
        dtype=torch.float64,
        requires_grad=True,
    )
    w = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    fns = [softk.softmax, softk.log_softmax, softk.sparsemax, softk.entmax15, lambda x: softk.entmax(x, 1.7)]
    fns += [(lambda m: lambda x: softk.soft_topk(x, 2, method=m))(m) for m in METHODS]
    for fn in fns:
        out = fn(x)
        loss = torch.where(torch.isfinite(out), out * w, 0.0).sum()
        (g,) = torch.autograd.grad(loss, x)
        assert bool(torch.isfinite(g).all())
        assert bool((g[~torch.isfinite(x)] == 0).all())
        assert bool((g[1:] == 0).all())  # fully masked row; row with one finite entry (k=1) or ≤ k
    (g,) = torch.autograd.grad(softk.logsumexp(x).sum(), x)
    assert bool(torch.isfinite(g).all()) and bool((g[1] == 0).all())


def test_masked_gradient_equals_gradient_of_removed_entries():
    x = _x((7,))
    keep = torch.tensor([1, 1, 0, 1, 0, 1, 1], dtype=torch.bool)
    g = torch.linspace(-1, 1, 7, dtype=torch.float64)
    for fn in (softk.sparsemax, lambda v: softk.soft_topk(v, 2, method="sigmoid")):
        xm = torch.where(keep, x, float("-inf"))
        (a,) = torch.autograd.grad((fn(xm) * g).sum(), x)
        (b,) = torch.autograd.grad((fn(x[keep]) * g[keep]).sum(), x)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


@pytest.mark.parametrize("alpha0", [1.15, 1.5, 2.0, 2.7])
def test_gradcheck_entmax_alpha_tensor(alpha0):
    x = _x((3, 5), seed=1)
    alpha = torch.full((3, 1), alpha0, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, a: softk.entmax(x, a, -1, 0.9), (x, alpha), eps=1e-6, atol=1e-6)
    # a single α shared by all rows (0-d), and along dim 0
    a0 = torch.tensor(alpha0, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, a: softk.entmax(x, a, 0), (x, a0), eps=1e-6, atol=1e-6)


def test_entmax_alpha_gradient_at_softmax_limit():
    """At α = 1 the α-gradient formula is 0/0; the implemented limit must match
    central differences of the oracle in α (an independent computation)."""
    x = np.array([0.2, -0.5, 1.1, 0.4])
    h = 1e-4
    dp_fd = (oracle.entmax(x, 1 + h) - oracle.softmax(x)) / h  # one-sided: α < 1 is undefined
    dp_fd2 = (oracle.entmax(x, 1 + 2 * h) - oracle.softmax(x)) / (2 * h)
    dp_ref = 2 * dp_fd - dp_fd2  # Richardson: O(h^2)
    g = torch.tensor([0.3, -1.0, 0.5, 2.0], dtype=torch.float64)
    a = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    (ga,) = torch.autograd.grad((softk.entmax(torch.tensor(x), a) * g).sum(), a)
    np.testing.assert_allclose(ga.item(), float(dp_ref @ g.numpy()), rtol=1e-5)


def test_entmax_alpha_second_derivative_at_softmax_limit():
    """d²/dα² of gᵀp at α = 1: the limit's own α-derivative was lost (its
    expression did not depend on α), giving −1.23 where the limit from
    α > 1 is −0.68.  Against the oracle's second difference at 1, 1 + h,
    1 + 2h (Richardson), independent of the α = 1 branch."""
    x = np.array([0.2, -0.5, 1.1, 0.4]) * 3
    g = np.array([0.3, -1.0, 0.5, 2.0])
    h = 1e-3
    f = [float(oracle.entmax(x, 1 + j * h) @ g) if j else float(oracle.softmax(x) @ g) for j in range(4)]
    second = (f[2] - 2 * f[1] + f[0]) / h**2  # at 1 + h, with its O(h) lead term removed below
    second2 = (f[3] - 2 * f[2] + f[1]) / h**2  # at 1 + 2h
    want = 2 * second - second2  # the second derivative at α = 1, O(h²)
    a = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    (d1,) = torch.autograd.grad((softk.entmax(torch.tensor(x), a) * torch.tensor(g)).sum(), a, create_graph=True)
    (d2,) = torch.autograd.grad(d1, a)
    np.testing.assert_allclose(d2.item(), want, rtol=3e-5)  # the differences' own error: 6e-6


def test_half_precision_backward_is_finite_and_close():
    x32 = torch.randn(4, 33, generator=torch.Generator().manual_seed(3))
    g = torch.randn(4, 33, generator=torch.Generator().manual_seed(4))
    for dtype in (torch.float16, torch.bfloat16):
        for fn in (softk.sparsemax, softk.entmax15, lambda v: softk.soft_topk(v, 5, method="laplace")):
            xh = x32.to(dtype).requires_grad_()
            (gh,) = torch.autograd.grad(fn(xh), xh, g.to(dtype))
            assert gh.dtype == dtype
            xf = xh.detach().float().requires_grad_()
            (gf,) = torch.autograd.grad(fn(xf), xf, g)
            tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
            torch.testing.assert_close(gh.float(), gf, rtol=0, atol=tol * (1 + gf.abs().max().item()))


def test_potential_keeps_nan_rows_nan_and_ignores_masks():
    from softk.threshold import SIGMOID, SPARSE
    from softk._ops.potential import potential

    x = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0], [float("-inf"), 1.0, 2.0]], dtype=torch.float64)
    for fam in (SIGMOID, SPARSE):
        phi = potential(x, fam, 1, -1, 1.0)
        assert torch.isnan(phi[0]) and torch.isfinite(phi[1:]).all()
        torch.testing.assert_close(phi[2], potential(x[2:, 1:], fam, 1, -1, 1.0)[0], rtol=0, atol=1e-14)


NAN_ROW_MAPS = {
    "softmax": softk.softmax,
    "sparsemax": softk.sparsemax,
    "entmax15": softk.entmax15,
    "entmax1.3": lambda x: softk.entmax(x, 1.3),
    "entmax3": lambda x: softk.entmax(x, 3.0),
    **{m: (lambda m: lambda x: softk.soft_topk(x, 2, method=m))(m) for m in ("exp", "sigmoid", "laplace", "sparse")},
    "topk_sum": lambda x: softk.topk_sum(x, 2),
    "grad": lambda x: softk.soft_topk(x, 2, method="grad"),
}


@pytest.mark.parametrize("name", list(NAN_ROW_MAPS))
def test_nan_or_inf_row_has_nan_gradient_and_no_other_row_does(name):
    # torch.softmax's convention, on every family and backend: a NaN/+inf
    # score makes its row's output and gradient NaN (it used to be 0 for
    # some families on the PyTorch path, NaN on the native one).
    x = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0], [0.0, float("inf"), 1.0]],
                     dtype=torch.float64, requires_grad=True)
    out = NAN_ROW_MAPS[name](x)
    (g,) = torch.autograd.grad(out.sum() if out.dim() == 1 else out[:, 0].sum(), x)
    assert torch.isnan(g[0]).all() and torch.isnan(g[2]).all()
    assert torch.isfinite(g[1]).all()
