"""The fused linear loss's walk over vocabulary blocks (half-precision weights).

Its forward keeps a few numbers per row and its backward forms the gradient
one block of classes at a time, writing the weight gradient of each block
once in W's dtype (softk._ops.fused_walk).  Held here:

* in float64 (the walk forced on), against the unfused loss on the whole
  logits at the edges: a vocabulary that is not a multiple of the block,
  a single row or class, masked classes, far-from-origin logits, every row
  ignored, dense targets; the knobs and TS² are in test_fused_knobs.py;
* in bfloat16, against float64 on the same values: the loss and gradients
  are rounded once (within bfloat16's half ulp), closer than the unfused
  bfloat16 loss's;
* the sparse losses run the products of live (row, block) tiles only;
* in a fresh process, no float32 buffer of W's size.
"""

from __future__ import annotations

import os
import sys

import entmax
import pytest
import torch
import torch.nn.functional as F

from softk import losses as L
from softk._ops import fused_walk
from softk.losses import fused_linear as fused_module
from softk.losses import fused_linear_loss

from .. import safety_net

D = torch.float64
BF16_HALF_ULP = 2.0**-9  # bfloat16's unit roundoff: 8 significant bits


@pytest.fixture
def walk64(monkeypatch):
    """The walk on float64 inputs, with a count of its backward calls."""
    monkeypatch.setattr(fused_module, "WALK_DTYPES", (D,))
    calls = []
    real = fused_walk.walk
    monkeypatch.setattr(fused_walk, "walk", lambda *a: calls.append(a) or real(*a))
    return calls


UNFUSED = {
    "cross_entropy": lambda z, t, **kw: F.cross_entropy(z, t, **kw),
    "sparsemax": lambda z, t, **kw: L.sparsemax_loss(z, t, **kw),
    "entmax15": lambda z, t, **kw: L.entmax15_loss(z, t, **kw),
    "softmax": lambda z, t, **kw: L.softmax_loss(z, t, **kw),
}


def _compare(loss, x, w, b, t, reduction="mean", chunk=None, rtol=1e-11, atol=1e-13):
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_linear_loss(args[0], args[1], t, loss, args[2], reduction=reduction, chunk_size=chunk)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    ref = UNFUSED[loss](refs[0] @ refs[1].t() + refs[2], t, reduction=reduction)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    go = torch.linspace(0.5, 1.5, out.numel(), dtype=D).reshape(out.shape)
    got = torch.autograd.grad(out, args, go)
    want = torch.autograd.grad(ref, refs, go)
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True)
    return got


def _data(n, h, v, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, dtype=D, generator=g) * scale
    w = torch.randn(v, h, dtype=D, generator=g)
    b = torch.randn(v, dtype=D, generator=g)
    t = torch.randint(0, v, (n,), generator=g)
    return x, w, b, t


@pytest.mark.parametrize("loss", sorted(UNFUSED))
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("n,v,chunk", [(37, 300, 8), (1, 300, None), (9, 1, None), (5, 64, 2), (70, 129, 3)])
def test_walk_equals_the_unfused_loss(loss, reduction, n, v, chunk, walk64):
    x, w, b, t = _data(n, 6, v)
    t[t.numel() // 2] = -100
    t[-1] = v - 1  # the last class: the last, partial block
    _compare(loss, x, w, b, t, reduction, chunk)
    assert walk64


@pytest.mark.parametrize("loss", sorted(UNFUSED))
def test_walk_at_the_edges(loss, walk64):
    x, w, b, t = _data(12, 5, 200, seed=1)
    b[::7] = float("-inf")  # masked classes
    t = torch.where(b[t] == float("-inf"), (t + 1) % 200, t)
    _compare(loss, x, w, b, t)
    # logits near 1e4: formed relative to the row's max, so no digits are lost
    far = torch.zeros(200, dtype=D)
    far[:] = 1e4
    _compare(loss, x, w, far, t, rtol=1e-9, atol=1e-11)
    # every row ignored: the mean is NaN, every gradient 0
    t_none = torch.full_like(t, -100)
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_linear_loss(args[0], args[1], t_none, loss, args[2])
    assert out.isnan()
    for g in torch.autograd.grad(out, args):
        assert torch.equal(g, torch.zeros_like(g))


@pytest.mark.parametrize("loss", ["cross_entropy", "softmax", "sparsemax", "entmax15"])
def test_walk_with_a_dense_target(loss, walk64):
    x, w, b, _ = _data(10, 4, 150, seed=2)
    y = torch.softmax(torch.randn(10, 150, dtype=D) * 3, -1)
    y[3] = 0
    y[3, 7] = 1
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    out = fused_linear_loss(*args[:2], y, loss, args[2], chunk_size=4)
    refs = [a.clone().requires_grad_() for a in (x, w, b)]
    ref = UNFUSED[loss](refs[0] @ refs[1].t() + refs[2], y)
    torch.testing.assert_close(out, ref, rtol=1e-11, atol=1e-13)
    for g, e in zip(torch.autograd.grad(out, args), torch.autograd.grad(ref, refs)):
        torch.testing.assert_close(g, e, rtol=1e-11, atol=1e-13)
    assert walk64


def test_entmax_near_one_keeps_the_row_pass(walk64):
    # α − 1 < 1/8: p = f(z − λ) from a float λ loses digits, so the walk does not serve it
    x, w, b, t = _data(6, 4, 50)
    args = [a.clone().requires_grad_() for a in (x, w, b)]
    fused_linear_loss(args[0], args[1], t, "entmax", args[2], alpha=1.05).backward()
    assert not walk64
    fused_linear_loss(args[0], args[1], t, "entmax", args[2], alpha=1.3).backward()
    assert walk64


def test_half_weights_take_the_walk_and_float32_does_not(monkeypatch):
    calls = []
    real = fused_walk.walk
    monkeypatch.setattr(fused_walk, "walk", lambda *a: calls.append(a[0].dtype) or real(*a))
    x, w, _, t = _data(8, 4, 70)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        xa, wa = x.to(dtype).requires_grad_(), w.to(dtype).requires_grad_()
        fused_linear_loss(xa, wa, t).backward()
        assert wa.grad.dtype == dtype and xa.grad.dtype == dtype
    assert calls == [torch.bfloat16, torch.float16]
    # a frozen weight needs no accumulator, but takes the walk too: its
    # float32 logits, so that the loss is the one training computes (the row
    # pass formed half-precision logits: another loss, NaN in float16 past
    # 65504)
    xa = x.bfloat16().requires_grad_()
    fused_linear_loss(xa, w.bfloat16(), t).backward()
    assert calls == [torch.bfloat16, torch.float16, torch.bfloat16]


def _bf16_case(n=512, h=256, v=8192, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, h, generator=g).bfloat16()
    w = (torch.randn(v, h, generator=g) * 3 / h**0.5).bfloat16()
    t = torch.randint(0, v, (n,), generator=g)
    return x, w, t


def _errors(fn, x, w, ref):
    xa, wa = x.clone().requires_grad_(), w.clone().requires_grad_()
    out = fn(xa, wa)
    got = (out, *torch.autograd.grad(out, (xa, wa)))
    return [float((a.detach().double() - r.detach()).norm() / r.detach().norm()) for a, r in zip(got, ref)]


@pytest.mark.parametrize("loss", ["cross_entropy", "sparsemax", "ts2"])
def test_bf16_is_rounded_once_and_beats_the_unfused_bf16_loss(loss):
    x, w, t = _bf16_case()
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    out = fused_linear_loss(xd, wd, t, loss)
    ref = (out, *torch.autograd.grad(out, (xd, wd)))
    fused = _errors(lambda a, b: fused_linear_loss(a, b, t, loss), x, w, ref)
    unfused_fn = {"cross_entropy": lambda z: F.cross_entropy(z, t), "sparsemax": lambda z: L.sparsemax_loss(z, t),
                  "ts2": lambda z: L.ts2_loss(z, t)}[loss]
    unfused = _errors(lambda a, b: unfused_fn(a @ b.t()), x, w, ref)
    # float32 logits and accumulation: each output is the exact value rounded
    # once to bfloat16 (plus float32's far smaller error)
    for e in fused:
        assert e <= BF16_HALF_ULP * 1.05, (fused, unfused)
    # the unfused loss rounds its logits and G to bfloat16 as well
    for e, u in zip(fused[1:], unfused[1:]):
        assert e < 0.7 * u, (fused, unfused)


def test_sparse_losses_compute_live_tiles_only(walk64, monkeypatch):
    # sparsemax's support is a few classes of 4096: each row is live in the
    # blocks of its support and target only, out of 64 blocks of 64 classes
    x, w, b, t = _data(40, 8, 4096, seed=3, scale=3.0)
    seen = []
    real = fused_module.tile_loss

    def spy(*a, **kw):
        tl = real(*a, **kw)
        grad = tl.grad
        tl.grad = lambda z, *r: seen.append(z.shape[0]) or grad(z, *r)
        return tl

    monkeypatch.setattr(fused_module, "tile_loss", spy)
    _compare("sparsemax", x, w, b, t, chunk=1)
    block = fused_walk.plan(40, 8, 4096, 1)[0]
    assert block == 64
    supp = entmax.sparsemax(x @ w.t() + b, dim=-1) > 0  # the support, from the entmax package
    live = torch.zeros(40, 4096 // block, dtype=torch.bool)
    for i in range(40):
        live[i, supp[i].nonzero().squeeze(1) // block] = True
        live[i, t[i] // block] = True
    assert sum(seen) == int(live.sum())
    assert sum(seen) < 0.1 * 40 * (4096 // block)


FRESH = r"""
import torch, softk
from softk._cli.harness import PeakRSS
torch.set_num_threads(1)
n, h, v = 256, 1024, 32768
g = torch.Generator().manual_seed(0)
x = torch.randn(n, h, generator=g).bfloat16().requires_grad_()
w = (torch.randn(v, h, generator=g) / h**0.5).bfloat16().requires_grad_()
t = torch.randint(0, v, (n,), generator=g)
xs, ws = x.detach()[:8].clone().requires_grad_(), w.detach()[:16].clone().requires_grad_()
softk.losses.fused_linear_loss(xs, ws, t[:8] % 16, "{loss}").backward()
with PeakRSS() as mem:
    softk.losses.fused_linear_loss(x, w, t, "{loss}").backward()
print(mem.extra / (v * h * 2))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS is read from /proc")
@pytest.mark.parametrize("loss", ["cross_entropy", "sparsemax"])
def test_no_float32_buffer_of_the_weights_size(loss):
    # bf16 W of 64 MiB: its gradient is one W, and a float32 accumulator of
    # W's size two more (3 W in all).  Besides its gradient the walk holds a
    # float32 block of W and of its gradient (1024 classes: 1/8 W), float32
    # tiles of N × H logits and ∇X (1/64 W each) and the forward's 8 rows of
    # logits with the loss's temporaries: under 0.3 W.  glibc gives blocks of
    # 64 KiB or more back when freed, so the RSS follows the live tensors.
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = safety_net.run([sys.executable, "-c", FRESH.format(loss=loss)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    peak_in_dw = float(out.stdout.split()[-1])
    assert 1.0 <= peak_in_dw < 1.3, peak_in_dw
