"""A learnable τ (a tensor that requires grad): the same values as a float τ,
and a gradient that is finite where the true one is: masked entries, a τ far
below 1, half-precision scores."""

import numpy as np
import pytest
import torch

import softk

pytestmark = pytest.mark.usefixtures("each_cpu_backend")

NEG_INF = float("-inf")

# every entry point that takes a learnable τ, as f(x, τ) on rows (dim -1)
_CALLS = {
    "softmax": lambda x, t: softk.softmax(x, tau=t),
    "sparsemax": lambda x, t: softk.sparsemax(x, tau=t),
    "entmax15": lambda x, t: softk.entmax15(x, tau=t),
    "entmax1.3": lambda x, t: softk.entmax(x, 1.3, tau=t),
    "entmax_tensor_alpha": lambda x, t: softk.entmax(x, torch.tensor(1.3, dtype=torch.float64), tau=t),
    "log_softmax": lambda x, t: softk.log_softmax(x, tau=t),
    "logsumexp": lambda x, t: softk.logsumexp(x, tau=t),
    "normmax": lambda x, t: softk.normmax(x, tau=t),
    "topk_softmax": lambda x, t: softk.topk_softmax(x, 2, tau=t),
    "budget_sparsemax": lambda x, t: softk.budget_sparsemax(x, 2.0, tau=t),
    **{f"soft_topk_{m}": (lambda m: lambda x, t: softk.soft_topk(x, 2, tau=t, method=m))(m)
       for m in ("exp", "sigmoid", "laplace", "sparse", "grad", "iterative", "weighted")},
    **{f"topk_sum_{m}": (lambda m: lambda x, t: softk.topk_sum(x, 2, tau=t, method=m))(m)
       for m in ("exp", "sigmoid", "sparse", "grad")},
}
# the threshold maps: a learnable τ divides exactly as a float τ does, so the
# values are the same bit for bit
_THRESHOLD = [n for n in _CALLS if n.startswith(("softmax", "sparsemax", "entmax1", "normmax"))
              or n in ("soft_topk_exp", "soft_topk_sigmoid", "soft_topk_laplace", "soft_topk_sparse")]


def _learnable(tau, dtype=torch.float32):
    return torch.tensor(tau, dtype=dtype, requires_grad=True)


def _weighted_sum(out, w):
    return (torch.where(torch.isfinite(out), out, 0.0) * w).sum()


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_a_masked_entry_leaves_the_tau_gradient_as_without_it(name):
    # autograd's rule for x/τ, −g·x/τ², is 0·∞ = NaN on an entry masked with
    # −inf (g = 0 there): every learnable τ got NaN from one masked entry.
    # The gradient must be the one of the row without it, which a central
    # difference in float64 over a float τ checks.
    f = _CALLS[name]
    row = [0.31, 1.23, -0.52, 0.97, 0.05]  # no entry at a kink of any map
    w = torch.tensor([1.0, 3.0, 4.0, -2.0, 0.5], dtype=torch.float64)
    x = torch.tensor(row[:2] + [NEG_INF] + row[2:], dtype=torch.float64)
    wm = torch.cat([w[:2], torch.zeros(1, dtype=torch.float64), w[2:]])
    tau = _learnable(0.7, torch.float64)
    out = f(x, tau)
    _weighted_sum(out, wm if out.dim() else 1.0).backward()
    plain = torch.tensor(row, dtype=torch.float64)
    v = lambda t: float(_weighted_sum(f(plain, t), w if f(plain, t).dim() else 1.0))
    h = 1e-6
    numeric = (v(0.7 + h) - v(0.7 - h)) / (2 * h)
    assert torch.isfinite(tau.grad)
    np.testing.assert_allclose(tau.grad.item(), numeric, rtol=1e-7, atol=1e-9)


def _closed_form_tau_grad(kind, z, w, tau):
    """dL/dτ for L = Σ w·p, p = map(z0/τ), z = z0/τ the scaled row (float64):
    dp/dτ = J·(−z/τ) with the map's Jacobian J on its support S (g = 1 for
    sparsemax, g = √p for 1.5-entmax: J = diag(g) − g gᵀ/Σg; J = diag(p) − p pᵀ
    for softmax), entries far below the support contributing nothing."""
    if kind == "softmax":
        p = np.exp(z - z.max())
        p /= p.sum()
        g, norm = p, 1.0
    else:
        from ..oracle import maps as oracle

        p = oracle.sparsemax(z) if kind == "sparsemax" else oracle.entmax(z, 1.5)
        g = (p > 0).astype(float) if kind == "sparsemax" else np.sqrt(p)
        norm = g.sum()
    v = -z / tau
    v = np.where(g > 0, v, 0.0)
    jv = g * v - g * (g @ v) / norm
    return float(w @ jv)


@pytest.mark.parametrize("kind", ["softmax", "sparsemax", "entmax15"])
@pytest.mark.parametrize("tau", [1e-3, 1e-20, 1e-30, 1e-37])
def test_a_tau_far_below_one_keeps_a_finite_gradient(kind, tau):
    # x/τ² overflowed float32 below τ ≈ 1e-19: τ's gradient was NaN (∞·0 off
    # the support) where it is ≈ 1/τ, finite down to the floor
    f = {"softmax": softk.softmax, "sparsemax": softk.sparsemax, "entmax15": softk.entmax15}[kind]
    c = [0.5, 0.3, -0.4]  # three entries within O(τ) of each other, one far below
    x = torch.tensor([c[0] * tau, c[1] * tau, -1.0, c[2] * tau], requires_grad=True)
    t = _learnable(tau)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (f(x, tau=t) * w).sum().backward()
    xd = np.array([c[0], c[1], -1.0 / tau, c[2]]) - c[0]  # the scaled row (x − max)/τ, exact
    want = _closed_form_tau_grad(kind, xd, w.double().numpy(), tau)
    # float32 rounds x (c·τ) and the scaled row to ~1e-7 of their size
    np.testing.assert_allclose(t.grad.item(), want, rtol=2e-6)
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("name", _THRESHOLD)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tau", [1e-8, 1e-3, 0.7])
def test_a_learnable_tau_gives_the_values_of_a_float_tau(name, dtype, tau):
    # τ was cast to the input's dtype: a half τ of 1e-8 is 0 (NaN rows), and
    # (x − max)/τ rounded to half lost the differences near a threshold.  The
    # top-k maps also shifted by the maximum, not the k-th entry: with an
    # outlier, the entries near the threshold kept ulp(outlier/τ).
    f = _CALLS[name]
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(6, 9, generator=g) * tau).to(dtype)
    x[1, 4] = NEG_INF
    x[2, 0] = 60000.0 * tau if dtype == torch.float16 else 1e6 * tau  # an outlier
    out = f(x, _learnable(tau))
    assert out.dtype == dtype
    torch.testing.assert_close(out, f(x, tau), rtol=0, atol=0, equal_nan=True)


def test_a_learnable_tau_keeps_entries_whose_quotient_overflows_in_the_top_k():
    # (x − max)/τ overflowed to −inf and read as a masked entry: at k = 2 the
    # row [0, −2, −3] at τ = 3e-39 kept one entry, [1, 0, 0]
    x = torch.tensor([0.0, -2.0, -3.0])
    for m in ("exp", "sigmoid", "laplace", "sparse"):
        p = softk.soft_topk(x, 2, tau=_learnable(3e-39), method=m)
        # λ is solved to float32's resolution: an entry of 1 may read 1 − 2⁻²⁴
        torch.testing.assert_close(p, torch.tensor([1.0, 1.0, 0.0]), rtol=0, atol=2.0**-24)


@pytest.mark.parametrize("name", sorted(_CALLS))
def test_forward_mode_and_vmap_see_tau(name):
    # a τ that torch.func.jvp or forward-mode AD differentiates does not
    # require grad: it was read as a number, and the tangent was dropped (jvp
    # gave 0); a τ batched by vmap was read with .item() and raised
    f = _CALLS[name]
    x = torch.tensor([[0.31, 1.23, -0.52, 0.97, 0.05], [0.4, -1.1, 0.8, 0.82, 2.0]], dtype=torch.float64)
    w = torch.tensor([1.0, 3.0, 4.0, -2.0, 0.5], dtype=torch.float64)
    v = lambda t: float(_weighted_sum(f(x, t), w if f(x, t).dim() > 1 else 1.0))
    h = 1e-6
    numeric = (v(0.7 + h) - v(0.7 - h)) / (2 * h)
    tau = torch.tensor(0.7, dtype=torch.float64)
    _, tangent = torch.func.jvp(lambda t: f(x, t), (tau,), (torch.ones_like(tau),))
    np.testing.assert_allclose(float(_weighted_sum(tangent, w if tangent.dim() > 1 else 1.0)), numeric,
                               rtol=1e-7, atol=1e-9)
    import torch.autograd.forward_ad as fwAD

    with fwAD.dual_level():
        out = f(x, fwAD.make_dual(tau, torch.ones_like(tau)))
        tangent = fwAD.unpack_dual(out).tangent
    assert tangent is not None
    np.testing.assert_allclose(float(_weighted_sum(tangent, w if tangent.dim() > 1 else 1.0)), numeric,
                               rtol=1e-7, atol=1e-9)
    taus = torch.tensor([0.3, 0.7, 2.5], dtype=torch.float64)
    batched = torch.func.vmap(lambda t: f(x, t))(taus)
    torch.testing.assert_close(batched, torch.stack([f(x, float(t)) for t in taus]), rtol=1e-12, atol=1e-14)


def test_a_transformed_tau_is_refused_where_it_would_be_read_as_a_number():
    x = torch.tensor([[0.3, -1.0, 2.0], [1.0, 0.5, 0.0]])
    with pytest.raises(ValueError, match="tau is a tensor that requires grad"):
        torch.func.jvp(lambda t: softk.losses.sparsemax_loss(x, torch.tensor([0, 1]), tau=t),
                       (torch.tensor(0.5),), (torch.tensor(1.0),))
    with pytest.raises(ValueError, match="tau=.* is below 2.94e-39"):  # every τ of the batch is checked
        torch.func.vmap(lambda t: softk.sparsemax(x, tau=t))(torch.tensor([0.5, 1e-40]))


@pytest.mark.parametrize("method", ["exp", "sigmoid", "sparse", "grad"])
@pytest.mark.parametrize("tau", [1e-33, 1e-20, 0.3])
def test_topk_sum_with_a_learnable_tau_far_from_the_origin(method, tau):
    # τ·T₁(x/τ): x/τ overflowed at 1e6/1e-33 (an inf sum), and a masked entry
    # made τ's gradient NaN.  The value is the oracle's; ∂T/∂τ = −Σ[ψ(p) − ψ(1)p]
    # (the envelope theorem), 0 once p is k-hot
    from ..oracle import topk as oracle_topk

    row = [1e6 + 0.5, 1e6, NEG_INF, 1e6 - 3.0, 1e6 + 0.25]
    x = torch.tensor([row], dtype=torch.float64, requires_grad=True)
    t = _learnable(tau, torch.float64)
    out = softk.topk_sum(x, 2, tau=t, method=method)
    out.sum().backward()
    finite = [v for v in row if v > NEG_INF]
    want = oracle_topk.topk_sum(np.array(finite) - 1e6, 2, tau=tau, method=method) + 2e6
    np.testing.assert_allclose(out.item(), want, rtol=1e-15)
    h = 1e-7 * tau
    v = lambda s: float(oracle_topk.topk_sum(np.array(finite) - 1e6, 2, tau=s, method=method))
    np.testing.assert_allclose(t.grad.item(), (v(tau + h) - v(tau - h)) / (2 * h), rtol=1e-6, atol=1e-9)
    xf = x.detach().float()
    torch.testing.assert_close(softk.topk_sum(xf, 2, tau=_learnable(tau), method=method),
                               torch.tensor([want], dtype=torch.float32), rtol=0, atol=0.125)  # ulp(2e6)/2


def test_topk_sum_grad_method_with_a_float32_tau():
    # τ went to float64 twice, and the two gradients, each the size of the
    # scores over τ (1e8 here), were added in float32: 0 where it is 1.047.
    # With the 1e8 entry certainly selected, T = 1e8 + τ·logsumexp(o/τ) over
    # the rest o, and ∂T/∂τ at τ = 1 is the softmax's entropy over o.
    x = torch.tensor([1e8, 0.5, 0.1, -0.3])
    tau = _learnable(1.0)
    softk.topk_sum(x, 2, tau=tau, method="grad").backward()
    o = torch.tensor([0.5, 0.1, -0.3], dtype=torch.float64)
    p = torch.softmax(o, 0)
    want = float(torch.logsumexp(o, 0) - (p * o).sum())
    assert tau.grad.item() == pytest.approx(want, rel=1e-6)
