r"""The fused linear loss's backward products on the live vocabulary tiles of a
sparse gradient (softk._backends.triton.live_tiles) through the interpreter.

The kernels against the float64 dense products G W, Gᵀ X and Σ_rows G of the
same (exactly representable) entries: a gradient with a few non-zeros per row,
all-zero rows and all-zero tiles, and V, H, C that are not multiples of the
blocks (so every kernel meets ragged edges); float32, bfloat16 and float16.
Dead tiles of the accumulators keep their prior contents bit for bit, and an
all-zero gradient gives ∇X = 0.  Then the route inside the fused loss
(forced on CPU tensors) against the dense products, and on the
vocab-parallel loss.

Tolerances.  A sum of n products accumulated in float32 is within
n·u·Σ|a_i b_i| of the exact sum (u = 2⁻²⁴, the standard bound; the products
of two half or float32 inputs are formed exactly or rounded once), so each
entry is checked against n·u·(|G| |W|) computed in float64, plus the one
rounding of the stored result: u·|result| into a float32 accumulator, the
half dtype's u into a half ∇X (a whole ulp for bfloat16 under the
interpreter: see UNIT).  A tile that was skipped wrongly misses
whole terms of size |G||W|, far above that bound.
"""

from __future__ import annotations

import pytest
import torch

import softk._ops.fused_linear as FL
from softk._backends import kernels
from softk._backends.triton import live_tiles as LT
from softk.losses import fused_linear as fused_module
from softk.losses import fused_linear_loss

TILES = kernels.get("live_tiles", "triton")  # the kernel that runs the products on the live tiles

U32 = 2.0 ** -24
# the relative error of storing a float32 result in each dtype: half a unit in
# the last place, but a whole one for bfloat16, which Triton's interpreter
# (3.9) converts from float32 by truncation, not to nearest as a GPU does
UNIT = {torch.float32: U32, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -11}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
C, V, H = 70, 300, 80  # none a multiple of 64, nor of 16 but H
LIVE_TILES = (0, 2, 4)  # of the 64-class tiles; tile 4 is the cut one (classes 256-299)


def _sparse_g(dtype, block_v=64, seed=0):
    """G (C, V): rows with 1-4 non-zeros in the classes of LIVE_TILES (the
    last class, V − 1, among them), every fifth row all zero; and the live
    tiles' indices for ``block_v``."""
    g = torch.Generator().manual_seed(seed)
    cols = torch.cat([torch.arange(t * 64, min(t * 64 + 64, V)) for t in LIVE_TILES])
    out = torch.zeros(C, V, dtype=torch.float64)
    for i in range(C):
        if i % 5 == 2:
            continue
        k = int(torch.randint(1, 5, (1,), generator=g))
        pick = cols[torch.randint(0, cols.numel(), (k,), generator=g)]
        out[i, pick] = torch.randn(k, generator=g, dtype=torch.float64)
    out[7, V - 1] = 0.75
    out = out.to(dtype)
    live = sorted({int(c) // block_v for c in (out != 0).any(0).nonzero().squeeze(1)})
    return out, live


def _inputs(dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(V, H, generator=g, dtype=torch.float64).to(dtype)
    x = torch.randn(C, H, generator=g, dtype=torch.float64).to(dtype)
    return w, x


def _check(got, ref, bound, unit, what):
    """|got − ref| ≤ bound + unit·|ref| entrywise, ref and bound float64."""
    err = (got.double() - ref).abs()
    tol = bound + unit * ref.abs() + 1e-300
    worst = float((err / tol).max())
    assert worst <= 1.0, f"{what}: error {worst:.3g} of the bound"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blocks", [{}, dict(block_v=16, block_c=16, block_h=16)])
def test_products_equal_the_dense_float64_products(dtype, blocks):
    bv = blocks.get("block_v", LT.BLOCK_V)
    g, live = _sparse_g(dtype, bv)
    w, x = _inputs(dtype)
    assert LT.live_tiles(g, bv).tolist() == live and len(live) < -(-V // bv)  # some tiles dead
    gx = torch.full((C, H), float("nan"), dtype=dtype)
    before = torch.randn(V, H, generator=torch.Generator().manual_seed(2)) * 3  # the sentinel accumulator
    before_b = torch.randn(V, generator=torch.Generator().manual_seed(3)) * 3
    gw, gb = before.clone(), before_b.clone()
    assert LT.products(g, w, x, gx, gw, gb, **blocks)
    gd, wd, xd = g.double(), w.double(), x.double()
    _check(gx, gd @ wd, V * U32 * (gd.abs() @ wd.abs()), UNIT[dtype], "∇X")
    _check(gw - before.double(), gd.t() @ xd, C * U32 * (gd.abs().t() @ xd.abs()) + U32 * before.double().abs(),
           U32, "∇W")
    _check(gb - before_b.double(), gd.sum(0), C * U32 * gd.abs().sum(0) + U32 * before_b.double().abs(), U32, "∇b")
    dead = torch.ones(V, dtype=torch.bool)
    for t in live:
        dead[t * bv:(t + 1) * bv] = False
    assert dead.any()
    assert torch.equal(gw[dead], before[dead]) and torch.equal(gb[dead], before_b[dead])
    assert not torch.equal(gw[~dead], before[~dead])
    assert (gx[(g == 0).all(1)] == 0).all()  # all-zero rows of G: zero rows of ∇X


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_all_dead_gradient_gives_zeros_and_leaves_the_accumulators(dtype):
    g = torch.zeros(C, V, dtype=dtype)
    w, x = _inputs(dtype)
    gx = torch.full((C, H), float("nan"), dtype=dtype)
    gw, gb = torch.full((V, H), 5.0), torch.full((V,), -5.0)
    assert LT.live_tiles(g).numel() == 0
    assert LT.products(g, w, x, gx, gw, gb)
    assert (gx == 0).all() and (gw == 5.0).all() and (gb == -5.0).all()


def test_only_the_asked_products_and_the_share_limit():
    g, _ = _sparse_g(torch.float32)
    w, x = _inputs(torch.float32)
    gb = torch.zeros(V)
    assert LT.products(g, w, x, None, None, gb)  # the bias sums alone
    _check(gb, g.double().sum(0), C * U32 * g.double().abs().sum(0), U32, "∇b alone")
    gw = torch.zeros(V, H)
    assert LT.products(g, w, x, None, gw, None)  # ∇W without ∇b
    gd, xd = g.double(), x.double()
    _check(gw, gd.t() @ xd, C * U32 * (gd.abs().t() @ xd.abs()), U32, "∇W alone")
    # 3 of 5 tiles are live: above a share of 0.5 the launcher declines, writing nothing
    gx, gw = torch.full((C, H), float("nan")), torch.zeros(V, H)
    assert not LT.products(g, w, x, gx, gw, None, max_share=0.5)
    assert torch.isnan(gx).all() and (gw == 0).all()


def test_strided_operands():
    # G a column slice of a wider buffer, W a transposed view, ∇X a slice of a wider one
    g0, _ = _sparse_g(torch.float32)
    wide = torch.zeros(C, V + 5)
    wide[:, 2:V + 2] = g0
    g = wide[:, 2:V + 2]
    w, x = _inputs(torch.float32)
    wt = w.t().contiguous().t()
    gx_buf = torch.full((C, H + 3), float("nan"))
    gx = gx_buf[:, :H]
    gw = torch.zeros(V, H)
    assert LT.products(g, wt, x, gx, gw, None)
    gd = g0.double()
    _check(gx, gd @ w.double(), V * U32 * (gd.abs() @ w.double().abs()), U32, "∇X")
    _check(gw, gd.t() @ x.double(), C * U32 * (gd.abs().t() @ x.double().abs()), U32, "∇W")
    assert torch.isnan(gx_buf[:, H:]).all()


def _problem(dtype, seed=0, n=40, h=24, v=300):
    """x, W, b, targets: hidden states close to their target's weight row, so
    that the sparsemax / entmax15 supports are a few classes, and targets in
    the first 128 classes but for row 9's (the last class, in the cut tile):
    most tiles dead.  Row 5 ignored, row 20 random (a wide support)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(v, h, generator=g, dtype=torch.float64)
    y = torch.randint(0, 128, (n,), generator=g)
    y[9] = v - 1
    x = w[y] * 3 + torch.randn(n, h, generator=g, dtype=torch.float64) * 0.3
    x[20] = torch.randn(h, generator=g, dtype=torch.float64) * 0.2
    y[5] = -100
    b = torch.randn(v, generator=g, dtype=torch.float64) * 0.1
    return x.to(dtype), w.to(dtype), b.to(dtype), y


def _grads(x, w, b, y, loss, reduction):
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    out = fused_linear_loss(leaves[0], leaves[1], y, loss, leaves[2], reduction=reduction, chunk_size=16)
    return (out.detach(),) + torch.autograd.grad(out, leaves, torch.ones_like(out))


@pytest.mark.parametrize("loss", ["sparsemax", "entmax15"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_fused_loss_on_live_tiles_equals_the_dense_route(monkeypatch, loss, reduction):
    x, w, b, y = _problem(torch.float32)
    monkeypatch.setattr(FL, "SPARSE_MAX_SHARE", {"cpu": 0.0})  # the CPU's live columns off: dense
    dense = _grads(x, w, b, y, loss, reduction)
    ran = []
    real = LT.products

    def spy(g, *args, **kw):
        ran.append(LT.live_tiles(g).numel())
        return real(g, *args, **kw)

    monkeypatch.setattr(FL, "live_tiles_kernel", lambda x: TILES)
    monkeypatch.setattr(LT, "products", spy)
    tiles = _grads(x, w, b, y, loss, reduction)
    assert len(ran) == 3 and any(0 < r < 5 for r in ran), ran  # every chunk on the tiles, some dead
    # float32 both ways, summed in another order: rounding only (a skipped live
    # tile would be off by whole terms)
    for name, a, d in zip(("loss", "x", "weight", "bias"), tiles, dense):
        scale = float(d.abs().max())
        torch.testing.assert_close(a, d, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{loss} {name}: {m}")
    # and both against float64
    ref = _grads(*(t.double() for t in (x, w, b)), y, loss, reduction)
    for name, a, r in zip(("loss", "x", "weight", "bias"), tiles, ref):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-5 * float(r.abs().max()),
                                   msg=lambda m: f"{loss} {name} vs float64: {m}")


@pytest.mark.slow
def test_fused_loss_on_live_tiles_in_bfloat16(monkeypatch):
    # bf16 inputs: G in bf16 on both routes; ∇X rounded to bf16 on both, ∇W
    # and ∇b accumulated in float32 on both
    x, w, b, y = _problem(torch.bfloat16, seed=3)
    monkeypatch.setattr(FL, "SPARSE_MAX_SHARE", {"cpu": 0.0})
    # the row-chunk pass's dense products as the reference (half weights otherwise walk the vocabulary)
    monkeypatch.setattr(fused_module, "WALK_DTYPES", ())
    dense = _grads(x, w, b, y, "sparsemax", "mean")
    monkeypatch.setattr(fused_module, "WALK_DTYPES", (torch.float16, torch.bfloat16))
    ran, real = [], LT.products
    monkeypatch.setattr(FL, "live_tiles_kernel", lambda x: TILES)
    monkeypatch.setattr(LT, "products", lambda g, *a, **k: ran.append(g.dtype) or real(g, *a, **k))
    tiles = _grads(x, w, b, y, "sparsemax", "mean")
    assert ran == [torch.bfloat16] * 3
    for name, a, d in zip(("loss", "x", "weight", "bias"), tiles, dense):
        scale = float(d.float().abs().max())
        torch.testing.assert_close(a.float(), d.float(), rtol=2 ** -7, atol=2 ** -7 * scale, msg=lambda m: f"{name}: {m}")


def test_float64_keeps_the_torch_products(monkeypatch):
    monkeypatch.setattr(FL, "live_tiles_kernel", lambda x: TILES)
    monkeypatch.setattr(LT, "products", lambda *a, **k: pytest.fail("the float32 kernels ran on float64"))
    x, w, b, y = _problem(torch.float64)
    _grads(x, w, b, y, "sparsemax", "mean")


def test_the_route_is_the_explicit_triton_backends_on_cuda():
    import types

    import softk
    from softk._backends import dispatch

    x = torch.zeros(2, 2)
    with softk.use_backend("triton"):
        assert dispatch.pick("live_tiles", x) is None  # a CPU tensor: the CPU's live columns
        assert FL.live_tiles_kernel(x) is None
    assert dispatch.pick("live_tiles", torch.zeros(2, 2, device="meta")) is None
    # what the choice reads of a CUDA tensor (no GPU here): its device flag and dtype
    cuda = lambda dtype: types.SimpleNamespace(is_cuda=True, is_cpu=False, dtype=dtype)  # noqa: E731
    for name, dtype, want in (("triton", torch.bfloat16, TILES), ("triton", torch.float32, TILES),
                              ("triton", torch.float64, None), ("auto", torch.bfloat16, None),
                              ("torch", torch.bfloat16, None)):
        with softk.use_backend(name):
            assert dispatch.pick("live_tiles", cuda(dtype)) is want, (name, dtype)
            assert FL.live_tiles_kernel(cuda(dtype)) is want, (name, dtype)


def _vocab_parallel_tiles(rank, world):
    import softk._ops.fused_linear as FLr
    from softk._backends.triton import live_tiles as LTr
    from softk.distributed import vocab_parallel_fused_linear_loss

    x, w, b, y = _problem(torch.float32, seed=4, n=24, h=16, v=200)
    lo, hi = (0, 90) if rank == 0 else (90, 200)
    ref = _grads(*(t.double() for t in (x, w, b)), y, "sparsemax", "sum")
    ran = []
    real = LTr.products
    FLr.live_tiles_kernel = lambda x: kernels.get("live_tiles", "triton")
    LTr.products = lambda g, *a, **k: ran.append(1) or real(g, *a, **k)
    xl, wl, bl = x.clone().requires_grad_(), w[lo:hi].clone().requires_grad_(), b[lo:hi].clone().requires_grad_()
    out = vocab_parallel_fused_linear_loss(xl, wl, y, "sparsemax", bl, reduction="sum", chunk_size=8)
    hx, hw, hb = torch.autograd.grad(out, (xl, wl, bl))
    assert len(ran) == 3, ran
    for name, a, r in (("loss", out, ref[0]), ("x", hx, ref[1]), ("weight", hw, ref[2][lo:hi]),
                       ("bias", hb, ref[3][lo:hi])):
        torch.testing.assert_close(a.double(), r, rtol=1e-4, atol=1e-5 * float(r.abs().max()),
                                   msg=lambda m: f"rank {rank} {name}: {m}")


@pytest.mark.slow
def test_vocab_parallel_loss_takes_the_tiles(tmp_path):
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed unavailable")
    from ...distributed.dist_harness import run

    run(2, _vocab_parallel_tiles, tmp_path)


_COMPILE = r"""
from softk._backends.triton.live_tiles import BLOCK_C, BLOCK_H, BLOCK_V, _grad_w_kernel, _grad_x_kernel

blocks = dict(BLOCK_C=BLOCK_C, BLOCK_V=BLOCK_V, BLOCK_H=BLOCK_H)
ints = {n: "i32" for n in ("C", "V", "H")}
built = 0
# G in the inputs' half dtype (the autograd route) or float32 (float32 inputs,
# and the vocab-parallel loss's G beside half weights: widened)
for g, t in (("*bf16", "*bf16"), ("*fp16", "*fp16"), ("*fp32", "*fp32"), ("*fp32", "*bf16")):
    widen = g != t
    build(_grad_x_kernel, dict(G=g, W=t, GX=t if not widen else "*fp32", tiles="*i32", n_tiles="i32", **ints,
                               **{s: "i32" for s in ("sgc", "sgv", "swv", "swh", "sxc", "sxh")}),
          dict(blocks, WIDEN=widen), 4)
    for has_w, has_b in ((True, True), (True, False), (False, True)):
        build(_grad_w_kernel, dict(G=g, X=t, GW="*fp32", GB="*fp32", tiles="*i32", **ints,
                                   **{s: "i32" for s in ("sgc", "sgv", "sxc", "sxh", "swv", "swh")}),
              dict(blocks, HAS_W=has_w, HAS_B=has_b, WIDEN=widen), 4)
        built += 1
    built += 1
assert built == 16, built
print("OK")
"""


@pytest.mark.gpu_build
def test_live_tile_kernels_compile_for_a_gpu():
    from . import gpu_build

    gpu_build.compile_for_gpu(_COMPILE)
