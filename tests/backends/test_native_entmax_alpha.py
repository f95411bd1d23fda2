"""The compiled CPU kernel of α-entmax over every α it serves (1 < α ≤ 2)
against the NumPy float64 oracle (bisection, independent of the kernel's
Newton and of its final-round write of p).

Rows are chosen for the solver's stages: wide supports (most blocks of 32
hold candidates), narrow ones, widths that leave a partial block, ties at
the top and at the threshold, −inf masks, fully masked and one-entry rows,
and large offsets.  Outputs are pre-filled with NaN so an entry the kernel
forgets to write cannot pass.
"""

import numpy as np
import pytest
import torch

import softk
from softk._backends import native
from softk.threshold import entmax_family

from ..oracle import maps as oracle

pytestmark = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="needs a C compiler")

ALPHAS = [1.00001, 1.0001, 1.001, 1.01, 1.05, 1.1, 1.2, 1.25, 1.3, 1.4, 1.45, 1.55, 1.6, 1.75, 1.9, 1.99, 2.0]
EPS64 = float(np.finfo(np.float64).eps)


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(native, "_empty", lambda like: torch.full_like(like, float("nan")))


def _tol(dtype, alpha):
    if dtype == torch.float32:
        return 2e-6
    # Near α = 1 the oracle's own z − λ (λ ≈ −1/(α−1)) rounds to an ulp of
    # 1/(α−1), which p = w^{1/(α−1)} turns into about 1e-16/(α−1)² relative.
    q = 1.0 / (alpha - 1.0)
    return 1e-12 * max(1.0, q / 100.0)


def _reference(x, alpha):
    """The oracle on rows shifted by their finite maximum (exact in floating
    point, and the map is shift invariant), so that its bisection on z − λ
    is not limited by the offset's ulp."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    top = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    shifted = np.where(np.isnan(x) | np.isposinf(x), x, x - top)
    return oracle._apply(lambda r: oracle._row_map(oracle._f_entmax(alpha), r, 1), shifted, -1)


def _check(x, alpha):
    p = native.forward(entmax_family(alpha), x, 1)
    ref = _reference(x.double().numpy(), alpha)
    np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=_tol(x.dtype, alpha))
    return p


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_random_rows(rng, dtype, alpha):
    for n in (2, 31, 33, 300, 1029):
        for scale in (0.05, 1.0, 10.0):  # 0.05: nearly the whole row is the support
            _check(torch.tensor(rng.normal(size=(4, n)) * scale, dtype=dtype), alpha)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", ALPHAS)
def test_hard_rows(dtype, alpha):
    n = 100
    inf = np.inf
    geo = -np.geomspace(1e-3, 50.0, n)
    rows = [
        np.zeros(n),  # all tied
        np.r_[np.full(7, 2.0), np.zeros(n - 7)],  # ties at the top
        np.r_[1.0, np.zeros(n - 1)],  # ties just below the top
        geo,
        geo[::-1].copy(),
        np.linspace(-1.0, 0.0, n),
        np.r_[np.full(n - 3, -inf), 0.0, 1.0, 2.0],  # masks
        np.where(np.arange(n) % 3 == 0, -inf, np.linspace(-2, 2, n)),
        np.full(n, -inf),  # fully masked: zeros
        np.r_[np.full(n - 1, -inf), 5.0],  # one finite entry: 1 there
        np.linspace(-2.0, 2.0, n) + 1e4,  # offset
        np.linspace(-30.0, 30.0, n) - 1e4,
    ]
    x = torch.tensor(np.stack(rows), dtype=dtype)
    p = _check(x, alpha)
    assert torch.equal(p[8], torch.zeros(n, dtype=dtype))
    assert p[9, -1] == 1 and not p[9, :-1].any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", [1.0001, 1.3, 1.7, 2.0])
def test_size_one_and_bad_rows(dtype, alpha):
    one = native.forward(entmax_family(alpha), torch.tensor([[3.0], [-7.5]], dtype=dtype), 1)
    assert torch.equal(one, torch.ones(2, 1, dtype=dtype))
    x = torch.tensor([[0.0, float("nan"), 1.0], [float("inf"), 0.0, 1.0]], dtype=dtype)
    assert bool(torch.isnan(native.forward(entmax_family(alpha), x, 1)).all())


@pytest.mark.parametrize("alpha", [1.05, 1.3, 1.7])
def test_public_map_on_native_matches_oracle(rng, alpha):
    """softk.entmax under the native backend: the route the kernel serves."""
    x = torch.tensor(rng.normal(size=(16, 1024)), dtype=torch.float32)
    with softk.use_backend("native"):
        p = softk.entmax(x, alpha=alpha)
    ref = _reference(x.double().numpy(), alpha)
    np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=2e-6)


@pytest.mark.parametrize("alpha", [1.01, 1.1, 1.2, 1.3, 1.45, 1.6, 1.8, 1.99, 2.0])
def test_early_stop_keeps_p_to_rounding(rng, alpha):
    """Normal rows of 1024 in float64, where Newton mostly stops on its
    predicted error and writes p to second order from the round before:
    every p within a few ulps of the oracle's plus 1e-14 (tighter than the
    tolerance above, so a stop a round too early would show)."""
    x = torch.tensor(rng.normal(size=(32, 1024)), dtype=torch.float64)
    p = native.forward(entmax_family(alpha), x, 1).numpy()
    ref = _reference(x.numpy(), alpha)
    q = 1.0 / (alpha - 1.0)
    np.testing.assert_allclose(p, ref, rtol=64 * q * 2.0**-52, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", [1.49, 1.499, 1.4999])
def test_two_level_rows_where_halley_lands_past_the_top(dtype, alpha):
    # q = 1/(α−1) just above 2: R = Σw^{q−2} is about the candidates' count
    # and Halley's step nearly doubles Newton's, landing past the row's top
    # entry (G = S = 0); the solve took that for the root and wrote p = 0
    # everywhere (Σp = 0).  It now goes back to its last lower bound.
    for n, ones in ((129, 70), (160, 97), (300, 200), (511, 400)):
        x = torch.zeros(3, n, dtype=dtype)
        x[0, :ones] = 1.0
        x[1, n - ones:] = 1.0
        x[2] = torch.arange(n) % 3  # small integers: three levels
        p = _check(x, alpha)
        np.testing.assert_allclose(p.double().sum(-1).numpy(), np.ones(3), rtol=0,
                                   atol=64 * float(torch.finfo(dtype).eps))


@pytest.mark.parametrize("alpha", [1.125, 1.15, 1.2])
def test_double_rows_sum_to_one_after_a_halley_overshoot(alpha):
    # Halley's first step overshoots the root by a little (1.7e-6 on a row of
    # 1102 at α = 1.125), and Newton's step back was written as final
    # because the third-order write is exact for so short a step; but
    # Newton's step from the right misses the root by about |h''/2h'|·step²
    # (1e-13 there): Σp − 1 reached 468 ulps.  λ's own error moves Σp by
    # S·δλ, a few ulps of 1 at a λ exact to rounding (Σp = 1 is the equation
    # solved: no oracle needed).
    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(257, 1200))
        x = torch.tensor(rng.standard_normal((4, n)) * rng.choice([1, 3.33, 10]), dtype=torch.float64)
        p = native.forward(entmax_family(alpha), x, 1)
        np.testing.assert_allclose(p.sum(-1).numpy(), np.ones(4), rtol=0, atol=32 * EPS64)


@pytest.mark.parametrize("alpha", [1.01, 1.3, 1.5, 1.7])
def test_double_rows_of_equal_entries_are_uniform(alpha):
    # p = 1/n on every entry of a row of 32768 equal ones: G summed over
    # the candidates, n/8 terms a vector lane in double, put p off by up to
    # 350 ulps (α = 1.7); G in blocks of 256 is within a few
    n = 32768
    x = torch.full((2, n), 0.5, dtype=torch.float64)
    x[1, ::2] = -torch.inf  # half of them masked
    p = native.forward(entmax_family(alpha), x, 1)
    want = np.stack([np.full(n, 1 / n), np.where(np.arange(n) % 2 == 1, 2 / n, 0.0)])
    np.testing.assert_allclose(p.numpy(), want, rtol=32 * EPS64, atol=0)


def _mixed_rows(rng, n):
    """Rows whose solves take different numbers of rounds and stages, in an
    order that puts each kind beside the others: N(0, 1), peaked (× 100),
    nearly flat (× 0.01), a large offset, −inf masks, one dominant entry
    over many tiny ones, fully masked, NaN, and a row of one finite entry."""
    inf = np.inf
    rows = [rng.normal(size=n), rng.normal(size=n) * 100, rng.normal(size=n) * 0.01, rng.normal(size=n) + 1e5,
            np.where(rng.random(n) < 0.5, -inf, rng.normal(size=n)), np.r_[30.0, rng.normal(size=n - 1) * 1e-3],
            np.full(n, -inf), np.r_[np.nan, rng.normal(size=n - 1)], np.r_[2.0, np.full(n - 1, -inf)]]
    return np.stack([rows[i] for i in rng.permutation(len(rows))])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("alpha", [1.001, 1.15, 1.3, 1.5, 1.7, 2.0])
def test_rows_solved_together_give_each_row_its_own_answer(rng, dtype, alpha):
    """The row kernel (rows over 256 entries) solves several rows at once,
    their rounds in turn: every batch size, each row's kind beside every
    other, must give each row exactly (bit for bit) what it gets alone, and
    that within the oracle's tolerance."""
    fam = entmax_family(alpha)
    for n in (257, 1024, 1029, 4100):  # 4100: past ALPHA_VALS_MAX, the rows keep their indices
        x = torch.tensor(_mixed_rows(rng, n), dtype=dtype)
        alone = torch.cat([native.forward(fam, x[i : i + 1], 1) for i in range(len(x))])
        bits = torch.int64 if dtype == torch.float64 else torch.int32
        for size in range(1, len(x) + 1):
            got = torch.cat([native.forward(fam, x[r : r + size], 1) for r in range(0, len(x), size)])
            assert torch.equal(got.view(bits), alone.view(bits)), (n, size)
        ok = ~torch.isnan(x).any(-1)
        ref = _reference(x[ok].double().numpy(), alpha)
        np.testing.assert_allclose(alone[ok].double().numpy(), ref, rtol=0, atol=_tol(dtype, alpha))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.9, 1.99, 1.999])
def test_rows_of_equal_entries_near_two_sum_to_one(dtype, alpha):
    # every entry in the support with p = 1/n: |λ| and each v − λ are about
    # n^(1−α) (3e-5 at n = 32768), and the solve stopped at a step of 4 eps
    # in absolute terms: Σp was off by thousands of ulps (7e-4 in float32
    # at n = 32768, α = 1.999; 2.9e-13 in float64 at 16384, α = 1.99).  Where
    # the support's spread is below 1/64 the tolerance scales with it; now
    # within 16 ulps
    eps = torch.finfo(dtype).eps
    for n in (300, 513, 4096, 5000, 16384, 32768):
        x = torch.full((3, n), 0.37, dtype=dtype)
        x[1] += 1e3
        x[2] = torch.linspace(0, 1e-6, n, dtype=dtype)  # near-equal
        with softk.use_backend("native"):
            p = softk.entmax(x, alpha=alpha)
        assert float((p.double().sum(-1) - 1).abs().max()) <= 16 * eps, n
