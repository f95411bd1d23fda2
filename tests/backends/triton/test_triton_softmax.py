"""The softmax kernels (softk._backends.triton.softmax, through the CPU interpreter)
against an independent NumPy float64 reference: softmax, log_softmax and
logsumexp forward and backward, on the single-read and the looped variants,
many rows per program with a ragged last program, -inf masks, fully masked
rows, NaN/+inf rows among normal rows of the same program, offsets up to
1e6, τ = 1e-3 and 10, float32/bf16/fp16, any dim, 1-D input, double
backward, torch.compile and vmap; and a ptxas build for sm_90."""

import math

import numpy as np
import pytest
import torch

from . import gpu_build

import softk
from softk._backends.triton import softmax as ts

EPS32 = float(np.finfo(np.float32).eps)
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# one ulp of the output dtype, relative: the rounding of the store (the
# interpreter truncates float32 → bfloat16; a GPU rounds to nearest, half that)
EPS = {torch.float32: EPS32, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}
TINY = {torch.float32: 1e-44, torch.bfloat16: 1e-38, torch.float16: 6e-8}  # smallest subnormal, about


# ------------------------------------------------------------- the reference
def ref_rows(x, tau):
    """(p, log p, τ·logsumexp(x/τ)) of each row of float64 x, written from the
    definitions and the row conventions: -inf entries are masked, a fully
    masked row gives p = 0, log p = -inf, lse = -inf; NaN/+inf rows are NaN."""
    x = np.atleast_2d(x)
    p, lp, lse = np.zeros_like(x), np.full_like(x, -np.inf), np.full(x.shape[0], -np.inf)
    for i, row in enumerate(x):
        if np.isnan(row).any() or np.isposinf(row).any():
            p[i], lp[i], lse[i] = np.nan, np.nan, np.nan
            continue
        fin = row > -np.inf
        if not fin.any():
            continue
        z = row[fin] / tau
        lz = z.max() + np.log(np.exp(z - z.max()).sum())
        lp[i, fin] = z - lz
        p[i, fin] = np.exp(z - lz)
        lse[i] = tau * lz
    return p, lp, lse


def _close(got, ref, tol):
    """got (a tensor) equals ref where ref is NaN or ±inf, and lies within the
    per-element tolerance ``tol`` elsewhere."""
    got = got.double().numpy().reshape(ref.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    inf = np.isinf(ref)
    np.testing.assert_array_equal(got[inf], ref[inf])
    ok = np.isfinite(ref)
    err = np.abs(got[ok] - ref[ok])
    bad = err > np.broadcast_to(tol, ref.shape)[ok]
    assert not bad.any(), f"max err {err.max():.3g}, worst {np.argmax(err - np.broadcast_to(tol, ref.shape)[ok])}"


def tol_logp(lp, n, dtype):
    # float32: u = (x − max)/τ and log S carry a few ulps of their size;
    # then the rounding to the output dtype
    a = np.nan_to_num(np.abs(lp), posinf=0.0)
    return 4 * EPS32 * (a + 2 * math.log(n) + 2) + EPS[dtype] * a


def tol_p(p, lp, n, dtype):
    return p * (tol_logp(lp, n, dtype) - EPS[dtype] * np.nan_to_num(np.abs(lp), posinf=0.0)
                + 2 * EPS32 + EPS[dtype]) + TINY[dtype]


def tol_lse(lse, tau, n, dtype):
    return 2 * EPS32 * np.abs(lse) + 4 * EPS32 * tau * (2 * math.log(n) + 2) + EPS[dtype] * np.abs(lse)


def _t(xn, dtype):
    return torch.tensor(xn, dtype=torch.float32).to(dtype)


def _as_input(xn, dtype):
    """The values the kernel reads (rounded to dtype), as float64."""
    return _t(xn, dtype).double().numpy()


@pytest.fixture(autouse=True)
def nan_outputs(monkeypatch):
    """Every output starts as NaN: an element the kernel does not write fails."""
    monkeypatch.setattr(ts, "_new", lambda like, shape=None: torch.full(
        like.shape if shape is None else shape, float("nan"), dtype=like.dtype, device=like.device))


def _rows(rng, n):
    """Normal rows with, between them (so that they share programs), masked
    entries, a fully masked row, NaN and +inf rows, a single finite entry,
    offsets 1e4–1e6, a dominant entry and ties."""
    r = [rng.normal(size=n) * 2 for _ in range(4)]
    r.insert(1, np.full(n, -np.inf))
    r.insert(3, np.where(np.arange(n) == n // 2, np.nan, rng.normal(size=n)))
    r.insert(5, np.where(np.arange(n) == 0, np.inf, rng.normal(size=n)))
    masked = rng.normal(size=n)
    masked[rng.random(n) < 0.5] = -np.inf
    masked[0] = 0.3
    r.append(masked)
    r.append(np.where(np.arange(n) == n - 1, 1.5, -np.inf))
    for off in (1e4, 1e5, 1e6):
        r.append(off + rng.normal(size=n) * 3)
    r.append(np.where(np.arange(n) == n // 3, 50.0, 0.0))
    r.append(np.full(n, 0.7))
    return np.stack(r).astype(np.float32).astype(np.float64)


VARIANTS = {"single": lambda n: None, "loop": lambda n: max(4, ts._pow2(n) // 4)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("n", [1, 2, 5, 16, 64, 300])
@pytest.mark.slow
def test_forward_matches_reference(rng, n, variant, monkeypatch):
    # a small tile: several rows per program (1–16 of the 14 rows) and, for
    # n = 64 (4 per program) and the looped n = 300 (2), several programs,
    # the last one ragged
    monkeypatch.setattr(ts, "TILE", 256)
    block = VARIANTS[variant](n)
    xn = _rows(rng, n)
    for i, dtype in enumerate(DTYPES):
        x = _t(xn, dtype)
        xd = _as_input(xn, dtype)
        for tau in ((1.0, 1e-3, 10.0) if dtype == torch.float32 else ((1e-3, 10.0)[i % 2],)):
            p, lp, lse = ref_rows(xd, tau)
            got_p = ts.softmax_rows(x, tau, block=block)
            got_lp = ts.softmax_rows(x, tau, log=True, block=block)
            got_lse = ts.logsumexp_rows(x, tau, block=block)
            assert got_p.dtype == got_lp.dtype == got_lse.dtype == dtype
            _close(got_p, p, tol_p(p, lp, n, dtype))
            _close(got_lp, lp, tol_logp(lp, n, dtype))
            _close(got_lse, lse, tol_lse(lse, tau, n, dtype))


def test_wide_rows_loop_with_the_default_block(rng):
    # wider than SINGLE_MAX: the looped variant at its own block, an outlier
    # in the last (ragged) block moves the running max late
    n = ts.SINGLE_MAX + 37
    assert not ts.config(n, 2)[0]
    xn = (rng.normal(size=(2, n)) * 3).astype(np.float32).astype(np.float64)
    xn[0, -1] = 40.0
    xn[1, : n // 2] = -np.inf
    p, lp, lse = ref_rows(xn, 0.5)
    x = _t(xn, torch.float32)
    _close(ts.softmax_rows(x, 0.5), p, tol_p(p, lp, n, torch.float32))
    _close(ts.logsumexp_rows(x, 0.5), lse, tol_lse(lse, 0.5, n, torch.float32))


def test_config_heuristic():
    # the documented shape rules (untuned): one read up to SINGLE_MAX, about
    # TILE entries per program for narrow rows, no more rows than exist
    assert ts.config(64, 10**6) == (True, 64, ts.TILE // 64, 4)
    assert ts.config(64, 3) == (True, 64, 4, 1)
    assert ts.config(1, 1) == (True, 4, 1, 1)
    assert ts.config(ts.SINGLE_MAX, 9) == (True, ts.SINGLE_MAX, 1, 16)
    assert ts.config(ts.SINGLE_MAX + 1, 9)[:3] == (False, ts.LOOP_BLOCK, 1)
    assert ts.config(300, 9, block=64)[:3] == (False, 64, 16)


# ------------------------------------------------------------ the public API
def _moved_ref(xn, dim, tau):
    moved = np.moveaxis(xn, dim, -1)
    p, lp, lse = ref_rows(moved.reshape(-1, moved.shape[-1]), tau)
    back = lambda a: np.moveaxis(a.reshape(moved.shape), -1, dim)  # noqa: E731
    return back(p), back(lp), lse.reshape(moved.shape[:-1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_public_functions_any_dim_and_1d(rng, dtype, monkeypatch):
    calls = []
    for name in ("softmax_rows", "logsumexp_rows"):
        fn = getattr(ts, name)
        monkeypatch.setattr(ts, name, lambda *a, _f=fn, _n=name, **k: calls.append(_n) or _f(*a, **k))
    xn = (rng.normal(size=(3, 4, 5)) * 2).astype(np.float32).astype(np.float64)
    xn[1, :, 2] = -np.inf
    x, xd = _t(xn, dtype), _as_input(xn, dtype)
    with softk.use_backend("triton"):
        for dim, tau in ((0, 1.0), (1, 0.5), (-1, 2.0)):
            p, lp, lse = _moved_ref(xd, dim, tau)
            n = xn.shape[dim]
            _close(softk.softmax(x, dim, tau), p, tol_p(p, lp, n, dtype))
            _close(softk.log_softmax(x, dim, tau), lp, tol_logp(lp, n, dtype))
            got = softk.logsumexp(x, dim, tau, keepdim=True)
            assert got.shape == tuple(1 if i == dim % 3 else s for i, s in enumerate(x.shape))
            _close(got.squeeze(dim), lse, tol_lse(lse, tau, n, dtype))
        v, vd = x[1, 1], xd[1, 1]  # 1-D, with a masked entry
        p, lp, lse = ref_rows(vd, 1.0)
        _close(softk.log_softmax(v), lp[0], tol_logp(lp[0], 5, dtype))
        out = softk.logsumexp(v)
        assert out.shape == ()
        _close(out, lse[0], tol_lse(lse[0], 1.0, 5, dtype))
        with pytest.raises(ValueError, match="tau"):
            softk.log_softmax(x, tau=0.0)
    assert calls == ["softmax_rows", "softmax_rows", "logsumexp_rows"] * 3 + ["softmax_rows", "logsumexp_rows"]


# ---------------------------------------------------------------- gradients
def _grad_case(rng, n=40):
    xn = rng.normal(size=(5, n)) * 2
    xn[1, ::3] = -np.inf
    xn[2] = -np.inf
    xn[3] += 1e4
    xn[4, 7] = np.nan
    return xn.astype(np.float32).astype(np.float64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_backward_kernels_match_reference_jacobian(rng, variant, dtype):
    n, tau = 40, 0.5
    block = VARIANTS[variant](n)
    xn = _grad_case(rng, n)
    gn = _as_input(rng.normal(size=(5, n)), dtype)
    x, g, xd = _t(xn, dtype), _t(gn, dtype), _as_input(xn, dtype)
    p, lp, _ = ref_rows(xd, tau)
    rel = tol_p(p, lp, n, dtype) / np.where(p > 0, p, 1.0)  # p's relative tolerance
    ag = np.abs(gn)
    jac_soft = [(np.diag(pi) - np.outer(pi, pi)) / tau for pi in p]  # J of p(x), from the definition
    jac_log = [(np.eye(n) - np.outer(np.ones(n), pi)) / tau for pi in p]  # J of log p(x)
    # softmax: dx = Jᵀ g
    got = ts.softmax_backward_rows(ts.softmax_rows(x, tau, block=block), g, tau, block=block)
    want = np.stack([j.T @ gi for j, gi in zip(jac_soft, gn)])
    cross = (rel * p * ag).sum(1, keepdims=True)
    tol = 2 * (rel * p * (ag + (p * ag).sum(1, keepdims=True)) + p * cross) / tau + EPS[dtype] * np.abs(want) + 1e-30
    _close(got, want, tol)
    # log_softmax; masked entries get g/τ, the fully masked row 0
    got = ts.softmax_backward_rows(ts.softmax_rows(x, tau, log=True, block=block), g, tau, log=True, block=block)
    want = np.stack([j.T @ gi for j, gi in zip(jac_log, gn)])
    want[2] = 0.0
    tol = (4 * EPS32 * ag + 2 * (rel + 8 * EPS32) * p * ag.sum(1, keepdims=True)) / tau + EPS[dtype] * np.abs(want)
    _close(got, want, tol)
    # logsumexp: ∇ τ·lse(x/τ) = p, per row times g
    g1 = _as_input(rng.normal(size=5), dtype)
    got = ts.logsumexp_backward_rows(x, _t(g1, dtype), tau, block=block)
    want = g1[:, None] * p
    _close(got, want, (rel + EPS[dtype]) * np.abs(want) + TINY[dtype])


def test_public_autograd_and_double_backward(rng):
    # through the custom ops: the kernels in the backward (no graph), and the
    # tensor code under create_graph, whose second derivatives match the
    # Hessians from the definitions: −Σg (diag p − p pᵀ)/τ² for Σ g·log p,
    # and (diag p − p pᵀ)/τ for τ·lse(x/τ); and jvp
    n, tau = 6, 0.7
    xn = (rng.normal(size=n) * 2).astype(np.float32).astype(np.float64)
    gn = rng.normal(size=n).astype(np.float32).astype(np.float64)
    vn = rng.normal(size=n).astype(np.float32).astype(np.float64)
    p, lp, lse = (a[0] for a in ref_rows(xn, tau))
    hp = np.diag(p) - np.outer(p, p)
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    g, v = (torch.tensor(a, dtype=torch.float32) for a in (gn, vn))
    with softk.use_backend("triton"):
        (d1,) = torch.autograd.grad(softk.log_softmax(x, tau=tau), x, g)
        (d2,) = torch.autograd.grad(softk.logsumexp(x, tau=tau), x)
        (e1,) = torch.autograd.grad(softk.log_softmax(x, tau=tau), x, g, create_graph=True)
        (h1,) = torch.autograd.grad(e1, x, v)
        (e2,) = torch.autograd.grad(softk.logsumexp(x, tau=tau), x, create_graph=True)
        (h2,) = torch.autograd.grad(e2, x, v)
        _, t1 = torch.func.jvp(lambda t: softk.log_softmax(t, tau=tau), (x.detach(),), (v,))
        _, t2 = torch.func.jvp(lambda t: softk.logsumexp(t, tau=tau), (x.detach(),), (v,))
    want1 = (gn - p * gn.sum()) / tau
    np.testing.assert_allclose(d1.double().numpy(), want1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(e1.detach().double().numpy(), want1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d2.double().numpy(), p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(h1.double().numpy(), -gn.sum() * hp @ vn / tau**2, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h2.double().numpy(), hp @ vn / tau, rtol=1e-5, atol=1e-6)
    # forward mode: J v with J = (I − 1 pᵀ)/τ for log p, pᵀ for the smooth max
    np.testing.assert_allclose(t1.double().numpy(), (vn - p @ vn) / tau, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t2.double().numpy(), p @ vn, rtol=1e-5, atol=1e-6)
    # a masked entry passes v/τ, a fully masked row nothing
    xm = torch.tensor([[0.0, 1.0, -np.inf], [-np.inf] * 3])
    vm = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]])
    with softk.use_backend("triton"):
        _, tm = torch.func.jvp(lambda t: softk.log_softmax(t, tau=tau), (xm,), (vm,))
    pm = ref_rows(np.array([0.0, 1.0, -np.inf]), tau)[0][0]
    want = np.stack([(np.array([1.0, 2.0, 3.0]) - pm @ [1.0, 2.0, 3.0]) / tau, np.zeros(3)])
    np.testing.assert_allclose(tm.double().numpy(), want, rtol=1e-5, atol=1e-6)


def test_compile_and_vmap_run_the_kernels(rng, monkeypatch):
    calls = []
    for name in ("softmax_rows", "logsumexp_rows", "softmax_backward_rows", "logsumexp_backward_rows"):
        fn = getattr(ts, name)
        monkeypatch.setattr(ts, name, lambda *a, _f=fn, _n=name, **k: calls.append(_n) or _f(*a, **k))
    torch._dynamo.reset()
    xn = (rng.normal(size=(3, 9)) * 2).astype(np.float32).astype(np.float64)
    xn[1, 2:5] = -np.inf
    x = torch.tensor(xn, dtype=torch.float32, requires_grad=True)
    p, lp, lse = ref_rows(xn, 0.5)
    with softk.use_backend("triton"):
        f = torch.compile(lambda t: (softk.softmax(t, tau=0.5), softk.log_softmax(t, tau=0.5),
                                     softk.logsumexp(t, tau=0.5)), fullgraph=True)
        out = f(x)
    for got, want in zip(out, (p, lp, lse)):
        _close(got.detach(), want, 1e-5 * np.abs(want) + 1e-6)
    # the softmax backward is the threshold contract's (not this module's)
    (torch.where(torch.isfinite(out[1]), out[1], 0.0).sum() + out[2].sum()).backward()
    assert sorted(set(calls)) == ["logsumexp_backward_rows", "logsumexp_rows", "softmax_backward_rows", "softmax_rows"]
    # (g − p Σg)/τ with g = 1 on the finite entries of log p, plus ∇lse = p
    fin = np.isfinite(xn)
    want = (fin - p * fin.sum(1, keepdims=True)) / 0.5 + p
    np.testing.assert_allclose(x.grad.double().numpy(), want, rtol=1e-5, atol=1e-5)
    with softk.use_backend("triton"):
        vl = torch.func.vmap(lambda t: softk.logsumexp(t, 0, tau=0.5), in_dims=1)(x.detach())
        vs = torch.func.vmap(lambda t: softk.log_softmax(t, tau=0.5))(x.detach())
    _close(vl, ref_rows(xn.T, 0.5)[2], 1e-5)
    _close(vs, lp, 1e-5 * np.abs(lp) + 1e-6)


# ------------------------------------------------------- a build for a GPU
_COMPILE = r"""
from softk._backends.triton.softmax import SINGLE_MAX, config
from softk._backends.triton.softmax_kernels import softmax_bwd_kernel, softmax_fwd_kernel, softmax_index_loss_kernel

# every OUT mode, both backward kernels and the loss with class indices (with
# and without the gradient, with and without cross-entropy's rows) at the
# launcher's settings for a 1-wide and a 64-wide row (many rows per program),
# the widest single-read row and a looped one; the dtypes take turns
dtypes = ("*fp32", "*bf16", "*fp16")
fwd = {"X": "", "Y": "", "G": "", "R": "i32", "n": "i32", "inv_tau": "fp32", "tau": "fp32"}
bwd = {"Y": "", "G": "", "DX": "", "R": "i32", "n": "i32", "inv_tau": "fp32"}
loss = {"X": "", "T": "*i64", "GR": "", "LOSS": "*fp32", "SCALE": "*fp32", "R": "i32", "n": "i32", "inv_tau": "fp32"}
shapes = [(1, 4096), (64, 4096), (SINGLE_MAX, 64), (SINGLE_MAX + 1, 64)]
assert [config(n, r)[0] for n, r in shapes] == [True, True, True, False]
built = 0
for i, (n, r) in enumerate(shapes):
    single, blk, rows, warps = config(n, r)
    for out in range(4):
        ty = dtypes[(i + out) % 3]
        build(softmax_fwd_kernel, dict(fwd, X=ty, Y=ty, G=ty), dict(OUT=out, ROWS=rows, BLOCK=blk, SINGLE=single), warps)
        built += 1
    for log in (False, True):
        ty = dtypes[(i + log + 1) % 3]
        build(softmax_bwd_kernel, dict(bwd, Y=ty, G=ty, DX=ty), dict(LOG=log, ROWS=rows, BLOCK=blk, SINGLE=single), warps)
        built += 1
    for want, ce in ((True, True), (True, False), (False, i % 2 == 0)):
        ty = dtypes[(i + want + ce) % 3]
        build(softmax_index_loss_kernel, dict(loss, X=ty, GR=ty), dict(ROWS=rows, BLOCK=blk, SINGLE=single, WANT_GRAD=want,
              CE_ROWS=ce), warps)
        built += 1
assert built == 36, built
print("OK")
"""


@pytest.mark.gpu_build
def test_kernels_compile_for_a_gpu():
    # as in test_triton_search: the interpreter accepts code the compiler
    # rejects, so build every variant for sm_90 (ptxas included) in a
    # process where TRITON_INTERPRET is unset
    gpu_build.compile_for_gpu(_COMPILE)
