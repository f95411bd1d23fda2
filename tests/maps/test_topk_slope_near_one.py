r"""Soft top-k "sigmoid" and "laplace" where p nears 1, against mpmath.

Their slope there is f′(u) ≈ 1 − p (sigmoid: σ(u)σ(−u); laplace: ½e^{−|u|}),
which p's rounding loses: p = 1 − 4e-5 holds 1 − p to 2 % in bfloat16, and
once p rounds to 1 nothing of it is left.  Read off p, that zeroed the
whole row's gradient where every entry lies far from λ: sigmoid, k = 1, on
[0, −40] gave dx = 0 for −log p₂, whose exact gradient is ±½.  The backward
of these families forms u = (x − x_j)/τ + f⁻¹(p_j) from the input instead,
anchored at an entry with p_j ≤ ½ (``Family.slope_from_x``).

Each entry's gradient is checked against its own error scale,
d_i (|g_i| + |ḡ|): an entry near 1 has a tiny d_i, so a check against the
row's largest gradient would not see it lose all its digits.

The forward on the same rows: with entries near 1, Σp's rounding (an ulp of
k) can be more than the whole mass of the entries near 0, so Σp = k holds on
a flat of λ, and a λ anywhere on it leaves their p off by any factor.
Sigmoid's search on the tensor path sums the two tails apart
(``Family.residual``).
"""

from __future__ import annotations

import mpmath
import numpy as np
import pytest
import torch

import softk
from softk._backends.torch.threshold import backward as threshold_backward
from softk._backends.triton.function import FAMILY_IDS, backward_rows
from softk.threshold.families import THRESHOLD_METHODS

mpmath.mp.dps = 60
# the forward's search on rows this far apart takes log 0 and 0/0 in lanes it
# then discards, which Triton's interpreter (numpy) reports
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

FAMS = ["sigmoid", "laplace"]
BACKENDS = ["torch", "triton"]


def _f(fam, u):
    if fam == "sigmoid":
        return 1 / (1 + mpmath.exp(-u))
    return 1 - mpmath.exp(-u) / 2 if u >= 0 else mpmath.exp(u) / 2


def _df(fam, u):
    e = mpmath.exp(-abs(u))
    return e / (1 + e) ** 2 if fam == "sigmoid" else e / 2


def _excess(fam, z, counts, k, lam):
    """Σ c_i f(z_i − λ) − k, summed as the tail below λ less the tail above
    (f(u) = 1 − f(−u)), so that e^{−150} next to 1 is not lost to the
    working precision."""
    below = sum(c * _f(fam, zi - lam) for zi, c in zip(z, counts) if zi < lam)
    above = sum(c * _f(fam, lam - zi) for zi, c in zip(z, counts) if zi >= lam)
    return below - above - (k - sum(c for zi, c in zip(z, counts) if zi >= lam))


def _lam(fam, z, counts, k):
    """λ with Σ c_i f(z_i − λ) = k: bisection in 60 digits (past the
    bracket's width first: rows may span the float range)."""
    lo, hi = min(z) - 200, max(z) + 200
    for _ in range(400 + int(mpmath.log(hi - lo, 2))):
        mid = (lo + hi) / 2
        if _excess(fam, z, counts, k, mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _ref(fam, x, k, tau):
    """(p, d) at the exact λ, found over the row's distinct values (a wide
    row of a few values costs nothing)."""
    vals, counts = np.unique(x[np.isfinite(x)], return_counts=True)
    lam = _lam(fam, [mpmath.mpf(float(v)) / tau for v in vals], counts, k)
    p, d = np.zeros(len(x), dtype=object), np.zeros(len(x), dtype=object)
    for i, v in enumerate(x):
        if np.isfinite(v):
            u = mpmath.mpf(float(v)) / tau - lam
            p[i], d[i] = _f(fam, u), _df(fam, u)
        else:
            p[i], d[i] = mpmath.mpf(0), mpmath.mpf(0)
    return p, d


def _ref_vjp(d, g, tau):
    """(d (g − ḡ)/τ, d (|g| + |ḡ|)/τ): the gradient and each entry's error scale."""
    g = [mpmath.mpf(float(v)) for v in g]
    gbar = sum(di * gi for di, gi in zip(d, g)) / sum(d)
    want = np.array([float(di * (gi - gbar) / tau) for di, gi in zip(d, g)])
    scale = np.array([float(di * (abs(gi) + abs(gbar)) / tau) for di, gi in zip(d, g)])
    return want, scale


ROWS = [
    ([0.0, -40.0], 1, 1.0),  # p₁ = 1 − 4e-18: 1 in float32
    ([0.0, -20.0], 1, 1.0),  # p₁ = 1 − 4.5e-5: 1 in bfloat16
    ([3.0, 2.5, -30.0, -35.0], 2, 1.0),  # two entries near 1, two near 0
    ([5.0, 4.0, 3.0, -9.0, -10.0], 3, 0.25),  # |u| from 24 to 52
    ([0.0, float("-inf"), -40.0], 1, 1.0),  # a masked entry
    ([0.3, 0.0, -0.2], 2, 1.0),  # every p above ½: the smallest is the anchor
]
# below ½ every entry keeps its relative precision: p's own rounding
# (the bfloat16 output's 2⁻⁸) and u's, a few ulps of the largest |u| (float32)
TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2.0**-6, torch.float16: 2.0**-8}


def _run(fam, backend, x, k, tau, g=None):
    xx = x.clone().requires_grad_()
    with softk.use_backend(backend):
        p = softk.soft_topk(xx, k, tau=tau, method=fam)
    if g is None:  # −log of the smallest finite entry
        j = int(torch.where(torch.isfinite(x), p.detach().double(), 2.0).argmin())
        g = torch.zeros(len(x), dtype=torch.float64)
        g[j] = -1 / p[j].detach().double()
    p.backward(g.to(p.dtype))
    return xx.grad.double().numpy(), g.numpy()


def _check(dx, want, scale, u_max, dtype):
    tol = TOL[dtype] * (1 + (u_max if dtype == torch.float32 else 0))
    err = np.abs(dx - want)
    floor = torch.finfo(dtype).tiny * torch.finfo(dtype).eps  # a gradient among the subnormals: their spacing
    assert np.all(err <= tol * scale + floor), (dx, want, err / np.maximum(scale, 1e-300))


def _case(backend, dtype, fam, row, k, tau):
    """(x, the reference's (p, d) on x's rounded scores, twice the largest |z|)."""
    if backend == "triton" and dtype == torch.float64:
        pytest.skip("the Triton kernels compute in float32 and take no float64")
    x = torch.tensor(row, dtype=dtype)
    xs = x.double().numpy()
    return x, _ref(fam, xs, k, tau), float(np.abs(xs[np.isfinite(xs)]).max() / tau) * 2


CASES = [pytest.mark.parametrize("backend", BACKENDS),
         pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16]),
         pytest.mark.parametrize("fam", FAMS),
         pytest.mark.parametrize("row, k, tau", ROWS)]


def _cases(test):
    for mark in CASES:
        test = mark(test)
    return test


@_cases
def test_every_entry_keeps_its_gradient_near_p_one(backend, dtype, fam, row, k, tau):
    x, (_, d), u_max = _case(backend, dtype, fam, row, k, tau)
    # the loss −log p_j of the smallest entry, then a spread of gradients
    dx, g = _run(fam, backend, x, k, tau)
    want, scale = _ref_vjp(d, g, tau)
    assert np.abs(want).max() > 0.1 / tau  # an O(1) gradient, which p = 1 zeroed
    _check(dx, want, scale, u_max, dtype)
    g = torch.linspace(-1.0, 2.0, len(row), dtype=torch.float64) ** 3
    dx, g = _run(fam, backend, x, k, tau, g)
    _check(dx, *_ref_vjp(d, g, tau), u_max, dtype)


@_cases
def test_entries_near_zero_keep_their_relative_precision(backend, dtype, fam, row, k, tau):
    # The forward, on the same rows: where the entries near 1 make Σp's
    # rounding (an ulp of k) larger than the mass near 0, Σp = k holds on a
    # whole flat of λ, and a λ anywhere on it put those p off by any factor
    # (3.2× for the −30 of [3, 2.5, −30, −35] in float32): every p_i here is
    # within a few ulps of u of its value, relative to itself
    x, (p_ref, _), u_max = _case(backend, dtype, fam, row, k, tau)
    want = np.array([float(v) for v in p_ref])
    with softk.use_backend(backend):
        got = softk.soft_topk(x, k, tau=tau, method=fam).double().numpy()
    # (bfloat16: an ulp, up to 2⁻⁷ of p; Triton's interpreter truncates its stores)
    tol = {torch.float64: 1e-13 * (1 + u_max), torch.float32: 1e-6 * (1 + u_max), torch.bfloat16: 2.0**-7}[dtype]
    assert np.all(np.abs(got - want) <= tol * want), (got, want)


@pytest.mark.parametrize("row, k, tau", [
    ([0.0, -300.0, -1000.0], 1, 1.0),  # p₂ = e^{−150}
    ([0.0, -800.0, -1600.0], 1, 1.0),  # p₂ = e^{−400}
    ([10.0, 0.0, -300.0, -1000.0], 2, 1.0),
    ([0.0, -0.62, -0.08, -0.54], 1, 0.01),  # p₃ = e^{−400} at τ = 0.01
])
def test_sigmoid_entries_far_below_in_float64(row, k, tau):
    # Newton on the difference of the two tails moves one unit of u a step
    # where every entry is far from λ, and ran out of steps before e^{−150};
    # on their log-ratio it takes a few
    x = torch.tensor(row, dtype=torch.float64)
    want = np.array([float(v) for v in _ref("sigmoid", x.numpy(), k, tau)[0]])
    got = softk.soft_topk(x, k, tau=tau, method="sigmoid").numpy()
    assert np.all(np.abs(got - want) <= 1e-12 * want), (got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", FAMS)
def test_rows_past_the_on_chip_backward(backend, fam):
    # 8193 entries: the Triton backward's looped variant (one read for the
    # anchor, two for the sums and dx); the top two entries near 1 and 0;
    # with it a row holding a NaN (dx NaN, all of it) and a fully masked
    # one (dx 0)
    row = [0.0, -20.0] + [-30.0] * 8191
    x = torch.tensor([row, row, [float("-inf")] * len(row)], dtype=torch.float32)
    x[1, 5] = float("nan")
    g = torch.zeros(x.shape, dtype=torch.float64)
    g[:, :3] = torch.tensor([1.0, -2.0, 0.5])
    xx = x.clone().requires_grad_()
    with softk.use_backend(backend):
        softk.soft_topk(xx, 2, method=fam).backward(g.float())
    _, d = _ref(fam, x[0].double().numpy(), 2, 1.0)
    want, scale = _ref_vjp(d, g[0], 1.0)
    _check(xx.grad[0].double().numpy(), want, scale, 60.0, torch.float32)
    assert torch.isnan(xx.grad[1]).all()
    assert torch.equal(xx.grad[2], torch.zeros(len(row)))


@pytest.mark.parametrize("fam", FAMS)
def test_forward_mode_and_a_graph_built_backward(fam):
    # jvp and create_graph=True take the differentiable formula (x tracked)
    x = torch.tensor([0.0, -40.0], dtype=torch.float32)
    _, d = _ref(fam, x.double().numpy(), 1, 1.0)
    v = torch.tensor([1.0, -1.0])
    want, scale = _ref_vjp(d, v.double(), 1.0)  # J is symmetric: J·v = vjp(v)
    _, jv = torch.func.jvp(lambda t: softk.soft_topk(t, 1, method=fam), (x,), (v,))
    _check(jv.double().numpy(), want, scale, 40.0, torch.float32)
    xx = x.clone().requires_grad_()
    p = softk.soft_topk(xx, 1, method=fam)
    (dx,) = torch.autograd.grad(-torch.log(p[1]), xx, create_graph=True)
    np.testing.assert_allclose(dx.detach().numpy(), [0.5, -0.5], rtol=1e-6)  # L = a + log 2 (laplace), softplus(a) (sigmoid)



def _exact_grad(fam, x):
    """∇(−log p_last) at the mpf scores x (k = 1, τ = 1), in 60 digits."""
    lam = _lam(fam, x, [1] * len(x), 1)
    p = [_f(fam, v - lam) for v in x]
    d = [_df(fam, v - lam) for v in x]
    g = [0] * (len(x) - 1) + [-1 / p[-1]]
    gbar = sum(di * gi for di, gi in zip(d, g)) / sum(d)
    return [di * (gi - gbar) for di, gi in zip(d, g)]


@pytest.mark.parametrize("fam", FAMS)
def test_second_derivatives_through_the_anchor(fam):
    # through the anchor's p_j, u moves with λ: a row of three, where the
    # Hessian of −log p₃ tells it (a symmetric row of two does not), in
    # float64 against central differences of the exact gradient (h = 1e-20)
    row = [0.0, -3.0, -9.0]
    xx = torch.tensor(row, dtype=torch.float64, requires_grad=True)
    p = softk.soft_topk(xx, 1, method=fam)
    (dx,) = torch.autograd.grad(-torch.log(p[2]), xx, create_graph=True)
    (h0,) = torch.autograd.grad(dx[0], xx)
    h = mpmath.mpf("1e-20")
    want = []
    for i in range(3):
        up = [mpmath.mpf(v) + (h if j == i else 0) for j, v in enumerate(row)]
        dn = [mpmath.mpf(v) - (h if j == i else 0) for j, v in enumerate(row)]
        want.append(float((_exact_grad(fam, up)[0] - _exact_grad(fam, dn)[0]) / (2 * h)))
    # (laplace: −log p₃ is linear in x where p₃ < ½ and the others above, so
    # its Hessian is ~0, up to the rounding of O(1) terms)
    np.testing.assert_allclose(h0.numpy(), want, rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype, row", [
    (torch.float32, [0.0, 0.0, -101.3]),  # p₃ = 1e-44, subnormal
    (torch.float16, [0.0, 0.0, -16.0]),  # p₃ = 1e-7, 2 subnormal ulps of float16
])
def test_a_subnormal_p_is_not_the_anchor(backend, dtype, row):
    # k = 1.5: the two top entries at p = ¾, which give u to the dtype's
    # precision, and one subnormal p ≤ ½, which gives it to a few digits
    x = torch.tensor(row, dtype=dtype)
    _, d = _ref("laplace", x.double().numpy(), 1.5, 1.0)
    g = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    dx, g = _run("laplace", backend, x, 1.5, 1.0, g)
    want, scale = _ref_vjp(d, g, 1.0)
    _check(dx, want, scale, 0.0, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("dtype, n, k", [
    (torch.bfloat16, 100, 99),  # 1 − p ≈ 0.01: a bfloat16 p holds it to ~30 %
    (torch.float32, 2, 2 - 2.0**-10),  # 1 − p ≈ 5e-4: a float32 p holds it to ~1e-4
    (torch.float32, 8193, 8192.5),  # the looped backward; 1 − p ≈ 6e-5
])
def test_rows_whose_every_p_is_above_one_half(backend, fam, dtype, n, k):
    # No p ≤ ½ to anchor on: u from the smallest p is only as good as its
    # 1 − p, and the backward refines it by Newton on Σf(u) = k over the
    # tails, which x gives to full precision
    x = torch.zeros(n, dtype=dtype)
    x[::7] = 0.5
    x[1] = -0.3
    _, d = _ref(fam, x.double().numpy(), k, 1.0)
    g = torch.zeros(n, dtype=torch.float64)
    g[:3] = torch.tensor([1.0, -0.5, 0.25])[:n]
    dx, g = _run(fam, backend, x, k, 1.0, g)
    _check(dx, *_ref_vjp(d, g, 1.0), 1.0, dtype)


def _rounded_row(fam, dtype, n, k, low):
    """A row of n scores within 0.02 of each other (five values: the
    reference sums over distinct ones) at budget k, and ``low`` entries at
    −200 (p = 0 in any half dtype): x, p (the reference, rounded to
    nearest) and d."""
    spread = 0.01 * torch.tensor([0.0, 0.3, -0.5, 1.0, -1.2]).repeat(n // 5)
    x = torch.cat([spread, torch.full((low,), -200.0)]).to(dtype)
    p, d = _ref(fam, x.double().numpy(), k, 1.0)
    p = torch.tensor([float(v) for v in p], dtype=torch.float64).to(dtype)
    assert bool(((p == 1) | (p == 0)).all())  # nothing to anchor on
    return x, p, d


ROUNDED = [(torch.bfloat16, 600, 599, 0),  # 1 − p ≈ 1.7e-3, below ε/4 = 2⁻⁹
           (torch.bfloat16, 600, 599, 2),  # and two entries at p = 0
           (torch.float16, 9000, 8999, 1)]  # 1 − p ≈ 1.1e-4 < 2⁻¹²; the looped Triton backward


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("dtype, n, k, low", ROUNDED)
def test_rows_whose_every_p_rounds_to_zero_or_one(backend, fam, dtype, n, k, low):
    # No p strictly inside (0, 1): the backward anchors at the lowest entry
    # that rounded to 1, at the u where rounding to 1 begins, and Newton on
    # Σf(u) = k over x's tails finds u; the exact gradient is 1/n-sized
    # where reading p would give 0.  The kernels are called on the rounded
    # p, which Triton's interpreter (it truncates its stores) does not write.
    x, p, d = _rounded_row(fam, dtype, n, k, low)
    g = torch.linspace(-1.0, 2.0, len(x), dtype=torch.float64) ** 3
    if backend == "torch":
        dx = threshold_backward(THRESHOLD_METHODS[fam], p, g.to(dtype), 1.0, x, k)
    else:
        dx = backward_rows(p[None], g.to(dtype)[None], FAMILY_IDS[fam], 1.0, x=x[None], k=k)[0]
    want, scale = _ref_vjp(d, g, 1.0)
    assert np.abs(want).max() > 0.5 / n
    _check(dx.double().numpy(), want, scale, 0.0, dtype)


@pytest.mark.parametrize("fam", FAMS)
def test_a_row_of_ones_through_the_op(fam):
    # the public call passes k on to the backward and to jvp
    x, p, d = _rounded_row(fam, torch.bfloat16, 600, 599, 2)
    xx = x.clone().requires_grad_()
    out = softk.soft_topk(xx, 599, method=fam)
    assert torch.equal(out, p)
    g = torch.linspace(-1.0, 2.0, len(x), dtype=torch.float64) ** 3
    out.backward(g.to(x.dtype))
    want, scale = _ref_vjp(d, g, 1.0)
    _check(xx.grad.double().numpy(), want, scale, 0.0, torch.bfloat16)
    _, jv = torch.func.jvp(lambda t: softk.soft_topk(t, 599, method=fam), (x,), (g.to(x.dtype),))
    _check(jv.double().numpy(), want, scale, 0.0, torch.bfloat16)  # J is symmetric


# rows whose finite entries number at most k: p = 1 on each of them
SHORT_ROWS = [([0.0, 0.0, float("-inf")], 2), ([0.109, -0.487, float("-inf"), float("-inf")], 2.41),
              ([3.0, float("-inf")], 1), ([0.0, 0.5, 0.2] + [float("-inf")] * 8997, 3)]  # the looped Triton backward


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rows_of_at_most_k_finite_entries_have_no_gradient(backend, fam, dtype):
    # p = 1 on each finite entry for every x and k nearby: d = 0.  The anchor
    # where rounding to 1 begins gave these rows a slope of about ε/4, which
    # the vjp's d/Σd made O(1): dx was ε/(4τ) (0.98 in bfloat16 at τ = 1e-3)
    for row, k in SHORT_ROWS:
        x = torch.tensor(row, dtype=dtype)
        p = (x > float("-inf")).to(dtype)
        g = torch.linspace(-1.0, 2.0, len(row), dtype=dtype)
        for tau in (1e-3, 1.0):
            if backend == "torch":
                dx = threshold_backward(THRESHOLD_METHODS[fam], p, g, tau, x, k)
            else:
                dx = backward_rows(p[None], g[None], FAMILY_IDS[fam], tau, x=x[None], k=k)[0]
            assert torch.equal(dx, torch.zeros_like(dx)), (row, k, tau, dx)


@pytest.mark.parametrize("fam", FAMS)
def test_a_per_row_budget_above_the_finite_entries_has_no_gradient(fam):
    # ∂p/∂k = d/Σd was 1.99 on the first row: the same slope of about ε/4
    x = torch.tensor([[float("-inf"), 0.109, -0.487], [0.3, float("-inf"), float("-inf")]], dtype=torch.float64,
                     requires_grad=True)
    k = torch.tensor([[2.41], [1.0]], dtype=torch.float64, requires_grad=True)
    p = softk.soft_topk(x, k, tau=0.1, method=fam)
    assert torch.equal(p.detach(), (x > float("-inf")).double())
    p.backward(torch.tensor([[0.3, -1.0, 2.0], [1.5, 0.2, -0.7]], dtype=torch.float64))
    assert torch.equal(k.grad, torch.zeros_like(k)) and torch.equal(x.grad, torch.zeros_like(x))


@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_per_row_budget_in_half_precision(fam, dtype):
    # the per-row k's backward forms the slope in float32, as every other path
    x = torch.tensor([[45.25, -99.5]], dtype=dtype)
    _, d = _ref(fam, x[0].double().numpy(), 1, 2.0)
    g = torch.tensor([1.0, 0.0], dtype=torch.float64)
    want, scale = _ref_vjp(d, g, 2.0)
    xx = x.clone().requires_grad_()
    p = softk.soft_topk(xx, torch.ones(1, 1, dtype=dtype), tau=2.0, method=fam)
    p.backward(g[None].to(dtype))
    _check(xx.grad[0].double().numpy(), want, scale, 145.0, dtype)


@pytest.mark.parametrize("fam", FAMS)
def test_the_derivative_in_a_per_row_budget(fam):
    # ∂p/∂k = d/Σd: ½ each on [0, −40] (both slopes e^{−20}-small and equal)
    x = torch.tensor([[0.0, -40.0]])
    k = torch.tensor([[1.0]], requires_grad=True)
    p = softk.soft_topk(x, k, method=fam)
    p[0, 1].backward()
    assert k.grad.item() == pytest.approx(0.5, rel=1e-6)


def test_the_triton_backward_asks_for_the_input():
    p = torch.full((1, 4), 0.5)
    with pytest.raises(ValueError, match="x is required"):
        backward_rows(p, p, FAMILY_IDS["sigmoid"], 1.0)
    with pytest.raises(ValueError, match="x is not taken"):
        backward_rows(p, p, FAMILY_IDS["exp"], 1.0, x=p)


_F64_MIN, _F32_MIN = torch.finfo(torch.float64).min, torch.finfo(torch.float32).min


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("dtype, row", [
    (torch.float64, [2.0, _F64_MIN, 0.0, 1.0]),  # a mask written as the dtype's minimum
    (torch.float64, [1.7e308, -1e308, 0.0, 1.0]),
    (torch.float64, [1e60, -1e63, 0.0, 1.0]),
    (torch.float32, [2.0, _F32_MIN, 0.0, 1.0]),
])
def test_rows_that_span_the_float_range(backend, fam, dtype, row):
    # Newton on the tails' log-ratio: where every share of a tail underflows,
    # the plain sums gave r = ±inf and the search bisected a range of 1e308
    # for want of a step, ending far from λ: sigmoid gave [1, 0, 1, 1] at
    # k = 2 (Σp = 3).  Summed in logs, one step crosses the gap.
    x, (p_ref, _), _ = _case(backend, dtype, fam, row, 2, 1.0)
    want = np.array([float(v) for v in p_ref])
    with softk.use_backend(backend):
        got = softk.soft_topk(x, 2, method=fam).double().numpy()
    tol = {torch.float64: 1e-13, torch.float32: 1e-6}[dtype]
    assert np.all(np.abs(got - want) <= tol * np.maximum(want, 1e-300)), (got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sigmoid_rows_whose_entries_lie_far_apart(backend, dtype):
    # z 50 apart (x 0.05 apart at τ = 1e-3): from the bracket of the whole
    # row each Newton step crossed one entry, and 300 entries ran past the
    # iteration cap (Σp = 22 for k = 1); the bracket from the order
    # statistics around k starts among the entries near the threshold
    if backend == "triton" and dtype == torch.float64:
        pytest.skip("the Triton kernels compute in float32 and take no float64")
    x = (torch.arange(300, dtype=torch.float64) * 0.05).to(dtype)
    p_ref, _ = _ref("sigmoid", x.double().numpy(), 1, 1e-3)
    want = np.array([float(v) for v in p_ref])
    with softk.use_backend(backend):
        got = softk.soft_topk(x, 1, tau=1e-3, method="sigmoid").double().numpy()
    big = want > 1e-30  # (the rest: σ of −70 units and below, to the dtype's range)
    # |u| ≤ 70 on those entries, each u to an ulp of itself, and p's relative
    # error is about u's absolute one: 100 eps
    tol = 100 * torch.finfo(dtype).eps
    assert np.all(np.abs(got[big] - want[big]) <= tol * want[big]), (got[-3:], want[-3:])
    assert abs(got.sum() - 1) <= 4 * torch.finfo(dtype).eps


@pytest.mark.parametrize("fam", FAMS + ["exp", "sparse"])
@pytest.mark.parametrize("row, k, want", [([0.0, -1e20], 1.3, [1.0, 0.3]), ([5.0, 0.0, -1e20], 2.3, [1.0, 1.0, 0.3])])
def test_a_fractional_k_whose_partial_entry_lies_far_below(fam, row, k, want):
    # λ lies within O(1) of the ⌈k⌉-th entry; carried relative to the ⌊k⌋-th,
    # λ' could not hold the 0.3 at ulp(1e20) (Σp = 1.5 and 2.0 came out)
    got = softk.soft_topk(torch.tensor(row, dtype=torch.float64), k, method=fam).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.parametrize("low, n_low", [(-200.0, 1), (-300.0, 1), (-300.0, 8190)])
def test_gradient_where_a_tail_underflows(backend, fam, low, n_low):
    # λ ≈ low/2: the slopes are e^{−100} (a float32 subnormal, which
    # torch.sigmoid flushes to 0 past u = −88.7) or e^{−150} (0); at −300
    # every p rounds to 0 or 1 and the tail below λ underflows at the
    # anchor's start, where the plain sums give Newton no step and left the
    # slopes at ~1e-8: summed as logs, they take u to 150 (8193 entries: the
    # looped Triton backward, whose log-sums run online across its blocks)
    x = torch.tensor([2.0, low, 0.0, 1.0] + [low] * (n_low - 1))
    _, d = _ref(fam, x.double().numpy(), 3, 1.0)
    g = torch.zeros(len(x), dtype=torch.float64)
    g[2] = -1.0
    dx, g = _run(fam, backend, x, 3, 1.0, g)
    want, scale = _ref_vjp(d, g, 1.0)
    assert np.abs(want).max() < 1e-40
    _check(dx, want, scale, 200.0, torch.float32)


@pytest.mark.parametrize("method", ["sigmoid", "laplace"])
def test_the_second_derivative_at_k_equal_to_n_is_finite(method):
    # every p is 1: the backward's Newton steps on the anchor masked the
    # quotient r/slope only after forming it, and the double backward met
    # 0·∞ in the branch not taken: NaN Hessians of the map and of its loss.
    # The exact Hessian is 0; the anchored one is of the slope where p
    # rounds to 1, ε/4 ≈ 5.6e-17 in float64
    x = torch.tensor([[0.5, -0.3, 1.2]], dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    y = torch.ones(1, 3, dtype=torch.float64)
    for f in (lambda a: (softk.soft_topk(a, 3, method=method) * w).sum(),
              lambda a: softk.losses.soft_topk_loss(a, y, k=3, method=method)):
        hess = torch.autograd.functional.hessian(f, x)
        assert torch.isfinite(hess).all()
        assert hess.abs().max() < 1e-15
