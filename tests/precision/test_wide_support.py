"""The PyTorch path on a wide support far below the row's maximum.

One entry at ½ and hundreds to thousands near 1e-4: every entry is in the
support and λ lies near −½ in the frame of the max, so an ulp of λ (6e-8
in float32) reaches each of n entries of about 1e-4 the same way, and Σp
was off by n·eps·|λ| (sparsemax: 5e-5 at 1024 entries, 3.6e-4 at 8192).
The PyTorch path settles p with one Newton step on the exact differences
z − λ (:func:`softk.threshold.solve.settled_probs`); the native rows solve
again in the frame of the threshold (tests/backends/test_native.py).
"""

import numpy as np
import pytest
import torch

import softk
from softk.threshold.families import SPARSE
from softk.threshold.solve import settled_probs

from ..oracle import maps as oracle

EPS32 = float(np.finfo(np.float32).eps)
MAPS = {"sparsemax": (softk.sparsemax, oracle._f_relu), "entmax15": (softk.entmax15, oracle._f_entmax(1.5)),
        "entmax1.6": (lambda x: softk.entmax(x, alpha=1.6), oracle._f_entmax(1.6))}


@pytest.mark.parametrize("name", MAPS)
@pytest.mark.parametrize("n", [48, 1024, 8192])  # 48: the general solver; from 64 on, the candidates' fast path
def test_sum_is_one_on_a_wide_support_far_below_the_max(name, n):
    fn, f = MAPS[name]
    rng = np.random.default_rng(n)
    x = rng.normal(size=(6, n)) * 1e-4
    x[:, 7] = 0.5
    x[1] += 3e3  # an offset: its 1e-4s round to ulp(3e3), ties among them
    x[4] *= 1e4  # a row of N(0, 1) with an entry at 5e3: p = one-hot
    x = torch.tensor(x, dtype=torch.float32)
    with softk.use_backend("torch"):
        p = fn(x).double().numpy()
    np.testing.assert_allclose(p.sum(-1), np.ones(6), rtol=0, atol=16 * EPS32)
    ref = oracle._apply(lambda r: oracle._row_map(f, r - r.max(), 1), x.double().numpy(), -1)
    np.testing.assert_allclose(p, ref, rtol=16 * EPS32, atol=4 * EPS32 * 0.5)


def test_settled_capped_entries_stay_at_most_one():
    # The settle step moves every entry inside (0, 1) up by −δ where Σf < k;
    # one a few ulps under the cap went past it (1 + 2⁻²³ on budget_sparsemax).
    u = torch.tensor([[0.99999994, 0.5, 0.25]])
    p, step = settled_probs(SPARSE, u, 1.75 + 1e-5)  # Σf − k past SETTLE_ULPS: a step of −3e-6
    assert step.item() < 0 and (p <= 1).all()


@pytest.mark.parametrize("n,top,inside", [(4000, 1500, 2), (20000, 9000, 3), (3000, 1000, 5)])
def test_a_large_budget_with_few_entries_inside(n, top, inside):
    # ~k entries at the cap and a handful strictly inside (0, 1).  Without a
    # step p was off by 1e-6 to 1.1e-4 here; with a step on the residual
    # Σf − k summed in float32 (rounded to an ulp of k, 1e-3 at 9000) over
    # the few inside entries, by 1e-5; the entries at the cap are counted
    # instead, and p is within two ulps of 1
    rng = np.random.default_rng(n)
    x = np.concatenate([3 + rng.uniform(0, 1, top), rng.uniform(0.1, 0.9, inside),
                        -3 - rng.uniform(0, 1, n - top - inside)])
    x = rng.permutation(x).astype(np.float32)
    k = float(np.float32(top + np.float64(x[(x > 0) & (x < 1)]).sum()))  # λ = 0, k a float32
    ref = oracle.soft_topk(x.astype(np.float64)[None], k, method="sparse")
    with softk.use_backend("torch"):
        p = softk.budget_sparsemax(torch.from_numpy(x)[None], k).double().numpy()
    np.testing.assert_allclose(p, ref, rtol=0, atol=2 * EPS32)
