"""The autograd contract of every threshold map, on every CPU backend CI runs:
vmap, jacrev, jacfwd, jvp (torch.func and torch.autograd.functional), double
backward, Hessians of the potentials and losses, τ as a tensor that requires
grad, and that every public loss and topk_sum reaches the selected backend.

Jacobians are checked against central differences of the NumPy float64
oracle (tests/oracle.py), never against softk itself.
"""

import numpy as np
import pytest
import torch

import softk
from softk._backends import kernels
from softk.losses import entmax15_loss, entmax_loss, softmax_loss, soft_topk_loss, sparsemax_loss

from ..oracle import maps as oracle, topk as oracle_topk

pytestmark = pytest.mark.usefixtures("each_cpu_backend")

# name -> (softk map of a 1-D float64 tensor, oracle map of a NumPy row)
MAPS = {
    "softmax": (lambda t: softk.softmax(t, tau=0.7), lambda r: oracle.softmax(r, tau=0.7)),
    "sparsemax": (softk.sparsemax, oracle.sparsemax),
    "entmax15": (softk.entmax15, lambda r: oracle.entmax(r, 1.5)),
    "entmax1.3": (lambda t: softk.entmax(t, 1.3), lambda r: oracle.entmax(r, 1.3)),
    "exp": (lambda t: softk.soft_topk(t, 2, tau=0.5), lambda r: oracle.soft_topk(r, 2, tau=0.5)),
    "sigmoid": (lambda t: softk.soft_topk(t, 2, method="sigmoid"), lambda r: oracle.soft_topk(r, 2, method="sigmoid")),
    "laplace": (lambda t: softk.soft_topk(t, 2, method="laplace"), lambda r: oracle.soft_topk(r, 2, method="laplace")),
    "sparse": (lambda t: softk.soft_topk(t, 2, method="sparse"), lambda r: oracle.soft_topk(r, 2, method="sparse")),
}
# Away from the kinks (no entry within 1e-3 of a breakpoint), so central
# differences with eps = 1e-6 are exact to ~1e-9.
ROW = np.array([0.31, -0.42, 1.13, 0.64, -1.37, 0.95])


def _jac(name):
    return oracle.numerical_jacobian(MAPS[name][1], ROW)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_jacrev_jacfwd_match_oracle_jacobian(name):
    fn = MAPS[name][0]
    x = torch.tensor(ROW)
    expect = _jac(name)
    np.testing.assert_allclose(torch.func.jacrev(fn)(x).numpy(), expect, atol=1e-7)
    np.testing.assert_allclose(torch.func.jacfwd(fn)(x).numpy(), expect, atol=1e-7)


@pytest.mark.parametrize("name", sorted(MAPS))
def test_jvp_is_jacobian_times_v(name):
    fn = MAPS[name][0]
    v = np.array([-1.0, 2.0, 0.5, -0.3, 0.1, 0.7])
    expect = _jac(name) @ v
    x, vt = torch.tensor(ROW), torch.tensor(v)
    _, out = torch.func.jvp(fn, (x,), (vt,))
    np.testing.assert_allclose(out.numpy(), expect, atol=1e-7)
    # torch.autograd.functional.jvp (double backward) was once silently zero on the compiled kernels.
    _, out = torch.autograd.functional.jvp(fn, x, vt)
    np.testing.assert_allclose(out.numpy(), expect, atol=1e-7)
    assert np.abs(expect).max() > 1e-3  # the check can fail


@pytest.mark.parametrize("name", sorted(MAPS))
def test_vmap_equals_the_loop(name):
    fn = MAPS[name][0]
    xs = torch.tensor(np.stack([ROW, ROW[::-1] * 2, ROW + 3]))
    out = torch.func.vmap(fn)(xs)
    for row, got in zip(xs.numpy(), out.numpy()):
        np.testing.assert_allclose(got, MAPS[name][1](row), atol=1e-12)
    # vmap over a non-leading dimension, and vmap of grad
    np.testing.assert_allclose(torch.func.vmap(fn, in_dims=1, out_dims=1)(xs.T).numpy(), out.numpy().T, atol=0)
    w = torch.arange(6.0, dtype=torch.float64)
    grads = torch.func.vmap(torch.func.grad(lambda t: (fn(t) * w).sum()))(xs)
    for row, got in zip(xs.numpy(), grads.numpy()):
        np.testing.assert_allclose(got, oracle.numerical_jacobian(MAPS[name][1], row).T @ w.numpy(), atol=1e-6)


@pytest.mark.parametrize("name", ["entmax15", "exp", "softmax", "sigmoid", "laplace", "entmax1.3"])
def test_gradgradcheck(name):
    fn = MAPS[name][0]
    x = torch.tensor(ROW, requires_grad=True)
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("name", sorted(MAPS))
def test_forward_over_forward_second_derivative(name):
    # functorch does not differentiate a Function's custom jvp at an outer
    # forward level: jacfwd(jacfwd(f)) gave 0 for the curvature.  Against
    # central differences (h = 1e-5, error ~1e-10) of the first derivative
    # that test_jacrev_jacfwd_match_oracle_jacobian checks against the oracle
    fn = MAPS[name][0]
    c = torch.tensor([1.0, -2.0, 0.5, 3.0, -0.7, 1.4], dtype=torch.float64)
    x = torch.tensor(ROW)

    def f(t):
        return fn(t) @ c

    got = torch.func.jacfwd(torch.func.jacfwd(f))(x)
    h, grad = 1e-5, torch.func.jacrev(f)
    want = torch.stack([(grad(x + h * e) - grad(x - h * e)) / (2 * h) for e in torch.eye(6, dtype=torch.float64)], 1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    v, u = torch.eye(6, dtype=torch.float64)[:2]
    nested = torch.func.jvp(lambda t: torch.func.jvp(f, (t,), (v,))[1], (x,), (u,))[1]
    torch.testing.assert_close(nested, want[0, 1], rtol=0, atol=1e-7)


def test_entmax15_second_derivative_is_finite_at_the_support_edge():
    # An entry with p = 0 (here -1.37): d = √p has an infinite slope at 0, the
    # contract's slope must not turn that into NaN.
    x = torch.tensor(ROW, requires_grad=True)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0, -1.0], dtype=torch.float64)
    (g,) = torch.autograd.grad((softk.entmax15(x) * w).sum(), x, create_graph=True)
    assert g.grad_fn is not None
    (h,) = torch.autograd.grad((g * w).sum(), x)
    assert torch.isfinite(h).all()
    # against central differences of the oracle's gradient
    def grad_of(r):
        return oracle.numerical_jacobian(lambda q: oracle.entmax(q, 1.5), r).T @ w.numpy()

    num = oracle.numerical_jacobian(grad_of, ROW, eps=1e-4) .T @ w.numpy()
    np.testing.assert_allclose(h.numpy(), num, atol=1e-5)


@pytest.mark.parametrize("method", ["exp", "sigmoid", "laplace"])
def test_topk_sum_hessian_is_soft_topk_jacobian(method):
    x = torch.tensor(ROW)
    H = torch.autograd.functional.hessian(lambda t: softk.topk_sum(t, 2, method=method), x)
    expect = oracle.numerical_jacobian(lambda r: oracle.soft_topk(r, 2, method=method), ROW)
    np.testing.assert_allclose(H.numpy(), expect, atol=1e-7)
    assert np.abs(expect).max() > 1e-2


def test_softmax_loss_hessian_equals_torch_cross_entropy():
    x = torch.tensor(ROW).reshape(2, 3)
    y = torch.tensor([2, 0])
    H = torch.autograd.functional.hessian(lambda t: softmax_loss(t, y), x)
    H_ce = torch.autograd.functional.hessian(lambda t: torch.nn.functional.cross_entropy(t, y), x)
    np.testing.assert_allclose(H.numpy(), H_ce.numpy(), atol=1e-12)
    assert H_ce.abs().max() > 1e-2


@pytest.mark.parametrize(
    "loss",
    [
        lambda t, y: sparsemax_loss(t, y),
        lambda t, y: entmax15_loss(t, y, tau=0.5),
        lambda t, y: entmax_loss(t, y, alpha=1.3),
        lambda t, y: softmax_loss(t, y),
    ],
)
def test_losses_gradgradcheck(loss):
    x = torch.tensor(ROW).reshape(2, 3).requires_grad_()
    y = torch.tensor([2, 0])
    assert torch.autograd.gradcheck(lambda t: loss(t, y), (x,))
    assert torch.autograd.gradgradcheck(lambda t: loss(t, y), (x,))


def test_tau_tensor_gets_its_gradient():
    x = torch.tensor(ROW)
    w = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0, -1.0], dtype=torch.float64)
    for fn, ref in (
        (lambda t, tau: softk.entmax15(t, tau=tau), lambda r, tau: oracle.entmax(r, 1.5, tau=tau)),
        (lambda t, tau: softk.soft_topk(t, 2, tau=tau), lambda r, tau: oracle.soft_topk(r, 2, tau=tau)),
        (lambda t, tau: softk.softmax(t, tau=tau), lambda r, tau: oracle.softmax(r, tau=tau)),
        (lambda t, tau: softk.topk_sum(t, 2, tau=tau), lambda r, tau: oracle_topk.topk_sum(r, 2, tau=tau)),
    ):
        tau = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
        (fn(x, tau) * (w if fn(x, tau).dim() else 1)).sum().backward()
        val = lambda t: float((ref(ROW, t) * (w.numpy() if np.ndim(ref(ROW, t)) else 1)).sum())
        num = (val(0.8 + 1e-6) - val(0.8 - 1e-6)) / 2e-6
        assert tau.grad is not None
        np.testing.assert_allclose(tau.grad.item(), num, rtol=1e-6)


def test_tau_tensor_is_refused_where_it_would_be_detached():
    tau = torch.tensor(0.5, requires_grad=True)
    with pytest.raises(ValueError, match="tau"):
        sparsemax_loss(torch.randn(2, 3), torch.tensor([0, 1]), tau=tau)


def _count_backend_calls(monkeypatch):
    calls = []
    for name in ("torch", "native"):  # the CPU's threshold kernels
        be = kernels.get("threshold", name).impl
        fwd = be.forward

        def spy(family, x, k, tau, _fwd=fwd, _name=name):
            calls.append((_name, family.name))
            return _fwd(family, x, k, tau)

        monkeypatch.setattr(be, "forward", spy)
    return calls


def test_losses_and_topk_sum_reach_the_selected_backend(monkeypatch, each_cpu_backend):
    """Every call runs on the selected backend; on "native" the losses take
    the fused loss kernel (softk._backends.native.loss) instead of the map's forward."""
    import softk._backends.native.loss as fused

    calls = _count_backend_calls(monkeypatch)
    run = fused.fenchel_young_fused_rows
    monkeypatch.setattr(fused, "fenchel_young_fused_rows",
                        lambda z, t, family, *a, **kw: calls.append(("fused", family.name)) or run(z, t, family, *a, **kw))
    x = torch.randn(4, 6)
    y = torch.tensor([0, 1, 2, 3])
    multi = torch.zeros(4, 6)
    multi[:, :2] = 1
    expect_backend = each_cpu_backend
    for fn, fam, loss in (
        (lambda: sparsemax_loss(x, y), "sparsemax", True),
        (lambda: entmax15_loss(x, y), "entmax15", True),
        (lambda: entmax_loss(x, y, alpha=1.3), "entmax", True),
        (lambda: softmax_loss(x, y), "softmax", True),
        (lambda: soft_topk_loss(x, multi, k=2), "exp", True),
        (lambda: softk.topk_sum(x, 2), "exp", False),
        (lambda: softk.softmax(x), "softmax", False),
        (lambda: softk.losses.fenchel_young_loss(x, y, softk.families.SPARSEMAX), "sparsemax", True),
    ):
        calls.clear()
        fn()
        assert calls == [("fused" if loss and expect_backend == "native" else expect_backend, fam)], calls


def test_native_backend_is_not_asked_for_what_it_does_not_serve(monkeypatch, each_cpu_backend):
    calls = _count_backend_calls(monkeypatch)
    softk.soft_topk(torch.randn(3, 5), 2, method="sigmoid")
    softk.entmax(torch.randn(3, 5), alpha=2.5)
    assert [c[0] for c in calls] == ["torch", "torch"]


# The other constructions: plain PyTorch (iterative, weighted, topk_softmax,
# log_softmax, logsumexp), or their own custom ops (GradTopK, tensor-α entmax).
OTHERS = {
    "grad": (lambda t: softk.soft_topk(t, 2, method="grad"), lambda r: oracle_topk.gradtopk(r, 2)),
    "iterative": (lambda t: softk.soft_topk(t, 2, method="iterative"), lambda r: oracle_topk.iterative(r, 2)),
    "weighted": (lambda t: softk.soft_topk(t, 2, method="weighted"), lambda r: oracle_topk.weighted(r, 2)),
    "topk_sum_grad": (lambda t: softk.topk_sum(t, 2, method="grad"), lambda r: oracle_topk.topk_sum(r, 2, method="grad")),
    "topk_softmax": (lambda t: softk.topk_softmax(t, 3), lambda r: oracle_topk.topk_softmax(r, 3)),
    "log_softmax": (lambda t: softk.log_softmax(t, tau=0.5), lambda r: np.log(oracle.softmax(r, tau=0.5))),
    "logsumexp": (lambda t: softk.logsumexp(t), lambda r: oracle._lse(r)),
    "entmax_tensor_alpha": (
        lambda t: softk.entmax(t, torch.tensor([1.3], dtype=t.dtype)),
        lambda r: oracle.entmax(r, 1.3),
    ),
}


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_maps_under_torch_func(name):
    fn, ref = OTHERS[name]
    x = torch.tensor(ROW)
    expect = oracle.numerical_jacobian(lambda r: np.atleast_1d(ref(r)), ROW)
    np.testing.assert_allclose(np.atleast_2d(torch.func.jacrev(fn)(x).numpy()), expect, atol=1e-6)
    np.testing.assert_allclose(np.atleast_2d(torch.func.jacfwd(fn)(x).numpy()), expect, atol=1e-6)
    xs = torch.tensor(np.stack([ROW, ROW[::-1] * 2]))
    out = torch.func.vmap(fn)(xs)
    for row, got in zip(xs.numpy(), out.numpy()):
        np.testing.assert_allclose(got, ref(row), atol=1e-9)


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_maps_compile_without_graph_breaks(name):
    fn, _ = OTHERS[name]
    torch._dynamo.reset()
    x = torch.tensor(ROW)
    np.testing.assert_allclose(torch.compile(fn, fullgraph=True, backend="aot_eager")(x).numpy(), fn(x).numpy(), atol=1e-12)


def test_gradtopk_second_derivative_is_a_clear_error():
    x = torch.tensor(ROW, requires_grad=True)
    (g,) = torch.autograd.grad(softk.soft_topk(x, 2, method="grad")[0], x, create_graph=True)
    with pytest.raises(NotImplementedError, match="first derivatives only"):
        torch.autograd.grad(g.sum(), x)
    # topk_sum's "grad" value is twice differentiable: its Hessian is GradTopK's Jacobian
    H = torch.autograd.functional.hessian(lambda t: softk.topk_sum(t, 2, method="grad"), torch.tensor(ROW))
    expect = oracle.numerical_jacobian(lambda r: oracle_topk.gradtopk(r, 2), ROW)
    np.testing.assert_allclose(H.numpy(), expect, atol=1e-7)


@pytest.mark.parametrize("alpha", [5.0, 10.0, 50.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_large_alpha_backward_against_mpmath_jacobian(alpha, dtype):
    """d = p^(2−α) spans far more than the dtype's range at large α (1e58 at
    p = 0.06, α = 50): J·g = d⊙(g − Σ(d⊙g)/Σd) must be formed without
    cancelling.  Reference: the Jacobian built in mpmath from the mpmath p."""
    import mpmath

    from ..oracle import mp as oracle_mp

    x = np.array([0.0, -0.001, -0.002, -0.5, -0.0005])
    g = np.array([1.0, 2.0, 3.0, 4.0, -1.5])
    xt = torch.tensor(x, dtype=dtype, requires_grad=True)
    for a in (alpha, torch.tensor([alpha], dtype=dtype)):
        xt.grad = None
        (softk.entmax(xt, alpha=a) * torch.tensor(g, dtype=dtype)).sum().backward()
        with mpmath.workdps(60):
            p = oracle_mp.threshold_row("entmax", xt.detach().double().numpy(), 1, alpha=alpha)
            d = [mpmath.mpf(pi) ** (2 - alpha) if pi > 0 else mpmath.mpf(0) for pi in p]
            sd = sum(d)
            sdg = sum(di * gi for di, gi in zip(d, g))
            expect = np.array([float(di * (gi - sdg / sd)) for di, gi in zip(d, g)])
        assert np.isfinite(xt.grad.numpy()).all()
        # d = p^(2−α) turns p's relative error δ into (α − 2)·δ: δ ≈ 1e-10
        # (float64, anchor form at α = 50) and 2e-5 (float32)
        tol = (alpha - 2) * (1e-10 if dtype == torch.float64 else 4e-5)
        np.testing.assert_allclose(xt.grad.double().numpy(), expect, rtol=tol, atol=tol * np.abs(expect).max())
