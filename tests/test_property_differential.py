r"""Property-based differential suite: the public maps on every backend against
an exact reference, on rows drawn where the arithmetic is hard.

Maps (public API only): ``softk.softmax``, ``softk.sparsemax``,
``softk.entmax15``, ``softk.entmax(x, alpha=α)`` and ``softk.soft_topk(x, k,
tau=τ, method=m)`` for m in exp, sigmoid, laplace, sparse; under
``softk.use_backend(b)`` for b in torch, native and triton (Triton's CPU
interpreter, tests/conftest.py sets TRITON_INTERPRET=1; rows of at most 6
there).  Rows: 2 to 8 entries in float16, bfloat16, float32 or float64, with an
offset up to 1e6 (what the dtype holds), one dominant entry, entries near the
dtype's largest value, −inf masks (fully masked rows included); τ from 1e-3
to 10, α from 1.00001 to 50, k from 1 to n.

Checks, on each drawn row:

- Σp = min(k, number of finite entries) (k = 1 for the k = 1 maps; a fully
  masked row is all zeros, docs/guides/numerics.md), 0 ≤ p ≤ 1;
- p against the exact map of the rounded input (mpmath at 400 bits on the row
  shifted exactly by its reference entry, tests/oracle/mp.py's root finder;
  it shares no code with softk) within the precision model of
  docs/guides/numerics.md: with s = (x − r)/τ, d = f'(s − λ) and
  W = Σ d_j |s_j| / Σ d_j,
  ``tol_i = 8·eps·[d_i (|s_i| + W + 4k/Σd) + κ_i p_i]`` in the working precision
  (float32 for the half dtypes), κ = 8 for the exp-like and piecewise-linear
  maps and 8·(1 + |log p_i|) for entmax (the dtype's precision, with no factor
  1/(α−1): the map can be formed relative to its anchor), plus the rounding of
  p to a half dtype (half an ulp of p, a whole one in Triton's interpreter, or of its
  smallest subnormal);
- finite gradients (the backward of a random cotangent) on rows of finite
  entries, wherever the exact Jacobian, bounded by max d / τ, fits the dtype.

The seed is fixed (``derandomize=True``): CI sees the same rows on every run.
Each test draws ``SOFTK_PROPERTY_EXAMPLES`` rows (default 25; the file runs in
about a minute on one core).  For a release, run it larger, with fresh rows::

    SOFTK_PROPERTY_EXAMPLES=2000 SOFTK_PROPERTY_RANDOM=1 python -m pytest tests/test_property_differential.py

Known failures sit in tests of their own, marked ``xfail(strict=True)`` with
the reason: a fix makes them pass, and strict xfail then fails until the
mark is removed (with fresh rows, SOFTK_PROPERTY_RANDOM=1, a region can also
pass by missing its failing rows: read an XPASS there as "look", not "fixed").
"""

from __future__ import annotations

import math
import os

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import softk

from .oracle import mp as oracle_mp

EXAMPLES = int(os.environ.get("SOFTK_PROPERTY_EXAMPLES", "25"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("SOFTK_PROPERTY_RANDOM"),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], print_blob=True)

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
METHODS = ("exp", "sigmoid", "laplace", "sparse")
MAPS = ("softmax", "sparsemax", "entmax15", "entmax", *(f"topk-{m}" for m in METHODS))


def _backends():
    out = ["torch"]
    out.append(pytest.param("native", marks=pytest.mark.skipif(
        not softk._backends.registry.native_available(), reason="needs the compiled kernels")))
    try:
        import triton  # noqa: F401
        out.append("triton")
    except ImportError:
        out.append(pytest.param("triton", marks=pytest.mark.skip(reason="triton is not installed")))
    return out


BACKENDS = _backends()
# The interpreter evaluates both sides of every tl.where with NumPy (tests/backends/triton/conftest.py).
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


# ------------------------------------------------------------------ draws
def _round(values, dtype):
    """The values as the dtype holds them, as float64."""
    return torch.tensor(values, dtype=torch.float64).to(dtype).double().numpy()


@st.composite
def cases(draw, backend, dtypes=DTYPES, maps=MAPS, alpha_range=(1.00001, 50.0), finite=False, kinds=None,
          taus=(1e-3, 1e-2, 0.1, 0.5, 1.0, 3.0, 10.0)):
    """(map, dtype, row as the dtype holds it (float64), τ, k, α)."""
    dtype = draw(st.sampled_from(dtypes))
    name = draw(st.sampled_from(maps))
    n = draw(st.integers(2, 6 if backend == "triton" else 8))
    big = float(torch.finfo(dtype).max)
    row = np.array(draw(st.lists(st.floats(-3, 3, width=32), min_size=n, max_size=n)), dtype=np.float64)
    kind = draw(st.sampled_from(kinds or ("plain", "offset", "dominant", "near-max")))
    if kind == "ties":  # integers in [-3, 3]: ties in the support, gaps to the rest
        row = np.round(row)
    elif kind == "offset":
        row += draw(st.sampled_from([1e2, 1e4, 1e6])) * draw(st.sampled_from([1.0, -1.0]))
    elif kind == "dominant":
        row[draw(st.integers(0, n - 1))] = draw(st.sampled_from([20.0, 500.0, 1e4, 1e7]))
    elif kind == "near-max":
        for i in draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True)):
            row[i] = big * draw(st.floats(0.05, 0.9)) * draw(st.sampled_from([1.0, -1.0]))
    row = np.clip(row, -big, big)  # an offset of 1e6 is past float16's range
    if not finite and draw(st.booleans()):
        mask = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        row[np.array(mask)] = -np.inf
    tau = draw(st.sampled_from(taus))
    lo, hi = alpha_range
    alpha = float(1 + math.exp(draw(st.floats(math.log(lo - 1), math.log(hi - 1)))))
    alpha = min(max(alpha, lo), hi)
    k = draw(st.integers(1, n)) if name.startswith("topk") else 1
    return name, dtype, _round(row, dtype), tau, k, alpha


# ------------------------------------------------------------------ reference
def _family(name):
    return name[len("topk-"):] if name.startswith("topk-") else name


def reference(name, row, k, tau, alpha):
    """The exact map of the float row (float64 values), rounded once to float64.

    mpmath at 400 bits on z = (x − r)/τ, r the k-th largest finite entry: the
    shift keeps λ near 0 whatever the row's magnitude (near the float max, λ
    itself would need more than 400 bits)."""
    out = np.zeros_like(row)
    fin = np.isfinite(row)
    if fin.sum() <= k:
        out[fin] = 1.0
        return out
    f, df = oracle_mp._fam(_family(name), alpha if name == "entmax" else None)
    with mp.workprec(oracle_mp.PREC):
        vals = [mp.mpf(float(v)) for v in row[fin]]
        r = sorted(vals, reverse=True)[k - 1]
        out[fin] = oracle_mp.probabilities(f, df, [(v - r) / mp.mpf(tau) for v in vals], k)
    return out


def _slope(name, p, alpha):
    """d = f'(u) at the solution, read off p."""
    fam = _family(name)
    if fam in ("softmax",):
        return p
    if fam == "exp":
        return np.where(p < 1, p, 0.0)
    if fam == "sigmoid":
        return p * (1 - p)
    if fam == "laplace":
        return np.minimum(p, 1 - p)
    if fam == "sparse":
        return ((p > 0) & (p < 1)).astype(float)
    if fam == "sparsemax":
        return (p > 0).astype(float)
    a = 1.5 if fam == "entmax15" else alpha
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(p > 0, np.exp((2 - a) * np.log(np.where(p > 0, p, 1.0))), 0.0)


def tolerance(name, p, row, tau, k, alpha, dtype, backend="torch"):
    """tol_i of the module docstring.  Triton's CPU interpreter rounds float32
    to the half dtypes toward zero (softmax on [0, 2] at τ = 0.1 in bfloat16:
    2.0518e-9, where the float32 result 2.06115e-9 rounds to 2.0664e-9): a
    whole ulp of p there."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    eps = float(torch.finfo(work).eps)
    fin = np.isfinite(row)
    tol = np.zeros_like(p)
    if fin.sum() <= k:
        return tol
    x = row[fin]
    r = np.sort(x)[::-1][k - 1]
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.abs((x - r) / tau)
    d = _slope(name, p[fin], alpha)
    d = np.where(np.isfinite(d), d, 0.0)
    s = np.where(d > 0, s, 0.0)  # d = 0: p is exactly 0 or 1 whatever s is
    sd = d.sum()
    W = (d * s).sum() / sd if sd > 0 else 0.0
    if _family(name) in ("entmax", "entmax15"):
        with np.errstate(divide="ignore"):
            kappa = 8.0 * (1 + np.abs(np.where(p[fin] > 0, np.log(np.where(p[fin] > 0, p[fin], 1.0)), 0.0)))
    else:
        kappa = 8.0
    tol[fin] = 8 * eps * (d * (s + W + (4 * k / sd if sd > 0 else 0.0)) + kappa * p[fin])
    info = torch.finfo(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        ulps = 1.0 if backend == "triton" else 0.5
        tol[fin] += ulps * float(info.eps) * p[fin]
    # p below the dtype's smallest subnormal rounds to 0 (6e-73 is 0 in float32)
    return tol + float(info.smallest_normal) * float(info.eps)


# ------------------------------------------------------------------ the calls
def call(name, x, k, tau, alpha):
    if name == "softmax":
        return softk.softmax(x, tau=tau)
    if name == "sparsemax":
        return softk.sparsemax(x, tau=tau)
    if name == "entmax15":
        return softk.entmax15(x, tau=tau)
    if name == "entmax":
        return softk.entmax(x, alpha=alpha, tau=tau)
    return softk.soft_topk(x, k, tau=tau, method=_family(name))


def check_forward(backend, case):
    name, dtype, row, tau, k, alpha = case
    x = torch.tensor(row, dtype=torch.float64).to(dtype)
    with softk.use_backend(backend):
        p = call(name, x, k, tau, alpha)
    assert p.dtype == dtype and p.shape == x.shape
    got = p.double().numpy()
    m = int(np.isfinite(row).sum())
    want_sum = min(k, m)
    ref = reference(name, row, k, tau, alpha)
    tol = tolerance(name, ref, row, tau, k, alpha, dtype, backend)
    where = f"{name} on {backend}, {dtype}, k={k}, tau={tau}, alpha={alpha}: x={row.tolist()} p={got.tolist()}"
    assert np.isfinite(got).all(), where
    assert abs(got.sum() - want_sum) <= tol.sum() + 8 * len(row) * np.finfo(np.float64).eps * k, \
        f"sum {got.sum()} != {want_sum}; {where}"
    assert (got >= 0).all() and (got <= 1).all(), where
    bad = np.abs(got - ref) > tol
    assert not bad.any(), f"{where}\n  ref={ref.tolist()}\n  err={np.abs(got - ref)[bad].tolist()} tol={tol[bad].tolist()}"


def check_gradient(backend, case, seed=0):
    name, dtype, row, tau, k, alpha = case
    ref = reference(name, row, k, tau, alpha)
    d = _slope(name, ref, alpha)
    bound = (float(np.max(d, initial=0.0)) if np.isfinite(d).all() else math.inf) / tau * len(row) * 4
    if not bound < float(torch.finfo(dtype).max):
        return  # the exact gradient is past the dtype: ±inf is its rounding (docs/guides/numerics.md)
    x = torch.tensor(row, dtype=torch.float64).to(dtype).requires_grad_()
    g = torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, size=len(row))).to(dtype)
    with softk.use_backend(backend):
        p = call(name, x, k, tau, alpha)
        (dx,) = torch.autograd.grad(p, x, g)
    assert torch.isfinite(dx).all(), f"{name} on {backend}, {dtype}, k={k}, tau={tau}, alpha={alpha}: x={row.tolist()} dx={dx.tolist()}"


# ------------------------------------------------------------------ the tests
# The regions this suite found failing are also drawn apart, denser (tests at
# the end): entmax with α in (1, 1.01) on rows whose entries lie far apart in
# units of τ, and the top-k maps on rows near the float max.
NEAR_ONE = 1.01
TOPK = tuple(m for m in MAPS if m.startswith("topk"))
K1 = tuple(m for m in MAPS if not m.startswith("topk"))


def _sound(backend, **kw):
    """Every region: each map with α from 1.00001 and rows near the float max."""
    kinds = ("plain", "offset", "dominant", "near-max")
    return st.one_of(
        cases(backend, maps=K1, alpha_range=(1.00001, 50.0), kinds=kinds, **kw),
        cases(backend, maps=TOPK, kinds=kinds, **kw),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@PROPERTY
@given(data=st.data())
def test_maps_match_the_exact_map(backend, data):
    check_forward(backend, data.draw(_sound(backend)))


@pytest.mark.parametrize("backend", BACKENDS)
@PROPERTY
@given(data=st.data())
def test_gradients_are_finite_on_finite_rows(backend, data):
    check_gradient(backend, data.draw(_sound(backend, finite=True)))


# ------------------------------------------------------------------ the regions once failing
# Entmax near α = 1 failed on the torch path, in half precision and on Triton
# (an entry far below the rest: sums from 0.9998 to 201), and the top-k maps
# on rows near the float max (NaN on torch and native, [1, 1, 1] on Triton);
# both are fixed, and these tests keep drawing them densely.  A region found
# failing is marked xfail(strict=True) until fixed: a fix makes the test pass,
# which fails the run until the mark goes.  No shrinking: the first failing
# row is enough.
FAILING = settings(PROPERTY, phases=[Phase.explicit, Phase.reuse, Phase.generate])


def _near_one(backend, dtypes, failing=True):
    # where it fails: entries far apart in units of τ (an entry out of the support)
    if not failing:
        return cases(backend, dtypes=dtypes, maps=("entmax",), alpha_range=(1.00001, NEAR_ONE))
    return cases(backend, dtypes=dtypes, maps=("entmax",), alpha_range=(1.00001, NEAR_ONE),
                 kinds=("ties", "dominant"), taus=(1e-3, 1e-2))


@FAILING
@given(data=st.data())
def test_entmax_near_alpha_one_native_float32_float64(data):
    """The compiled kernels form entmax relative to its anchor in float32/float64."""
    if not softk._backends.registry.native_available():
        pytest.skip("needs the compiled kernels")
    check_forward("native", data.draw(_near_one("native", (torch.float32, torch.float64), failing=False)))


@FAILING
@given(data=st.data())
def test_entmax_near_alpha_one_torch(data):
    check_forward("torch", data.draw(_near_one("torch", DTYPES)))


def test_entmax_near_alpha_one_half_native():
    """It fails at scattered α only (about 6 % of a grid on [-500, 0, 0, 0]), too
    sparse for a few random draws to hit: a grid of α, every one checked."""
    if not softk._backends.registry.native_available():
        pytest.skip("needs the compiled kernels")
    failed = []
    for alpha in np.linspace(1.00001, 1.001, 100):
        for dtype in (torch.float16, torch.bfloat16):
            try:
                check_forward("native", ("entmax", dtype, np.array([-500.0, 0.0, 0.0, 0.0]), 1.0, 1, float(alpha)))
            except AssertionError as err:
                failed.append(str(err).splitlines()[0])
    assert not failed, f"{len(failed)} of 200 fail, e.g. {failed[0]}"


@FAILING
@given(data=st.data())
def test_entmax_near_alpha_one_triton(data):
    if "triton" not in BACKENDS:
        pytest.skip("triton is not installed")
    check_forward("triton", data.draw(_near_one("triton", (torch.float32, torch.float16, torch.bfloat16))))


@pytest.mark.parametrize("backend", BACKENDS)
@FAILING
@given(data=st.data())
def test_topk_near_the_float_max(backend, data):
    check_forward(backend, data.draw(cases(backend, dtypes=(torch.float32, torch.bfloat16), maps=TOPK,
                                           kinds=("near-max",))))
