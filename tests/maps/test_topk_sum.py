"""topk_sum against the reference (dual form min_λ ΣF(z−λ)+kλ for the threshold
methods, mpmath τ·log e_k for "grad"), its gradient, bounds and limits."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import softk
import softk.nn

from ..oracle import topk as ref

METHODS = ["exp", "sigmoid", "laplace", "sparse", "grad"]
SHAPES_DIMS = [((7,), 0), ((3, 6), -1), ((4, 5, 3), 1), ((1, 1), -1)]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
def test_matches_reference(rng, method, shape, dim):
    xn = rng.normal(size=shape) * 2
    n = shape[dim]
    for k in sorted({1, max(1, n // 2), n}):
        for tau in (1.0, 0.3):
            out = softk.topk_sum(torch.tensor(xn), k, dim, tau, method)
            expect = ref.topk_sum(xn, k, dim, tau, method)
            np.testing.assert_allclose(out.numpy(), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_float32_and_keepdim(rng, method):
    xn = rng.normal(size=(3, 8))
    x = torch.tensor(xn, dtype=torch.float32)
    out = softk.topk_sum(x, 3, 1, 0.5, method, keepdim=True)
    assert out.shape == (3, 1) and out.dtype == torch.float32
    expect = ref.topk_sum(x.double().numpy(), 3, -1, 0.5, method)
    np.testing.assert_allclose(out[:, 0].double().numpy(), expect, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_dtypes(rng, method, dtype):
    x = torch.tensor(rng.normal(size=(2, 6))).to(dtype).requires_grad_()
    out = softk.topk_sum(x, 2, method=method)
    assert out.dtype == dtype
    expect = ref.topk_sum(x.detach().double().numpy(), 2, method=method)
    rtol = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]  # one rounding of the result
    np.testing.assert_allclose(out.detach().double().numpy(), expect, rtol=rtol, atol=0)
    (g,) = torch.autograd.grad(out.sum(), x)
    assert g.dtype == dtype and torch.isfinite(g).all()


@pytest.mark.parametrize("method", METHODS)
def test_gradient_is_soft_topk(rng, method):
    x = torch.tensor(rng.normal(size=(3, 6)), requires_grad=True)
    (g,) = torch.autograd.grad(softk.topk_sum(x, 2, tau=0.6, method=method).sum(), x)
    torch.testing.assert_close(g, softk.soft_topk(x.detach(), 2, tau=0.6, method=method), rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda t: softk.topk_sum(t, 2, tau=0.6, method=method), (x,))


@pytest.mark.parametrize("method", ["exp", "grad"])
def test_k1_is_logsumexp(rng, method):
    xn = rng.normal(size=(4, 7)) * 3
    out = softk.topk_sum(torch.tensor(xn), 1, tau=0.5, method=method).numpy()
    m = (xn / 0.5).max(-1)
    expect = 0.5 * (m + np.log(np.exp(xn / 0.5 - m[:, None]).sum(-1)))
    np.testing.assert_allclose(out, expect, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("method", METHODS)
def test_small_tau_gives_hard_sum(rng, method):
    xn = np.stack([rng.permutation(9) for _ in range(3)]).astype(np.float64)
    for k in (1, 4, 8):
        out = softk.topk_sum(torch.tensor(xn), k, tau=1e-3, method=method).numpy()
        np.testing.assert_allclose(out, ref.hard_topk_sum(xn, k), rtol=0, atol=1e-9)


@given(
    st.lists(st.floats(-30, 30, allow_nan=False), min_size=2, max_size=10),
    st.integers(1, 9),
    st.sampled_from([0.05, 0.5, 2.0]),
    st.sampled_from(METHODS),
)
def test_bounds(values, k, tau, method):
    # hard sum <= topk_sum <= hard sum + τ·bound; bound = log C(n,k) for "grad",
    # max over the capped simplex of −Ω₀ for the threshold methods (attained
    # at p = k/n by symmetry and convexity).
    x = np.array(values)
    n = x.size
    k = min(k, n)
    out = float(softk.topk_sum(torch.tensor(x), k, tau=tau, method=method))
    hard = ref.hard_topk_sum(x, k)
    q = k / n
    def xlogx(t):
        return t * math.log(t) if t > 0 else 0.0

    psi = {
        "exp": lambda p: xlogx(p) - p,
        "sigmoid": lambda p: xlogx(p) + xlogx(1 - p),
        "laplace": lambda p: xlogx(2 * p) / 2 - p if p < 0.5 else xlogx(2 * (1 - p)) / 2 - (1 - p),
        "sparse": lambda p: 0.5 * p * p,
    }
    if method == "grad":
        bound = math.log(math.comb(n, k))
    else:
        f = psi[method]
        bound = -(n * f(q) - f(1.0) * k)
    slack = 1e-9 * (1 + abs(hard))
    assert hard - slack <= out <= hard + tau * bound + slack


def test_masks_and_degenerate_rows():
    inf = float("inf")
    x = torch.tensor(
        [[1.0, -inf, 2.0, 0.5], [-inf, 3.0, -inf, 1.0], [-inf] * 4, [0.0, float("nan"), 1.0, 1.0]],
        dtype=torch.float64,
        requires_grad=True,
    )
    for method in METHODS:
        out = softk.topk_sum(x, 2, method=method)
        np.testing.assert_allclose(out[0].item(), ref.topk_sum(np.array([[1.0, 2.0, 0.5]]), 2, method=method)[0], rtol=1e-13)
        assert out[1].item() == 4.0 and out[2].item() == 0.0 and math.isnan(out[3].item())
        (g,) = torch.autograd.grad(out[:3].sum(), x)
        assert g[0, 1] == 0 and g[1].tolist() == [0, 1, 0, 1] and (g[2] == 0).all()


def test_rejects_methods_without_a_potential():
    x = torch.randn(5)
    for method in ("iterative", "weighted", "softmax"):
        with pytest.raises(ValueError, match="method"):
            softk.topk_sum(x, 2, method=method)
    with pytest.raises(ValueError, match="k"):
        softk.topk_sum(x, 6)
    with pytest.raises(ValueError, match="tau"):
        softk.topk_sum(x, 2, tau=float("inf"))


def test_modules():
    x = torch.tensor([[1.0, 4.0, 2.0, 3.0]], dtype=torch.float64)
    m = softk.nn.TopKSum(2, tau=0.5, method="grad", keepdim=True)
    torch.testing.assert_close(m(x), softk.topk_sum(x, 2, tau=0.5, method="grad", keepdim=True))
    assert "method='grad'" in repr(m)
    assert softk.nn.HardTopK(2)(x).tolist() == [[0, 1, 0, 1]]
    torch.testing.assert_close(softk.nn.TopKSoftmax(2, tau=2.0)(x), softk.topk_softmax(x, 2, tau=2.0))
    with pytest.raises(ValueError, match="k"):
        softk.nn.TopKSoftmax(0)
    with pytest.raises(ValueError, match="method"):
        softk.nn.TopKSum(2, method="iterative")


@pytest.mark.parametrize("method", ["exp", "sigmoid", "laplace", "sparse"])
@pytest.mark.parametrize("tau", [0.1, 1.0])
def test_a_sum_near_the_float_max(method, tau):
    # the top-2 sum of [1.7e308, −1e308, 0, 1] is 1.7e308 + 1, finite; the
    # shift m·Σp = 3.4e308 and (x − m)/τ both overflowed, to inf and NaN
    from ..oracle import mp as omp

    x = torch.tensor([1.7e308, -1e308, 0.0, 1.0], dtype=torch.float64)
    want = omp.topk_sum_row(method, x.numpy(), 2, tau)
    got = softk.topk_sum(x, 2, tau=tau, method=method).item()
    assert got == pytest.approx(want, rel=1e-15)
    xx = x.clone().requires_grad_()
    softk.topk_sum(xx, 2, tau=tau, method=method).backward()
    torch.testing.assert_close(xx.grad, softk.soft_topk(x, 2, tau=tau, method=method))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["exp", "sigmoid", "laplace", "sparse"])
def test_ties_at_the_float_max(dtype, method):
    # Φ's shift times Σp as summed (1 + an ulp) overflowed: the shift now
    # takes the mass exactly, min(k, finite entries), and the sum, the max
    # plus a smoothing term of a few units, rounds to the max
    big = torch.finfo(dtype).max
    assert softk.topk_sum(torch.full((8,), big, dtype=dtype), 1, method=method).item() == big


@pytest.mark.parametrize("method", ["exp", "sigmoid", "laplace", "sparse", "grad"])
@pytest.mark.parametrize("row", [[1e38, -1e38, 3e38, 2e38], [1e38, -1e38, 1.5e38, 1.4e38]])
def test_a_sum_past_the_float_max_is_inf(method, row):
    # x − m overflowed for entries of both signs near the float max: −inf
    # times a positive p, plus m·Σp = +inf, gave NaN where the sum is +inf
    # (or finite: sparse on the second row, 3.0033e38)
    import itertools

    import mpmath as mp

    from ..oracle import mp as omp

    x = torch.tensor(row)
    row = x.double().tolist()  # the float32 scores, exactly
    if method == "grad":  # τ log e₂(exp(x/τ)) over the pairs
        with mp.workprec(200):
            z = [mp.mpf(v) / mp.mpf(1e38) for v in row]
            want = float(mp.mpf(1e38) * mp.log(mp.fsum(mp.exp(a + b) for a, b in itertools.combinations(z, 2))))
    else:
        want = omp.topk_sum_row(method, np.array(row), 2, 1e38)
    got = softk.topk_sum(x, 2, tau=1e38, method=method).item()
    if want > float(torch.finfo(torch.float32).max):
        assert got == float("inf")
    else:
        assert got == pytest.approx(want, rel=1e-6)


def _grad_method_reference(row, k, tau):
    """τ log e_k(exp(x/τ)) over the k-subsets, in mpmath."""
    import itertools

    import mpmath as mp

    with mp.workprec(300):
        z = [mp.mpf(v) / mp.mpf(tau) for v in row]
        total = mp.fsum(mp.exp(mp.fsum(c)) for c in itertools.combinations(z, k))
        return float(mp.mpf(tau) * mp.log(total))


@pytest.mark.parametrize("dtype, row, k, tau", [
    (torch.float64, [-1e308, -1.7e308, 1.5e308], 3, 1.0),
    (torch.float64, [-1e308, -1.7e308, 1.5e308], 2, 1.0),
    (torch.float64, [-1e308, -1.7e308, 1.5e308], 1, 1.0),
    (torch.float32, [-2e38, -3e38, 2e38], 3, 1.0),
    (torch.float32, [-2.7031454e38, 1.6313861e38, 2.4464468e38], 3, 3.0625e38),
    (torch.float64, [-1.7976931348623157e308, 4.486, 1.7976931348623157e308, -1.7976931348623157e308], 3,
     8.988465674311579e307),  # (x − r)/τ: x − r overflowed
    (torch.float64, [1.7976931348623157e308, -1.7976931348623157e308, -1.7976931348623157e308], 2,
     8.988465674311579e307),
])
@pytest.mark.parametrize("method", ["exp", "sigmoid", "laplace", "sparse", "grad"])
def test_a_sum_near_the_float_max_that_is_finite(dtype, row, k, tau, method):
    # a term overflowed where the sum does not: x − m for entries of both
    # signs, m·Σp, τψ(1)·Σp, and GradTopK's k·r and its sum of a full row:
    # NaN, inf or −inf for these finite sums
    from ..oracle import mp as omp

    x = torch.tensor(row, dtype=dtype)
    exact = x.double().tolist()
    if k == len(row):  # every entry selected: the sum itself
        want = float(sum(__import__("fractions").Fraction(v) for v in exact))
    elif method == "grad":
        want = _grad_method_reference(exact, k, tau)
    else:
        want = omp.topk_sum_row(method, np.array(exact), k, tau)
    got = softk.topk_sum(x, k, tau=tau, method=method).item()
    # the shift m·Σp and the sum it cancels against each round to an ulp of
    # their size, k·max|x|, which here is a few times the sum's
    eps = torch.finfo(dtype).eps
    assert got == pytest.approx(want, rel=0, abs=4 * eps * k * max(abs(v) for v in exact))
