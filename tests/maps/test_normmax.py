"""α-normmax (softk.normmax) against the independent NumPy float64
oracle (tests/oracle_normmax.py), which itself is checked against scipy's
solution of the definition; derivatives against gradcheck and against
central differences of the oracle; the row conventions; the limits."""

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from torch.autograd import gradcheck, gradgradcheck

import softk
from softk import normmax

from ..oracle import normmax as on

ALPHAS = [1.05, 1.5, 2.0, 3.0, 10.0]
# |p − oracle| per dtype: p's relative error is ~β·eps (β = 1/(α−1), largest at α = 1.05)
TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def _t(a, dtype=torch.float64, grad=False):
    return torch.tensor(np.asarray(a), dtype=dtype, requires_grad=grad)


def test_oracle_solves_the_definition(rng):
    # the KKT form both sides use, against scipy on <z, p> − ||p||_α over the simplex
    for alpha in (1.3, 2.0, 4.0):
        z = rng.normal(size=6)
        p_opt, f_opt = on.normmax_by_optimisation(z, alpha)
        p = on.normmax_row(z, alpha)
        assert -(z @ p) + on.alpha_norm(p, alpha) <= f_opt + 1e-12  # at least as good as SLSQP's optimum
        np.testing.assert_allclose(p, p_opt, atol=1e-6)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("dtype", list(TOL))
def test_matches_oracle(rng, alpha, dtype):
    x = _t(rng.normal(size=(6, 9)) * 2, dtype)
    p = normmax(x, alpha)
    assert p.dtype == dtype
    np.testing.assert_allclose(p.double().numpy(), on.normmax(x.double().numpy(), alpha), atol=TOL[dtype])


def test_entmax_readme_values():
    # the entmax package's README: normmax_bisect(x, alpha=2) and alpha=1000
    x = torch.tensor([-2.0, 0.0, 0.5])
    torch.testing.assert_close(normmax(x, 2.0), torch.tensor([0.0, 0.3110, 0.6890]), atol=1e-4, rtol=0)
    torch.testing.assert_close(normmax(x, 1000.0), torch.tensor([0.0, 0.4997, 0.5003]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_every_dim_and_per_row_alpha(rng, dim):
    x = rng.normal(size=(3, 4, 5))
    shape = list(x.shape)
    shape[dim] = 1
    alpha = 1 + 3 * rng.random(size=shape)
    p = normmax(_t(x), _t(alpha), dim=dim)
    np.testing.assert_allclose(p.numpy(), on.normmax(x, alpha, dim=dim), atol=1e-12)
    np.testing.assert_allclose(normmax(_t(x), 2.5, dim=dim).numpy(), on.normmax(x, 2.5, dim=dim), atol=1e-12)


def test_one_d_size_one_and_empty():
    assert normmax(torch.tensor([3.0])).tolist() == [1.0]
    assert normmax(torch.randn(4, 1)).eq(1).all()
    assert normmax(torch.randn(1, 5), dim=0).eq(1).all()
    assert normmax(torch.empty(0, 3)).shape == (0, 3)


@pytest.mark.parametrize("offset", [1e4, 1e6])
def test_far_from_origin(rng, offset):
    x = offset + rng.normal(size=(4, 7))  # the float64 values are the data
    for alpha in (1.5, 2.0, 4.0):
        np.testing.assert_allclose(normmax(_t(x), alpha).numpy(), on.normmax(x, alpha), atol=1e-12)
    x32 = torch.tensor(1e4 + rng.normal(size=(4, 7)), dtype=torch.float32)
    np.testing.assert_allclose(normmax(x32, 2.0).double().numpy(), on.normmax(x32.double().numpy(), 2.0), atol=2e-5)


@pytest.mark.parametrize("tau", [1e-8, 1e-3, 0.1, 1.0, 10.0])
def test_temperature(rng, tau):
    x = rng.normal(size=(4, 6))
    np.testing.assert_allclose(normmax(_t(x), 2.0, tau=tau).numpy(), on.normmax(x, 2.0, tau=tau), atol=1e-12)


def test_ties_one_dominant_entry_and_limits():
    ties = torch.tensor([1.0, 1.0, 1.0, -5.0], dtype=torch.float64)
    for alpha in (1.0, 1.5, 2.0, 50.0):
        torch.testing.assert_close(normmax(ties, alpha), torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0], dtype=torch.float64))
    dominant = torch.tensor([40.0, 0.0, 0.1, -3.0], dtype=torch.float64)
    assert normmax(dominant, 2.0).tolist() == [1.0, 0.0, 0.0, 0.0]
    # α = 1 is the argmax (uniform on ties); α → 1⁺ approaches it
    x = torch.tensor([0.3, 1.0, 0.9, 1.0], dtype=torch.float64)
    assert normmax(x, 1.0).tolist() == [0.0, 0.5, 0.0, 0.5]
    y = torch.tensor([0.3, 1.0, 0.5, 0.2], dtype=torch.float64)
    assert normmax(y, 1.001)[1] > 1 - 1e-12
    # α → ∞: uniform on the support of sparsemax(x) (the ℓ∞ ball's face)
    s = (softk.sparsemax(y) > 0).double()
    torch.testing.assert_close(normmax(y, 1e7), s / s.sum(), atol=1e-5, rtol=0)


def test_masks_and_row_conventions():
    inf = float("inf")
    x = torch.tensor([[0.5, -inf, 1.0, 0.2, -inf], [-inf] * 5, [2.0, -inf, -inf, -inf, -inf],
                      [0.0, float("nan"), 1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0, inf]], dtype=torch.float64,
                     requires_grad=True)
    p = normmax(x, 2.0)
    torch.testing.assert_close(p[0, [0, 2, 3]], normmax(x[0, [0, 2, 3]].detach(), 2.0))  # -inf = removed
    assert p[0, [1, 4]].eq(0).all()
    assert p[1].eq(0).all() and p[2].tolist() == [1.0, 0, 0, 0, 0]
    assert p[3].isnan().all() and p[4].isnan().all()
    g = torch.autograd.grad((p[:3] * torch.randn(3, 5, dtype=torch.float64)).sum(), x, retain_graph=True)[0]
    assert g[1:3].eq(0).all() and torch.isfinite(g[0]).all()
    g_all = torch.autograd.grad(p.nansum(), x)[0]
    assert torch.isfinite(g_all[:3]).all()  # a NaN row does not reach the others


@pytest.mark.parametrize("alpha", [1.2, 2.0, 5.0])
def test_gradcheck_gradgradcheck_forward_ad(rng, alpha):
    x = _t(rng.normal(size=(3, 6)), grad=True)
    assert gradcheck(lambda t: normmax(t, alpha), (x,), check_forward_ad=True)
    assert gradgradcheck(lambda t: normmax(t, alpha), (x,))


def test_gradients_in_alpha_and_tau(rng):
    x = _t(rng.normal(size=(4, 6)), grad=True)
    alpha = _t(1.1 + 3 * rng.random(size=(4, 1)), grad=True)
    tau = _t(0.7, grad=True)
    f = lambda t, a, s: normmax(t, a, tau=s)  # noqa: E731
    assert gradcheck(f, (x, alpha, tau))
    assert gradgradcheck(f, (x, alpha, tau))
    # forward mode in x and α (a τ tensor without requires_grad is read as a number by softk's check_tau)
    assert gradcheck(lambda t, a: normmax(t, a, tau=0.7), (x, alpha), check_forward_ad=True)


def test_derivatives_match_oracle_differences(rng):
    z = rng.normal(size=6)
    alpha, h = 2.7, 1e-6
    w = rng.normal(size=6)
    a = _t([alpha], grad=True)
    (normmax(_t(z), a) @ _t(w)).backward()
    num = (on.normmax_row(z, alpha + h) - on.normmax_row(z, alpha - h)) @ w / (2 * h)
    np.testing.assert_allclose(a.grad.item(), num, atol=1e-7)
    jac = torch.func.jacrev(lambda t: normmax(t, alpha))(_t(z)).numpy()
    cols = [(on.normmax_row(z + h * e, alpha) - on.normmax_row(z - h * e, alpha)) / (2 * h) for e in np.eye(6)]
    np.testing.assert_allclose(jac, np.stack(cols, axis=1), atol=1e-7)
    np.testing.assert_allclose(jac, jac.T, atol=1e-12)  # the Jacobian is symmetric


def test_torch_func_and_compile(rng):
    x = _t(rng.normal(size=(3, 5)))
    f = lambda t: normmax(t, 2.0)  # noqa: E731
    torch.testing.assert_close(torch.func.vmap(f)(x), f(x))
    torch.testing.assert_close(torch.func.jacrev(f)(x[0]), torch.func.jacfwd(f)(x[0]))
    alphas = _t([1.5, 2.0, 3.0])
    torch.testing.assert_close(torch.func.vmap(normmax)(x, alphas), normmax(x, alphas[:, None]))


@pytest.mark.slow
def test_compile_fullgraph(rng):
    x = _t(rng.normal(size=(3, 5)), grad=True)
    f = lambda t: normmax(t, 2.0, dim=0)  # noqa: E731
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x))
    g = torch.compile(lambda t: (f(t) ** 2).sum(), fullgraph=True)
    torch.testing.assert_close(torch.autograd.grad(g(x), x)[0], torch.autograd.grad((f(x) ** 2).sum(), x)[0])


def test_bad_arguments():
    x = torch.randn(2, 3)
    for alpha, err in [(0.5, ValueError), (float("inf"), ValueError), (float("nan"), ValueError), ("2", TypeError),
                       (True, TypeError), (torch.tensor([[0.9], [2.0]]), ValueError), (torch.tensor([2]), TypeError),
                       (torch.ones(3, 1) * 2, ValueError)]:
        with pytest.raises(err, match="alpha"):
            normmax(x, alpha)
    with pytest.raises(TypeError, match="x"):
        normmax(torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="dim"):
        normmax(x, dim=2)
    with pytest.raises(ValueError, match="tau"):
        normmax(x, tau=0.0)


finite_rows = arrays(np.float64, st.integers(2, 8), elements=st.floats(-20, 20, allow_nan=False))


@given(x=finite_rows, alpha=st.sampled_from([1.1, 1.5, 2.0, 4.0, 20.0]))
def test_property_simplex_and_order(x, alpha):
    p = normmax(_t(x), alpha).numpy()
    assert np.all(p >= 0) and abs(p.sum() - 1) < 1e-12
    order = np.argsort(x)
    assert np.all(np.diff(p[order]) >= -1e-12)  # larger score, no smaller probability
    ref = on.normmax_row(x, alpha)
    np.testing.assert_allclose(p, ref, atol=1e-10)
    if not np.any((ref > 0) & (ref < 1e-6)):  # no entry at the support's edge: the supports agree exactly
        assert np.array_equal(p > 0, ref > 0)


@given(x=finite_rows, shift=st.floats(-50, 50), data=st.data())
def test_property_shift_invariance_and_permutation(x, shift, data):
    perm = data.draw(st.permutations(range(x.size)))
    p = normmax(_t(x), 2.0)
    torch.testing.assert_close(normmax(_t(x + shift), 2.0), p, atol=1e-12, rtol=0)
    torch.testing.assert_close(normmax(_t(x[perm]), 2.0), p[perm], atol=1e-12, rtol=0)


@given(x=finite_rows, data=st.data(), bump=st.floats(0.01, 3.0))
def test_property_raising_a_score_raises_its_probability(x, data, bump):
    i = data.draw(st.integers(0, x.size - 1))
    y = x.copy()
    y[i] += bump
    assume(np.isfinite(y).all())
    assert normmax(_t(y), 1.7)[i] >= normmax(_t(x), 1.7)[i] - 1e-12


def test_second_derivative_in_alpha_on_a_fully_masked_row():
    # log ‖p‖ was −inf/α there, whose second derivative in α is NaN; p is 0
    # whatever α, so every derivative is 0
    x = torch.full((1, 3), float("-inf"), dtype=torch.float64)
    a = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(softk.normmax(x, alpha=a)[:, 0].sum(), a, create_graph=True)
    (h,) = torch.autograd.grad(g, a)
    assert g.item() == 0.0 and h.item() == 0.0
