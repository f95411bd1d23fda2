"""The lean forwards (sparsemax, entmax15, α-entmax for 1.125 ≤ α ≤ 2; the
smooth top-k maps exp, sigmoid and laplace; rows held in registers) through
the CPU interpreter, against the NumPy float64 oracle: every width from 1 to
8192 (with and without the candidate buffer), k above 1 and next to the
finite count, ties, −inf masks, fully masked and broken rows, offsets to
1e6, τ from 1e-8 to 10, entries near the float range and far apart (the
top-k rows the lean search hands to the general one), half dtypes, rows
whose candidates overflow the buffer next to rows whose do not, and which
calls take them."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import pytest
import torch

from softk._backends.triton import function as tf
from softk._backends.triton.function import FAMILY_IDS, forward_rows, lean_forward_rows, takes_lean

from . import gpu_build
from ...oracle import maps as oracle

EPS32 = float(np.finfo(np.float32).eps)
# (family, α, k): the maps the lean forward serves
MAPS = [("sparsemax", 2.0, 1), ("sparsemax", 2.0, 2.5), ("entmax15", 1.5, 1), ("entmax", 1.125, 1),
        ("entmax", 1.3, 1), ("entmax", 1.7, 1), ("entmax", 2.0, 1)]
IDS = [f"{f}-a{a}-k{k}" for f, a, k in MAPS]


TOPK = [("exp", 1.5, 1), ("exp", 1.5, 2), ("sigmoid", 1.5, 2), ("laplace", 1.5, 2), ("sigmoid", 1.5, 1.5),
        ("laplace", 1.5, 3.5)]
TOPK_IDS = [f"{f}-k{k}" for f, _, k in TOPK]


def _oracle(fam, alpha, k, x, tau):
    # the maps are shift-invariant: the bisection gets each row less its
    # finite max (exact in float64 for float32 entries), whose bracket ends
    # max ± 1 would round away at 1e38
    if fam in oracle.F_BY_METHOD:
        f = oracle.F_BY_METHOD[fam]
    else:
        f = oracle._f_relu if fam == "sparsemax" else oracle._f_entmax(alpha)
    fin = np.where(np.isfinite(x), x, -np.inf)
    top = np.max(fin, axis=-1, keepdims=True)
    shifted = x - np.where(np.isfinite(top), top, 0.0)
    return oracle._apply(lambda r: oracle._row_map(f, r / tau, k), shifted, -1)


def _f32(a):
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def _check(p, ref, k, alpha, fam="sparsemax"):
    # the error of f(z − λ) in float32 on a frame z of the support's spread
    # (at most k·f⁻¹ of the max; for the top-k maps λ within 8 of the frame's
    # reference): a few ulps of that spread
    got = p.double().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    spread = 8.0 if fam in oracle.F_BY_METHOD else max(1.0, k) / (alpha - 1.0)
    np.testing.assert_allclose(got, ref, rtol=4e-6, atol=4 * EPS32 * spread, equal_nan=True)


def _rows(rng, n):
    r = [rng.normal(size=n) * s for s in (0.1, 1.0, 10.0)]
    masked = rng.normal(size=n) * 2
    masked[rng.random(n) < 0.6] = -np.inf
    r.append(masked)
    r.append(np.repeat(rng.normal(size=-(-n // 8)), 8)[:n])  # ties
    r.append(np.r_[100.0, np.zeros(n - 1)])  # one dominant entry
    few = np.full(n, -np.inf)
    few[[0, n // 2, n - 1]] = [0.5, -1.0, 2.0]
    r.append(few)
    r.append(np.full(n, -np.inf))  # fully masked
    nan = rng.normal(size=n)
    nan[n // 3] = np.nan
    r.append(nan)
    inf = rng.normal(size=n)
    inf[n - 1] = np.inf
    r.append(inf)
    r.append(rng.uniform(size=n))  # every entry within 1 of the max: the buffer overflows
    return _f32(np.stack(r))


def _run(x, fam, alpha, k, tau, **kw):
    xt = torch.tensor(x, dtype=torch.float32)
    out = torch.full_like(xt, float("nan"))  # every entry must be written
    p, its = lean_forward_rows(xt, FAMILY_IDS[fam], k, tau, alpha, return_passes=True, out=out, **kw)
    return p, its


@pytest.mark.parametrize("n", [1, 5, 16, 64, 300, 1024])
@pytest.mark.parametrize("fam, alpha, k", MAPS, ids=IDS)
def test_matches_oracle(rng, fam, alpha, k, n):
    x = _rows(rng, n)
    for tau in (0.7,):
        p, its = _run(x, fam, alpha, k, tau)
        _check(p, _oracle(fam, alpha, k, x, tau), k, alpha)
        assert its.max() <= 12, its


@pytest.mark.parametrize("n", [3, 16, 64, 300, 1024])
@pytest.mark.parametrize("fam, alpha, k", TOPK, ids=TOPK_IDS)
def test_topk_matches_oracle(rng, fam, alpha, k, n):
    x = _rows(rng, n)
    near = rng.normal(size=n)
    near[: max(0, n - int(k) - 1)] = -np.inf  # k next to the finite count
    far = rng.normal(size=n) * 1e4  # entries far apart: λ beyond the lean frame
    outlier = rng.normal(size=n)
    outlier[0] = 1e6  # one entry far above the top k
    x = _f32(np.vstack([x, near, far, outlier]))
    for tau in (0.7, 1e-3):
        p, its = _run(x, fam, alpha, k, tau)
        _check(p, _oracle(fam, alpha, k, x, tau), k, alpha, fam)
    # the far rows are the general search's: the same bits as the general kernel's
    general = forward_rows(torch.tensor(x[-2:], dtype=torch.float32), FAMILY_IDS[fam], k, 1e-3, alpha, onchip=True)
    assert torch.equal(p[-2:].view(torch.int32), general.view(torch.int32))


@pytest.mark.parametrize("fam, alpha, k", MAPS, ids=IDS)
def test_wide_rows_match_oracle(rng, fam, alpha, k):
    # rows wider than the registers' limit: two reads, the candidates in a
    # buffer; the rows it cannot serve (overflow, NaN, +inf, ≤ k finite
    # entries, a fully masked row) through the general search
    n = tf.LEAN_MAX + 1000
    x = _rows(rng, n)[[1, 3, 7, 8, 9, 10]]
    huge = np.full(n, -np.inf)
    huge[[5, n - 1]] = [3.0e38, -2.0e38]  # ≤ k finite entries whose z would overflow
    x = np.vstack([x, huge[None, :]])
    p, its = _run(x, fam, alpha, k, 0.5)
    _check(p, _oracle(fam, alpha, k, x, 0.5), k, alpha)
    assert its.max() <= 12, its


@pytest.mark.parametrize("fam, alpha, k", MAPS, ids=IDS)
def test_wide_rows_swept_without_the_buffer_match_oracle(rng, fam, alpha, k, monkeypatch):
    # the wide kernel's sweeps for every map (sparsemax's and entmax15's
    # search; α-entmax takes the buffer unless told): from the lane maxima's
    # bound, a read of the row each step and one to write p (or the row
    # conventions: NaN, +inf, ≤ k finite entries, fully masked)
    monkeypatch.setattr(tf, "_lean_wide_compacts", lambda fam: False)
    n = tf.LEAN_MAX + 1000
    x = _rows(rng, n)[[0, 1, 3, 4, 5, 6, 7, 8, 9, 10]]
    huge = np.full(n, -np.inf)
    huge[[5, n - 1]] = [3.0e38, -2.0e38]
    x = np.vstack([x, huge[None, :], _f32(1e6 + rng.normal(size=n))[None, :]])
    for tau in (0.5, 1e-3):
        p, its = _run(x, fam, alpha, k, tau)
        _check(p, _oracle(fam, alpha, k, x, tau), k, alpha)
        assert its.max() <= 12, its


@pytest.mark.parametrize("n", [3000, 8192, tf.LEAN_MAX + 1808])
def test_sparsemax_sum_is_k_on_a_wide_support(n):
    # a support of nearly the whole row, λ far below the max: in the frame of
    # the max, λ's rounding (half an ulp of 1.9) reached every entry of the
    # support (f' = 1), and Σp − k was −4e-4 at 8192 entries; searched in the
    # frame of the groups' (lanes') bound it is a few ulps of k
    fam, alpha, k = "sparsemax", 2.0, 2
    x = np.full((2, n), -1.9 + 0.1 / (n - 1))
    x[0, 7] = 0.0
    x[1] = 0.0
    x[1, 11] = 0.5
    x = _f32(x)
    p, _ = _run(x, fam, alpha, k, 1.0)
    ref = _oracle(fam, alpha, k, x, 1.0)
    _check(p, ref, k, alpha)
    np.testing.assert_allclose(p.double().sum(-1).numpy(), [k, k], rtol=0, atol=16 * EPS32 * k)
    small = ref[0] < 1e-3  # the support's small entries, to a few ulps each
    np.testing.assert_allclose(p.double().numpy()[0][small], ref[0][small], rtol=64 * EPS32)


@pytest.mark.parametrize("n", [64, 128, 1024])
@pytest.mark.parametrize("scale", [1e-2, 1e-3])
def test_entmax15_sum_is_k_on_near_equal_rows(n, scale):
    # every entry in the support, λ far above the search's first point (−2√k
    # in the max's frame on narrow rows): the closed form's discriminant
    # w1² − cnt·r cancels there (u near 2 on every entry), and the step it
    # gave was taken as exact; Σp − k reached 2e-5 at 128 entries and 1.8e-4
    # in the fused loss at 1024.  Its rounding through Σp is about
    # (Σu/2)·4 ulps of λ, under 1e-6 here
    rng = np.random.default_rng(n)
    for k in (1, 2):
        x = _f32(rng.normal(size=(4, n)) * scale)
        p, _ = _run(x, "entmax15", 1.5, k, 1.0)
        _check(p, _oracle("entmax15", 1.5, k, x, 1.0), k, 1.5, "entmax15")
        np.testing.assert_allclose(p.double().sum(-1).numpy(), np.full(4, k), rtol=0, atol=16 * EPS32 * k)


@pytest.mark.parametrize("n, k", [(1000, 1e-3), (4096, 1)])
@pytest.mark.parametrize("alpha", [1.7, 2.0])
def test_alpha_newton_stops_on_equal_rows(n, k, alpha):
    # p = k/n on a row of equal entries, λ = −(k/n)^(α−1)/(α−1) close to 0:
    # Newton's steps fell to the sums' rounding but stayed above 4 ulps of
    # so small a λ, and the search ran all MAXIT = 60 sweeps
    x = np.zeros((2, n))
    x[1, ::2] = -np.inf  # half of them masked
    p, its = _run(x, "entmax", alpha, k, 1.0)
    _check(p, _oracle("entmax", alpha, k, x, 1.0), k, alpha)
    assert its.max() <= 4, its


@pytest.mark.slow
@pytest.mark.parametrize("fam, alpha, k", MAPS, ids=IDS)
def test_wide_rows_match_oracle_at_20000(rng, fam, alpha, k):
    x = _rows(rng, 20000)
    p, _ = _run(x, fam, alpha, k, 0.7)
    _check(p, _oracle(fam, alpha, k, x, 0.7), k, alpha)


@pytest.mark.slow
@pytest.mark.parametrize("fam, alpha, k", TOPK, ids=TOPK_IDS)
def test_topk_matches_oracle_at_8192(rng, fam, alpha, k):
    x = _rows(rng, 8192)[[1, 2, 3, 4, 6, 8, 10]]
    p, _ = _run(x, fam, alpha, k, 1.0)
    _check(p, _oracle(fam, alpha, k, x, 1.0), k, alpha, fam)


@pytest.mark.slow
@pytest.mark.parametrize("fam, alpha, k", MAPS, ids=IDS)
def test_matches_oracle_at_8192(rng, fam, alpha, k):
    x = _rows(rng, 8192)[[1, 2, 3, 4, 6, 8, 10]]
    p, _ = _run(x, fam, alpha, k, 1.0)
    _check(p, _oracle(fam, alpha, k, x, 1.0), k, alpha)


@pytest.mark.parametrize("fam, alpha, k", MAPS, ids=IDS)
def test_offsets_and_temperatures(rng, fam, alpha, k):
    # the frame is the row max: an offset of 1e6 and τ from 1e-8 to 10 keep
    # the differences that carry the mass; entries near the float max too
    base = rng.normal(size=(3, 256))
    for offset, tau in ((1e4, 0.3), (1e6, 10.0), (0.0, 1e-8), (0.0, 10.0), (1e6, 1.0)):
        x = _f32(offset + base * (tau if tau < 1e-3 else 1.0))
        p, _ = _run(x, fam, alpha, k, tau)
        _check(p, _oracle(fam, alpha, k, x, tau), k, alpha)
    big = _f32(np.r_[3.0e38, 3.0e38 - 1e32, -3.0e38, 1.0e38, rng.normal(size=60)][None, :])
    p, _ = _run(big, fam, alpha, k, 0.5)
    _check(p, _oracle(fam, alpha, k, big, 0.5), k, alpha)


@pytest.mark.parametrize("fam, alpha, k", MAPS + TOPK, ids=IDS + TOPK_IDS)
def test_rows_do_not_depend_on_their_neighbours(rng, fam, alpha, k):
    # a row whose candidates overflow the buffer (uniform: all within 1 of
    # the max), or (top-k) whose λ the general search finds (entries far
    # apart), shares a program with rows that need neither: each row's p and
    # count are those of a program of its own, bit for bit
    x = _f32(np.stack([rng.normal(size=512), rng.uniform(size=512), rng.normal(size=512) * 3e4,
                       np.full(512, -np.inf)]))
    runs = [_run(x, fam, alpha, k, 1.0, rows_per_program=rpp) for rpp in (1, 2, 4)]
    for p, its in runs[1:]:
        assert torch.equal(p.view(torch.int32), runs[0][0].view(torch.int32))
        assert torch.equal(its, runs[0][1])
    _check(runs[0][0], _oracle(fam, alpha, k, x, 1.0), k, alpha, fam)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_dtypes(rng, dtype):
    x = torch.tensor(rng.normal(size=(6, 300)) * 2, dtype=dtype)
    for fam, alpha, k in MAPS + TOPK:
        p = lean_forward_rows(x, FAMILY_IDS[fam], k, 1.0, alpha)
        assert p.dtype == dtype
        ref = _oracle(fam, alpha, k, x.double().numpy(), 1.0)
        # one rounding to the half dtype
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=2.0 ** -7, atol=2.0 ** -9 * max(1, k))


def test_which_calls_take_it():
    sm, e15, ent, exp = (FAMILY_IDS[f] for f in ("sparsemax", "entmax15", "entmax", "exp"))
    assert takes_lean(sm, 8192, 2.0) and takes_lean(e15, 1, 1.5) and takes_lean(ent, 64, 1.125)
    assert takes_lean(ent, 64, 2.0) and not takes_lean(ent, 64, 1.1) and not takes_lean(ent, 64, 2.5)
    assert takes_lean(exp, 64, 1.5) and takes_lean(FAMILY_IDS["laplace"], 8192, 1.5)
    assert not takes_lean(FAMILY_IDS["sparse"], 64, 1.5) and not takes_lean(FAMILY_IDS["softmax"], 64, 1.5)
    assert takes_lean(sm, tf.LEAN_MAX + 1, 2.0) and not takes_lean(exp, tf.LEAN_MAX + 1, 2.0)
    # forward_rows takes it by default, the general kernel where a variant is asked for
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    _, lean_its = forward_rows(x, sm, 1, 1.0, return_passes=True)
    _, lean_direct = lean_forward_rows(x, sm, 1, 1.0, return_passes=True)
    assert torch.equal(lean_its, lean_direct)
    general = forward_rows(x, sm, 1, 1.0, onchip=True)
    assert torch.allclose(general, lean_forward_rows(x, sm, 1, 1.0), atol=1e-6)


def test_rows_per_program_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="rows_per_program"):
        lean_forward_rows(torch.zeros(4, 16), FAMILY_IDS["sparsemax"], 1, 1.0, rows_per_program=3)


_COMPILE = r"""
from softk._backends.triton.lean import lean_fwd_kernel
from softk._backends.triton.function import LEAN_GROUP, LEAN_SLOTS, MAXIT
dtypes = ("*fp32", "*bf16", "*fp16")
sig = {"X": "", "Y": "", "ITS": "*i32", "SZ": "*fp32", "SI": "*i32", "R": "i32", "n": "i32", "k": "fp32",
       "inv_tau": "fp32", "am1": "fp32"}
# (ROWS, BLOCK, COMPACT, GROUP, warps): router rows, a compacted row, a whole row searched from the groups' bound
# in the launch settings the launcher ships (_lean_config)
from softk._backends.triton.function import _lean_config
variants = [(*_lean_config(64, 1), 64, False, 0), (*_lean_config(1024, 1), 1024, True, LEAN_GROUP),
            (*_lean_config(8192, 1), 8192, False, LEAN_GROUP)]
variants = [(rows, blk, compact, group, warps) for rows, warps, blk, compact, group in variants]
built = 0
for fam in (1, 2, 3):
    for i, (rows, blk, compact, group, warps) in enumerate(variants):
        ty = dtypes[(fam + i) % 3]
        build(lean_fwd_kernel, dict(sig, X=ty, Y=ty), dict(FAM=fam, ROWS=rows, BLOCK=blk, COUNT=i == 0, COMPACT=compact,
              GROUP=group, C=LEAN_SLOTS if compact else 1, MAXIT=MAXIT, WRITE_ITS=i == 1), warps)
        built += 1
assert built == 9, built
from softk._backends.triton.lean_topk import lean_topk_fwd_kernel
from softk._backends.triton.function import LEAN_TOPK_IT, NEWTON_CAP
sig = {"X": "", "Y": "", "ITS": "*i32", "R": "i32", "n": "i32", "k": "fp32", "inv_tau": "fp32"}
for fam in (4, 5, 6):
    for i, (rows, blk, warps) in enumerate([(*_lean_config(64, fam)[:1], 64, _lean_config(64, fam)[1]),
                                            (*_lean_config(8192, fam)[:1], 8192, _lean_config(8192, fam)[1])]):
        ty = dtypes[(fam + i) % 3]
        build(lean_topk_fwd_kernel, dict(sig, X=ty, Y=ty), dict(FAM=fam, ROWS=rows, BLOCK=blk, LEAN_IT=LEAN_TOPK_IT,
              NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=i == 0), warps)
        built += 1
assert built == 15, built
from softk._backends.triton.lean_wide import lean_wide_fwd_kernel
from softk._backends.triton.function import LEAN_WIDE_SLOTS
sig = {"X": "", "Y": "", "ITS": "*i32", "SZ": "*fp32", "SI": "*i32", "R": "i32", "n": "i32", "k": "fp32",
       "inv_tau": "fp32", "am1": "fp32"}
for fam in (1, 2, 3):
    ty = dtypes[fam % 3]
    block, warps = _lean_config(70001, fam)
    for compact in (True, False):  # the buffer, or sweeps of the row
        build(lean_wide_fwd_kernel, dict(sig, X=ty, Y=ty), dict(FAM=fam, BLOCK=block, C=LEAN_WIDE_SLOTS if compact else 1,
              BIG=False, NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=fam == 1, COMPACT=compact), warps)
        built += 1
assert built == 21, built
print("OK")
"""


@pytest.mark.gpu_build
def test_lean_kernel_compiles_for_a_gpu():
    # the interpreter accepts code the compiler rejects: build every family
    # in its shapes for sm_90 (ptxas included), without a GPU
    gpu_build.compile_for_gpu(_COMPILE)


@pytest.mark.parametrize("fam, alpha", [("sparsemax", 2.0), ("entmax", 1.3), ("entmax", 3.0)])
@pytest.mark.parametrize("onchip", [True, False])
def test_general_kernel_rows_of_at_most_k_entries_far_apart(fam, alpha, onchip):
    # a row of 2 finite entries under k = 2.5 is 1 on both, however far
    # apart: the general kernel read "finite" off z, where (x − max)/τ had
    # overflowed to −inf for the lower entry, and wrote 0 there
    x = torch.full((1, 40), float("-inf"))
    x[0, 3], x[0, 30] = 3.0e38, -2.0e38
    p = forward_rows(x, FAMILY_IDS[fam], 2.5, 0.5, alpha, onchip=onchip, block=None if onchip else 16)
    expected = torch.zeros_like(x)
    expected[0, [3, 30]] = 1.0
    assert torch.equal(p, expected)


@st.composite
def _wide_cases(draw):
    """(family, α, k, rows, τ): two rows of a width that takes the buffer
    (300, 1100) or the two reads (8300), of a drawn kind."""
    fam, alpha, k = draw(st.sampled_from(MAPS + TOPK))
    n = draw(st.sampled_from([300, 1100] + ([8300] if fam not in oracle.F_BY_METHOD else [])))
    seed = draw(st.integers(0, 2**31 - 1))
    r = np.random.default_rng(seed)
    kind = draw(st.sampled_from(["normal", "ties", "masked", "offset", "dominant", "uniform", "far"]))
    x = r.normal(size=(2, n)) * draw(st.sampled_from([0.1, 1.0, 10.0]))
    if kind == "ties":
        x = np.round(x)
    elif kind == "masked":
        x[r.random((2, n)) < draw(st.sampled_from([0.5, 0.99]))] = -np.inf
    elif kind == "offset":
        x += draw(st.sampled_from([1e4, -1e6]))
    elif kind == "dominant":
        x[:, r.integers(n)] = draw(st.sampled_from([20.0, 1e4]))
    elif kind == "uniform":
        x = r.uniform(size=(2, n))
    elif kind == "far":
        x[:, r.integers(n, size=3)] = r.normal(size=(2, 3)) * 1e30
    tau = draw(st.sampled_from([1e-3, 0.3, 1.0, 10.0]))
    return fam, alpha, k, _f32(x), tau


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_wide_cases())
def test_property_wide_rows_match_oracle(case):
    fam, alpha, k, x, tau = case
    p, _ = _run(x, fam, alpha, k, tau)
    _check(p, _oracle(fam, alpha, k, x, tau), k, alpha, fam)


@pytest.mark.parametrize("n", [16384, 40000])
@pytest.mark.parametrize("fam, alpha", [("sparsemax", 2.0), ("entmax15", 1.5)])
def test_wide_near_constant_rows_are_uniform(n, fam, alpha):
    # p = 1/n on a constant row: the sweeps searched in the frame of the
    # lanes' root (about −1/1024), far from λ (about −1/n), and each p was a
    # difference of two terms of about 1e-3 whose roundings, alike on alike
    # entries, added up: sparsemax was off by 5.7e-6 at 16384 and 4.6e-5 at
    # 131072.  A second search in the frame of λ leaves an ulp or so.
    x = np.zeros((2, n))
    x[1] = 5.0 + 1e-6 * np.random.default_rng(n).normal(size=n)
    x = _f32(x)
    p, _ = _run(x, fam, alpha, 1, 1.0)
    np.testing.assert_allclose(p.double().numpy()[0], np.full(n, 1.0 / n), rtol=4 * EPS32, atol=0)
    np.testing.assert_allclose(p.double().sum(-1).numpy(), [1.0, 1.0], rtol=0, atol=16 * EPS32)
    _check(p, _oracle(fam, alpha, 1, x, 1.0), 1, alpha, fam)
