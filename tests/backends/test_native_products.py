"""The CPU kernels of the products over a sparse P's nonzeros
(softk._backends.native.products) against float64 NumPy products: P·X,
A·Bᵀ sampled on P's support, and acc += Pᵀ·X.  Every width of the kernels'
column tiles (whole tiles of 64 floats or 32 doubles, single vectors, the
columns left over), rows not a multiple of the 32-entry mask blocks, empty
rows, a right factor with more rows than P reads, NaN in P, inf at keys of
weight 0, and threads.  Outputs are pre-filled with NaN."""

import numpy as np
import pytest
import torch

import softk
from softk._backends.native import products

from ..attention.test_support import sparse_p

pytestmark = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="needs a C compiler")


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(products, "_empty", lambda shape, dtype: torch.full(shape, float("nan"), dtype=dtype))


def f64(t):
    return t.double().numpy()


def close(got, want, scale, n, dtype):
    # a sum of n products in floating point errs by at most about n·eps
    # times the sum of their sizes (``scale``); twice that covers the order
    # the kernels add in
    bound = 2 * max(n, 1) * float(torch.finfo(dtype).eps) * scale + float(torch.finfo(dtype).tiny)
    err = np.abs(f64(got) - want)
    assert (err <= bound).all(), (err.max(), (err / bound).max())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("S", [1, 31, 32, 33, 100])
@pytest.mark.parametrize("E", [1, 5, 16, 37, 64, 130])
def test_products_equal_the_numpy_sums(dtype, S, E):
    G0, G1, R, Sx = 2, 3, 7, S + 4  # the right factor holds more keys than P reads (a causal chunk's prefix)
    p = sparse_p((G0, G1, R, S), 0.2, dtype=dtype)
    p[0, 1] = 0.0  # a group of empty rows
    p[1, 2, 3] = 0.0
    g = torch.Generator().manual_seed(1)
    x = torch.randn(G0, G1, Sx, E, generator=g, dtype=torch.float64).to(dtype)
    a = torch.randn(G0, G1, R, E, generator=g, dtype=torch.float64).to(dtype)
    pn, xn, an = f64(p), f64(x)[:, :, :S], f64(a)
    xt = xn.transpose(0, 1, 3, 2)

    got = products.mm(p, x)
    assert got.shape == (G0, G1, R, E) and got.dtype == dtype
    close(got, pn @ xn, np.abs(pn) @ np.abs(xn), S, dtype)
    assert torch.equal(got[0, 1], torch.zeros(R, E, dtype=dtype))  # rows with no nonzero: exactly 0

    got = products.sampled(p, a, x)
    assert got.shape == p.shape
    close(got, (an @ xt) * (pn != 0), np.abs(an) @ np.abs(xt), E, dtype)
    assert (got[p == 0] == 0).all()  # 0 off the support, not a product

    acc = torch.randn(G0, G1, Sx, E, generator=g, dtype=torch.float64).to(dtype)
    acc0 = f64(acc).copy()  # f64 of a float64 tensor is a view of it
    products.mm_t_(acc, p, a)
    pt = pn.transpose(0, 1, 3, 2)
    close(acc[:, :, :S], acc0[:, :, :S] + pt @ an, np.abs(acc0[:, :, :S]) + np.abs(pt) @ np.abs(an), R + 1, dtype)
    assert (f64(acc)[:, :, S:] == acc0[:, :, S:]).all()  # keys past S untouched


def test_a_nan_weight_reaches_the_row_and_inf_at_a_zero_weight_does_not():
    p = sparse_p((1, 1, 3, 40), 0.3)
    p[0, 0, 0, 5] = float("nan")
    p[0, 0, 1, 7] = 0.0
    p[0, 0, 1, 8] = 0.5
    x = torch.randn(1, 1, 40, 4, dtype=torch.float64)
    x[0, 0, 7] = float("inf")  # read by no row: every weight on key 7 is 0 (row 0 only if it drew one)
    p[0, 0, :, 7] = 0.0
    out = products.mm(p, x)
    assert torch.isnan(out[0, 0, 0]).all()
    assert torch.isfinite(out[0, 0, 1:]).all()
    np.testing.assert_allclose(f64(out[0, 0, 1:]), np.nan_to_num(f64(p[0, 0, 1:]) @ np.where(
        np.isinf(f64(x[0, 0])), 0.0, f64(x[0, 0]))), rtol=0, atol=1e-12 * 40)  # sums of 40 terms below 4


def test_threads_split_rows_and_groups():
    # large enough for the kernels to take torch's threads (2^15 entries of P and up)
    p = sparse_p((3, 2, 64, 600), 0.05)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 2, 600, 24, generator=g, dtype=torch.float64)
    a = torch.randn(3, 2, 64, 24, generator=g, dtype=torch.float64)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got = products.mm(p, x), products.sampled(p, a, x)
        acc = torch.zeros(3, 2, 600, 24, dtype=torch.float64)
        products.mm_t_(acc, p, a)
    finally:
        torch.set_num_threads(threads)
    pn, xn, an = f64(p), f64(x), f64(a)
    f = torch.float64
    close(got[0], pn @ xn, np.abs(pn) @ np.abs(xn), 600, f)
    close(got[1], (an @ xn.transpose(0, 1, 3, 2)) * (pn != 0), np.abs(an) @ np.abs(xn.transpose(0, 1, 3, 2)), 24, f)
    pt = pn.transpose(0, 1, 3, 2)
    close(acc, pt @ an, np.abs(pt) @ np.abs(an), 64, f)


def test_a_broadcast_right_factor_is_read_per_group():
    p = sparse_p((2, 3, 5, 20), 0.3)
    x = torch.randn(1, 3, 20, 6, dtype=torch.float64)  # one batch for both of p's
    xb = np.broadcast_to(f64(x), (2, 3, 20, 6))
    close(products.mm(p, x), f64(p) @ xb, np.abs(f64(p)) @ np.abs(xb), 20, torch.float64)


def test_serves(monkeypatch):
    p = torch.zeros(2, 3)
    assert products.serves(p, torch.zeros(3, 2))
    with monkeypatch.context() as m:
        m.setattr(softk._backends.registry, "_native_ok", False)  # SOFTK_NATIVE=0, read once a process
        assert not products.serves(p)
    assert not products.serves(p.half())
    assert not products.serves(p, torch.zeros(3, 2, dtype=torch.float64))  # one dtype
