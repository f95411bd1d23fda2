"""log_softmax and logsumexp on every CPU backend, against a NumPy float64 oracle.

The eager CPU path runs torch's fused ops with one check that every row is
ordinary (softk._maps.simplex); rows that are fully masked, or hold NaN or +inf,
take the general tensor code.  Both must meet the same error model far from
the origin and at every τ, and the same row conventions.
"""

import numpy as np
import pytest
import torch

import softk

pytestmark = pytest.mark.usefixtures("each_cpu_backend")

INF = float("inf")


def _oracle(xn: np.ndarray, tau: float):
    """(log softmax, logsumexp) of float64 rows, shifting before dividing."""
    m = xn.max(-1, keepdims=True)
    z = (xn - m) / tau
    lse = np.log(np.exp(z).sum(-1, keepdims=True))
    return z - lse, (m + tau * lse)[..., 0]


@pytest.mark.parametrize("dtype,eps", [(torch.float32, 2.0**-23), (torch.float64, 2.0**-52)])
@pytest.mark.parametrize("offset", [0.0, 1e4, -1e6])
@pytest.mark.parametrize("tau", [1e-3, 0.3, 1.0, 10.0])
def test_far_from_the_origin(dtype, eps, offset, tau):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 40, generator=g, dtype=torch.float64) * 0.02 * max(tau, 1e-2) * 50 + offset).to(dtype)
    x[2, 5] = -INF  # a partially masked row stays on the fast path
    xn = x.double().numpy()
    want_y, want_lse = _oracle(xn, tau)
    y = softk.log_softmax(x, tau=tau).double().numpy()
    lse = softk.logsumexp(x, tau=tau).double().numpy()
    finite = np.isfinite(want_y)
    assert np.array_equal(finite, np.isfinite(y))
    # first-order model: each of z = (x − m)/τ and the log-sum rounds to a few ulps of its size
    err = np.abs(y[finite] - want_y[finite])
    assert (err <= 8 * eps * (1 + np.abs(want_y[finite]))).all(), err.max()
    assert (np.abs(lse - want_lse) <= 8 * eps * (np.abs(want_lse) + tau)).all()


@pytest.mark.parametrize("tau", [0.5, 1.0])
def test_gradients_match_the_oracle(tau):
    """d/dx Σ g·log_softmax = (g − p Σg)/τ and d logsumexp = p."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 9, dtype=torch.float64, generator=g).requires_grad_()
    w = torch.randn(3, 9, dtype=torch.float64, generator=g)
    (dx,) = torch.autograd.grad((softk.log_softmax(x, tau=tau) * w).sum(), x)
    y, _ = _oracle(x.detach().numpy(), tau)
    p = np.exp(y)
    wn = w.numpy()
    np.testing.assert_allclose(dx.numpy(), (wn - p * wn.sum(-1, keepdims=True)) / tau, rtol=0, atol=1e-14)
    (dl,) = torch.autograd.grad(softk.logsumexp(x, tau=tau).sum(), x)
    np.testing.assert_allclose(dl.numpy(), p, rtol=0, atol=1e-15)


@pytest.mark.parametrize("fill,expected", [(-INF, -INF), (float("nan"), float("nan")), (INF, float("nan"))])
def test_special_rows_next_to_ordinary_ones(fill, expected):
    """A fully masked row gives -inf and a zero gradient; a NaN or +inf row
    gives NaN (and a NaN gradient); the ordinary rows beside them are exact."""
    x = torch.tensor([[0.0, 1.0, 2.0], [0.5, -1.0, 3.0]], dtype=torch.float64)
    x[1] = -INF if fill == -INF else torch.tensor([0.5, fill, 3.0])
    xg = x.clone().requires_grad_()
    y = softk.log_softmax(xg)
    lse = softk.logsumexp(xg)
    want_y, want_lse = _oracle(x[:1].numpy(), 1.0)
    np.testing.assert_allclose(y[0].detach().numpy(), want_y[0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(lse[0].item(), want_lse[0], rtol=0, atol=1e-15)
    if expected == -INF:
        assert bool((y[1] == -INF).all()) and lse[1].item() == -INF
    else:
        assert bool(y[1].isnan().all()) and lse[1].isnan()
    (dx,) = torch.autograd.grad(y.sum() + lse.sum(), xg)
    assert bool(torch.isfinite(dx[0]).all())
    if expected == -INF:
        assert bool((dx[1] == 0).all())
    else:
        assert bool(dx[1].isnan().all())
