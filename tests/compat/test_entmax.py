"""softk.compat.entmax's maps (activations, root_finding) do what entmax's own
tests check — sums to one, sparsity, gradients of every function, bisection
equal to the exact maps, per-row α along any dim, -inf masks, modules,
normmax and budget — against NumPy float64 references (tests/oracle*.py and
the dense α < 1 map below), plus the layout and signatures of entmax's API."""

import inspect

import numpy as np
import pytest
import torch
from torch import nn
from torch.autograd import gradcheck, gradgradcheck

import softk
import softk.compat.entmax as entmax
from softk.compat.entmax import activations, losses, root_finding

from ..oracle import maps as oracle, budget as oracle_budget, normmax as oracle_normmax

# entmax master's public API: name -> (module, parameters with defaults after the input)
API = {
    "sparsemax": ("activations", "X, dim=-1, k=None, return_support_size=False"),
    "entmax15": ("activations", "X, dim=-1, k=None, return_support_size=False"),
    "Sparsemax": ("activations", "dim=-1, k=None, return_support_size=False"),
    "Entmax15": ("activations", "dim=-1, k=None, return_support_size=False"),
    "entmax_bisect": ("root_finding", "X, alpha=1.5, dim=-1, n_iter=50, ensure_sum_one=True"),
    "sparsemax_bisect": ("root_finding", "X, dim=-1, n_iter=50, ensure_sum_one=True"),
    "normmax_bisect": ("root_finding", "X, alpha=2, dim=-1, n_iter=50"),
    "budget_bisect": ("root_finding", "X, budget=2, dim=-1, n_iter=50"),
    "SparsemaxBisect": ("root_finding", "dim=-1, n_iter=None"),
    "EntmaxBisect": ("root_finding", "alpha=1.5, dim=-1, n_iter=50"),
    "NormmaxBisect": ("root_finding", "alpha=2, dim=-1, n_iter=50"),
    "BudgetBisect": ("root_finding", "budget=2, dim=-1, n_iter=50"),
    "sparsemax_loss": ("losses", "X, target, k=None, return_support_size=False"),
    "entmax15_loss": ("losses", "X, target, k=None, return_support_size=False"),
    "sparsemax_bisect_loss": ("losses", "X, target, n_iter=50"),
    "entmax_bisect_loss": ("losses", "X, target, alpha=1.5, n_iter=50"),
    "normmax_bisect_loss": ("losses", "X, target, alpha=2, n_iter=50"),
    "SparsemaxLoss": ("losses", "k=None, ignore_index=-100, reduction='elementwise_mean', return_support_size=False"),
    "Entmax15Loss": ("losses", "k=100, ignore_index=-100, reduction='elementwise_mean', return_support_size=False"),
    "SparsemaxBisectLoss": ("losses", "n_iter=50, ignore_index=-100, reduction='elementwise_mean'"),
    "EntmaxBisectLoss": ("losses", "alpha=1.5, n_iter=50, ignore_index=-100, reduction='elementwise_mean'"),
    "NormmaxBisectLoss": ("losses", "alpha=2, n_iter=50, ignore_index=-100, reduction='elementwise_mean'"),
}
MODULES = {"activations": activations, "root_finding": root_finding, "losses": losses}


def signature_text(obj) -> str:
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    return ", ".join(str(p) for p in sig.parameters.values() if p.name != "self")


@pytest.mark.parametrize("name", list(API))
def test_layout_names_and_signatures(name):
    module, params = API[name]
    obj = getattr(entmax, name)
    assert getattr(MODULES[module], name) is obj and name in entmax.__all__
    assert signature_text(obj) == params


def _t(a, dtype=torch.float64, grad=False):
    return torch.tensor(np.asarray(a), dtype=dtype, requires_grad=grad)


def dense_entmax_row(row, alpha):
    """α-entmax for 0 < α < 1 from its definition's KKT form, by bisection:
    p_i = ((1−α)(λ − z_i))^(−1/(1−α)) with Σp = 1 and λ > max z."""
    row = np.asarray(row, dtype=np.float64)
    out = np.zeros_like(row)
    finite = np.isfinite(row)
    if finite.sum() <= 1:
        out[finite] = 1.0
        return out
    z = row[finite] - row[finite].max()
    c = 1.0 - alpha
    g = lambda lam: np.sum((c * (lam - z)) ** (-1 / c))  # noqa: E731  decreasing in λ
    lo, hi = 1 / c, finite.sum() ** c / c  # p_max = 1 at lo, every p <= 1/m at hi
    for _ in range(4000):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        lo, hi = (mid, hi) if g(mid) >= 1 else (lo, mid)
    out[finite] = (c * (0.5 * (lo + hi) - z)) ** (-1 / c)
    return out


# ------------------------------------------------------------ values and sums
def test_maps_match_references(rng):
    x = rng.normal(size=(5, 7)) * 1.5
    X = _t(x)
    np.testing.assert_allclose(entmax.sparsemax(X).numpy(), oracle.sparsemax(x), atol=1e-12)
    np.testing.assert_allclose(entmax.entmax15(X).numpy(), oracle.entmax(x, 1.5), atol=1e-12)
    for alpha in (1.25, 2.0, 3.0):
        np.testing.assert_allclose(entmax.entmax_bisect(X, alpha).numpy(), oracle.entmax(x, alpha), atol=1e-12)
    for alpha in (0.05, 0.5, 0.9):
        ref = np.stack([dense_entmax_row(r, alpha) for r in x])
        np.testing.assert_allclose(entmax.entmax_bisect(X, alpha).numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(entmax.entmax_bisect(X, 1.0).numpy(), oracle.softmax(x), atol=1e-12)
    np.testing.assert_allclose(entmax.normmax_bisect(X).numpy(), oracle_normmax.normmax(x, 2.0), atol=1e-12)
    np.testing.assert_allclose(entmax.budget_bisect(X, 2.5).numpy(), oracle_budget.budget_sparsemax(x, 2.5), atol=1e-12)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_sum_to_one_nonnegative_and_sparse(rng, dim):
    X = _t(rng.normal(size=(3, 4, 5)) * 3)
    maps = [entmax.sparsemax, entmax.entmax15, entmax.sparsemax_bisect, entmax.normmax_bisect,
            lambda t, dim: entmax.entmax_bisect(t, 1.7, dim), lambda t, dim: entmax.entmax_bisect(t, 0.4, dim)]
    for f in maps:
        p = f(X, dim=dim)
        assert (p >= 0).all()
        torch.testing.assert_close(p.sum(dim), torch.ones(()).double().expand_as(p.sum(dim)))
    assert (entmax.sparsemax(X, dim=dim) == 0).any() and (entmax.entmax_bisect(X, 0.4, dim) > 0).all()
    torch.testing.assert_close(entmax.budget_bisect(X, 3.0, dim=dim).sum(dim), torch.full(p.sum(dim).shape, 3.0).double())


def test_bisection_names_equal_the_exact_maps(rng):
    X = _t(0.5 * rng.normal(size=(4, 6)))
    sm = softk.sparsemax(X)
    torch.testing.assert_close(entmax.sparsemax_bisect(X), sm, atol=0, rtol=0)
    torch.testing.assert_close(entmax.entmax_bisect(X, alpha=1.5), softk.entmax15(X), atol=1e-15, rtol=0)
    torch.testing.assert_close(entmax.entmax_bisect(X, alpha=2), sm, atol=1e-15, rtol=0)
    for c in (1, 2, 3, 4, 5):  # entmax's test: budget 1 is sparsemax at every scale
        torch.testing.assert_close(entmax.budget_bisect(c * X, budget=1), softk.sparsemax(c * X), atol=1e-15, rtol=0)
    for k, n_iter in [(1, 5), (3, None), (100, 0)]:  # entmax's hints change nothing
        torch.testing.assert_close(entmax.sparsemax(X, k=k), sm, atol=0, rtol=0)
        torch.testing.assert_close(entmax.entmax_bisect(X, 1.3, n_iter=n_iter, ensure_sum_one=False),
                                   entmax.entmax_bisect(X, 1.3), atol=0, rtol=0)


def test_return_support_size(rng):
    X = _t(rng.normal(size=(4, 6)) * 2)
    for f in (entmax.sparsemax, entmax.entmax15):
        P, s = f(X, dim=0, return_support_size=True)
        assert s.dtype == torch.int64 and s.shape == (1, 6) and torch.equal(s, (P > 0).sum(0, keepdim=True))
    P, s = entmax.Sparsemax(dim=-1, return_support_size=True)(X)
    assert s.shape == (4, 1) and torch.equal(P, entmax.sparsemax(X))


def test_private_threshold_helpers_reproduce_the_maps_on_every_row():
    # sparsemax(X) = clamp(X − tau, 0) and entmax15(2X) = clamp(X − tau, 0)²,
    # also on a row of one finite entry (tau was −inf: clamp gave inf) and on
    # a fully masked row (p = 0); against the float64 oracle
    inf = float("inf")
    X = _t(np.array([[0.3, -inf, -inf], [-inf, -inf, -inf], [1.0, 0.5, -1.0], [2.0, 2.0, -3.0]]))
    tau, size = activations._sparsemax_threshold_and_support(X)
    want = np.nan_to_num(oracle.sparsemax(X.numpy()))  # (the oracle's fully masked row is 0/0)
    np.testing.assert_allclose(torch.clamp(X - tau, min=0).numpy(), want, rtol=0, atol=1e-15)
    assert size.squeeze(-1).tolist() == [1, 0, 2, 2]
    tau, size = activations._entmax_threshold_and_support(X / 2)
    want = np.nan_to_num(oracle.entmax(X.numpy(), 1.5))
    np.testing.assert_allclose((torch.clamp(X / 2 - tau, min=0) ** 2).numpy(), want, rtol=0, atol=1e-15)


def test_normmax_alpha_at_most_one_is_the_argmax():
    X = torch.tensor([[0.2, 1.0, 0.5], [1.0, 1.0, -1.0]], dtype=torch.float64)
    expected = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)
    for alpha in (0.3, 0.9, 1.0, torch.tensor([[0.5], [1.0]], dtype=torch.float64)):
        torch.testing.assert_close(entmax.normmax_bisect(X, alpha), expected)


def test_dense_alpha_tends_to_softmax_and_keeps_the_order(rng):
    x = rng.normal(size=(3, 6))
    p = entmax.entmax_bisect(_t(x), 0.999)
    torch.testing.assert_close(p, torch.softmax(_t(x), -1), atol=2e-3, rtol=0)
    order = np.argsort(x, axis=1)
    assert (np.diff(np.take_along_axis(entmax.entmax_bisect(_t(x), 0.3).numpy(), order, 1), axis=1) > 0).all()
    x32 = torch.tensor(x, dtype=torch.float32)
    ref = np.stack([dense_entmax_row(r, 0.5) for r in x32.double().numpy()])
    np.testing.assert_allclose(entmax.entmax_bisect(x32, 0.5).double().numpy(), ref, atol=2e-6)


# --------------------------------------------------------- per-row α, any dim
@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_per_row_alpha_along_any_dim(rng, dim):
    shape = [2, 3, 2, 4]
    X = _t(rng.normal(size=shape))
    a_shape = list(shape)
    a_shape[dim] = 1
    alphas = _t(0.05 + 2.5 * rng.random(size=a_shape))  # rows below and above 1, as entmax's tests draw them
    P = entmax.entmax_bisect(X, alphas, dim=dim)
    Pn = entmax.normmax_bisect(X, alphas + 1, dim=dim)
    rows, a_rows = X.movedim(dim, -1).reshape(-1, shape[dim]), alphas.movedim(dim, -1).reshape(-1)
    for got, row, a in zip(P.movedim(dim, -1).reshape(-1, shape[dim]), rows, a_rows.tolist()):
        torch.testing.assert_close(got, entmax.entmax_bisect(row, a), atol=1e-14, rtol=0)
    ref = oracle_normmax.normmax(X.numpy(), (alphas + 1).numpy(), dim=dim)
    np.testing.assert_allclose(Pn.numpy(), ref, atol=1e-12)


# ---------------------------------------------------------------- gradients
def test_gradcheck_every_map(rng):
    X = _t(rng.normal(size=(2, 5)), grad=True)
    for f in (entmax.sparsemax, entmax.entmax15, entmax.sparsemax_bisect, entmax.normmax_bisect,
              lambda t: entmax.budget_bisect(t, 2.5), lambda t: entmax.sparsemax(t, k=2)):
        assert gradcheck(f, (X,))
    for alpha in (0.2, 0.75, 1.0, 1.25, 2.25):
        a = _t(alpha, grad=True)
        assert gradcheck(entmax.entmax_bisect, (X, a), check_forward_ad=alpha < 1)
    a = _t([[0.4], [1.7]], grad=True)  # one row below 1, one above
    assert gradcheck(entmax.entmax_bisect, (X, a))
    assert gradgradcheck(entmax.entmax_bisect, (X, a))
    assert gradcheck(entmax.normmax_bisect, (X, _t(1 + 5 * rng.random(size=(2, 1)), grad=True)))
    assert gradcheck(entmax.budget_bisect, (X, _t(5 * rng.random(size=(2, 1)), grad=True)))


# -------------------------------------------------------------------- masks
MASKED = [entmax.Sparsemax(dim=1), entmax.Entmax15(dim=1), entmax.Sparsemax(dim=1, k=512), entmax.sparsemax_bisect,
          entmax.normmax_bisect] + [lambda t, a=a: entmax.entmax_bisect(t, a) for a in (0.5, 1.25, 1.5, 2.25)]


@pytest.mark.parametrize("f", MASKED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_minus_inf_is_removal(rng, f, dtype):
    x = torch.tensor(rng.normal(size=(2, 6)), dtype=dtype)
    x[:, 3:] = -float("inf")
    y = f(x)
    assert (y[:, 3:] == 0).all()
    torch.testing.assert_close(y[:, :3], f(x[:, :3]), atol=4 * torch.finfo(dtype).eps, rtol=0)
    assert entmax.entmax_bisect(torch.full((1, 3), -float("inf"), dtype=dtype), 0.5).eq(0).all()


# ------------------------------------------------------------------ modules
def test_modules_equal_their_functions_and_learn_alpha(rng):
    X = _t(rng.normal(size=(3, 5)))
    pairs = [(entmax.Sparsemax(0), entmax.sparsemax(X, 0)), (entmax.Entmax15(k=2), entmax.entmax15(X)),
             (entmax.SparsemaxBisect(), entmax.sparsemax_bisect(X)), (entmax.EntmaxBisect(0.6), entmax.entmax_bisect(X, 0.6)),
             (entmax.NormmaxBisect(3, dim=0), entmax.normmax_bisect(X, 3, dim=0)),
             (entmax.BudgetBisect(1.5), entmax.budget_bisect(X, 1.5))]
    for module, expected in pairs:
        assert isinstance(module, nn.Module)
        torch.testing.assert_close(module(X), expected, atol=0, rtol=0)
    layer = entmax.EntmaxBisect(alpha=nn.Parameter(torch.tensor(1.4, dtype=torch.float64)))
    (layer(X) * X).sum().backward()
    assert layer.alpha.grad is not None and torch.isfinite(layer.alpha.grad)
    assert not isinstance(entmax.NormmaxBisect(), entmax.EntmaxBisect)


# ------------------------------------------------------------------- errors
def test_errors_keep_entmax_types_and_softk_messages():
    X = torch.randn(3, 4)
    with pytest.raises(IndexError, match="dim") as err:
        entmax.sparsemax(X, dim=2)
    assert isinstance(err.value, ValueError)
    with pytest.raises(RuntimeError, match="alpha") as err:
        entmax.entmax_bisect(X, torch.ones(4, 1) * 1.5)  # not expandable to (3, 1)
    assert isinstance(err.value, ValueError)
    with pytest.raises(RuntimeError, match="X"):
        entmax.entmax15(torch.ones(3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="k"):
        entmax.sparsemax(X, k=0)
    with pytest.raises(AttributeError, match="torch.Tensor") as err:  # entmax reads X.shape
        entmax.budget_bisect([[0.0, 1.0]])
    assert isinstance(err.value, TypeError)
    with pytest.raises(TypeError, match="n_iter"):
        entmax.entmax_bisect(X, n_iter=2.5)
    with pytest.raises(IndexError, match="dim"):
        entmax.Entmax15(dim="1")
    for bad in (0.0, -1.0, float("nan"), torch.tensor([[0.0], [1.0], [2.0]])):
        with pytest.raises(ValueError, match="alpha"):
            entmax.entmax_bisect(X, bad)
    with pytest.raises(ValueError, match="budget"):
        entmax.budget_bisect(X, 5)  # no p <= 1 sums to 5 over 4 entries
    with pytest.raises(ValueError, match="budget"):
        entmax.BudgetBisect(-1)


def _dense_mp(row, alpha):
    """p of the dense map in 80 digits: p_i = ((1−α)(λ − z_i))^(−1/(1−α)),
    Σp = 1, λ by bisection (λ lies 1/(1−α) above max z, so the working
    precision must hold it and the z − λ to many more digits than a double)."""
    import mpmath as mp

    with mp.workdps(80):
        a, z = mp.mpf(alpha), [mp.mpf(float(v)) for v in row]
        f = lambda lam: [((1 - a) * (lam - v)) ** (-1 / (1 - a)) for v in z]  # noqa: E731
        lo, hi = max(z) + 1 / (1 - a), max(z) + len(z) ** (1 - a) / (1 - a)
        for _ in range(400):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if mp.fsum(f(mid)) > 1 else (lo, mid)
        return f((lo + hi) / 2)


@pytest.mark.parametrize("gap", [1e-3, 1e-5, 1e-7, 1e-9])
def test_dense_alpha_just_below_one(gap):
    # λ lies 1/(1−α) above max z: solved there, the z − λ that make p kept
    # eps/(1−α) of their digits (float32 at α = 1 − 1e-7: rows summing to
    # 0.82), and ∂p/∂α and the loss took differences of 1/(1−α)-sized terms
    # (∂p₀/∂α = 4e10 for 0.036 at 1 − 1e-9, a loss of 184 for 0.93)
    import mpmath as mp

    row = [0.3, -1.2, 0.8, 0.1, -0.4]
    alpha = 1 - gap
    with mp.workdps(80):
        pm, am = _dense_mp(row, alpha), mp.mpf(alpha)
        want = [float(v) for v in pm]
        h = mp.mpf(10) ** -30
        dwant = [float((u - d) / (2 * h)) for u, d in zip(_dense_mp(row, am + h), _dense_mp(row, am - h))]
        # the Fenchel–Young loss at the one-hot target 2: <z, p> − Ω(p) + Ω(e_2) − z_2, Ω(e_2) = 0
        loss_want = float(mp.fsum(p * (mp.mpf(z) - mp.mpf(row[2])) for p, z in zip(pm, row))
                          - mp.fsum(p * mp.expm1((am - 1) * mp.log(p)) for p in pm) / (am * (am - 1)))
    a = _t([[alpha]], grad=True)
    p = entmax.entmax_bisect(_t([row]), alpha=a)
    np.testing.assert_allclose(p[0].detach().numpy(), want, rtol=1e-13)
    for i in range(len(row)):
        (g,) = torch.autograd.grad(p[0, i], a, retain_graph=True)
        np.testing.assert_allclose(g.item(), dwant[i], rtol=1e-8, atol=1e-12)
    loss = entmax.entmax_bisect_loss(_t([row]), torch.tensor([2]), alpha=alpha)
    np.testing.assert_allclose(loss.item(), loss_want, rtol=1e-12)
    loss32 = entmax.entmax_bisect_loss(torch.tensor([row]), torch.tensor([2]), alpha=alpha)
    np.testing.assert_allclose(loss32.item(), loss_want, rtol=1e-6)
    p32 = entmax.entmax_bisect(torch.tensor([row]), alpha=alpha)
    # float32: a few ulps of u = z − λ' (|u| ≤ 2) and of the power
    np.testing.assert_allclose(p32[0].double().numpy(), want, rtol=8 * 2.0**-23)
