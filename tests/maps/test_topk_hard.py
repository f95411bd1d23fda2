"""hard_topk and topk_softmax against the NumPy reference (tests/oracle_topk.py)."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import softk

from ..oracle import maps as oracle, topk as ref

SHAPES_DIMS = [((7,), 0), ((3, 9), -1), ((4, 6, 5), 1), ((2, 5, 3), 0), ((1, 1), -1)]
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_hard_topk_matches_reference(rng, shape, dim, dtype):
    x = torch.tensor(rng.normal(size=shape)).to(dtype)
    xn = x.double().numpy()  # the rounded values, so ties created by rounding agree
    n = shape[dim]
    for k in sorted({1, max(1, n // 2), n}):
        out = softk.hard_topk(x, k, dim)
        assert out.dtype == dtype and not out.requires_grad
        np.testing.assert_array_equal(out.double().numpy(), ref.hard_topk(xn, k, dim))


@pytest.mark.parametrize("shape,dim", SHAPES_DIMS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_topk_softmax_matches_reference(rng, shape, dim, dtype):
    x = torch.tensor(rng.normal(size=shape) * 2).to(dtype)
    xn = x.double().numpy()
    n = shape[dim]
    tol = {torch.float64: 1e-14, torch.float32: 1e-6}[dtype]
    for k in sorted({1, max(1, n // 2), n}):
        for tau in (1.0, 0.3):
            out = softk.topk_softmax(x, k, dim, tau)
            np.testing.assert_allclose(out.double().numpy(), ref.topk_softmax(xn, k, dim, tau), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_topk_softmax_half_is_computed_in_float32(rng, dtype):
    x = torch.tensor(rng.normal(size=(3, 8))).to(dtype)
    out = softk.topk_softmax(x, 3)
    assert out.dtype == dtype
    expect = ref.topk_softmax(x.double().numpy(), 3)
    tol = {torch.float16: 1e-3, torch.bfloat16: 4e-3}[dtype]  # one rounding of the result
    np.testing.assert_allclose(out.double().numpy(), expect, rtol=0, atol=tol)


def test_k_equals_n_is_softmax(rng):
    xn = rng.normal(size=(4, 6))
    out = softk.topk_softmax(torch.tensor(xn), 6, tau=0.5).numpy()
    np.testing.assert_allclose(out, oracle.softmax(xn, -1, 0.5), rtol=0, atol=1e-15)


def test_ties_pick_exactly_k_lower_index_first():
    x = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.0], [5.0, 5.0, 5.0, 5.0, 5.0]])
    assert softk.hard_topk(x, 2).tolist() == [[0, 1, 1, 0, 0], [1, 1, 0, 0, 0]]
    p = softk.topk_softmax(x, 2)
    assert p.tolist() == [[0, 0.5, 0.5, 0, 0], [0.5, 0.5, 0, 0, 0]]


def test_masks_and_degenerate_rows():
    inf = float("inf")
    x = torch.tensor(
        [
            [1.0, -inf, 3.0, -inf],  # 2 finite, k = 3: select just those
            [-inf, -inf, -inf, -inf],  # fully masked
            [0.0, float("nan"), 1.0, 2.0],
            [0.0, inf, 1.0, 2.0],
        ]
    )
    h = softk.hard_topk(x, 3)
    assert h[0].tolist() == [1, 0, 1, 0] and h[1].tolist() == [0, 0, 0, 0]
    assert torch.isnan(h[2:]).all()
    p = softk.topk_softmax(x, 3)
    np.testing.assert_allclose(p[0].numpy(), ref.topk_softmax([1.0, -np.inf, 3.0, -np.inf], 3), atol=1e-7)
    assert p[1].tolist() == [0, 0, 0, 0]
    assert torch.isnan(p[2:]).all()


def test_gradient_flows_only_through_kept_entries(rng):
    x = torch.tensor(rng.normal(size=(3, 7)), requires_grad=True)
    keep = softk.hard_topk(x, 3).bool()
    p = softk.topk_softmax(x, 3, tau=0.7)
    g = torch.tensor(rng.normal(size=(3, 7)))
    (gx,) = torch.autograd.grad(p, x, g)
    assert (gx[~keep] == 0).all()
    # on the kept entries: the softmax Jacobian of x/τ, from the reference
    pn = p.detach().numpy()
    gn = g.numpy()
    expect = pn * (gn - (pn * gn).sum(-1, keepdims=True)) / 0.7
    np.testing.assert_allclose(gx.numpy(), expect, rtol=0, atol=1e-14)
    assert torch.autograd.gradcheck(lambda t: softk.topk_softmax(t, 3, tau=0.7), (x,))


def test_fully_masked_row_has_zero_gradient():
    x = torch.tensor([[-float("inf")] * 3, [0.0, 1.0, 2.0]], requires_grad=True)
    softk.topk_softmax(x, 2).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[0] == 0).all()


def test_empty_input():
    assert softk.hard_topk(torch.zeros(2, 0), 1, dim=0).shape == (2, 0)


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=20), st.integers(1, 20))
def test_exactly_k_selected_and_they_are_the_largest(values, k):
    x = torch.tensor(values, dtype=torch.float64)
    k = min(k, x.numel())
    h = softk.hard_topk(x, k)
    assert int(h.sum()) == k
    if k < x.numel():
        assert x[h.bool()].min() >= x[~h.bool()].max()
    p = softk.topk_softmax(x, k)
    assert abs(float(p.sum()) - 1) < 1e-12 and (p[~h.bool()] == 0).all()


def test_errors_name_the_parameter():
    x = torch.randn(2, 4)
    with pytest.raises(ValueError, match="k"):
        softk.hard_topk(x, 0)
    with pytest.raises(ValueError, match="k must be a whole number"):
        softk.topk_softmax(x, 2.5)
    with pytest.raises(ValueError, match="tau"):
        softk.topk_softmax(x, 2, tau=-1.0)
    with pytest.raises(ValueError, match="dim"):
        softk.hard_topk(x, 1, dim=2)
    with pytest.raises(TypeError, match="x"):
        softk.hard_topk([1.0, 2.0], 1)
