"""The capped maps in half precision keep the gradient of an entry that
rounds to 1: the sparse (capped-simplex) family's backward reads saturation
off p (f′ = 0 at p = 1), so an unsaturated entry just below 1 that the
store rounded to 1 (bfloat16 rounds every p above 1 − 2⁻⁹) zeroed the whole
row's gradient.  The reference is the capped simplex's Jacobian in float64,
J = diag(s) − s sᵀ/|S| on the entries S strictly inside (0, 1)."""

import pytest
import torch

import softk

CASES = [  # a row whose top entry lies just below 1, and its dtype
    (torch.bfloat16, [1.0, 0.002]),
    (torch.float16, [1.0, 0.000244140625]),
    (torch.bfloat16, [0.3, 1.0, 0.00390625, -2.0]),
]


def _jacobian_row(x64, k, j):
    """Row j of the capped simplex's Jacobian at x (float64, τ = 1), from a
    bisection on λ of Σ clip(x − λ, 0, 1) = k."""
    lo, hi = float(x64.min()) - 1, float(x64.max())
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(torch.clamp(x64 - mid, 0, 1).sum()) > k else (lo, mid)
    p = torch.clamp(x64 - (lo + hi) / 2, 0, 1)
    s = ((p > 0) & (p < 1)).double()
    return s[j] * (torch.eye(len(x64), dtype=torch.float64)[j] - s / s.sum())


def _maps(k):
    return {
        "soft_topk_sparse": lambda z: softk.soft_topk(z, k, method="sparse"),
        "budget_sparsemax": lambda z: softk.budget_sparsemax(z, float(k)),
    }


@pytest.mark.parametrize("backend", ["torch", "native", "triton"])
@pytest.mark.parametrize("dtype, row", CASES)
@pytest.mark.parametrize("name", ["soft_topk_sparse", "budget_sparsemax"])
def test_an_entry_that_rounds_to_one_keeps_its_gradient(backend, dtype, row, name):
    if backend == "triton":
        pytest.importorskip("triton")
    k = 1
    f = _maps(k)[name]
    x = torch.tensor(row, dtype=dtype, requires_grad=True)
    with softk.use_backend(backend):
        p = f(x)
        for j in range(len(row)):
            (g,) = torch.autograd.grad(p[j], x, retain_graph=True)
            want = _jacobian_row(x.detach().double(), k, j)
            # the gradient is formed in float32 and rounded once to ``dtype``
            torch.testing.assert_close(g.double(), want, rtol=torch.finfo(dtype).eps, atol=0)
    assert (p < 1).all()  # no entry is saturated at these rows


@pytest.mark.parametrize("dtype, row, k, want", [
    (torch.float32, [1.0, 0.0, -5.0], 1, [1.0, 0.0, 0.0]),  # λ = 0
    (torch.bfloat16, [-1.0, 0.75, -0.75, -2.0, 0.0, -1.0], 5, [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]),  # λ = −2
])
def test_an_entry_at_the_kink_is_stored_as_one_on_every_backend(dtype, row, k, want):
    # clip(u, 0, 1) is 1 exactly from u = 1 on: only entries below 1 in the
    # registers stay below 1 (a first version of the half-precision guard
    # lowered u = 1 too, and in float32: [0.99999994, 0, 0] on Triton)
    x = torch.tensor(row, dtype=dtype)
    for backend in ("torch", "native", "triton"):
        with softk.use_backend(backend):
            got = softk.soft_topk(x, k, method="sparse")
        torch.testing.assert_close(got, torch.tensor(want, dtype=dtype), rtol=0, atol=0)
