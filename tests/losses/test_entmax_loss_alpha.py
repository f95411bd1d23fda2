"""entmax_loss with one α per row (a tensor, learnable) against the NumPy
float64 oracle: the value, ∂L/∂x and ∂L/∂α (central differences of the
oracle in α), for class-index and dense targets."""

import numpy as np
import pytest
import torch

from softk.losses import entmax_loss, fused_linear_loss

from ..oracle import losses as ol


def _oracle(x, y, alphas, tau=1.0):
    return np.array([ol.fy_loss("entmax", x[i : i + 1], y[i : i + 1], alpha=float(alphas[i]), tau=tau)[0] for i in range(len(alphas))])


@pytest.mark.parametrize("dense", [False, True])
def test_value_and_gradients_match_oracle(rng, dense):
    x = rng.normal(size=(4, 5)) * 1.5
    alphas = np.array([1.3, 1.7, 2.5, 1.05])
    idx = np.array([0, 2, 4, 1])
    y = np.eye(5)[idx]
    if dense:
        y = 0.7 * y + 0.3 * np.eye(5)[(idx + 1) % 5]
    xt = torch.tensor(x, requires_grad=True)
    at = torch.tensor(alphas[:, None], requires_grad=True)
    target = torch.tensor(y) if dense else torch.tensor(idx)
    loss = entmax_loss(xt, target, alpha=at, reduction="none", tau=0.8)
    ref = _oracle(x, y, alphas, tau=0.8)
    np.testing.assert_allclose(loss.detach().numpy(), ref, rtol=1e-9, atol=1e-12)
    loss.sum().backward()
    h = 1e-5
    for i in range(4):
        up, dn = alphas.copy(), alphas.copy()
        up[i] += h
        dn[i] -= h
        num = (_oracle(x, y, up, 0.8).sum() - _oracle(x, y, dn, 0.8).sum()) / (2 * h)
        np.testing.assert_allclose(at.grad[i, 0].item(), num, rtol=1e-5, atol=1e-8)
    gx = np.zeros_like(x)
    for i in range(4):
        for j in range(5):
            e = np.zeros_like(x)
            e[i, j] = h
            gx[i, j] = (_oracle(x + e, y, alphas, 0.8).sum() - _oracle(x - e, y, alphas, 0.8).sum()) / (2 * h)
    np.testing.assert_allclose(xt.grad.numpy(), gx, atol=1e-6)


@pytest.mark.parametrize("dense", [False, True])
def test_forward_mode_matches_the_oracle(rng, dense):
    # jvp and jacfwd with a tensor α raised (the α term had no forward rule);
    # J·v against a central difference of the oracle along (v_x, v_α)
    x = rng.normal(size=(3, 5)) * 1.5
    alphas = np.array([1.3, 1.7, 2.5])
    idx = np.array([0, 2, 4])
    y = np.eye(5)[idx]
    if dense:
        y = 0.7 * y + 0.3 * np.eye(5)[(idx + 1) % 5]
    vx, va = rng.normal(size=x.shape), rng.normal(size=alphas.shape)
    target = torch.tensor(y) if dense else torch.tensor(idx)

    def f(xt, at):
        return entmax_loss(xt, target, alpha=at, reduction="none", tau=0.8)

    _, jv = torch.func.jvp(f, (torch.tensor(x), torch.tensor(alphas[:, None])),
                           (torch.tensor(vx), torch.tensor(va[:, None])))
    h = 1e-5
    num = (_oracle(x + h * vx, y, alphas + h * va, 0.8) - _oracle(x - h * vx, y, alphas - h * va, 0.8)) / (2 * h)
    np.testing.assert_allclose(jv.numpy(), num, rtol=1e-6, atol=1e-9)
    ja = torch.func.jacfwd(f, argnums=1)(torch.tensor(x), torch.tensor(alphas[:, None]))
    num_a = [(_oracle(x, y, alphas + h * np.eye(3)[i], 0.8) - _oracle(x, y, alphas - h * np.eye(3)[i], 0.8))[i] / (2 * h)
             for i in range(3)]
    np.testing.assert_allclose(np.diagonal(ja[:, :, 0].numpy()), num_a, rtol=1e-6, atol=1e-9)


def test_alpha_one_rows_are_the_softmax_loss(rng):
    x = torch.tensor(rng.normal(size=(2, 4)))
    y = torch.tensor([1, 3])
    loss = entmax_loss(x, y, alpha=torch.ones(2, 1, dtype=torch.float64), reduction="none")
    expect = torch.nn.functional.cross_entropy(x, y, reduction="none")
    np.testing.assert_allclose(loss.numpy(), expect.numpy(), rtol=1e-12)


def test_bad_alpha_tensor_is_refused():
    with pytest.raises(ValueError, match="alpha"):
        entmax_loss(torch.zeros(2, 3), torch.tensor([0, 1]), alpha=torch.tensor([[0.5], [2.0]]))
    with pytest.raises(ValueError, match="alpha"):
        entmax_loss(torch.zeros(2, 3), torch.tensor([0, 1]), alpha=torch.tensor([1.5, 2.0, 3.0]))


def test_second_derivatives_in_x_and_alpha_together(rng):
    """The Hessian in (x, α) is symmetric and right: the α-gradient is written in
    the live p, so its x-derivative is −∂²Ω/∂p∂α · ∂p/∂x (it was 0 when the
    α term read a detached p).  (α = 1 exactly: the one-sided check in
    tests/compat/test_entmax_losses.py; a central difference would leave the domain.)"""
    from torch.autograd import gradgradcheck

    x = torch.tensor(rng.normal(size=(3, 5)), dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 3, 1])
    for a0 in ([[1.2], [1.8], [3.0]], [[1.01], [1.5], [2.0]]):
        alpha = torch.tensor(a0, dtype=torch.float64, requires_grad=True)
        assert gradgradcheck(lambda u, a: entmax_loss(u, y, alpha=a, reduction="sum"), (x, alpha))


def test_tensor_alpha_loss_under_vmap(rng):
    x = torch.tensor(rng.normal(size=(4, 3, 5)), dtype=torch.float64)
    y = torch.tensor([0, 3, 1])
    alpha = torch.tensor([[1.2], [1.8], [3.0]], dtype=torch.float64)
    got = torch.vmap(lambda u: entmax_loss(u, y, alpha=alpha, reduction="sum"))(x)
    want = torch.stack([entmax_loss(u, y, alpha=alpha, reduction="sum") for u in x])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dense", [False, True])
def test_per_sample_gradients_under_vmap_of_grad(rng, dense):
    # torch.func per-sample gradients in x and in a shared tensor α against the
    # oracle (central differences in α).  vmap(grad(...)) with a tensor α hit a
    # torch internal assert ("wrapper == nullptr") while the α-family travelled
    # inside the value op instead of as its tensor input.
    from torch.func import grad, vmap

    x = rng.normal(size=(4, 5)) * 1.5
    idx = np.array([0, 2, 4, 1])
    y = np.eye(5)[idx]
    if dense:
        y = 0.6 * y + 0.4 * np.eye(5)[(idx + 2) % 5]
    target = torch.tensor(y) if dense else torch.tensor(idx)
    a0 = 1.7

    def loss(a, xr, tr):
        return entmax_loss(xr[None], tr[None], alpha=a, tau=0.8, reduction="sum")

    a = torch.tensor(a0, dtype=torch.float64)
    dx = vmap(grad(loss, argnums=1), in_dims=(None, 0, 0))(a, torch.tensor(x), target)
    da = vmap(grad(loss, argnums=0), in_dims=(None, 0, 0))(a, torch.tensor(x), target)
    eps = 1e-6
    for i in range(4):
        up = ol.fy_loss("entmax", x[i : i + 1], y[i : i + 1], alpha=a0 + eps, tau=0.8)[0]
        down = ol.fy_loss("entmax", x[i : i + 1], y[i : i + 1], alpha=a0 - eps, tau=0.8)[0]
        np.testing.assert_allclose(da[i].item(), (up - down) / (2 * eps), rtol=1e-5, atol=1e-8)
        fd = np.zeros(5)
        for j in range(5):
            e = np.zeros(5)
            e[j] = eps
            fd[j] = (ol.fy_loss("entmax", (x[i] + e)[None], y[i : i + 1], alpha=a0, tau=0.8)[0]
                     - ol.fy_loss("entmax", (x[i] - e)[None], y[i : i + 1], alpha=a0, tau=0.8)[0]) / (2 * eps)
        np.testing.assert_allclose(dx[i].numpy(), fd, rtol=1e-5, atol=1e-8)


# A bfloat16 target sums to 1 only to its rounding (here 0.9985); the loss
# at it is within |Σy − 1|·(max|ψ'(y)| + max|z|) of the loss at y/Σy.  The
# Tsallis ψ = y^α/(α(α−1)) summed as it stands added (Σy − 1)/(α(α−1)), a
# whole unit at α = 1.001 (the loss came out clamped to 0 where it is 0.52).
_X_BF16 = [[0.3356, 0.5270], [1.25, -0.5]]
_Y_BF16 = [[0.9272, 0.0728], [0.3, 0.7]]


@pytest.mark.parametrize("backend", ["torch", "native", "triton", "tensor alpha"])
@pytest.mark.parametrize("alpha", [1.001, 1.01, 1.5])
def test_a_half_precision_target_that_sums_to_one_only_to_its_rounding(backend, alpha):
    import softk
    from ..oracle import mp as omp

    x = torch.tensor(_X_BF16, dtype=torch.bfloat16)
    y = torch.tensor(_Y_BF16).bfloat16()
    yd = y.double().numpy()
    delta = np.abs(yd.sum(1) - 1)
    assert delta.max() > 1e-3
    want = np.array([omp.fy_row("entmax", x[i].double().numpy(), yd[i] / yd[i].sum(), alpha=alpha) for i in range(2)])
    with softk.use_backend("auto" if backend == "tensor alpha" else backend):
        a = torch.full((2, 1), alpha, dtype=torch.bfloat16) if backend == "tensor alpha" else alpha
        got = entmax_loss(x, y, alpha=a, reduction="none").double().numpy()
    bound = delta * (np.abs(np.log(yd)).max() + 2.0) + 2.0**-8 * want  # the target's rounding, the output's
    assert np.all(np.abs(got - want) <= bound), (got, want, bound)


@pytest.mark.parametrize("backend", ["torch", "native", "triton"])
@pytest.mark.parametrize("alpha", [1.00001, 1.02, 1.13])
def test_alpha_near_one_keeps_the_float32_digits(backend, alpha):
    # ψ summed as y^α/(α(α−1)) has terms 1/(α − 1) = 1e5 that cancel to the
    # loss, whose float32 value kept 3 digits; (y^α − y)/(α(α−1)) has none.
    # The fused kernels form the loss from λ ≈ −1/(α − 1), known to
    # eps/(α − 1): the tensor path serves α this near 1
    import softk

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, generator=g)
    t = torch.tensor([0, 3, 6, 2])
    want = np.array([ol.fy_row("entmax", x[i].double().numpy(), np.eye(7)[int(t[i])], alpha=alpha) for i in range(4)])
    with softk.use_backend(backend):
        got = entmax_loss(x, t, alpha=alpha, reduction="none").double().numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6)


@pytest.mark.usefixtures("each_cpu_backend")
@pytest.mark.parametrize("route", ["eager", "tensor_alpha", "ignored", "fused", "compile"])
@pytest.mark.parametrize("alpha, n", [(50.0, 9), (10.0, 70000)])
def test_a_tied_row_at_large_alpha_has_the_loss_gradient_not_nan(route, alpha, n):
    # p = 1/n on a tied row, whose map slope p^(2−α) overflows float32 (9^48,
    # 70000^8): the loss gradient is (p − y)/τ all the same, but the zero
    # cotangent the Fenchel–Young value gives p went through the map's
    # backward as inf·0 = NaN (and from an ignored padding row into W.grad)
    t = torch.tensor([0])
    want = torch.full((1, n), 1.0 / n)
    want[0, 0] -= 1.0
    if route == "fused":
        # a zero head: every row of logits is tied; the gradient of W is Σ_i (p_i − y_i) x_iᵀ
        x, w = torch.randn(4, 16, dtype=torch.float64).float(), torch.zeros(n, 16, requires_grad=True)
        tt = torch.tensor([0, 1, 2, -100])
        fused_linear_loss(x, w, tt, "entmax", alpha=alpha, reduction="sum").backward()
        y = torch.zeros(4, n)
        y[torch.arange(3), tt[:3]] = 1.0
        ref = ((torch.full((3, n), 1.0 / n) - y[:3]).double().t() @ x[:3].double())
        torch.testing.assert_close(w.grad.double(), ref, rtol=0, atol=1e-6)
        return
    x = torch.zeros(2 if route == "ignored" else 1, n, requires_grad=True)
    if route == "ignored":
        loss = entmax_loss(x, torch.tensor([0, -100]), alpha=alpha, reduction="sum")
    elif route == "tensor_alpha":
        loss = entmax_loss(x, t, alpha=torch.tensor([[alpha]]))
    elif route == "compile":
        loss = torch.compile(lambda v: entmax_loss(v, t, alpha=alpha), backend="aot_eager", fullgraph=True)(x)
    else:
        loss = entmax_loss(x, t, alpha=alpha)
    (g,) = torch.autograd.grad(loss, x)
    torch.testing.assert_close(g[:1], want, rtol=0, atol=1e-7)
    if route == "ignored":
        assert torch.equal(g[1], torch.zeros(n))


def test_tensor_alpha_under_compile_and_vmap_over_alpha(rng):
    # the α = 1 rows' check read α on the host (compile refused it), and so
    # did the family's convexity flag (vmap over α refused it); values against
    # the oracle, the compiled gradients against the eager ones
    x = rng.normal(size=(3, 6))
    alphas = np.array([1.3, 1.0, 2.5])
    y = np.array([0, 2, 5])
    xt, at, yt = torch.tensor(x), torch.tensor(alphas), torch.tensor(y)
    ref = _oracle(x[[0, 2]], np.eye(6)[y[[0, 2]]], alphas[[0, 2]])  # α = 1: the softmax loss
    ref = np.array([ref[0], torch.nn.functional.cross_entropy(xt[1:2], yt[1:2]).item(), ref[1]])

    def f(v, a):
        return entmax_loss(v, yt, alpha=a[:, None], reduction="none")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    np.testing.assert_allclose(compiled(xt, at).numpy(), ref, rtol=1e-9, atol=1e-12)
    xr, ar = xt.clone().requires_grad_(), at.clone().requires_grad_()
    got = torch.autograd.grad(compiled(xr, ar).sum(), (xr, ar))
    want = torch.autograd.grad(f(xr, ar).sum(), (xr, ar))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    mapped = torch.func.vmap(lambda v, t, a: entmax_loss(v[None], t[None], alpha=a[None, None], reduction="sum"))
    np.testing.assert_allclose(mapped(xt, yt, at).numpy(), ref, rtol=1e-9, atol=1e-12)
