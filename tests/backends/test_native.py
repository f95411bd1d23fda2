"""The compiled CPU kernels (softk._backends.native) against the NumPy float64 oracle.

The oracle bisects g(λ) = Σ f(z − λ) = k to adjacent floats, independently of
the kernels' Newton/closed-form solvers.  Rows are chosen to stress them:
supports that shrink many times, ties at the threshold, a dominant entry for
"exp", masks, saturated and NaN rows, huge offsets, every width up to 70,001.
Outputs are pre-filled with NaN (``nan_outputs``) so an element the kernel
forgets to write cannot pass.
"""

import math
import os
import sys

import numpy as np
import pytest
import torch

import softk
from softk._backends import native
from softk.threshold import ENTMAX15, EXP, SOFTMAX, SPARSEMAX, entmax_family

from .. import safety_net
from ..oracle import maps as oracle

pytestmark = pytest.mark.skipif(not softk._backends.registry.native_available(), reason="needs a C compiler")

ALPHAS = [1.05, 1.2, 1.3, 1.7, 1.9]
EPS32 = float(np.finfo(np.float32).eps)
TOL = {torch.float64: 1e-12, torch.float32: 2e-6}


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    monkeypatch.setattr(native, "_empty", lambda like: torch.full_like(like, float("nan")))


def _families():
    fams = [("softmax", SOFTMAX), ("sparsemax", SPARSEMAX), ("entmax15", ENTMAX15), ("exp", EXP)]
    return fams + [(f"entmax{a}", entmax_family(a)) for a in ALPHAS]


def _oracle_f(name):
    if name == "sparsemax":
        return oracle._f_relu
    if name == "entmax15":
        return oracle._f_entmax(1.5)
    if name == "exp":
        return oracle._f_exp
    return oracle._f_entmax(float(name[len("entmax"):]))


def reference(name, x, k):
    """The oracle map along the last dimension (any k, including the uncapped families)."""
    if name == "softmax":
        return oracle._apply(lambda r: oracle._row_map(np.exp, r, k, lambda z: oracle._lse(z) - math.log(k)), x, -1)
    return oracle._apply(lambda r: oracle._row_map(_oracle_f(name), r, k), x, -1)


def _check(p, ref, dtype, scale=1.0):
    np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=TOL[dtype] * max(1.0, scale))


def _ks(name, n):
    if name.startswith("entmax") or name == "softmax":
        return [1] if name != "softmax" else [1, 3]
    return [k for k in (1, 2, 5, 64) if k < n]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name,family", _families())
@pytest.mark.parametrize("n", [2, 3, 17, 300, 4099])
def test_random_rows_against_oracle(rng, dtype, name, family, n):
    for scale in (0.1, 1.0, 10.0):
        x = torch.tensor(rng.normal(size=(5, n)) * scale, dtype=dtype)
        for k in _ks(name, n):
            p = native.forward(family, x, k)
            _check(p, reference(name, x.double().numpy(), k), dtype)


@pytest.mark.parametrize("name,family", _families())
def test_hard_rows_against_oracle(name, family):
    """Ties at the top and at the threshold, geometric spreads (the support
    shrinks once per Newton round), masks, a dominant entry, huge offsets."""
    n = 257
    geo = -np.geomspace(1e-3, 50.0, n)
    rows = [
        np.zeros(n),  # all tied
        np.r_[np.full(5, 3.0), np.zeros(n - 5)],  # ties at the top
        geo,
        geo[::-1].copy(),
        np.linspace(-1.0, 0.0, n),
        np.r_[100.0, np.zeros(n - 1)],  # saturated entry dominates "exp"
        np.r_[100.0, 100.0, 99.0, np.zeros(n - 3)],
        np.r_[np.full(n - 3, -np.inf), 0.0, 1.0, 2.0],  # masks
        np.where(np.arange(n) % 2 == 0, -np.inf, np.linspace(-2, 2, n)),
        np.linspace(-2.0, 2.0, n) + 1e6,  # large offset: tolerances are relative to the spread
    ]
    x = torch.tensor(np.stack(rows))
    # The maps are shift invariant and z − max(z) is exact here (Sterbenz), so the
    # oracle bisects on the shifted rows: at an offset of 1e6 its own bisection
    # on z − λ would be limited to ulp(1e6) ≈ 1e-10.
    top = np.max(np.where(np.isfinite(x.numpy()), x.numpy(), -np.inf), axis=1, keepdims=True)
    shifted = x.numpy() - top
    for k in _ks(name, n):
        _check(native.forward(family, x, k), reference(name, shifted, k), torch.float64)


@pytest.mark.parametrize("name,family", [("sparsemax", SPARSEMAX), ("entmax15", ENTMAX15)])
@pytest.mark.parametrize("n", [300, 1024, 8192])
def test_wide_support_far_below_the_max_sums_to_k(name, family, n):
    # one entry at ½ and the rest about 1e-4: every entry in the support, λ
    # near −½ in the frame of the max, where an ulp of λ (6e-8) reaches each
    # of n entries of about 1e-4: sparsemax's Σp was off by 1e-4 at 1024 and
    # 3.7e-4 at 8192 (rows of up to 256 entries, solved sixteen at a time,
    # keep that frame).  Solved again in the frame of the threshold, Σp is
    # within a few ulps of k; each p is
    # within a few ulps of the max's frame (an entry within that of λ may
    # have left the candidates before the second solve)
    rng = np.random.default_rng(n)
    x = rng.normal(size=(20, n)) * 1e-4
    x[:, 7] = 0.5
    x[5] *= 1e4  # a row of N(0, 1): kept in the frame of the max
    for k in (1, 2):
        xt = torch.tensor(x, dtype=torch.float32)
        p = native.forward(family, xt, k)
        np.testing.assert_allclose(p.double().sum(-1).numpy(), np.full(20, k), rtol=0, atol=16 * EPS32 * k)
        ref = reference(name, xt.double().numpy(), k)
        np.testing.assert_allclose(p.double().numpy(), ref, rtol=16 * EPS32, atol=4 * EPS32 * 0.5)


def test_sparsemax_tie_exactly_at_the_threshold():
    # An entry exactly at λ (p = 0 there): the support test must not stall on it.
    x = torch.tensor([[1.5, 0.5, 0.0, -3.0]], dtype=torch.float64)  # λ = 0.5, p = (1, 0, 0, 0)
    ref = reference("sparsemax", x.numpy(), 1)
    _check(native.forward(SPARSEMAX, x, 1), ref, torch.float64)
    y = torch.tensor([[1.0, 1.0, 0.0, -1.0]], dtype=torch.float64)  # k = 1: λ = 0.5; k = 2: λ = 0
    for k in (1, 2):
        _check(native.forward(SPARSEMAX, y, k), reference("sparsemax", y.numpy(), k), torch.float64)


@pytest.mark.parametrize("name,family", _families())
def test_row_conventions(name, family):
    inf, nan = float("inf"), float("nan")
    x = torch.tensor(
        [
            [0.0, nan, 1.0, 2.0],
            [inf, 0.0, 1.0, 2.0],
            [-inf, -inf, -inf, -inf],
            [-inf, 0.5, -inf, -inf],
            [1.0, 2.0, 3.0, 4.0],
        ],
        dtype=torch.float64,
    )
    p = native.forward(family, x, 1)
    assert bool(torch.isnan(p[:2]).all())
    assert torch.equal(p[2], torch.zeros(4, dtype=torch.float64))
    assert torch.equal(p[3], torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64))
    _check(p[4:], reference(name, x[4:].numpy(), 1), torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n", [32, 33, 64, 100, 1024])
@pytest.mark.parametrize("name,family", [f for f in _families() if f[0] != "softmax"])
def test_row_conventions_at_every_position(name, family, n, dtype):
    """The row scan's NaN, +inf and finite-count checks at each position of a
    row long enough to hold whole blocks (and a partial one for n = 33, 100):
    one NaN or +inf anywhere makes the row NaN, a row with k = 1 finite
    entry anywhere gets 1 on it, and one with two finite entries is solved
    (an entry the count missed would give 1 on both)."""
    positions = sorted({0, 1, 15, 16, 31, n // 2, n - 2, n - 1} & set(range(n)))
    rows, expect = [], []
    for i in positions:
        for bad in (float("nan"), float("inf")):
            r = torch.linspace(-1, 1, n, dtype=dtype)
            r[i] = bad
            rows.append(r)
            expect.append(torch.full((n,), float("nan"), dtype=dtype))
        r = torch.full((n,), float("-inf"), dtype=dtype)
        r[i] = 0.25
        rows.append(r)
        expect.append(torch.where(torch.arange(n) == i, 1.0, 0.0).to(dtype))
        r = r.clone()
        r[(i + n // 3) % n] = 0.0
        rows.append(r)
        expect.append(torch.tensor(reference(name, r[None].double().numpy(), 1)[0], dtype=dtype))
    p = native.forward(family, torch.stack(rows), 1)
    torch.testing.assert_close(p, torch.stack(expect), rtol=0, atol=TOL[dtype], equal_nan=True)


def test_wide_row_beyond_65536(rng):
    x = torch.tensor(rng.normal(size=(2, 70_001)) * 3)
    for name, family in _families()[:4]:
        k = 64 if name == "exp" else 1
        _check(native.forward(family, x, k), reference(name, x.numpy(), k), torch.float64)


def test_solver_rounds_stay_few(rng):
    """The λ solvers finish in a few rounds on ordinary rows (a regression to
    bisection-like behaviour, ~50 rounds, fails here).  Rounds are counted
    over both solves of the zero-below families (block maxima, then the
    candidates); on this data (float64): sparsemax 5, entmax15 6, entmax α 5–9, exp 2."""
    x = torch.tensor(rng.normal(size=(64, 1024)))
    limits = {"softmax": 1, "sparsemax": 8, "entmax15": 10, "exp": 3}
    for name, family in _families():
        k = 64 if name == "exp" else 1
        _, rounds = native.forward(family, x, k, return_iters=True)
        assert rounds <= limits.get(name, 16), (name, rounds)


@pytest.mark.parametrize("alpha", [1.15, 1.3])
def test_alpha_rows_take_three_rounds(alpha):
    """A float α-entmax row of 1024 N(0, 1) entries: one round on the block
    maxima, then two on its candidates, the first with rough powers whose
    step is pulled back by their error bound, the second landing on λ and
    writing p.  A pull-back far larger than the error (which costs the
    second round its last-step status) leaves no row at three."""
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))
    family = entmax_family(alpha)
    rounds = [native.forward(family, x[i : i + 1], 1, return_iters=True)[1] for i in range(64)]
    assert min(rounds) == 3 and sum(r == 3 for r in rounds) >= 0.8 * len(rounds), rounds


def test_threads_do_not_change_results(rng):
    x = torch.tensor(rng.normal(size=(257, 600)), dtype=torch.float32)
    g = torch.randn(257, 600, dtype=torch.float32)
    before = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            p = native.forward(ENTMAX15, x, 1)
            outs.append((p, native.backward(ENTMAX15, p, g, 0.7)))
    finally:
        torch.set_num_threads(before)
    for p, d in outs[1:]:
        assert torch.equal(p, outs[0][0]) and torch.equal(d, outs[0][1])


@pytest.mark.parametrize("name,family", _families())
def test_backward_against_oracle_jacobian(rng, name, family):
    """vjp from the kernels = gᵀ J with J the oracle's central-difference Jacobian."""
    k = 2 if name in ("exp", "sparsemax") else 1
    for _ in range(3):
        row = rng.normal(size=9) * 1.5
        g = rng.normal(size=9)
        jac = oracle.numerical_jacobian(lambda r: reference(name, r[None], k)[0], row, eps=1e-6)
        p = native.forward(family, torch.tensor(row[None]), k)
        for tau in (1.0, 0.5):
            got = native.backward(family, p, torch.tensor(g[None]), tau)[0].numpy()
            np.testing.assert_allclose(got, g @ jac / tau, rtol=0, atol=2e-6)


def test_gradcheck_through_the_public_maps(rng):
    x = torch.tensor(rng.normal(size=(3, 11)), requires_grad=True)
    with softk.use_backend("native"):
        for fn in (
            lambda v: softk.sparsemax(v, tau=0.7),
            lambda v: softk.entmax15(v),
            lambda v: softk.entmax(v, 1.3),
            lambda v: softk.soft_topk(v, 3, tau=1.3),
        ):
            assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-6)


def test_half_inputs_and_every_dim(rng):
    xn = rng.normal(size=(3, 40, 5))
    with softk.use_backend("native"):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            x = torch.tensor(xn, dtype=dtype)
            for dim in (0, 1, 2, -1):
                p = softk.entmax15(x, dim=dim)
                assert p.dtype == dtype
                ref = oracle.entmax(x.double().numpy(), 1.5, dim)
                tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3, torch.float32: 2e-6}[dtype]
                np.testing.assert_allclose(p.double().numpy(), ref, rtol=0, atol=tol)


def test_uncovered_families_run_on_torch_under_native():
    assert native.family_id(entmax_family(2.6)) is None
    assert native.family_id(entmax_family(torch.tensor([[1.3]]))) is None
    x = torch.tensor([[0.0, 1.0, 3.0]], dtype=torch.float64)
    with softk.use_backend("native"):
        p = softk.entmax(x, 2.6)
    np.testing.assert_allclose(p.numpy(), oracle.entmax(x.numpy(), 2.6), rtol=0, atol=1e-12)


def _run(code, **env):
    full = {**os.environ, **env}
    return safety_net.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def test_disabled_or_missing_compiler_falls_back_to_torch(tmp_path):
    code = ("import torch, softk\nfrom softk._backends import dispatch\n"
            "print(dispatch.pick('threshold', torch.zeros(2), softk.families.SPARSEMAX).backend)")
    r = _run(code, SOFTK_NATIVE="0")
    assert r.returncode == 0 and r.stdout.strip() == "torch", r.stderr
    r = _run(code, SOFTK_CC="no-such-cc", SOFTK_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0 and r.stdout.strip() == "torch", r.stderr
    assert "compiled CPU kernels unavailable (no C compiler 'no-such-cc' on PATH)" in r.stderr
    r = _run("import torch, softk\nwith softk.use_backend('native'):\n    pass", SOFTK_NATIVE="0")
    assert r.returncode != 0 and "name='native': that backend cannot run on this machine" in r.stderr


@pytest.mark.slow
def test_cache_is_built_once_per_key(tmp_path):
    code = "import torch, softk\nprint(float(softk.sparsemax(torch.tensor([0.0, 1.0, 5.0]))[2]))"
    for _ in range(2):
        r = _run(code, SOFTK_CACHE_DIR=str(tmp_path))
        assert r.returncode == 0 and r.stdout.strip() == "1.0", r.stderr
    assert len(list(tmp_path.glob("kernels-*.so"))) == 1


def test_forked_child_with_one_thread_runs():
    """A forked child running one thread (what DataLoader workers do) computes the
    same result.  Like torch's own CPU ops, which share the same OpenMP runtime,
    a child that asks for several threads after the parent used them hangs
    (GNU libgomp is not fork-safe); that is torch's rule, not softk's."""
    code = (
        "import os, torch, softk\n"
        "torch.set_num_threads(2)\n"
        "x = torch.randn(256, 512)\n"
        "p = softk.sparsemax(x)\n"  # the parent's OpenMP threads now exist
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    torch.set_num_threads(1)\n"
        "    q = softk.sparsemax(x)\n"
        "    os._exit(0 if torch.equal(p, q) else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
    )
    r = _run(code)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_out_takes_the_result(dtype, rng):
    """``out`` receives p (and the backward's dx) in place, equal to a fresh
    call's; a buffer of another shape, dtype or layout is refused by name."""
    x = torch.tensor(rng.normal(size=(6, 300)), dtype=dtype)
    g = torch.tensor(rng.normal(size=(6, 300)), dtype=dtype)
    for name, family in _families():
        out = torch.full_like(x, float("nan"))
        p = native.forward(family, x, 1, out=out)
        assert p.data_ptr() == out.data_ptr()
        _check(p, reference(name, x.double().numpy(), 1), dtype)
        dx = torch.full_like(x, float("nan"))
        assert native.backward(family, p, g, 1.0, out=dx).data_ptr() == dx.data_ptr()
        torch.testing.assert_close(dx, native.backward(family, p, g, 1.0), rtol=0, atol=0)
    for bad in (torch.empty(6, 299, dtype=dtype), torch.empty(6, 300, dtype=torch.float16),
                torch.empty(300, 6, dtype=dtype).t()):
        with pytest.raises(ValueError, match="out must be a contiguous CPU tensor of shape"):
            native.forward(SPARSEMAX, x, 1, out=bad)


def test_rows_longer_than_int32_go_elsewhere():
    """The kernels index a sparse row's candidates with int32: a row of more
    than 2**31 - 1 entries is refused by the entry points (status -3, before
    any memory is touched) and by ``serves``, so the dispatcher sends it to
    the tensor code; softmax and "exp" keep no indices and take it."""
    from softk._backends.native import build, threshold

    n = 2**31
    lib = build.library()
    for suffix in ("f32", "f64"):
        for fam in (1, 2, 3):
            assert getattr(lib, f"softk_forward_threads_{suffix}")(fam, None, None, 0, n, 1.0, 1.5, None, 1) == -3
            assert getattr(lib, f"softk_fy_loss_threads_{suffix}")(
                fam, None, None, None, None, None, None, None, 0, n, 1.0, 1.5, 1.0, -100, 1, -1.0, 0, 1) == -3
        assert getattr(lib, f"softk_forward_threads_{suffix}")(1, None, None, 0, n - 1, 1.0, 1.5, None, 1) == 0
    empty = torch.empty(0, n)  # no memory: a shape to ask about
    for family in (SPARSEMAX, ENTMAX15, entmax_family(1.3)):
        assert "at most 2**31 - 1" in threshold.serves(empty, family)
        assert threshold.serves(torch.empty(0, n - 1), family) is None
    assert threshold.serves(empty, SOFTMAX) is None and threshold.serves(empty, EXP) is None
