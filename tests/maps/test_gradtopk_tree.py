"""GradTopK's two algorithms, each forced on the same inputs: the tree of log-space
polynomial products (softk._backends.gradtopk.tree) and the sequential scan
(softk._backends.gradtopk.scan), against the mpmath oracle (tests/oracle_topk.py), the
subset enumeration and each other, forward, backward and log e_k."""

import math

import mpmath
import numpy as np
import pytest
import torch

import softk
from softk._ops import gradtopk

from ..oracle import topk as ref

ALGORITHMS = ("scan", "tree")
INF = float("inf")


def _run(algorithm, fn, monkeypatch):
    monkeypatch.setattr(gradtopk, "ALGORITHM", algorithm)
    return fn()


def _grad(x, k, tau=1.0, dim=-1):
    return softk.soft_topk(x, k, dim=dim, tau=tau, method="grad")


def _nan_like(a):
    return np.full_like(a, np.nan)


# ------------------------------------------------------------ the oracle grid

_GRID = [(1, [1]), (2, [1, 2]), (3, [1, 2, 3]), (7, list(range(1, 8))), (64, list(range(1, 65)))]
_GRID += [(300, [1, 2, 3, 31, 32, 33, 100, 255, 256, 257, 299, 300])]


@pytest.mark.parametrize("n,ks", _GRID, ids=[f"n{n}" for n, _ in _GRID])
@pytest.mark.slow
def test_both_algorithms_match_mpmath_for_every_k(rng, monkeypatch, n, ks):
    x = rng.normal(size=(2, n)) * 3
    x[1, ::5] = -INF  # masked entries (row 1 has fewer finite entries: the m <= k convention too)
    xt = torch.tensor(x)
    for k in ks:
        expect = ref.gradtopk(x, k)
        for algorithm in ALGORITHMS:
            out = _run(algorithm, lambda: _grad(xt, k).numpy(), monkeypatch)
            # relative: the tails e^-40 carry as many digits as p ~ 1/2
            np.testing.assert_allclose(out, expect, rtol=1e-10, atol=0, err_msg=f"{algorithm} n={n} k={k}")


def test_forced_algorithm_is_the_one_that_runs(monkeypatch):
    calls = []
    for name in ALGORITHMS:
        real = gradtopk.ALGORITHMS[name]
        monkeypatch.setitem(gradtopk.ALGORITHMS, name, lambda *a, _n=name, _f=real: calls.append(_n) or _f(*a))
    x = torch.randn(3, 40, dtype=torch.float64)
    for algorithm in ALGORITHMS:
        calls.clear()
        _run(algorithm, lambda: _grad(x, 4), monkeypatch)
        assert calls == [algorithm]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_ties_masks_and_degenerate_rows(monkeypatch, algorithm):
    x = np.array(
        [
            [2.0] * 9,  # all tied: p = k/n
            [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, -1.0, -1.0, 5.0],  # blocks of ties
            [1.0, -INF, 2.0, 0.5, -INF, 0.5, -INF, 3.0, -INF],  # masked entries: the polynomial 1
            [-INF, -INF, 3.0, -INF, 1.0, -INF, -INF, 0.0, -INF],  # m = k finite: p = 1 there
            [-INF] * 9,  # fully masked: zeros
            [-INF, 4.0] + [-INF] * 7,  # fewer finite entries than k
        ]
    )
    out = torch.full((6, 9), float("nan"), dtype=torch.float64)
    out[:] = _run(algorithm, lambda: _grad(torch.tensor(x), 3), monkeypatch)
    np.testing.assert_allclose(out.numpy(), ref.gradtopk(x, 3), rtol=1e-12, atol=0)
    np.testing.assert_allclose(out[0].numpy(), np.full(9, 3 / 9), rtol=1e-14, atol=0)
    np.testing.assert_allclose(out[1].numpy(), ref.gradtopk_brute(x[1], 3), rtol=1e-12, atol=0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("offset", [1e4, -1e4, 1e6])
def test_far_from_origin(rng, monkeypatch, algorithm, offset):
    x = rng.normal(size=(3, 50)) * 2 + offset
    for k in (1, 7, 49):
        out = _run(algorithm, lambda: _grad(torch.tensor(x), k, tau=0.5).numpy(), monkeypatch)
        # the oracle sees the same float64 inputs; the shift by the (k+1)-th largest is exact
        np.testing.assert_allclose(out, ref.gradtopk(x, k, tau=0.5), rtol=1e-10, atol=0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("scale,n,k", [(30.0, 100, 50), (1e3, 60, 20), (0.01, 300, 150)])
def test_scales_match_mpmath(rng, monkeypatch, algorithm, scale, n, k):
    x = rng.normal(size=(2, n)) * scale
    out = _run(algorithm, lambda: _grad(torch.tensor(x), k).numpy(), monkeypatch)
    expect = ref.gradtopk(x, k)
    # entries clamped at T above the (k+1)-th are off by at most 2nk·e^-130 (absolute)
    np.testing.assert_allclose(out, expect, rtol=1e-10, atol=2 * n * k * math.exp(-130))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_outliers_and_the_documented_floor(monkeypatch, algorithm):
    def run():
        rows = [_grad(torch.tensor([v, 0.0, 1.0], dtype=torch.float64), 2) for v in (1e12, 1e16, 1e300)]
        tiny = _grad(torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64), 1, tau=1e-300)
        return torch.stack(rows).numpy(), tiny.numpy()

    rows, tiny = _run(algorithm, run, monkeypatch)
    for row in rows:
        np.testing.assert_allclose(row, [1, 0.2689414213699951, 0.7310585786300049], rtol=1e-13, atol=0)
    np.testing.assert_allclose(tiny, [1, 0, 0], rtol=0, atol=2 * 3 * 1 * math.exp(-130))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_float32_matches_mpmath_of_its_own_values(rng, monkeypatch, algorithm):
    x32 = torch.tensor(rng.normal(size=(3, 300)) * 4, dtype=torch.float32)
    x32[1, :17] = -INF
    x32[2] = -INF  # fully masked
    for k in (1, 32, 200):
        out = _run(algorithm, lambda: _grad(x32, k), monkeypatch)
        assert out.dtype == torch.float32
        expect = ref.gradtopk(x32.double().numpy(), k)
        # float64 inside, one rounding to float32 at the end (tails may go subnormal)
        np.testing.assert_allclose(out.double().numpy(), expect, rtol=2**-23, atol=1e-44)


# ---------------------------------------------------------------- the algorithms agree


@pytest.mark.parametrize("n,k", [(5, 2), (33, 8), (128, 31), (300, 37), (257, 256)])
def test_algorithms_agree_forward_backward_and_log_ek(rng, monkeypatch, n, k):
    x = rng.normal(size=(4, n)) * 5
    x[1, ::3] = -INF
    g = torch.tensor(rng.normal(size=(4, n)))

    def run():
        xt = torch.tensor(x, requires_grad=True)
        p = _grad(xt, k)
        (hg,) = torch.autograd.grad(p, xt, g)
        return p.detach(), hg, softk.topk_sum(torch.tensor(x), k, method="grad")

    scan, tree = (_run(r, run, monkeypatch) for r in ALGORITHMS)
    # p relative (tails included); H g absolute (it ends in g + dc − <p, g>,
    # a difference of O(1) terms); log e_k relative
    for a, b, rtol, atol in zip(scan, tree, (1e-10, 0, 1e-13), (0, 3e-11, 0)):
        assert torch.isfinite(a).all() and torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=rtol, atol=atol)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_log_ek_matches_mpmath(rng, monkeypatch, algorithm):
    x = rng.normal(size=(3, 70)) * 4
    x[2, :30] = -INF
    out = _run(algorithm, lambda: softk.topk_sum(torch.tensor(x), 9, tau=0.5, method="grad").numpy(), monkeypatch)
    for r in range(3):
        row = x[r][np.isfinite(x[r])]
        _, log_ek = ref.gradtopk_row_mp(row, 9, tau=0.5)
        np.testing.assert_allclose(out[r], 0.5 * float(log_ek), rtol=1e-13, atol=0)


def _marginals_mp(w, k):
    """GradTopK marginals of mpf weights w (n > k) from the oracle's tables."""
    n = len(w)
    pre, suf = ref._esp_tables(w, k), ref._esp_tables(w[::-1], k)[::-1]
    return [w[i] * mpmath.fsum(pre[i][a] * suf[i + 1][k - 1 - a] for a in range(k)) / pre[n][k] for i in range(n)]


def _hvp_mp(row, g, k, tau):
    """H g / τ (the backward of p along g) by a central difference in mpmath at
    80 digits with step 1e-30: truncation ~1e-60, rounding ~1e-50."""
    out = np.zeros(len(row))
    fin = np.flatnonzero(np.isfinite(row))
    if fin.size <= k:
        return out
    with mpmath.workdps(80):
        eps = mpmath.mpf(10) ** -30

        def at(s):
            return _marginals_mp([mpmath.exp((mpmath.mpf(row[i]) + s * mpmath.mpf(g[i])) / tau) for i in fin], k)

        for i, a, b in zip(fin, at(eps), at(-eps)):
            out[i] = float((a - b) / (2 * eps))
    return out


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n,k,scale", [(100, 50, 30.0), (128, 31, 5.0), (40, 33, 3.0)])
def test_backward_matches_mpmath(rng, monkeypatch, algorithm, n, k, scale):
    x = rng.normal(size=(2, n)) * scale
    x[1, ::7] = -INF
    g = rng.normal(size=(2, n))

    def run():
        xt = torch.tensor(x, requires_grad=True)
        return torch.autograd.grad(_grad(xt, k, tau=0.8), xt, torch.tensor(g))[0].numpy()

    expect = np.stack([_hvp_mp(x[r], g[r], k, 0.8) for r in range(2)])
    # measured: the scan 1.4e-11, the tree 6.5e-12 off at n = 100, k = 50, scale 30
    np.testing.assert_allclose(_run(algorithm, run, monkeypatch), expect, rtol=0, atol=3e-11)


# ----------------------------------------------------------------- derivatives


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n,k", [(6, 1), (6, 3), (9, 5), (40, 33)])
@pytest.mark.slow
def test_gradcheck_and_gradgradcheck(rng, monkeypatch, algorithm, n, k):
    monkeypatch.setattr(gradtopk, "ALGORITHM", algorithm)
    x = torch.tensor(rng.normal(size=(2, n)), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _grad(t, k, 0.7), (x,))
    # log e_k's gradient is p, whose derivative is the HVP: a second order exists there
    assert torch.autograd.gradgradcheck(lambda t: softk.topk_sum(t, k, tau=0.7, method="grad"), (x,))
    # and a second derivative of p itself is refused, as documented
    p = _grad(x, k, 0.7)
    (gx,) = torch.autograd.grad(p, x, torch.ones_like(p), create_graph=True)
    with pytest.raises(NotImplementedError, match="first derivatives only"):
        gx.sum().backward()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_jacfwd_jacrev_and_vmap_agree(rng, monkeypatch, algorithm):
    monkeypatch.setattr(gradtopk, "ALGORITHM", algorithm)
    x = torch.tensor(rng.normal(size=(3, 8)) * 2)
    x[0, 2] = -INF
    fwd = torch.func.vmap(torch.func.jacfwd(lambda t: _grad(t, 3)))(x)
    rev = torch.func.vmap(torch.func.jacrev(lambda t: _grad(t, 3)))(x)
    torch.testing.assert_close(fwd, rev, rtol=0, atol=1e-14)
    torch.testing.assert_close(fwd, fwd.transpose(-1, -2), rtol=0, atol=1e-14)  # H symmetric
    assert (fwd[0, 2] == 0).all() and (fwd[0, :, 2] == 0).all()  # masked entry: no gradient


# ------------------------------------------------------------------ the tree itself


def test_cpu_blocks_give_the_same_products(rng, monkeypatch):
    from softk._backends.gradtopk import tree as gradtopk_tree

    z = torch.tensor(rng.normal(size=(5, 300)) * 4)
    z[2, ::4] = -INF
    g = torch.tensor(rng.normal(size=(5, 300)))
    whole = gradtopk_tree.solve_tree(z, 40, g)
    monkeypatch.setattr(gradtopk_tree, "_CPU_BLOCK", 97)  # many ragged blocks of rows x nodes
    for a, b in zip(whole, gradtopk_tree.solve_tree(z, 40, g)):
        torch.testing.assert_close(b, a, rtol=1e-15, atol=0)


def test_algorithm_choice(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert gradtopk.algorithm(8, 4096, 256, cuda) == "tree"
    assert gradtopk.algorithm(256, 1024, 8, cuda) == "tree"
    assert gradtopk.algorithm(8, 4096, 256, cpu) == "tree"  # k >= 32
    assert gradtopk.algorithm(8, 4096, 2, cpu) == "tree"  # few rows: the scan is overhead-bound
    assert gradtopk.algorithm(16, 100, 31, cpu) == "tree"
    assert gradtopk.algorithm(17, 100, 31, cpu) == "scan"
    assert gradtopk.algorithm(256, 1024, 8, cpu) == "scan"
    assert gradtopk.algorithm(256, 1024, 32, cpu) == "tree"
    monkeypatch.setattr(gradtopk, "ALGORITHM", "scan")
    assert gradtopk.algorithm(8, 4096, 256, cuda) == "scan"
    monkeypatch.setattr(gradtopk, "ALGORITHM", "sideways")
    with pytest.raises(ValueError, match="ALGORITHM"):
        gradtopk.algorithm(8, 4096, 256, cpu)
