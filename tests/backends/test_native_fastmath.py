"""The float kernels' inline log2, exp2 and w^q (kernels.c: fast_log2f,
fast_exp2f, fast_powf, which α-entmax's float rows use in place of libm's
exp and log) against NumPy in float64, in ulps of the float32 result, over
the ranges the solver feeds them."""

import numpy as np
import pytest

import softk
from softk._backends.native import build

pytestmark = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="needs a C compiler")


def _run(which, x, q=1.0):
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    build.library().softk_fastmath_f32(which, x.ctypes.data, y.ctypes.data, x.size, q)
    return y


def _ulps(got, want):
    """|got − want| in ulps of want rounded to float32 (the float32 spacing at want)."""
    want32 = want.astype(np.float32)
    spacing = np.spacing(np.abs(want32)).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def _floats(lo, hi, n, rng):
    """Log-uniform floats in [lo, hi], every binade's edges and powers of two included."""
    x = np.exp(rng.uniform(np.log(lo), np.log(hi), n))
    edges = 2.0 ** np.arange(np.ceil(np.log2(lo)), np.floor(np.log2(hi)) + 1)
    x = np.concatenate([x, edges, np.nextafter(edges.astype(np.float32), np.float32(0)), [np.sqrt(0.5), np.sqrt(2)]])
    return x[(x >= lo) & (x <= hi)].astype(np.float32)


def test_log2_within_2_ulps(rng):
    x = _floats(np.finfo(np.float32).tiny, 3e38, 200_000, rng)
    x = np.concatenate([x, np.float32(1) + np.arange(-300, 300, dtype=np.float32) * np.float32(2**-23)])
    want = np.log2(x.astype(np.float64))
    got = _run(0, x)
    assert got[x == 1].tolist() == [0.0] * int((x == 1).sum())  # log2 1 = 0 exactly
    nz = want != 0
    assert _ulps(got[nz], want[nz]).max() <= 2


def test_exp2_within_2_ulps(rng):
    y = np.concatenate([rng.uniform(-126, 127.4, 200_000), rng.uniform(-1, 1, 50_000),
                        np.arange(-126, 128), np.arange(-126, 127) + 0.25]).astype(np.float32)
    want = np.exp2(y.astype(np.float64))
    assert _ulps(_run(1, y), want).max() <= 2


def test_exp2_flushes_below_and_overflows_above():
    """Below 2^-126 the result is 0 (no subnormals), from 2^127.5 up inf."""
    y = np.array([-127.0, -150.0, -1e6, 128.0, 200.0, 1e6], dtype=np.float32)
    got = _run(1, y)
    assert (got[:3] == 0).all()
    assert np.isposinf(got[3:]).all()


@pytest.mark.parametrize("q", [1.0, 1.0 / 0.9, 2.0, 1.0 / 0.3, 5.0, 8.0])
def test_pow_within_a_few_ulps_of_the_p_that_matter(rng, q):
    """w^q carries the rounding of q·log2 w, half an ulp of itself, which is
    ln 2 times that relative in w^q (as libm's e^{q log w} did): within 4 ulps
    where 2^-4 ≤ w^q ≤ 2 (the p of a budget k = 1), within 2 + 1.5 |log2 w^q|
    ulps down to 1e-30, and nothing above 2^-126 below it."""
    w = _floats(np.finfo(np.float32).tiny, 64.0, 200_000, rng)
    q32 = float(np.float32(q))  # the kernel's q is a float
    want = np.exp(q32 * np.log(w.astype(np.float64)))
    got = _run(2, w, q)
    big = (want >= 2.0**-4) & (want <= 2.0)
    assert _ulps(got[big], want[big]).max() <= 4
    mid = (want >= 1e-30) & (want <= 3e38)
    assert (_ulps(got[mid], want[mid]) <= 2 + 1.5 * np.abs(np.log2(want[mid]))).all()
    tiny = want < 2.0**-126
    assert (got[tiny] <= 2.0**-126).all()


def _rough_rel(q):
    """kernels.c's ROUGH_REL: the bound the α row solve pulls its rough round's step back by."""
    return 2e-6 * abs(q) + 1e-5


@pytest.mark.parametrize("q", [0.0, 0.5, 1.0, 1.0 / 0.3 - 2, 2.0, 3.0, 4.0, 5.0, 6.0])
def test_rough_pow_within_its_stated_bound(rng, q):
    """rough_powf (the exponent q − 2 of the α row solve's first round, 2 ≤ q
    ≤ 8) is within ROUGH_REL(q) relative of w^q wherever the result is
    normal, and that bound is less than twice the largest error measured at
    q = 3, so it is not loose enough to hide a worse fit."""
    w = _floats(np.finfo(np.float32).tiny, 1e4, 200_000, rng)
    q32 = float(np.float32(q))
    want = np.exp(q32 * np.log(w.astype(np.float64)))
    got = _run(3, w, q).astype(np.float64)
    normal = (want >= 2.0**-120) & (want <= 2.0**120)
    rel = np.abs(got[normal] / want[normal] - 1)
    assert rel.max() <= _rough_rel(q)
    if q == 3.0:
        assert rel.max() > _rough_rel(q) / 2
