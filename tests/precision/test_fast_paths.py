"""The fast paths (block max-pooling for the sparse families, top-k + logsumexp
for soft_topk "exp") against the independent NumPy oracle (the exact mpmath
reference for the k = 1 maps), on rows wide enough
(>= 64) to take them, with the row conventions that the prefilter must keep:
-inf masks (including masks that leave fewer than k+1 block maxima), NaN/+inf
rows, ties, heavy tails, any dim, half precision."""

import numpy as np
import pytest
import torch

import softk
from softk.threshold import ENTMAX15, EXP, SPARSE, SPARSEMAX, entmax_family
from softk.threshold.fast_paths import solve_on_candidates
from softk._backends.torch.threshold import map_rows as torch_forward

from ..oracle import maps as oracle


@pytest.fixture(autouse=True)
def torch_path():
    """These are the PyTorch path's fast methods (solve.py); the compiled kernels
    have their own tests (test_native.py) and run the oracle suites too."""
    with softk.use_backend("torch"):
        yield

K1_MAPS = [
    ("sparsemax", lambda x, d=-1: softk.sparsemax(x, d), lambda xn, d=-1: oracle.sparsemax(xn, d)),
    ("entmax15", lambda x, d=-1: softk.entmax15(x, d), lambda xn, d=-1: oracle.entmax(xn, 1.5, d)),
    ("entmax1.3", lambda x, d=-1: softk.entmax(x, 1.3, d), lambda xn, d=-1: oracle.entmax(xn, 1.3, d)),
    ("entmax2.6", lambda x, d=-1: softk.entmax(x, 2.6, d), lambda xn, d=-1: oracle.entmax(xn, 2.6, d)),
]


def _rows(rng, r, n, scale):
    x = rng.normal(size=(r, n)) * scale
    x[0, : n // 2] = -np.inf  # half masked
    x[1, 1::37] = -np.inf  # scattered mask
    x[2, :] = -np.inf  # fully masked
    x[2, 5] = 0.3  # ... but one finite entry: p = 1 there
    x[3, :] = x[3, 0]  # all tied
    x[4, 3 * n // 4 :] = 7.0  # a block of ties at the top
    x[5, :] = -np.inf
    x[5, [0, 1, 40]] = [1.0, 1.5, 0.2]  # three finite entries, one block apart
    x[6, :40] = -np.inf
    x[6, 0] = 50.0  # a dominant entry alone in its (masked) block: support size 1
    return x


ALPHA = {"sparsemax": 2.0, "entmax15": 1.5, "entmax1.3": 1.3, "entmax2.6": 2.6}


@pytest.mark.parametrize("name,fn,ref", K1_MAPS)
@pytest.mark.parametrize("n", [64, 1000, 4099])
@pytest.mark.parametrize("scale", [0.3, 3.0, 40.0])
@pytest.mark.slow
def test_sparse_families_wide_rows_match_exact(rng, name, fn, ref, n, scale):
    # Against the exact p (mpmath, see test_newton_precision.py) rather than
    # the float64 oracle: the oracle ends its bisection on either of two
    # adjacent floats around λ, which on the 4099-way tie at scale 40 is
    # 1.0e-12 off in p for α = 2.6; the solver itself is within 2e-14 there.
    from .test_newton_precision import entmax_exact

    xn = _rows(rng, 8, n, scale)
    out = fn(torch.tensor(xn)).numpy()
    exact = np.stack([entmax_exact(row, ALPHA[name])[0] for row in xn])
    np.testing.assert_allclose(out, exact, rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 3, 40])
def test_sparse_topk_wide_rows_match_oracle(rng, k):
    xn = _rows(rng, 8, 2000, 2.0)
    out = softk.soft_topk(torch.tensor(xn), k, method="sparse").numpy()
    np.testing.assert_allclose(out, oracle.soft_topk(xn, k, method="sparse"), rtol=0, atol=1e-12)


@pytest.mark.parametrize("k", [1, 17, 64])
@pytest.mark.parametrize("scale", [0.5, 5.0, 60.0])
def test_exp_topk_wide_rows_match_oracle(rng, k, scale):
    xn = _rows(rng, 8, 1500, scale)
    out = softk.soft_topk(torch.tensor(xn), k, method="exp").numpy()
    np.testing.assert_allclose(out, oracle.soft_topk(xn, k, method="exp"), rtol=0, atol=1e-12)


def test_broken_rows_stay_nan_and_others_are_untouched(rng):
    xn = rng.normal(size=(4, 500))
    xn[1, 7] = np.nan
    xn[2, 300] = np.inf
    x = torch.tensor(xn)
    for p in (softk.sparsemax(x), softk.entmax15(x), softk.soft_topk(x, 5), softk.entmax(x, 1.7)):
        assert torch.isnan(p[1]).all() and torch.isnan(p[2]).all()
    np.testing.assert_allclose(softk.sparsemax(x)[[0, 3]].numpy(), oracle.sparsemax(xn[[0, 3]]), atol=1e-12)


def test_any_dim_and_float32(rng):
    xn = rng.normal(size=(3, 700, 2)) * 2
    x = torch.tensor(xn, dtype=torch.float32)
    for name, fn, ref in K1_MAPS:
        np.testing.assert_allclose(fn(x, 1).double().numpy(), ref(xn, 1), rtol=0, atol=2e-6)
    p = softk.soft_topk(x, 10, dim=1)
    np.testing.assert_allclose(p.double().numpy(), oracle.soft_topk(xn, 10, 1), rtol=0, atol=5e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32(rng, dtype):
    xn = rng.normal(size=(4, 900)) * 2
    x = torch.tensor(xn).to(dtype)
    xr = x.double().numpy()  # the rounded input is what the map sees
    for p, ref in ((softk.sparsemax(x), oracle.sparsemax(xr)), (softk.entmax15(x), oracle.entmax(xr, 1.5))):
        assert p.dtype == dtype
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=torch.finfo(dtype).eps)


def test_support_path_is_taken_on_wide_rows(rng):
    """Guard that wide rows on the PyTorch path are solved on a few gathered
    candidate columns, and that these hold the whole support."""
    z = torch.tensor(rng.normal(size=(4, 3000)))
    for fam in (SPARSEMAX, ENTMAX15, entmax_family(1.3), SPARSE):
        p = torch_forward(fam, z, 1)
        *_, idx, valid = solve_on_candidates(fam, z, 1)
        assert idx is not None
        assert idx.shape[-1] < 3000 // 2
        # Every non-zero of p is a valid candidate column.
        # (padding slots repeat a column, so count rather than overwrite)
        marked = torch.zeros_like(p, dtype=torch.long).scatter_add_(-1, idx, valid.long()) > 0
        assert bool(((p > 0) == marked).all())


@pytest.mark.parametrize("name,fn,ref", K1_MAPS)
def test_wide_row_gradients_match_oracle_jacobian(rng, name, fn, ref):
    """vjp on wide rows (fast forward paths) against central differences of the oracle."""
    n = 96
    xn = rng.normal(size=n) * 3
    xn[:20] = -np.inf
    g = rng.normal(size=n)
    x = torch.tensor(xn, requires_grad=True)
    fn(x).backward(torch.tensor(g))
    fin = np.isfinite(xn)
    jac = oracle.numerical_jacobian(lambda r: ref(np.where(fin, 0, -np.inf) + np.nan_to_num(r, neginf=0)), np.where(fin, xn, 0.0))
    expect = jac.T @ g
    np.testing.assert_allclose(x.grad.numpy()[fin], expect[fin], rtol=0, atol=1e-6)
    assert (x.grad.numpy()[~fin] == 0).all()


@pytest.mark.slow
def test_soft_topk_exp_gradcheck_wide_row(rng):
    x = torch.tensor(rng.normal(size=(2, 70)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softk.soft_topk(t, 3), (x,))


@pytest.mark.slow
def test_sparse_gradcheck_wide_row(rng):
    x = torch.tensor(rng.normal(size=(2, 130)) * 3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: softk.entmax15(t), (x,))
    assert torch.autograd.gradcheck(lambda t: softk.entmax(t, 1.3), (x,))
