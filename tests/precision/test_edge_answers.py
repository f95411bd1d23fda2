"""The edge rows of :mod:`tests.precision.edge_cases` on the torch path and
the compiled CPU kernels: exact answers (float64 references), sums of 1 or
k, finite gradients.  α near one × dtype: the default run covers each, the
slow tier every combination (tests/matrix.py)."""

import numpy as np
import pytest
import torch

import softk
from tests import matrix
from tests.oracle import maps as maps_oracle
from tests.oracle.mp import threshold_row
from tests.precision.edge_cases import (HALF, METHODS, NEAR_ONE, OVERFLOW_ROWS, entmax_reference,
                                        near_one_rows, overflow_reference, tolerance)

pytestmark = pytest.mark.usefixtures("each_cpu_backend")


@pytest.mark.parametrize("alpha, dtype", matrix.product(NEAR_ONE, (torch.float32,) + HALF))
def test_entmax_near_alpha_one_matches_float64(alpha, dtype):
    for x, tau in near_one_rows(dtype):
        p = softk.entmax(x, alpha=alpha, tau=tau)
        ref = entmax_reference(x, alpha, tau)
        err = np.abs(p.double().numpy() - ref)
        assert (err <= tolerance(dtype, ref)).all(), (tuple(x.shape), tau, err.max())
        sums = p.double().sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums), rtol=0, atol=x.shape[-1] * torch.finfo(dtype).eps)


@pytest.mark.parametrize("alpha, dtype", [(1 + 2**-23, torch.float32), (1 + 2**-22, torch.float32),
                                          (1.00000005, torch.float32), (1 + 2**-52, torch.float64),
                                          (1 + 2**-50, torch.float64)])
def test_entmax_within_ulps_of_alpha_one_matches_float64(alpha, dtype):
    # the kernel's re-solve near softmax started up to 8 units of z left of
    # λ there and stopped after 8 Newton steps of about 1: rows summed to
    # 1.4–2.2; an α that float32 rounds to 1 (1.00000005) gave NaN
    for x, tau in near_one_rows(dtype):
        x = x.to(dtype)
        p = softk.entmax(x, alpha=alpha, tau=tau)
        ref = entmax_reference(x, alpha, tau)
        tol = tolerance(dtype, ref) if dtype != torch.float64 else 32 * np.finfo(np.float64).eps
        err = np.abs(p.double().numpy() - ref)
        assert (err <= tol).all(), (tuple(x.shape), tau, err.max())


@pytest.mark.parametrize("dtype", (torch.float32,) + HALF, ids=str)
def test_entmax_near_alpha_one_gradient_is_finite(dtype):
    for x, tau in near_one_rows(dtype):
        x = x.clone().requires_grad_(True)
        p = softk.entmax(x, alpha=1.0001, tau=tau)
        cot = torch.randn(p.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
        (g,) = torch.autograd.grad(p, x, cot)
        assert torch.isfinite(g).all(), (tuple(x.shape), tau)
        # the map is shift invariant: every row's gradient sums to 0, to the
        # rounding of n terms of size |cotangent|/τ
        bound = 16 * x.shape[-1] * torch.finfo(dtype).eps * cot.double().abs().max() / tau
        assert g.double().sum(-1).abs().max() <= bound, (tuple(x.shape), tau)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("row, k, tau, exact", OVERFLOW_ROWS)
def test_soft_topk_where_x_over_tau_overflows(row, k, tau, exact, method):
    x = torch.tensor([row], requires_grad=True)
    p = softk.soft_topk(x, k, tau=tau, method=method)
    ref = overflow_reference(row, k, tau, method, exact)
    np.testing.assert_allclose(p.detach().double().numpy()[0], ref, rtol=0, atol=1e-6)
    (g,) = torch.autograd.grad(p, x, torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)], ids=str)
@pytest.mark.parametrize("alpha", [1.00001, 1.001, 1.01, 1.5])
def test_entmax_alpha_gradient_near_one_matches_a_central_difference(alpha, dtype, tol):
    # softk.entmax's tensor-α gradient (the attention tests' float64 reference for dα)
    # against a central difference of the mpmath oracle: independent of softk's formula
    g = torch.Generator().manual_seed(0)
    x, cot = torch.randn(4, 9, generator=g, dtype=torch.float64), torch.randn(4, 9, generator=g, dtype=torch.float64)
    a = torch.full((4, 1), alpha, dtype=dtype, requires_grad=True)
    (got,) = torch.autograd.grad(softk.entmax(x.to(dtype), alpha=a), a, cot.to(dtype))
    h = 1e-7 * alpha
    want = np.array([(threshold_row("entmax", r, 1, alpha=alpha + h) - threshold_row("entmax", r, 1, alpha=alpha - h))
                     @ c / (2 * h) for r, c in zip(x.numpy(), cot.numpy())])
    err = np.abs(got.double().numpy()[:, 0] - want).max() / np.abs(want).max()
    assert err <= tol, err


def test_entmax15_on_near_constant_rows_matches_float64():
    # a dense support reached in one closed-form step from a bound far below
    # the root: D² − c·r cancelled, and float32 sums of c terms drifted (the
    # native kernel was off by 1.4e-3 on 32768 equal entries, and its row sum
    # by 1.5e-4 on a linspace row of 256)
    eps = np.finfo(np.float32).eps
    for x in (torch.linspace(0, 0.1, 256)[None], torch.linspace(0, 0.02, 40)[None],
              torch.linspace(0, 0.1, 5000)[None]):
        p = softk.entmax15(x)
        ref = entmax_reference(x, 1.5, 1.0)
        err = np.abs(p.double().numpy() - ref).max()
        assert err <= 8 * eps * ref.max(), (x.shape[-1], err / ref.max() / eps)
    for n in (16, 300, 32768, 100000):  # equal entries: p = 1/n exactly
        p = softk.entmax15(torch.zeros(2, n))
        np.testing.assert_allclose(p.double().numpy(), 1.0 / n, rtol=8 * eps, atol=0)


@pytest.mark.parametrize("alpha", [1.3, 1.7, 1.9])
def test_entmax_alpha_on_near_constant_short_rows_matches_float64(alpha):
    # Newton landed past the root by the rounding of G and of its step, and
    # g ≤ k was read as the root: p was off by up to 1045 ulps of its
    # largest entry (α = 1.9, 128 entries half of them 3e-4 lower)
    eps = np.finfo(np.float32).eps
    half = torch.zeros(1, 128)
    half[0, 64:] = -3e-4
    for x in (half, torch.linspace(0, 0.1, 256)[None], torch.zeros(1, 300)):
        p = softk.entmax(x, alpha=alpha)
        ref = entmax_reference(x, alpha, 1.0)
        err = np.abs(p.double().numpy() - ref).max()
        assert err <= 16 * eps * ref.max(), (x.shape[-1], err / ref.max() / eps)


@pytest.mark.parametrize("alpha", [1.05, 1.15, 1.3, 1.7])
def test_entmax_alpha_on_wide_near_constant_rows_matches_float64(alpha):
    # λ is found where Σ w^q = 1, and the native kernel summed w^q in float32
    # vector lanes, whose error grows with n/16: on 32768 equal entries p was
    # off by 150–200 ulps (60 at α = 1.05), on 8192 by up to 44
    eps = np.finfo(np.float32).eps
    for n in (8192, 32768):  # equal entries: p = 1/n exactly
        p = softk.entmax(torch.zeros(2, n), alpha=alpha)
        np.testing.assert_allclose(p.double().numpy(), 1.0 / n, rtol=8 * eps, atol=0)
    if alpha < 1.1:
        return  # float32's λ ≈ −1/(α−1) alone costs (α−1)|λ|/w ulps of p there
    x = torch.linspace(0, 0.01, 20000)[None]
    p = softk.entmax(x, alpha=alpha)
    ref = maps_oracle.entmax(x.double().numpy(), alpha)
    err = np.abs(p.double().numpy() - ref).max()
    assert err <= 16 * eps * ref.max(), err / ref.max() / eps
