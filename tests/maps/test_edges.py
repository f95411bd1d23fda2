"""Edge cases: ties, masks, saturated and NaN rows, sizes, dtypes, errors, modules, backend."""

import numpy as np
import pytest
import torch

import softk
from softk import nn as snn

from ..oracle import maps as oracle
from ..precision import float_max_rows

# Every test here runs on both CPU paths: the PyTorch one and the compiled kernels.
pytestmark = pytest.mark.usefixtures("each_cpu_backend")

METHODS = ["exp", "sigmoid", "laplace", "sparse"]
INF = float("inf")


def _all_maps(k=2):
    maps = {
        "softmax": softk.softmax,
        "sparsemax": softk.sparsemax,
        "entmax15": softk.entmax15,
        "entmax1.3": lambda x, dim=-1: softk.entmax(x, 1.3, dim),
    }
    for m in METHODS:
        maps[m] = (lambda m: lambda x, dim=-1: softk.soft_topk(x, k, dim, method=m))(m)
    return maps


@pytest.mark.parametrize("method", METHODS)
def test_ties_do_not_crash_and_are_symmetric(method):
    # The seed's reference ThreTopK code crashes on x = [1, 1, 1, 1], k = 3.
    p = softk.soft_topk(torch.tensor([1.0, 1.0, 1.0, 1.0]), 3, method=method)
    # exact for the closed forms; "sigmoid" is a Newton solve to float32 precision
    atol = 1e-7 if method == "sigmoid" else 0.0
    torch.testing.assert_close(p, torch.full((4,), 0.75), rtol=0, atol=atol)
    assert p.unique().numel() == 1
    q = softk.soft_topk(torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=torch.float64), 2, method=method)
    assert q[1] == q[2]
    ref = oracle.soft_topk(np.array([2.0, 1.0, 1.0, 0.0]), 2, method=method)
    np.testing.assert_allclose(q.numpy(), ref, atol=1e-12)


def test_minus_inf_is_removal():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(5, 9))
    keep = rng.random((5, 9)) > 0.3
    keep[:, 0] = keep[:, 1] = keep[:, 2] = True
    xm = np.where(keep, x, -np.inf)
    for name, fn in _all_maps(k=2).items():
        out = fn(torch.tensor(xm)).numpy()
        assert (out[~keep] == 0).all(), name
        for r in range(5):
            alone = fn(torch.tensor(x[r][keep[r]])).numpy()
            np.testing.assert_allclose(out[r][keep[r]], alone, atol=1e-14, err_msg=name)


def test_fully_masked_and_short_rows():
    x = torch.tensor([[-INF, -INF, -INF, -INF], [-INF, 2.0, -INF, -INF], [0.0, -INF, 3.0, -INF]])
    for name, fn in _all_maps(k=2).items():
        p = fn(x)
        assert torch.equal(p[0], torch.zeros(4)), name  # no finite entry: zeros, not NaN
        assert torch.equal(p[1], torch.tensor([0.0, 1.0, 0.0, 0.0])), name  # one finite entry
    for m in METHODS:
        # two finite entries and k = 3: each finite entry gets 1, Σp = 2 < k.
        p = softk.soft_topk(x, 3, method=m)
        assert torch.equal(p[2], torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert torch.equal(softk.log_softmax(x)[0], torch.full((4,), -INF))
    assert softk.logsumexp(x)[0].item() == -INF


def test_nan_stays_in_its_row():
    x = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0], [INF, 0.0, 1.0]])
    for name, fn in _all_maps(k=2).items():
        p = fn(x)
        assert bool(torch.isnan(p[0]).all()), name
        assert bool(torch.isfinite(p[1]).all()), name
        assert bool(torch.isnan(p[2]).all()), name


@pytest.mark.parametrize("shape,dim", [((1,), 0), ((3, 1), -1), ((1, 4), 0), ((2, 1, 3), 1)])
def test_size_one_dimension(shape, dim):
    x = torch.randn(shape)
    for name, fn in _all_maps(k=1).items():
        assert torch.equal(fn(x, dim=dim), torch.ones(shape)), name


def test_empty_tensors():
    x = torch.randn(0, 5)
    for name, fn in _all_maps(k=2).items():
        assert fn(x).shape == (0, 5), name
    assert softk.softmax(torch.randn(3, 0)).shape == (3, 0)
    assert softk.sparsemax(torch.randn(3, 0)).shape == (3, 0)


EMPTY = [((3, 0), 1), ((0, 4), 0), ((0, 4), 1), ((0,), 0), ((2, 0, 3), 1), ((2, 0, 3), 2)]


@pytest.mark.parametrize("shape,dim", EMPTY)
def test_every_map_on_empty_dims(shape, dim):
    """An empty batch gives an empty result; an empty reduced dim gives the
    empty result for the k = 1 maps and softk's ValueError naming k for the
    top-k maps (k >= 1 entries cannot be chosen from none); never a raw torch
    error from inside a kernel."""
    maps = {**_all_maps(k=1), "grad": lambda x, dim: softk.soft_topk(x, 1, dim, method="grad"),
            "hard_topk": lambda x, dim: softk.hard_topk(x, 1, dim), "topk_softmax": lambda x, dim: softk.topk_softmax(x, 1, dim),
            "topk_sum": lambda x, dim: softk.topk_sum(x, 1, dim), "entmax_tensor_alpha":
            lambda x, dim: softk.entmax(x, torch.tensor(1.3), dim)}
    x = torch.randn(shape, requires_grad=True)
    for name, fn in maps.items():
        if shape[dim] == 0 and name not in ("softmax", "sparsemax", "entmax15", "entmax1.3", "entmax_tensor_alpha"):
            with pytest.raises(ValueError, match="k must be in"):
                fn(x, dim)
            continue
        y = fn(x, dim)
        assert y.numel() == 0, name
        if name == "hard_topk":  # a 0/1 mask: no gradient, on any input
            assert not y.requires_grad
            continue
        y.sum().backward()
        assert x.grad.shape == x.shape, name
        x.grad = None


@pytest.mark.parametrize("shape,dim", EMPTY)
def test_log_softmax_and_logsumexp_of_empty_dims(shape, dim):
    """Found by fuzzing: an empty dim raised amax's IndexError.  The log of an
    empty sum is -inf (as torch.logsumexp), an empty batch stays empty, and
    the gradient is defined (empty)."""
    x = torch.randn(shape, requires_grad=True)
    y = softk.log_softmax(x, dim=dim)
    assert y.shape == x.shape
    lse = softk.logsumexp(x, dim=dim)
    reduced = list(shape)
    del reduced[dim]
    assert lse.shape == tuple(reduced)
    if shape[dim] == 0:
        assert lse.numel() == int(np.prod(reduced)) and bool((lse == float("-inf")).all())
    assert softk.logsumexp(x, dim=dim, keepdim=True).shape == tuple(1 if i == dim else n for i, n in enumerate(shape))
    (y.sum() + lse.sum()).backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)])
def test_dtypes_against_oracle(dtype, tol):
    xn = np.random.default_rng(2).normal(size=(4, 50)) * 3
    x = torch.tensor(xn).to(dtype)
    xq = x.double().numpy()  # the values the dtype can hold
    pairs = [
        (softk.softmax(x), oracle.softmax(xq)),
        (softk.sparsemax(x), oracle.sparsemax(xq)),
        (softk.entmax15(x), oracle.entmax(xq, 1.5)),
        (softk.entmax(x, 1.25), oracle.entmax(xq, 1.25)),
    ] + [(softk.soft_topk(x, 7, method=m), oracle.soft_topk(xq, 7, method=m)) for m in METHODS]
    for out, ref in pairs:
        assert out.dtype == dtype
        np.testing.assert_allclose(out.double().numpy(), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_large_magnitudes_stay_finite(dtype):
    # The entmax package's bisection returns NaN here (deep-spin/entmax#30).
    big = 1e4 if dtype == torch.bfloat16 else 6e4
    x = torch.tensor([[big, -big, 0.5 * big, 0.0], [big, big, -big, 0.0]], dtype=dtype)
    outs = [softk.softmax(x), softk.sparsemax(x), softk.entmax15(x), softk.entmax(x, 1.3)]
    outs += [softk.soft_topk(x, 2, method=m) for m in METHODS]
    for p in outs:
        assert bool(torch.isfinite(p).all())
        assert abs(p.float().sum(-1) - p.float().sum(-1).round()).max() < 1e-2


def test_bad_input_errors_name_the_parameter():
    x = torch.randn(2, 4)
    cases = [
        (lambda: softk.soft_topk(x, 0), ValueError, "k"),
        (lambda: softk.soft_topk(x, 5), ValueError, "k"),
        (lambda: softk.soft_topk(x, 2.5, method="grad"), ValueError, "k"),
        (lambda: softk.soft_topk(x, True), TypeError, "k"),
        (lambda: softk.soft_topk(x, 2, method="foo"), ValueError, "method"),
        (lambda: softk.softmax(x, tau=0.0), ValueError, "tau"),
        (lambda: softk.sparsemax(x, tau=-1), ValueError, "tau"),
        (lambda: softk.sparsemax(x, tau=float("nan")), ValueError, "tau"),
        (lambda: softk.sparsemax(x, tau="1"), TypeError, "tau"),
        (lambda: softk.entmax(x, alpha=0.5), ValueError, "alpha"),
        (lambda: softk.entmax(x, alpha=torch.tensor([[0.9], [1.5]])), ValueError, "alpha"),
        (lambda: softk.entmax(x, alpha=torch.ones(4)), ValueError, "alpha"),
        (lambda: softk.entmax(x, alpha="2"), TypeError, "alpha"),
        (lambda: softk.sparsemax(torch.arange(4)), TypeError, "x"),
        (lambda: softk.softmax(torch.tensor(1.0)), ValueError, "x"),
        (lambda: softk.entmax15([1.0, 2.0]), TypeError, "x"),
        (lambda: softk.sparsemax(x, dim=2), ValueError, "dim"),
        (lambda: softk.sparsemax(x, dim=1.0), TypeError, "dim"),
        (lambda: snn.SoftTopK(0), ValueError, "k"),
        (lambda: snn.Entmax(alpha=1.0, learnable=True), ValueError, "alpha"),
        (lambda: snn.Entmax(alpha=1e39, learnable=True), ValueError, "beyond float32"),  # its parameter was inf
        # a module takes one α: a tensor of several is refused as what it is
        # (the message said "a float >= 1 or a tensor" of a tensor)
        (lambda: snn.Entmax(alpha=torch.tensor([1.5, 1.6])), TypeError, r"alpha must be a float >= 1 here, got Tensor of shape \(2,\)"),
    ]
    for call, exc, word in cases:
        with pytest.raises(exc, match=word):
            call()
    # and a one-element tensor is its value
    assert snn.Entmax(alpha=torch.tensor(1.5)).alpha == 1.5


def test_modules_match_functions_and_repr():
    x = torch.randn(3, 6, dtype=torch.float64)
    assert torch.equal(snn.Sparsemax(dim=0, tau=0.5)(x), softk.sparsemax(x, 0, 0.5))
    assert torch.equal(snn.Entmax15()(x), softk.entmax15(x))
    assert torch.equal(snn.Entmax(alpha=1.3)(x), softk.entmax(x, 1.3))
    assert torch.equal(snn.SoftTopK(2, -1, 0.5, "laplace")(x), softk.soft_topk(x, 2, -1, 0.5, "laplace"))
    assert "k=2, dim=-1, tau=0.5, method='laplace'" in repr(snn.SoftTopK(2, -1, 0.5, "laplace"))
    assert "dim=0, tau=0.5" in repr(snn.Sparsemax(dim=0, tau=0.5))
    assert "alpha=1.3" in repr(snn.Entmax(alpha=1.3))
    # every digit: 4 significant ones printed 1.00001 as 1 (softmax)
    assert "alpha=1.00001," in repr(snn.Entmax(alpha=1.00001))
    assert "alpha=1.00001," in repr(snn.Entmax(alpha=1.00001, learnable=True))


def test_learnable_alpha_trains():
    m = snn.Entmax(alpha=1.5, learnable=True)
    assert abs(m.alpha.item() - 1.5) < 1e-6 and "learnable=True" in repr(m)
    x = torch.randn(4, 6, dtype=torch.float64)
    target = softk.sparsemax(x)  # reachable at α = 2
    opt = torch.optim.Adam(m.parameters(), lr=0.1)
    for _ in range(60):
        opt.zero_grad()
        loss = ((m(x) - target) ** 2).sum()
        loss.backward()
        opt.step()
    assert m.alpha.item() > 1.8


@pytest.mark.parametrize("family", ["SPARSEMAX", "ENTMAX15"])
@pytest.mark.parametrize("backend", ["torch", "native"])
def test_at_most_k_finite_entries_far_apart_are_each_one(family, backend):
    # Σp = k > 1 on a k = 1 map (the kernels' own interface): a row of two
    # finite entries 5e38 apart is 1 on both, though (x − max)/τ overflows to
    # −inf for the lower one
    from softk._backends.native import threshold as native
    from softk._backends.torch import threshold as torch_kernel
    from softk.threshold import families

    if backend == "native" and not softk._backends.registry.native_available():
        pytest.skip("needs a C compiler")
    x = torch.full((1, 40), -INF)
    x[0, 3], x[0, 30] = 3.0e38, -2.0e38
    kernel = native if backend == "native" else torch_kernel
    p = kernel.forward(getattr(families, family), x, 2, 0.5)
    expected = torch.zeros_like(x)
    expected[0, [3, 30]] = 1.0
    assert torch.equal(p, expected)


_TAU_CALLS = {
    "softmax": lambda x, tau: softk.softmax(x, tau=tau),
    "sparsemax": lambda x, tau: softk.sparsemax(x, tau=tau),
    "entmax": lambda x, tau: softk.entmax(x, 1.3, tau=tau),
    "log_softmax": lambda x, tau: softk.log_softmax(x, tau=tau),
    "logsumexp": lambda x, tau: softk.logsumexp(x, tau=tau),
    "soft_topk": lambda x, tau: softk.soft_topk(x, 2, tau=tau),
    "iterative": lambda x, tau: softk.soft_topk(x, 2, tau=tau, method="iterative"),
    "weighted": lambda x, tau: softk.soft_topk(x, 2, tau=tau, method="weighted"),
    "topk_softmax": lambda x, tau: softk.topk_softmax(x, 2, tau=tau),
    "normmax": lambda x, tau: softk.normmax(x, tau=tau),
    "budget_sparsemax": lambda x, tau: softk.budget_sparsemax(x, 2.0, tau=tau),
    "cross_entropy": lambda x, tau: softk.losses.cross_entropy(x[None], torch.tensor([0]), tau=tau),
    "sparsemax_loss": lambda x, tau: softk.losses.sparsemax_loss(x[None], torch.tensor([0]), tau=tau),
}


@pytest.mark.parametrize("name", sorted(_TAU_CALLS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_tau_below_the_compute_dtype_is_refused(name, dtype):
    # x/τ is formed as x·(1/τ): below 1/max of float32 that factor is inf
    # (and τ itself 0 below the subnormals), and the row's maximum became
    # 0·inf = NaN in every map, silently
    x = torch.tensor([1.0, 0.5, -1.0, 0.0], dtype=dtype)
    with pytest.raises(ValueError, match="tau=1e-40 is below 2.94e-39, 1/max of float32"):
        _TAU_CALLS[name](x, 1e-40)
    out = _TAU_CALLS[name](x, 3e-39)  # just above: the argmax limit, finite
    assert not torch.isnan(out).any()
    assert not torch.isnan(_TAU_CALLS[name](x.double(), 1e-300)).any()  # float64 takes it
    with pytest.raises(ValueError, match=r"float64 input is computed in\), where x/tau is formed as x·\(1/tau\)$"):
        _TAU_CALLS[name](x.double(), 1e-320)  # (no advice to pass the float64 input it is)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax", "soft_topk", "normmax"])
def test_a_learnable_tau_far_below_one(name):
    # a τ that requires grad is divided into x with autograd: x/τ alone
    # overflowed at τ = 5e-39 (inf − inf = NaN rows) where the row shifted by
    # its maximum first does not, and a τ below the floor is refused as a
    # float one is
    x = torch.tensor([[1.0, -0.5, 2.0, 0.3]])
    want = torch.tensor([[0.0, 0.0, 1.0, 0.0]]) if name != "soft_topk" else None
    tau = torch.tensor(5e-39, requires_grad=True)
    out = _TAU_CALLS[name](x, tau)
    assert not torch.isnan(out).any()
    if want is not None:
        torch.testing.assert_close(out, want)
    with pytest.raises(ValueError, match="tau=.* is below 2.94e-39"):
        _TAU_CALLS[name](x, torch.tensor(1e-40, requires_grad=True))


@pytest.mark.parametrize("method", ["softmax", "exp", "sigmoid", "laplace", "sparse", "grad", "iterative", "weighted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entries_of_both_signs_at_the_float_max_with_a_large_tau(method, dtype):
    # x − max overflowed (−2·max = −inf) where (x − max)/τ is −4: p was
    # [1, 0] where it is that of [1, −1] at τ = 1/2, [0.982, 0.018] for softmax
    big = torch.finfo(dtype).max
    f = (lambda x, tau: softk.softmax(x, tau=tau)) if method == "softmax" else \
        (lambda x, tau: softk.soft_topk(x, 1, tau=tau, method=method))
    got = f(torch.tensor([big, -big], dtype=dtype), big / 2)
    want = f(torch.tensor([1.0, -1.0], dtype=dtype), 0.5)  # the same scaled row, [0, −4]
    torch.testing.assert_close(got, want, rtol=0, atol=2 * torch.finfo(dtype).eps)
    if method == "softmax":
        torch.testing.assert_close(got.double(), torch.tensor([1.0, float(np.exp(-4.0))], dtype=torch.float64)
                                   / (1 + np.exp(-4.0)), rtol=4 * torch.finfo(dtype).eps, atol=0)


@pytest.mark.parametrize("learnable", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(float_max_rows.MAPS))
def test_a_row_at_the_float_max_over_a_large_tau_every_map(name, dtype, learnable):
    # x − x₁ overflowed where (x − x₁)/τ is ordinary: log_softmax, the
    # learnable-τ path, α-entmax near 1 and the sigmoid slope read −inf there
    float_max_rows.check_map(name, dtype, learnable)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(float_max_rows.LOSSES))
def test_a_row_at_the_float_max_over_a_large_tau_every_loss(name, dtype):
    float_max_rows.check_loss(name, dtype)
