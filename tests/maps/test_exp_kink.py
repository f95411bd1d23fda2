"""Soft top-k "exp" (f = min(e^u, 1)) near its kink, against a float64
reference: the top entry of a k = 1 row whose others lie far below has
u ≈ −e^{−gap}, which the dtype rounds to p = 1 while f′ there is 1 (at k = 1
the map is softmax, which never saturates).  Read off p = 1 as saturated,
f′ = 0 zeroed the whole row's gradient; the maps write p = 1 only where
u > 0 and an entry at u ≤ 0 as at most the largest float below 1.  The
Triton backend's side of this is in tests/backends/triton/test_triton_conventions.py."""

import numpy as np
import pytest
import torch

import softk

BACKENDS = ["torch", "native"]


def _ref(x: np.ndarray, k: int):
    """(p, d) in float64: the saturated entries are the top s for the least
    s whose unsaturated rest, at λ = lse(rest) − log(k − s), lies below λ."""
    order = np.argsort(-x, kind="stable")
    z = x[order]
    for s in range(k):
        rest = z[s:]
        m = rest.max()
        lam = m + np.log(np.exp(rest - m).sum()) - np.log(k - s)
        if s == 0 or z[s - 1] > lam:
            if z[s] <= lam:
                break
    u = x - lam
    p = np.where(u > 0, 1.0, np.exp(np.minimum(u, 0)))
    d = np.where(u > 0, 0.0, p)
    return p, d


def _ref_vjp(d, g):
    return d * (g - (d * g).sum() / d.sum())


ROWS = [
    ([0.0, -40.0], 1),  # the top entry 4e-18 left of the kink
    ([0.0, -20.0] + [-30.0] * 300, 1),  # a row wide enough for the fast path
    ([5.0, 4.0, -20.0], 2),  # the 5 saturated, the 4 7e-13 left of the kink
    ([3.0, 2.9, -30.0, -35.0], 2),  # two entries left of the kink, none saturated
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("row, k", ROWS)
def test_the_gradient_of_a_small_entry_is_not_lost_at_the_kink(backend, dtype, row, k):
    if backend == "native" and dtype == torch.bfloat16:
        pytest.skip("the CPU kernels take float32 and float64")
    x = torch.tensor(row, dtype=dtype, requires_grad=True)
    with softk.use_backend(backend):
        p = softk.soft_topk(x, k, method="exp")
    j = len(row) - 1  # a small entry: the loss −log p_j
    (dx,) = torch.autograd.grad(-torch.log(p[j].double()), x)
    x64 = x.detach().double().numpy()
    p_ref, d_ref = _ref(x64, k)
    g = np.zeros(len(row))
    g[j] = -1 / p_ref[j]
    want = _ref_vjp(d_ref, g)
    # float32: a few ulps of the scale; bfloat16: p's own rounding (an ulp below 1)
    rel = {torch.float32: 1e-6, torch.float64: 1e-12, torch.bfloat16: 2.0**-7}[dtype]
    assert np.abs(want).max() > 0.5  # an O(1) gradient, which p = 1 read as saturated made 0
    assert np.all(np.abs(dx.double().numpy() - want) <= rel * np.abs(want).max() + 1e-30), (dx, want)
    # p itself: 1 exactly on the saturated entries only; elsewhere within what
    # λ's resolution, a few ulps of the scores' magnitude, does to e^{z − λ}
    eps = torch.finfo(dtype).eps
    got = p.detach().double().numpy()
    assert np.all((got == 1.0) == (d_ref == 0))
    assert np.all(np.abs(got - p_ref) <= 4 * eps * (1 + np.abs(x64).max()) * p_ref)
