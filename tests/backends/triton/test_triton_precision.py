r"""The torch backend's precision suite (tests/test_precision_scale.py) on the
Triton kernels, through the interpreter: every map far from the origin
(offsets to 1e6), τ from 1e-3 to 10 (and 1e30 on rows of that scale), one
dominant entry up to 1e7, α-entmax from 1.0001 to 50, against mpmath on the
rounded float32 input (tests/oracle_mp.py), on the on-chip and the looped
variant (blocks of 4 and 8 lanes: the lane-maxima start and the moved frame
of softk._backends.triton.frame run there).

Error model: the torch backend's own (``_tolerance`` of the suite, with its
derivation), float32 eps: the shifted scores s = (x − r)/τ rounded at 2·eps,
λ's stopping rule, and f's own rounding.  The kernels may be looser than
that bound by ``FACTOR`` = 2 at most (they round the frame's reference
itself, and sum in a different order); |Σp − k| within 8·n·eps·k·FACTOR.
The matrix is marked slow (its mpmath references take about a minute); the
cases of the precision targets run in the fast tier.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from softk._backends.triton.function import FAMILY_IDS, forward_rows

from ...oracle import maps as oracle_maps
from ...oracle import mp as oracle_mp
from ...precision.test_precision_scale import _d_clip, _d_entmax, _d_exp, _d_lap, _d_relu, _d_sig, _tolerance

EPS = float(np.finfo(np.float32).eps)
FACTOR = 2.0
N = 12


def _cases():
    rng = np.random.default_rng(20)
    base = rng.normal(size=N)
    out = {}
    for c, name in ((1e2, "1e2"), (1e4, "1e4"), (1e6, "1e6")):  # far from the origin, τ ≠ 1
        out[f"offset{name}-tau0.3"] = (base + c, 0.3)
    out["offset1e3-tau1e-3"] = (1e3 + 1e-3 * base, 1e-3)  # rounded to ulp(1e3): ties
    out["tau1e-3"] = (0.3 + 1e-3 * base, 1e-3)
    out["tau10"] = (3.0 * base, 10.0)
    out["offset-1e3-tau0.05"] = (base - 1e3, 0.05)
    for v, tau, name in ((1e4, 0.05, "outlier1e4-tau0.05"), (1e7, 1.0, "outlier1e7-tau1")):
        row = base.copy()  # one dominant entry: the top-k frame moves
        row[3] = v
        out[name] = (row, tau)
    out["scale1e30"] = (base * 1e30, 1e30)
    return {key: (np.asarray(r, dtype=np.float32), tau) for key, (r, tau) in out.items()}


CASES = _cases()

# name -> (family id, oracle name, α, d(p), capped, k values)
MAPS = {f"{m}": (FAMILY_IDS[m], m, 1.5, d, True, (1, 3))
        for m, d in (("exp", _d_exp), ("sigmoid", _d_sig), ("laplace", _d_lap), ("sparse", _d_clip))}
MAPS.update({
    "softmax": (FAMILY_IDS["softmax"], "softmax", 1.5, lambda p, u: p, False, (1,)),
    "sparsemax": (FAMILY_IDS["sparsemax"], "sparsemax", 1.5, _d_relu, False, (1,)),
    "entmax15": (FAMILY_IDS["entmax15"], "entmax15", 1.5, _d_entmax(1.5), False, (1,)),
})
ALPHAS = (1.0001, 1.3, 2.5, 3.0, 5.0, 10.0, 50.0)
MAPS.update({f"entmax{a:g}": (FAMILY_IDS["entmax"], "entmax", a, _d_entmax(a), False, (1,)) for a in ALPHAS})
VARIANTS = {"onchip": dict(onchip=True), "loop4": dict(onchip=False, block=4), "loop8": dict(onchip=False, block=8)}


@functools.lru_cache(maxsize=None)
def _reference(map_id, case_id, k):
    _, oname, alpha, *_ = MAPS[map_id]
    row, tau = CASES[case_id]
    return oracle_mp.threshold_row(oname, row.astype(np.float64), k, tau=tau,
                                   alpha=alpha if oname == "entmax" else None)


def check_map(map_id, case_id, k, variant):
    fam, oname, alpha, dfun, capped, _ = MAPS[map_id]
    row, tau = CASES[case_id]
    x = torch.from_numpy(row.copy())[None]
    out = torch.full_like(x, float("nan"))  # an unwritten entry cannot pass
    p = forward_rows(x, fam, k, tau, alpha, out=out, **VARIANTS[variant])[0].double().numpy()
    ref = _reference(map_id, case_id, k)
    tol = FACTOR * _tolerance(ref, row.astype(np.float64), tau, k, dfun, capped,
                              alpha if oname.startswith("entmax") else None, EPS)
    bad = ~(np.abs(p - ref) <= tol)
    assert not bad.any(), f"{map_id} {case_id} k={k} {variant}: p={p[bad]} ref={ref[bad]} tol={tol[bad]}"
    assert abs(p.sum() - k) <= FACTOR * 8 * N * EPS * k


# the cases of the precision targets, and the top-k frame's hard rows: the fast tier
FAST = [("sparsemax", "offset1e4-tau0.3", 1), ("entmax15", "offset1e6-tau0.3", 1), ("exp", "offset1e4-tau0.3", 3),
        ("softmax", "offset1e6-tau0.3", 1), ("exp", "outlier1e7-tau1", 3), ("laplace", "tau1e-3", 3),
        ("sparse", "outlier1e4-tau0.05", 3), ("exp", "offset-1e3-tau0.05", 3), ("entmax10", "offset1e4-tau0.3", 1),
        ("entmax1.0001", "tau10", 1)]


@pytest.mark.parametrize("map_id, case_id, k", FAST, ids=[f"{m}-{c}-k{k}" for m, c, k in FAST])
def test_the_precision_targets_are_exact(map_id, case_id, k):
    for variant in VARIANTS:
        check_map(map_id, case_id, k, variant)


@pytest.mark.slow
@pytest.mark.parametrize("map_id", sorted(MAPS))
def test_precision_suite_on_the_kernels(map_id):
    # Each case on one variant, the two variants taking turns (by case and
    # k), so that both see every kind of case and both k across the maps;
    # the interpreter's kernel runs are two thirds of this suite's time.
    for i, case_id in enumerate(CASES):
        for j, k in enumerate(MAPS[map_id][5]):
            check_map(map_id, case_id, k, ("onchip", "loop4")[(i + j + len(map_id)) % 2])


# Rows of the standard normal at τ = 1e-3, one past the lean forward's width
# (the looped kernel), and k where each has an entry just under the kink
# (exact p of 1 − 8e-7 and 1 − 9e-7 at k = 5 and 16, 1 − 2e-7 at k = 2).
WIDE_EXP_ROWS = ((13, 5), (0, 16), (1, 2))


@pytest.mark.parametrize("row, k", WIDE_EXP_ROWS, ids=[f"row{r}-k{k}" for r, k in WIDE_EXP_ROWS])
def test_exp_entries_just_under_the_kink_on_wide_rows(row, k):
    # The search's iterates come from above; one from a point 38 frame units
    # away (the probe) rounds by ulp(38)/2 = 2e-6, and landed below such an
    # entry, which read as saturated: λ was kept there (it "passed the root"),
    # the entry written 1 or 1 − 2⁻²⁴ (errors 2e-7 to 9e-7, the torch path's
    # 8e-8).  Error model: p = e^u, u formed next to λ (in the frame of λ, to
    # its rounding), so |δp| ≤ p·(eps/2 for exp and the store + a few eps·(|u| + 1)
    # for u): 4·eps·p·(1 + |u|), about three times the largest error seen on
    # 512 such rows and 8 values of k; float32's smallest normal below that
    # (p underflows there).  And an entry below 1 in float32 is not written 1.
    x = np.random.default_rng(0).normal(size=(64, 8193)).astype(np.float32)[row]
    tau = 1e-3
    p = forward_rows(torch.from_numpy(x.copy())[None], FAMILY_IDS["exp"], k, tau)[0].double().numpy()
    ref = oracle_maps.soft_topk(x.astype(np.float64), k, tau=tau, method="exp")
    u = np.log(np.maximum(ref, 1e-300))  # u ≤ 0 below the kink, 0 on the saturated entries
    tol = 4 * EPS * ref * (1 + np.abs(u)) + np.finfo(np.float32).tiny
    bad = ~(np.abs(p - ref) <= tol)
    assert not bad.any(), f"p={p[bad]} ref={ref[bad]} tol={tol[bad]}"
    assert (p[ref.astype(np.float32) < 1] < 1).all()
