"""The edge rows of :mod:`tests.precision.edge_cases` on the Triton kernels
(in the interpreter): α-entmax near α = 1 in every dtype, soft top-k where
(x − r)/τ overflows float32.  α × dtype and row × method: the default run
covers each, the slow tier every combination (tests/matrix.py)."""

import numpy as np
import pytest
import torch

import softk
from tests import matrix
from tests.precision.edge_cases import (HALF, METHODS, NEAR_ONE, OVERFLOW_ROWS, entmax_reference,
                                        near_one_rows, overflow_reference, tolerance)


@pytest.mark.parametrize("alpha, dtype", matrix.product(NEAR_ONE, (torch.float32,) + HALF))
def test_entmax_near_alpha_one_matches_float64(alpha, dtype):
    for x, tau in near_one_rows(dtype):
        with softk.use_backend("triton"):
            p = softk.entmax(x, alpha=alpha, tau=tau)
        ref = entmax_reference(x, alpha, tau)
        err = np.abs(p.double().numpy() - ref)
        assert (err <= tolerance(dtype, ref)).all(), (tuple(x.shape), tau, err.max())


@pytest.mark.parametrize("row, k, tau, exact, method", matrix.product(OVERFLOW_ROWS, METHODS))
def test_soft_topk_where_x_over_tau_overflows(row, k, tau, exact, method):
    x = torch.tensor([row], requires_grad=True)
    with softk.use_backend("triton"):
        p = softk.soft_topk(x, k, tau=tau, method=method)
        (g,) = torch.autograd.grad(p, x, torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    np.testing.assert_allclose(p.detach().double().numpy()[0], overflow_reference(row, k, tau, method, exact),
                               rtol=0, atol=1e-6)
    assert torch.isfinite(g).all()
