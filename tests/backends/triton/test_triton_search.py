"""The λ search of the Triton forward kernel (through the CPU interpreter)
against the NumPy float64 oracle: every family, the on-chip (row in registers)
and the looping (row read in blocks) variants, rows on which Newton's support
changes several times, ties, a dominant entry, masks, entries far apart
(τ → 0), half dtypes, a row wider than 65,536, the row conventions, the
bisection fallback, and the number of passes the kernel reports."""

import numpy as np
import pytest
import torch

from . import gpu_build

from softk._backends.triton import function as tf
from softk._backends.triton.function import FAMILY_IDS, FROM_X, backward_rows, forward_rows

from ...oracle import maps as oracle

EPS32 = float(np.finfo(np.float32).eps)
UNCAPPED = ("sparsemax", "entmax15", "entmax")
FAMS = ("sparsemax", "entmax15", "entmax", "exp", "sigmoid", "laplace", "sparse")
ALPHA = 1.3  # entmax α unless a test says otherwise

# Search passes for the rows of test_matches_oracle: the previous kernels
# took 60 for every family; the new ones need at most about 15 there.
MAX_PASSES = 16


def _oracle(fam, x, k, alpha=ALPHA):
    if fam == "sparsemax":
        return oracle.sparsemax(x)
    if fam == "entmax15":
        return oracle.entmax(x, 1.5)
    if fam == "entmax":
        return oracle.entmax(x, alpha)
    if fam == "softmax":
        return oracle.softmax(x)
    return oracle.soft_topk(x, k, method=fam)


def _f32(a):
    """Values exactly representable in float32, as float64 (the oracle's input)."""
    return np.asarray(a, dtype=np.float64).astype(np.float32).astype(np.float64)


def _run(fam, x, k, variant, alpha=ALPHA, dtype=torch.float32):
    """The kernel on rows ``x``; "loop" reads them in blocks of about a
    quarter of the width (several blocks and a ragged last one)."""
    rows = torch.tensor(np.atleast_2d(x)).to(dtype)
    onchip = variant == "onchip"
    block = max(16, 1 << (rows.shape[-1] // 4).bit_length() - 1)
    p, passes = forward_rows(rows, FAMILY_IDS[fam], k, 1.0, alpha, onchip=onchip, block=None if onchip else block,
                                  return_passes=True)
    return p, passes.numpy()


def _check(p, ref, x, rtol=1e-5):
    """float32 arithmetic: 1e-5 relative, plus a few ulps of the row's scale
    absolute (p = f(z − λ) can be no closer than z − λ is)."""
    x = np.atleast_2d(x)
    fin = np.isfinite(x)
    scale = max(1.0, float(np.abs(x[fin]).max())) if fin.any() else 1.0
    got = p.double().numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=2 * EPS32 * scale, equal_nan=True)


def _rows(rng, fam):
    """Rows that stress the search: scales from 0.1 to 100, −inf masks, ties,
    one dominant entry, few finite entries, a quadratic spread."""
    n = 96
    r = [rng.normal(size=n) * s for s in (0.1, 1.0, 10.0)]
    masked = rng.normal(size=n) * 2
    masked[rng.random(n) < 0.6] = -np.inf
    r.append(masked)
    r.append(np.repeat(rng.normal(size=8), n // 8))  # ties in groups of 12
    r.append(np.r_[100.0, np.zeros(n - 1)])  # one dominant entry
    few = np.full(n, -np.inf)
    few[[3, 50, 90]] = [0.5, -1.0, 2.0]
    r.append(few)
    r.append(-((np.arange(n) / 30.0) ** 2))
    if fam not in UNCAPPED:
        r.append(rng.normal(size=n) * 100)  # entries far apart: the τ → 0 regime
    return _f32(np.stack(r))


@pytest.mark.parametrize("variant", ["onchip", "loop"])
@pytest.mark.parametrize("fam", FAMS)
@pytest.mark.slow
def test_matches_oracle(rng, fam, variant):
    x = _rows(rng, fam)
    if variant == "loop":  # the interpreter is slow: half the rows for the looping copy
        x = x[::2]
    ks = (1,) if fam in UNCAPPED else (1, 2, 40)
    for i, k in enumerate(ks):  # each row once, the k's taking turns
        xi = x[i :: len(ks)]
        p, passes = _run(fam, xi, k, variant)
        _check(p, _oracle(fam, xi, k), xi)
        assert passes.max() <= MAX_PASSES, (k, passes)


@pytest.mark.parametrize(
    "alpha, variant", [(1.05, "onchip"), (1.5, "onchip"), (2.0, "onchip"), (2.5, "onchip"), (4.0, "onchip"), (1.05, "loop"), (4.0, "loop")]
)
def test_entmax_alpha_matches_oracle(rng, alpha, variant):
    x = _rows(rng, "entmax")[1:4]
    p, passes = _run("entmax", x, 1, variant, alpha=alpha)
    _check(p, _oracle("entmax", x, 1, alpha), x)
    # α > 2: f' is infinite at the edge of the support, Newton is slower there
    assert passes.max() <= (MAX_PASSES if alpha <= 2 else 24)


def _michelot_supports(z, k=1.0):
    """Support sizes visited by Michelot's iteration from max − k (float64,
    written here from the definition: λ ← (Σ_{z>λ} z − k)/#{z>λ})."""
    lam, sizes = z.max() - k, []
    while True:
        s = z > lam
        sizes.append(int(s.sum()))
        new = (z[s].sum() - k) / s.sum()
        if len(sizes) > 1 and sizes[-1] == sizes[-2]:
            return sizes
        lam = new


@pytest.mark.parametrize("variant", ["onchip", "loop"])
@pytest.mark.parametrize("fam", UNCAPPED)
def test_support_changes_several_times(fam, variant):
    # Rows on which the support shrinks in many steps from λ0 = max − 1.
    i = np.arange(256.0)
    x = _f32(np.stack([-np.sqrt(i) / 16, -i / 256, -(1.006**i - 1), -np.log1p(i) / 5]))
    for row in x:
        assert len(set(_michelot_supports(row))) >= 4  # the rows do what they are for
    p, passes = _run(fam, x, 1, variant)
    _check(p, _oracle(fam, x, 1), x)
    if variant == "onchip":
        assert (passes >= 3).all() and passes.max() <= MAX_PASSES
    else:
        # the looped variant starts from λ on its lane maxima (here the
        # row's top quarter, which holds the support): at most 3 passes
        assert passes.max() <= 3


@pytest.mark.parametrize("variant", ["onchip", "loop"])
def test_exp_dominant_entry_is_exact(variant):
    # [100, 0, 0, 0], k = 2: the dominant entry saturates, the other three
    # share the rest: 1/3 each.  In float32 e^{0−λ0} underflows at λ0 ≈ 99.3,
    # so the unsaturated sum must carry its own max.
    x = np.zeros((3, 1000))
    x[:, 0] = 100.0
    x[1, 1] = 60.0  # two saturated entries, the rest share k − 2
    x[2, 1:] = -np.inf  # and a mask around a dominant entry
    x[2, 500:504] = [0.0, -1.0, -2.0, -3.0]
    for top in (100.0, 1000.0):  # at 1000, e^{0−λ0} is 0 even as a subnormal
        xi = np.array([[top, 0, 0, 0]])
        for k, want in ((2, [[1, 1 / 3, 1 / 3, 1 / 3]]), (3, [[1, 2 / 3, 2 / 3, 2 / 3]])):
            p, passes = _run("exp", xi, k, variant)
            np.testing.assert_allclose(p.double().numpy(), want, rtol=2 * EPS32, atol=0)
            # λ0 = lse − log k, then λ1 = log(3/(k − 1)) exactly, confirmed by the
            # next pass; on chip λ lies ~top below the row maximum, so the row is
            # searched again (2 more passes) in the frame moved there (the looped
            # variant's frame is already there: λ of its lane maxima)
            assert passes.tolist() == ([4] if variant == "onchip" else [2])
    p, _ = _run("exp", x, 5, variant)
    ref = oracle.soft_topk(x, 5, method="exp")
    np.testing.assert_allclose(p.double().numpy()[:2], ref[:2], rtol=1e-6, atol=0)
    np.testing.assert_allclose(p.double().numpy()[0, 1:], 4 / 999, rtol=1e-6)
    _check(p, ref, x)


@pytest.mark.parametrize("fam", ["exp", "sigmoid", "laplace"])
def test_far_apart_entries_keep_relative_precision(rng, fam):
    # τ → 0: entries tens to hundreds apart, p down to ~1e−30.  λ has to be
    # right to float32 precision for the tiny p to be right relatively.
    x = _f32(rng.normal(size=(2, 200)) * np.array([[30.0], [8.0]]))
    for k in (1, 3, 100):
        p, passes = _run(fam, x, k, "onchip")
        ref = _oracle(fam, x, k)
        # (the oracle's sigmoid, 0.5 (1 + tanh(u/2)), is only absolutely exact: ~1e−16)
        keep = ref > (1e-9 if fam == "sigmoid" else 1e-30)
        got = p.double().numpy()
        # relative error of e^u is the absolute error of u: a few ulps of |z|
        rtol = 8 * EPS32 * np.abs(x).max(axis=1, keepdims=True)
        assert (np.abs(got - ref)[keep] <= (rtol * ref)[keep] + 1e-37).all(), (k, fam)
        assert passes.max() <= 20


@pytest.mark.parametrize(
    "fam, dtype", [(f, (torch.bfloat16, torch.float16)[i % 2]) for i, f in enumerate(FAMS + ("softmax",))] + [("exp", torch.float16)]
)
def test_half_inputs(rng, fam, dtype):
    xs = torch.tensor(rng.normal(size=(2, 64)) * 3).to(dtype)
    xs[1, ::4] = float("-inf")
    x = xs.double().numpy()  # the oracle sees exactly the half values
    k = 1 if fam in UNCAPPED + ("softmax",) else 5
    p, _ = _run(fam, x, k, "loop" if dtype == torch.bfloat16 else "onchip", dtype=dtype)
    assert p.dtype == dtype
    np.testing.assert_allclose(p.double().numpy(), _oracle(fam, x, k), rtol=0, atol=torch.finfo(dtype).eps)


def test_row_conventions_in_both_variants():
    x = np.array(
        [
            [0.5, -np.inf, 1.0, -np.inf, -np.inf, -np.inf],  # 2 finite ≤ k = 2: ones
            [-np.inf] * 6,  # nothing finite: zeros
            [0.0, 1.0, np.nan, 2.0, 3.0, 4.0],  # NaN: the row is NaN
            [0.0, 1.0, np.inf, 2.0, 3.0, 4.0],  # +inf: NaN too
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],  # an ordinary row next to them
        ]
    )
    for fam in FAMS + ("softmax",):
        k = 2
        for variant in ("onchip", "loop"):
            p, passes = _run(fam, x, k, variant)
            got = p.double().numpy()
            np.testing.assert_array_equal(got[0], [1, 0, 1, 0, 0, 0])
            np.testing.assert_array_equal(got[1], np.zeros(6))
            assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
            assert np.isclose(got[4].sum(), k, atol=1e-5)
            assert (passes[:4] == 0).all()  # filled rows skip the search


@pytest.mark.parametrize("fam", ["exp", "entmax15"])
def test_row_wider_than_65536(rng, fam):
    n = 70_001
    x = _f32(rng.normal(size=(1, n)) * 3)
    k = 1 if fam in UNCAPPED else 64
    p, passes = forward_rows(torch.tensor(x, dtype=torch.float32), FAMILY_IDS[fam], k, 1.0, return_passes=True)
    _check(p, _oracle(fam, x, k), x, rtol=4e-6)
    assert passes.max() <= MAX_PASSES


def test_passes_reported():
    # softmax needs no search; exp without saturation is exact after the
    # pass that checks it; a regression to fixed bisection shows as ~60.
    x = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]])
    _, passes = forward_rows(x, FAMILY_IDS["softmax"], 1, 1.0, return_passes=True)
    assert passes.tolist() == [0]
    _, passes = forward_rows(x, FAMILY_IDS["exp"], 1, 1.0, return_passes=True)
    assert passes.tolist() == [1]
    _, passes = forward_rows(x, FAMILY_IDS["sparsemax"], 1, 1.0, return_passes=True)
    assert 1 <= passes.item() <= 4


@pytest.mark.parametrize("fam", FAMS)
def test_bisection_fallback_is_correct(rng, fam, monkeypatch):
    # With Newton capped after 2 passes the search must finish by bisection
    # inside its bracket, to the same answer.
    monkeypatch.setattr(tf, "NEWTON_CAP", 2)
    x = _f32(rng.normal(size=(1, 48)) * 2)
    k = 1 if fam in UNCAPPED else 5
    p, passes = _run(fam, x, k, "onchip")
    _check(p, _oracle(fam, x, k), x)
    assert passes.max() <= tf.MAXIT


def test_iteration_cap_holds(rng, monkeypatch):
    # The loop stops at MAXIT passes whatever happens.
    monkeypatch.setattr(tf, "NEWTON_CAP", 0)
    monkeypatch.setattr(tf, "MAXIT", 3)
    x = _f32(rng.normal(size=(2, 64)))
    for fam in FAMS:
        _, passes = _run(fam, x, 2 if fam not in UNCAPPED else 1, "onchip")
        assert passes.max() <= 3


@pytest.mark.parametrize("fam", ["sparsemax", "entmax", "exp", "laplace"])
def test_backward_loop_variant_matches_oracle_jacobian(rng, fam):
    k = 1 if fam in UNCAPPED else 3
    xn = _f32(rng.normal(size=40) * 2)
    g = rng.normal(size=40)
    x = torch.tensor(xn[None], dtype=torch.float32)
    p = forward_rows(x, FAMILY_IDS[fam], k, 1.0, ALPHA, onchip=False, block=16)
    dx = backward_rows(p, torch.tensor(g[None], dtype=torch.float32), FAMILY_IDS[fam], 1.0, ALPHA, onchip=False, block=16,
                       x=x if FAMILY_IDS[fam] in FROM_X else None)
    jac = oracle.numerical_jacobian(lambda r: _oracle(fam, r[None], k)[0], xn, eps=1e-5)
    np.testing.assert_allclose(dx[0].double().numpy(), jac.T @ g, rtol=0, atol=5e-4)


_COMPILE = r"""
from softk._backends.triton.function import (BWD_LOOP_BLOCK, BWD_ONCHIP_MAX, FROM_X, MAXIT, NEWTON_CAP, ONCHIP_MAX,
                                             SHORT_BLOCK, _config)
from softk._backends.triton.kernels import threshold_bwd_kernel, threshold_fwd_kernel

# every family (α > 2 as well) in three variants, at the launcher's settings
# (the forward's and the backward's) for the widest on-chip row, a looped one
# and 64-wide rows (several rows per program); the dtypes take turns
dtypes = ("*fp32", "*bf16", "*fp16")
variants = [_config(ONCHIP_MAX, None, None), _config(ONCHIP_MAX + 1, None, None), _config(64, None, None)]
bwd_variants = [_config(n, None, None, backward=True) for n in (BWD_ONCHIP_MAX, BWD_ONCHIP_MAX + 1, 64)]
assert [v[0] for v in variants] == [v[0] for v in bwd_variants] == [True, False, True]
assert variants[1][1] == SHORT_BLOCK and bwd_variants[1][1] == BWD_LOOP_BLOCK
assert [v[3] for v in variants] == [1, 1, 8] and [v[3] for v in bwd_variants] == [1, 1, 8]
fwd = {"X": "", "Y": "", "ITS": "*i32", "R": "i32", "n": "i32", "k": "fp32", "inv_tau": "fp32", "am1": "fp32"}
bwd = {"P": "", "X": "", "G": "", "DX": "", "R": "i32", "n": "i32", "inv_tau": "fp32", "am1": "fp32", "k": "fp32"}
built = 0
for fam in range(8):
    for i, (onchip, blk, warps, rows) in enumerate(variants):
        # α-entmax: 1.125 ≤ α ≤ 2 plain; α > 2 (BIG, with the anchor form); α < 1.125 (the anchor form alone)
        for big, anchor in (((False, False), (True, True), (False, True)) if fam == 3 else ((False, False),)):
            ty = dtypes[(fam + i + big + anchor) % 3]
            build(threshold_fwd_kernel, dict(fwd, X=ty, Y=ty), dict(FAM=fam, ROWS=rows, BLOCK=blk, ONCHIP=onchip, BIG=big,
                  PROBE=fam >= 4 or big, ANCHOR=anchor, NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, WRITE_ITS=i != 1), warps)
            built += 1
        onchip, blk, warps, rows = bwd_variants[i]
        for logd in ((False, True) if fam == 3 else (False,)):  # α > 2: the log-slope backward
            ty = dtypes[(fam + i + 1 + logd) % 3]
            build(threshold_bwd_kernel, dict(bwd, P=ty, X=ty, G=ty, DX=ty), dict(FAM=fam, ROWS=rows, BLOCK=blk,
                  ONCHIP=onchip, LOGD=logd, FROM_X=fam in FROM_X, REFINE=fam in FROM_X), warps)
            built += 1
assert built == 57, built
print("OK")
"""


@pytest.mark.gpu_build
def test_kernels_compile_for_a_gpu():
    # The interpreter accepts code that the compiler rejects (a non-constexpr
    # global, a type that changes across a loop, a helper's tuple): compile
    # every family in three variants (on chip, looped, many rows per
    # program) for sm_90 without a GPU (ptxas included), in a process where
    # TRITON_INTERPRET is unset.  About 25–35 s with an empty Triton cache on
    # an idle 2-core machine; seconds once cached.
    gpu_build.compile_for_gpu(_COMPILE)
