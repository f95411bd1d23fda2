r"""Every map, far from the origin, against the exact answer for the float input.

Cases (float32 and float64 rows of 12, plus k where it applies): offsets c up
to 1e6 (x = randn + c), τ down to 1e-8, one dominant entry up to 1e7 (1e16 in
float64) and scales near what the dtype holds (randn·1e30 in float32,
·1e300 in float64).  Maps: every soft_topk method with an exact reference
(exp, sigmoid, laplace, sparse, grad), softmax, sparsemax, entmax15, entmax at
α ∈ {1.0001, 1.3, 1.5, 2, 2.5, 5, 10, 50}, topk_sum; on "torch" and, where a
compiled kernel exists, "native".  References: tests/oracle_mp.py (mpmath at
400 bits on the rounded input) and oracle_topk.gradtopk_row_mp.

Tolerance (why these numbers).  A correct implementation computes the shifted
scores s_j = (x_j − r)/τ, r an entry of the row, each with a relative rounding
of at most ~2·eps (one subtraction, one division), then λ, then p.  To first
order, with d = f'(u) at the exact solution (u = s − λ),
Δp_i = d_i (Δs_i − Δλ) and Δλ = Σ_j d_j Δs_j / Σ_j d_j, so

    |Δp_i| ≤ 2·eps·d_i·(|s_i| + W),   W = Σ_j d_j |s_j| / Σ_j d_j,

measured from the reference entry r (the k-th largest for the top-k maps, the
max for the k = 1 maps: λ is within O(log n) of it).  On top: λ's own
stopping rule (|Σp − k| ≤ 4·eps·k: |Δp_i| ≤ 4·eps·k·d_i/Σd) and the rounding
of f itself, κ_i·eps·p_i with κ = 8 for exp-like f and κ = 8·(β + |log p_i|)
for entmax (p = e^{β·log w}, β = 1/(α−1)).  The test allows 8× this bound:

    tol_i = 8·eps·[d_i (|s_i| + W + 4k/Σd) + κ_i p_i] + 2^-1074

(plus GradTopK's documented absolute floor 2nk·e^-130, see
softk._ops.gradtopk._clamp_margin).

A wrong λ by one ulp of the offset (what the unshifted path did) is d_i·ulp(c)
≫ tol_i, so every failure listed in the precision targets fails here.  |Σp − k| is also
checked against 8·n·eps·k.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import softk

from ..oracle import mp as oracle_mp
from ..oracle.topk import gradtopk_row_mp

N = 12
ENTMAX_ALPHAS = (1.0001, 1.3, 1.5, 2.0, 2.5, 5.0, 10.0, 50.0)




# ------------------------------------------------------------------ cases
def _case_rows():
    rng = np.random.default_rng(12)
    cases = []
    for dt, name in ((np.float32, "f32"), (np.float64, "f64")):
        base = rng.normal(size=N)
        for c in (0.0, 1e3, 1e6):
            cases.append((f"{name}-offset{c:g}", dt, (base + c).astype(dt), 1.0))
        for tau in (1e-4, 1e-8):
            # spread ~ τ so the map is not one-hot: x = 0.3 + τ·randn, rounded
            cases.append((f"{name}-tau{tau:g}", dt, (0.3 + tau * base).astype(dt), tau))
        for v in (1e4, 1e7) if dt is np.float32 else (1e4, 1e16):
            row = base.copy()
            row[3] = v
            cases.append((f"{name}-outlier{v:g}", dt, row.astype(dt), 1.0))
        big = 1e30 if dt is np.float32 else 1e300
        cases.append((f"{name}-scale{big:g}", dt, (base * big).astype(dt), big))
    return cases


CASES = _case_rows()


# ------------------------------------------------------------------ maps
def _d_exp(p, u):
    return np.where(p < 1, p, 0.0)


def _d_sig(p, u):
    return p * (1 - p)


def _d_lap(p, u):
    return np.minimum(p, 1 - p)


def _d_clip(p, u):
    return ((p > 0) & (p < 1)).astype(float)


def _d_relu(p, u):
    return (p > 0).astype(float)


def _d_entmax(alpha):
    def d(p, u):
        with np.errstate(divide="ignore", over="ignore"):
            return np.where(p > 0, np.exp((2 - alpha) * np.log(np.where(p > 0, p, 1.0))), 0.0)

    return d


def _topk_call(method):
    return lambda x, k, tau: softk.soft_topk(x, k, tau=tau, method=method)


# (id, call, oracle name or "grad", d, capped, native backend, k values, alpha)
MAPS = [(f"topk-{m}", _topk_call(m), m, d, True, m == "exp", (1, 3), None)
        for m, d in (("exp", _d_exp), ("sigmoid", _d_sig), ("laplace", _d_lap), ("sparse", _d_clip))]
MAPS += [
    ("topk-grad", _topk_call("grad"), "grad", _d_sig, True, False, (1, 3), None),
    ("softmax", lambda x, k, tau: softk.softmax(x, tau=tau), "softmax", lambda p, u: p, False, True, (1,), None),
    ("sparsemax", lambda x, k, tau: softk.sparsemax(x, tau=tau), "sparsemax", _d_relu, False, True, (1,), None),
    ("entmax15", lambda x, k, tau: softk.entmax15(x, tau=tau), "entmax15", _d_entmax(1.5), False, True, (1,), 1.5),
]
MAPS += [
    (f"entmax{a:g}", (lambda a: lambda x, k, tau: softk.entmax(x, alpha=a, tau=tau))(a), "entmax",
     _d_entmax(a), False, 1 < a <= 2, (1,), a)
    for a in ENTMAX_ALPHAS
]


@functools.lru_cache(maxsize=None)
def _reference(map_id, case_id, k):
    (_, _, oname, _, _, _, _, alpha) = next(m for m in MAPS if m[0] == map_id)
    (_, dt, row, tau) = next(c for c in CASES if c[0] == case_id)
    row = row.astype(np.float64)
    if oname == "grad":
        return np.array([float(v) for v in gradtopk_row_mp(row, k, tau=tau, dps=120)[0]], dtype=np.float64)
    return oracle_mp.threshold_row(oname, row, k, tau=tau, alpha=alpha)


def _tolerance(p, row, tau, k, dfun, capped, alpha, eps, floor=5e-324):
    """tol_i of the module docstring (float64 arithmetic on the exact p)."""
    order = np.sort(row)[::-1]
    r = order[k - 1] if capped else order[0]
    s = np.abs((row - r) / tau)
    s = np.where(np.isfinite(s), s, 0.0)
    d = dfun(p, None)
    d = np.where(np.isfinite(d), d, 0.0)
    sd = d.sum()
    W = (d * s).sum() / sd if sd > 0 else 0.0
    if alpha is None:
        kappa = 8.0
    else:
        with np.errstate(divide="ignore"):
            kappa = 8.0 * (1 / (alpha - 1) + np.abs(np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)))
    tol = 8 * eps * (d * (s + W + (4 * k / sd if sd > 0 else 0.0)) + kappa * p)
    return tol + floor


PARAMS = [
    pytest.param(m[0], c[0], k, b, id=f"{m[0]}-{c[0]}-k{k}-{b}")
    for m in MAPS
    for c in CASES
    for k in m[6]
    for b in (("torch", "native") if m[5] else ("torch",))
]


@pytest.mark.parametrize("map_id, case_id, k, backend", PARAMS)
@pytest.mark.slow
def test_map_is_exact_for_the_rounded_input(map_id, case_id, k, backend):
    (_, call, _, dfun, capped, _, _, alpha) = next(m for m in MAPS if m[0] == map_id)
    (_, dt, row, tau) = next(c for c in CASES if c[0] == case_id)
    x = torch.from_numpy(row.copy())
    with softk.use_backend(backend):
        p = call(x, k, tau).double().numpy()
    ref = _reference(map_id, case_id, k)
    eps = float(np.finfo(dt).eps)
    # grad: entries e^130 above the (k+1)-th are lowered to it (softk._ops.gradtopk._clamp_margin),
    # an absolute error of at most 2nk·e^-130 by design
    # and its tables hold log-weights up to k·(130 + log 2nk): their rounding is eps·k·140 in log p
    floor = 2 * N * k * math.exp(-130) if map_id == "topk-grad" else 5e-324
    tol = _tolerance(ref, row.astype(np.float64), tau, k, dfun, capped, alpha, eps, floor)
    if map_id == "topk-grad":
        tol = tol + 8 * eps * k * 140 * ref
    bad = np.abs(p - ref) > tol
    assert not bad.any(), f"p={p[bad]} ref={ref[bad]} tol={tol[bad]}"
    table = 140 * k if map_id == "topk-grad" else 1  # GradTopK's table rounding, as above
    assert abs(p.sum() - k) <= 8 * N * eps * k * table


# ------------------------------------------------------------------ topk_sum
SUM_METHODS = ("exp", "sigmoid", "laplace", "sparse")


@pytest.mark.parametrize("method", SUM_METHODS)
@pytest.mark.parametrize("case_id", [c[0] for c in CASES if "scale" not in c[0]])
@pytest.mark.slow
def test_topk_sum_is_exact_for_the_rounded_input(method, case_id):
    (_, dt, row, tau) = next(c for c in CASES if c[0] == case_id)
    k = 3
    x = torch.from_numpy(row.copy())
    with softk.use_backend("torch"):
        got = float(softk.topk_sum(x, k, tau=tau, method=method))
    want = oracle_mp.topk_sum_row(method, row.astype(np.float64), k, tau=tau)
    eps = float(np.finfo(dt).eps)
    # the value is Σ of the top k plus τ·O(k log n): its rounding is eps·Σ|top k|
    scale = np.sort(np.abs(row.astype(np.float64)))[::-1][: k + 1].sum() + tau * k * math.log(N)
    assert abs(got - want) <= 64 * eps * scale


# ------------------------------------------------------------------ hypothesis
@st.composite
def far_rows(draw):
    """Rows far from the origin: an offset up to 1e6, τ down to 1e-8 (with the
    row's spread ~τ so the map is not one-hot), or one entry up to 1e7."""
    n = draw(st.integers(3, 8))
    base = draw(st.lists(st.floats(-3, 3, allow_nan=False, width=32), min_size=n, max_size=n))
    kind = draw(st.sampled_from(["offset", "tau", "outlier"]))
    if kind == "offset":
        c = draw(st.sampled_from([1e2, 1e4, 1e6]))
        return np.array(base) + c, 1.0
    if kind == "tau":
        tau = draw(st.sampled_from([1e-3, 1e-6, 1e-8]))
        return 0.25 + tau * np.array(base), tau
    v = draw(st.sampled_from([1e3, 1e5, 1e7]))
    row = np.array(base)
    row[draw(st.integers(0, n - 1))] = v
    return row, 1.0


@given(far_rows(), st.sampled_from(["exp", "sigmoid", "sparse"]), st.integers(1, 2))
def test_hypothesis_soft_topk_solver_far_from_origin(row_tau, method, k):
    """The solver's own contract (softk.threshold.solve.solve_probs on z = x/τ
    formed exactly in float64 and rounded once to float32) at the same ranges."""
    from softk.threshold import THRESHOLD_METHODS
    from softk.threshold.solve import solve_probs

    row, tau = row_tau
    z32 = (row.astype(np.float32).astype(np.float64) / tau).astype(np.float32)
    z = torch.from_numpy(z32)
    act = torch.ones(1, dtype=torch.bool)
    p, _ = solve_probs(THRESHOLD_METHODS[method], z, k, act)
    ref = oracle_mp.threshold_row(method, z32.astype(np.float64), k)
    d = {"exp": _d_exp, "sigmoid": _d_sig, "sparse": _d_clip}[method]
    tol = _tolerance(ref, z32.astype(np.float64), 1.0, k, d, True, None, float(np.finfo(np.float32).eps))
    assert np.all(np.abs(p.double().numpy() - ref) <= tol)


@given(far_rows(), st.sampled_from(["exp", "sigmoid", "laplace", "sparse", "sparsemax", "entmax15"]), st.integers(1, 2))
def test_hypothesis_public_maps_far_from_origin(row_tau, method, k):
    """The public maps on both CPU backends at the same ranges (float32 input,
    exact reference of the rounded input)."""
    row, tau = row_tau
    x32 = row.astype(np.float32)
    k = 1 if method in ("sparsemax", "entmax15") else k
    d = {"exp": _d_exp, "sigmoid": _d_sig, "laplace": _d_lap, "sparse": _d_clip, "sparsemax": _d_relu,
         "entmax15": _d_entmax(1.5)}[method]
    ref = oracle_mp.threshold_row(method, x32.astype(np.float64), k, tau=tau)
    tol = _tolerance(ref, x32.astype(np.float64), tau, k, d, k > 1 or method in SUM_METHODS,
                     1.5 if method == "entmax15" else None, float(np.finfo(np.float32).eps))
    x = torch.from_numpy(x32)
    for backend in ("torch", "native"):
        with softk.use_backend(backend):
            if method in ("sparsemax", "entmax15"):
                p = getattr(softk, method)(x, tau=tau)
            else:
                p = softk.soft_topk(x, k, tau=tau, method=method)
        assert bool(np.all(np.abs(p.double().numpy() - ref) <= tol)), (backend, p, ref)


# ------------------------------------------------------------------ losses
LOSS_FAMILIES = [("exp", 3), ("sigmoid", 3), ("laplace", 3), ("sparse", 3), ("softmax", 1), ("sparsemax", 1), ("entmax15", 1)]


@pytest.mark.parametrize("name, k", LOSS_FAMILIES)
@pytest.mark.parametrize("case_id", [c[0] for c in CASES if "scale" not in c[0]])
@pytest.mark.slow
def test_fenchel_young_loss_is_exact_for_the_rounded_input(name, k, case_id):
    """L = Φ(z) + Ω(y) − <z, y> is shift invariant (Σp = Σy = k): computed
    on rows shifted by an entry r, its rounding is that of the shifted terms,
    eps·(1 + Σ_j |s_j| (p_j + y_j) + k log n) in z = x/τ units (16× allowed)."""
    from softk import families

    (_, dt, row, tau) = next(c for c in CASES if c[0] == case_id)
    y = np.zeros(N)
    y[[2, 5, 9][:k]] = 1.0  # entries of the base row, not the outlier (index 3)
    x = torch.from_numpy(row.copy())
    fam = getattr(families, name.upper())
    with softk.use_backend("torch"):
        got = float(softk.losses.fenchel_young_loss(x, torch.from_numpy(y.astype(dt)), fam, k=k, tau=tau, reduction="sum"))
    r64 = row.astype(np.float64)
    want = oracle_mp.fy_row(name, r64, y, k, tau=tau)
    p = oracle_mp.threshold_row(name, r64, k, tau=tau)
    ref_entry = np.sort(r64)[::-1][k - 1]
    s = np.abs((r64 - ref_entry) / tau)
    eps = float(np.finfo(dt).eps)
    assert abs(got - want) <= 16 * eps * (1 + (s * (p + y)).sum() + k * math.log(N)), (got, want)
