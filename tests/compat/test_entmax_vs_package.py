"""softk.compat.entmax next to the installed entmax package, on the same
random inputs: values, gradients, loss reductions, signatures and the types
of the errors entmax raises.  Skipped where entmax is not installed.
entmax's bisection (50 steps in float64) is accurate to ~1e-13, so values
are compared to 1e-9."""

import inspect

import numpy as np
import pytest
import torch

import softk.compat.entmax as compat

entmax = pytest.importorskip("entmax")

ATOL = 1e-9


def _pair(rng, shape=(4, 6), scale=1.0):
    x = torch.tensor(rng.normal(size=shape) * scale, requires_grad=True)
    return x, x.detach().clone().requires_grad_()


def _same_value_and_vjp(rng, ours, theirs, shape=(4, 6), scale=1.0):
    a, b = _pair(rng, shape, scale)
    pa, pb = ours(a), theirs(b)
    torch.testing.assert_close(pa, pb, atol=ATOL, rtol=0)
    g = torch.tensor(rng.normal(size=pa.shape))
    (pa * g).sum().backward()
    (pb * g).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-7, rtol=0)


@pytest.mark.parametrize("name", entmax.__all__ if hasattr(entmax, "__all__") else
                         [n for n in vars(entmax) if not n.startswith("_") and callable(getattr(entmax, n))])
def test_every_public_name_with_entmax_parameters(name):
    theirs = getattr(entmax, name)
    ours = getattr(compat, name)
    sig = lambda f: [(p.name, p.default) for p in inspect.signature(f).parameters.values()]  # noqa: E731
    ps, pt = sig(ours), sig(theirs)
    # master adds return_support_size after 1.3's parameters: ours are entmax's, maybe followed by it
    assert ps[: len(pt)] == pt and all(n == "return_support_size" for n, _ in ps[len(pt):])


def _entmax_names(module):
    """The public names a module of entmax offers: its own and the entmax maps it imports
    (entmax.losses imports sparsemax, entmax_bisect, ...), less the autograd Function
    classes, which softk.compat.entmax does not provide (documented)."""
    return sorted(n for n, v in vars(module).items()
                  if not n.startswith("_") and getattr(v, "__module__", "").startswith("entmax")
                  and not n.endswith("Function"))


@pytest.mark.parametrize("sub", ["activations", "root_finding", "losses"])
def test_every_public_name_of_each_submodule(sub):
    import importlib

    theirs = importlib.import_module(f"entmax.{sub}")
    ours = importlib.import_module(f"softk.compat.entmax.{sub}")
    names = _entmax_names(theirs)
    assert names  # the filter kept entmax's names
    assert [n for n in names if not hasattr(ours, n)] == []


@pytest.mark.parametrize("dim", [0, 1])
def test_activations(rng, dim):
    for k in (None, 3):
        _same_value_and_vjp(rng, lambda t: compat.sparsemax(t, dim, k), lambda t: entmax.sparsemax(t, dim, k))
        _same_value_and_vjp(rng, lambda t: compat.entmax15(t, dim, k), lambda t: entmax.entmax15(t, dim, k))
        _same_value_and_vjp(rng, compat.Sparsemax(dim, k), entmax.Sparsemax(dim, k))


@pytest.mark.parametrize("alpha", [0.3, 0.7, 1.25, 1.5, 2.0, 3.0])
def test_entmax_bisect(rng, alpha):
    _same_value_and_vjp(rng, lambda t: compat.entmax_bisect(t, alpha), lambda t: entmax.entmax_bisect(t, alpha))


def test_entmax_bisect_alpha_gradients(rng):
    x = torch.tensor(rng.normal(size=(4, 6)))
    a0 = torch.tensor(0.2 + 2 * rng.random(size=(4, 1)))
    grads = []
    for fn in (compat.entmax_bisect, entmax.entmax_bisect):
        a = a0.clone().requires_grad_()
        (fn(x, a) * torch.arange(6.0, dtype=torch.float64)).sum().backward()
        grads.append(a.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-7, rtol=0)
    _same_value_and_vjp(rng, lambda t: compat.EntmaxBisect(a0, dim=-1)(t), lambda t: entmax.EntmaxBisect(a0)(t))


@pytest.mark.parametrize("alpha", [1.5, 2, 5.0])
def test_normmax_bisect(rng, alpha):
    _same_value_and_vjp(rng, lambda t: compat.normmax_bisect(t, alpha), lambda t: entmax.normmax_bisect(t, alpha))
    a = torch.tensor(1.1 + 4 * rng.random(size=(1, 6)))  # one α per column: dim=0
    _same_value_and_vjp(rng, lambda t: compat.normmax_bisect(t, a, dim=0), lambda t: entmax.normmax_bisect(t, a, dim=0),
                        shape=(6, 6))


@pytest.mark.parametrize("budget", [0.5, 1, 2, 3.5])
def test_budget_and_sparsemax_bisect(rng, budget):
    _same_value_and_vjp(rng, lambda t: compat.budget_bisect(t, budget), lambda t: entmax.budget_bisect(t, budget))
    _same_value_and_vjp(rng, compat.sparsemax_bisect, entmax.sparsemax_bisect, scale=3.0)


LOSSES = [("SparsemaxLoss", {}), ("SparsemaxLoss", {"k": 2}), ("Entmax15Loss", {}), ("SparsemaxBisectLoss", {}),
          ("EntmaxBisectLoss", {"alpha": 1.3}), ("EntmaxBisectLoss", {"alpha": 0.6}), ("NormmaxBisectLoss", {}),
          ("NormmaxBisectLoss", {"alpha": 4.0})]


@pytest.mark.parametrize("name,kwargs", LOSSES)
@pytest.mark.parametrize("reduction", ["none", "sum", "elementwise_mean"])
def test_losses_and_their_reductions(rng, name, kwargs, reduction):
    y = torch.tensor(rng.integers(0, 6, size=5))
    for ignore_index in (-100, int(y[0])):
        ours = getattr(compat, name)(ignore_index=ignore_index, reduction=reduction, **kwargs)
        theirs = getattr(entmax, name)(ignore_index=ignore_index, reduction=reduction, **kwargs)
        _same_value_and_vjp(rng, lambda t: ours(t, y), lambda t: theirs(t, y), shape=(5, 6))


def test_functional_losses(rng):
    y = torch.tensor(rng.integers(0, 6, size=4))
    for name, args in [("sparsemax_loss", ()), ("entmax15_loss", (3,)), ("sparsemax_bisect_loss", ()),
                       ("entmax_bisect_loss", (1.7,)), ("normmax_bisect_loss", (2.5,))]:
        ours, theirs = getattr(compat, name), getattr(entmax, name)
        _same_value_and_vjp(rng, lambda t: ours(t, y, *args), lambda t: theirs(t, y, *args))


def _raised(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the point is which type
        return err
    return None


@pytest.mark.parametrize("case", ["dim", "reduction", "batch", "target", "alpha_shape", "budget_shape",
                                  "int_x", "k", "list_x", "list_target", "loss_1d_x", "loss_3d_x",
                                  "loss_0d_target", "loss_2d_target", "float_target", "alpha_type"])
def test_where_entmax_raises_we_raise_its_type_too(case):
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 2])
    calls = {
        "int_x": lambda m: m.sparsemax(torch.ones(3, 4, dtype=torch.long)),
        "k": lambda m: m.sparsemax(x, k=0),
        "list_x": lambda m: m.entmax_bisect([[0.0, 1.0]]),
        "list_target": lambda m: m.sparsemax_loss(x, [0, 1, 2]),
        "loss_1d_x": lambda m: m.sparsemax_loss(x[:, 0], y),
        "loss_3d_x": lambda m: m.entmax15_loss(x[..., None], y),
        "loss_0d_target": lambda m: m.SparsemaxLoss()(x, y[0]),
        "loss_2d_target": lambda m: m.entmax_bisect_loss(x, y[:, None]),
        "float_target": lambda m: m.sparsemax_loss(x, y.float()),
        "alpha_type": lambda m: m.entmax_bisect(x, alpha="1.5"),
        "dim": lambda m: m.sparsemax(x, dim=2),
        "reduction": lambda m: m.SparsemaxLoss(reduction="mean"),
        "batch": lambda m: m.sparsemax_loss(x, y[:2]),
        "target": lambda m: m.entmax15_loss(x, torch.tensor([0, 1, 7])),
        "alpha_shape": lambda m: m.entmax_bisect(x, torch.full((4, 1), 1.5)),
        "budget_shape": lambda m: m.budget_bisect(x, torch.full((4, 1), 2.0)),
    }
    theirs = _raised(lambda: calls[case](entmax))
    ours = _raised(lambda: calls[case](compat))
    assert theirs is not None and ours is not None
    assert isinstance(ours, type(theirs)) and isinstance(ours, (ValueError, TypeError))


def test_documented_differences(rng):
    x = torch.tensor(rng.normal(size=(2, 5)))
    # α = 1: entmax's bisection gives the uniform distribution, the compat layer softmax
    assert torch.allclose(entmax.entmax_bisect(x, 1.0), torch.full((2, 5), 0.2, dtype=torch.float64))
    torch.testing.assert_close(compat.entmax_bisect(x, 1.0), torch.softmax(x, -1))
    # a row with no finite entry: entmax fails (sparsemax, entmax15) or gives NaN (bisection); softk zeros
    masked = torch.full((1, 4), -float("inf"), dtype=torch.float64)
    with pytest.raises(RuntimeError):
        entmax.sparsemax(masked)
    assert entmax.entmax_bisect(masked, 1.3).isnan().all()
    assert compat.sparsemax(masked).eq(0).all() and compat.entmax_bisect(masked, 1.3).eq(0).all()
    # a budget above n: entmax all ones, the compat layer refuses it
    assert entmax.budget_bisect(x, 7).eq(1).all()
    with pytest.raises(ValueError, match="budget"):
        compat.budget_bisect(x, 7)
