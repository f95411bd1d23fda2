"""Budget sparsemax (softk.budget_sparsemax) against the independent
NumPy float64 oracle (tests/oracle_budget.py: exact breakpoint interpolation,
itself checked against scipy's QP of the definition)."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch.autograd import gradcheck, gradgradcheck

import softk
from softk import budget_sparsemax

from ..oracle import budget as ob

TOL = {torch.float64: 1e-12, torch.float32: 4e-6, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _t(a, dtype=torch.float64, grad=False):
    return torch.tensor(np.asarray(a), dtype=dtype, requires_grad=grad)


def test_oracle_solves_the_definition(rng):
    for budget in (0.4, 1.0, 2.5, 4.0):
        z = rng.normal(size=7)
        np.testing.assert_allclose(ob.budget_row(z, budget), ob.budget_by_qp(z, budget), atol=1e-8)


@pytest.mark.usefixtures("each_cpu_backend")  # an integer budget runs on the compiled kernels too
@pytest.mark.parametrize("budget", [0, 0.3, 1, 2.5, 3, 7.75, 9])
@pytest.mark.parametrize("dtype", list(TOL))
def test_matches_oracle(rng, budget, dtype):
    x = _t(rng.normal(size=(5, 9)), dtype)
    p = budget_sparsemax(x, budget)
    assert p.dtype == dtype
    ref = ob.budget_sparsemax(x.double().numpy(), budget)
    np.testing.assert_allclose(p.double().numpy(), ref, atol=TOL[dtype])
    np.testing.assert_allclose(p.double().sum(-1).numpy(), budget, atol=10 * TOL[dtype])


@pytest.mark.usefixtures("each_cpu_backend")
def test_entmax_values_and_special_budgets(rng):
    # the entmax package's own examples for budget_bisect
    x = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])
    torch.testing.assert_close(budget_sparsemax(x, 2), torch.tensor([0.0, 0.125, 0.375, 0.625, 0.875]))
    torch.testing.assert_close(budget_sparsemax(2 * x, 3), torch.tensor([0.0, 0.25, 0.75, 1.0, 1.0]))
    z = _t(rng.normal(size=(3, 6)))
    torch.testing.assert_close(budget_sparsemax(z, 1), softk.sparsemax(z), atol=1e-15, rtol=0)
    torch.testing.assert_close(budget_sparsemax(z, 1.0), softk.sparsemax(z), atol=1e-15, rtol=0)
    assert budget_sparsemax(z, 6).eq(1).all() and budget_sparsemax(z, 0).eq(0).all()
    torch.testing.assert_close(budget_sparsemax(z, 3), softk.soft_topk(z, 3, method="sparse"))


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_every_dim_and_per_row_budget(rng, dim):
    x = rng.normal(size=(3, 4, 5))
    shape = list(x.shape)
    shape[dim] = 1
    budget = rng.random(size=shape) * x.shape[dim]
    budget.flat[0] = 0.0
    p = budget_sparsemax(_t(x), _t(budget), dim=dim)
    np.testing.assert_allclose(p.numpy(), ob.budget_sparsemax(x, budget, dim=dim), atol=1e-12)
    np.testing.assert_allclose(budget_sparsemax(_t(x), 1.5, dim=dim).numpy(), ob.budget_sparsemax(x, 1.5, dim=dim),
                               atol=1e-12)


@pytest.mark.parametrize("offset", [1e4, 1e6])
@pytest.mark.parametrize("tau", [1e-8, 0.1, 1.0, 10.0])
def test_far_from_origin_and_temperature(rng, offset, tau):
    x = offset + rng.normal(size=(4, 7))
    np.testing.assert_allclose(budget_sparsemax(_t(x), 2.5, tau=tau).numpy(), ob.budget_sparsemax(x, 2.5, tau=tau),
                               atol=1e-9)


def test_masks_ties_and_row_conventions():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[0.5, -inf, 1.0, 0.2, -inf], [-inf] * 5, [2.0, 1.0, -inf, -inf, -inf],
                      [0.0, nan, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    p = budget_sparsemax(x, 2.5)
    torch.testing.assert_close(p[0, [0, 2, 3]], budget_sparsemax(x[0, [0, 2, 3]].detach(), 2.5))
    assert p[0, [1, 4]].eq(0).all() and p[1].eq(0).all()
    assert p[2].tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]  # 2 finite entries <= budget: 1 on each
    assert p[3].isnan().all()
    torch.testing.assert_close(p[4], torch.tensor([0.625] * 4 + [0.0], dtype=torch.float64))  # ties share
    g = torch.autograd.grad((p[[0, 1, 2, 4]] * torch.randn(4, 5, dtype=torch.float64)).sum(), x)[0]
    assert g[1:3].eq(0).all() and torch.isfinite(g[[0, 1, 2, 4]]).all()  # the NaN row's own gradient is NaN
    assert budget_sparsemax(torch.tensor([3.0]), 0.5).tolist() == [0.5]
    assert budget_sparsemax(torch.randn(4, 1), 1).eq(1).all()


def test_gradients_in_x_budget_and_tau(rng):
    x = _t(rng.normal(size=(3, 6)), grad=True)
    budget = _t([[0.7], [2.5], [4.2]], grad=True)
    tau = _t(0.8, grad=True)
    f = lambda u, b, s: budget_sparsemax(u, b, tau=s)  # noqa: E731
    assert gradcheck(f, (x, budget, tau))
    assert gradgradcheck(f, (x, budget, tau))
    assert gradcheck(lambda u: budget_sparsemax(u, 2), (x,), check_forward_ad=True)
    # ∂p/∂B against a central difference of the oracle
    z, w, h = rng.normal(size=6), rng.normal(size=6), 1e-6
    b = _t([2.3], grad=True)
    (budget_sparsemax(_t(z), b) @ _t(w)).backward()
    num = (ob.budget_row(z, 2.3 + h) - ob.budget_row(z, 2.3 - h)) @ w / (2 * h)
    np.testing.assert_allclose(b.grad.item(), num, atol=1e-7)
    zero = _t([[0.0]], grad=True)  # B = 0: zeros, zero gradient
    out = budget_sparsemax(x[:1], zero)
    assert out.eq(0).all() and torch.autograd.grad(out.sum(), zero)[0].eq(0).all()


def test_bad_arguments():
    x = torch.randn(2, 3)
    for budget, err in [(3.5, ValueError), (-0.1, ValueError), (float("nan"), ValueError), (True, TypeError),
                        ("2", TypeError), (torch.tensor([[1.0], [4.0]]), ValueError), (torch.ones(3, 1), ValueError),
                        (torch.tensor([1 + 1j]), TypeError), (torch.tensor([1], dtype=torch.bool), TypeError)]:
        with pytest.raises(err, match="budget"):
            budget_sparsemax(x, budget)
    with pytest.raises(TypeError, match="x"):
        budget_sparsemax(torch.ones(3, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="dim"):
        budget_sparsemax(x, 1, dim=-3)
    with pytest.raises(ValueError, match="tau"):
        budget_sparsemax(x, 1, tau=-1.0)


rows = arrays(np.float64, st.integers(2, 8), elements=st.floats(-10, 10, allow_nan=False))


@given(x=rows, frac=st.floats(0.0, 1.0))
def test_property_capped_simplex_and_order(x, frac):
    budget = frac * x.size
    p = budget_sparsemax(_t(x), budget).numpy()
    assert np.all(p >= 0) and np.all(p <= 1) and abs(p.sum() - budget) < 1e-10
    order = np.argsort(x)
    assert np.all(np.diff(p[order]) >= -1e-12)  # larger score, no smaller value
    ref = ob.budget_row(x, budget)
    np.testing.assert_allclose(p, ref, atol=1e-10)
    if not np.any(((ref > 0) & (ref < 1e-9)) | ((ref < 1) & (ref > 1 - 1e-9))):  # no entry at a vertex's edge
        assert np.array_equal(p > 0, ref > 0) and np.array_equal(p == 1, ref == 1)  # zeros and ones exact


@given(x=rows, a=st.floats(0.0, 1.0), b=st.floats(0.0, 1.0))
def test_property_monotone_in_the_budget(x, a, b):
    lo, hi = sorted((a * x.size, b * x.size))
    assert np.all(budget_sparsemax(_t(x), hi).numpy() >= budget_sparsemax(_t(x), lo).numpy() - 1e-12)


def test_vmap_over_a_per_row_budget_matches_oracle(rng):
    # under vmap each row's budget is a one-element tensor, which was read
    # with .item(): vmap refused the call
    x = rng.normal(size=(4, 7))
    b = np.array([1.5, 2.0, 3.3, 0.0])
    got = torch.func.vmap(budget_sparsemax)(_t(x), _t(b[:, None]))
    want = np.stack([ob.budget_row(r, v) for r, v in zip(x, b)])
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-12)
