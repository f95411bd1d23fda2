"""One test per numerical promise of the library, through
the public API on both CPU backends (where a map has no compiled kernel,
"native" runs the PyTorch path and the case is run once).

Expected values are exact answers for the rounded input, worked by hand in
the comments (or by tests/oracle_mp.py where noted), never softk's output.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import softk

from ..oracle import mp as oracle_mp

BACKENDS = ("torch", "native")
t = torch.tensor


def close(got, want, atol):
    torch.testing.assert_close(got.double(), torch.as_tensor(want, dtype=torch.float64), rtol=0, atol=atol)


# ---------------------------------------------------------------- tiny τ, ties, offsets
@pytest.mark.parametrize("backend", BACKENDS)
def test_sparsemax_tiny_tau(backend):
    with softk.use_backend(backend):
        close(softk.sparsemax(t([0.3, 0.1, 0.2]), tau=1e-8), [1, 0, 0], 0)  # gaps ≥ 1e7 ≫ 1
        close(softk.sparsemax(t([1.78125, 1.78125]), tau=1e-7), [0.5, 0.5], 0)  # a tie


@pytest.mark.parametrize("backend", BACKENDS)
def test_soft_topk_tiny_tau_ties(backend):
    with softk.use_backend(backend):
        # k = 1: the tie at 2 splits, 1 is 1e7 below: e^-1e7 = 0
        close(softk.soft_topk(t([1.0, 2.0, 2.0]), 1, tau=1e-7), [0, 0.5, 0.5], 1e-7)
        close(softk.soft_topk(t([1.0, 2.0, 2.0]), 2, tau=1e-8), [0, 1, 1], 1e-7)
        # τ·logsumexp of [0, 1, 2, 2]/τ = 2 + τ log 2
        v = softk.topk_sum(t([0.0, 1.0, 2.0, 2.0]), 1, tau=1e-8)
        close(v, 2.0, 1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_rows_at_an_offset(backend):
    with softk.use_backend(backend):
        close(softk.sparsemax(torch.full((3,), 1000.3), tau=1e-3), [1 / 3] * 3, 1e-7)
        close(softk.entmax15(t([-1.8151673] * 2), tau=1e-3), [0.5, 0.5], 1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["sparsemax", "sparse"])
@pytest.mark.slow
def test_error_does_not_grow_with_the_offset(backend, method):
    """randn(16, 200) + c: float32 error vs the float64 exact map of the same
    rounded input stays at float32 rounding up to c = 1e6 (it was 7e-2 off)."""
    g = torch.Generator().manual_seed(12)
    base = torch.randn(16, 200, generator=g)
    for c in (0.0, 1e2, 1e4, 1e6):
        x = base + c
        ref = torch.from_numpy(np.stack([
            oracle_mp.threshold_row(method, r, 1 if method == "sparsemax" else 5) for r in x.double().numpy()[:4]
        ]))
        with softk.use_backend(backend):
            p = softk.sparsemax(x[:4]) if method == "sparsemax" else softk.soft_topk(x[:4], 5, method="sparse")
        assert float((p.double() - ref).abs().max()) <= 2e-6, c  # spread ~6, eps32·6·8


# ---------------------------------------------------------------- outliers
@pytest.mark.parametrize("backend", BACKENDS)
def test_exp_topk_with_an_outlier(backend):
    with softk.use_backend(backend):
        # 1e6 saturates; the other two are softmax([0, 1]) = [.268941, .731059]
        close(softk.soft_topk(t([1e6, 0.0, 1.0]), 2), [1, 0.2689414213699951, 0.7310585786300049], 1e-7)
        g = torch.Generator().manual_seed(5)
        for v in (1e2, 1e4, 1e6):
            x = torch.randn(100, generator=g)
            x[7] = v
            p = softk.soft_topk(x, 5)
            assert abs(float(p.double().sum()) - 5) <= 100 * 6e-8, v  # issue: 4e-3 at 1e4


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigmoid_with_an_outlier_and_tiny_tau(backend):
    with softk.use_backend(backend):
        # σ(0 − λ) + σ(1 − λ) = 1 gives λ = 1/2: σ(∓1/2) = .377541, .622459
        close(softk.soft_topk(t([1e7, 0.0, 1.0]), 2, method="sigmoid"), [1, 0.3775406687981454, 0.6224593312018546], 1e-7)
        p = softk.soft_topk(t([0.3, 0.1, 0.2]), 1, tau=1e-8, method="sigmoid")
        assert abs(float(p.double().sum()) - 1) <= 4e-7  # issue: 1.12
        close(p, [1, 0, 0], 1e-6)


def test_gradtopk_any_float64_scale():
    # 1e16 is in S surely; the second slot is softmax([0, 1])
    for v in (1e12, 1e16, 1e300):
        p = softk.soft_topk(t([v, 0.0, 1.0], dtype=torch.float64), 2, method="grad")
        # 1e-13: the tables hold log-weights up to k·(130 + log 2nk) ≈ 270 (eps·270 ≈ 6e-14)
        close(p, [1, 0.2689414213699951, 0.7310585786300049], 1e-13)
    p = softk.soft_topk(t([0.3, 0.1, 0.2], dtype=torch.float64), 1, method="grad", tau=1e-300)
    close(p, [1, 0, 0], 1e-55)  # the documented floor 2nk·e^-130 (softk._ops.gradtopk._clamp_margin)


# ---------------------------------------------------------------- entmax
@pytest.mark.parametrize("backend", BACKENDS)
def test_entmax_alpha_2_5_far_from_origin(backend):
    with softk.use_backend(backend):
        assert abs(float(softk.entmax(t([0.3, 0.1, 0.2]), alpha=2.5, tau=1e-7).sum()) - 1) <= 1e-6
        close(softk.entmax(t([0.0, 1e5]), alpha=2.5), [0, 1], 1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_entmax_near_one_is_softmax_like(backend):
    with softk.use_backend(backend):
        close(softk.entmax(torch.zeros(5), alpha=1.0001), [0.2] * 5, 3e-8)
        x = torch.randn(3, 7, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        # α → 1⁺ tends to softmax: |p_α − softmax| = O(α − 1)
        for a in (1 + 1e-6, 1 + 1e-9):
            d = (softk.entmax(x, alpha=a) - torch.softmax(x, -1)).abs().max()
            assert float(d) <= 10 * (a - 1)


def test_entmax_large_alpha_keeps_small_support_entries():
    # exact answers of the rounded inputs, from tests/oracle_mp.py at 400 bits
    p = softk.entmax(t([0.0, -0.21782390773296356]), alpha=5.0)
    ref = oracle_mp.threshold_row("entmax", np.float32([0.0, -0.21782390773296356]).astype(np.float64), 1, alpha=5.0)
    close(p, ref, 3e-7)
    assert abs(ref[1] - 0.03386) < 1e-5
    p = softk.entmax(t([0.0, -0.08971541326218664], dtype=torch.float64), alpha=10.0)
    ref = oracle_mp.threshold_row("entmax", [0.0, -0.08971541326218664], 1, alpha=10.0)
    close(p, ref, 1e-13)
    assert abs(ref[1] - 0.02349) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [5.0, 10.0, 20.0, 50.0])
def test_entmax_rows_sum_to_one_at_large_alpha(alpha, dtype):
    """Random rows of 50 scaled so the supports hold several entries; issue:
    |Σp − 1| up to 0.165 (α = 10, float32)."""
    g = torch.Generator().manual_seed(int(alpha))
    x = torch.randn(20, 50, generator=g, dtype=dtype) / (4 * alpha)
    p = softk.entmax(x, alpha=alpha)
    eps = torch.finfo(dtype).eps
    assert float((p.double().sum(-1) - 1).abs().max()) <= 50 * eps
    assert int((p > 0).sum(-1).min()) >= 2


def test_huge_alpha_is_the_argmax_not_zeros():
    for a in (1e10, 1e30):
        close(softk.entmax(t([0.0, 1.0, 2.0]), alpha=a), [0, 0, 1], 0)
        close(softk.entmax(t([2.0, 2.0, 1.0]), alpha=a), [0.5, 0.5, 0], 1e-7)


def test_tensor_alpha_is_exact_and_inf_is_refused_like_a_float():
    # the tensor-α path takes p from the solver itself (no function.py needed)
    p = softk.entmax(t([[0.0, -0.21782390773296356]]), alpha=t([[5.0]]))
    close(p[0, 1], 0.033856, 2e-5)
    close(softk.entmax(torch.zeros(1, 5), alpha=t([[1.0001]])), [[0.2] * 5], 3e-8)
    close(softk.entmax(t([[0.0, 1e5]]), alpha=t([[2.5]])), [[0, 1]], 1e-7)
    close(softk.entmax(t([[0.0, 1.0, 2.0]]), alpha=t([[1e10]])), [[0, 0, 1]], 0)
    with pytest.raises(ValueError, match="alpha"):
        softk.entmax(t([[0.0, 1.0]]), alpha=t([[float("inf")]]))
    with pytest.raises(ValueError, match="alpha"):
        softk.entmax(t([0.0, 1.0]), alpha=float("inf"))
