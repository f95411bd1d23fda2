"""The work the row kernels issue, counted in the interpreter
(:mod:`softk._backends.triton.work`): exact and machine-independent, so the
cost of a design is pinned here as a test, not timed.

Forward element-wise operations per element, as a multiple of softk's own
softmax kernel on the same rows, at the widths of routers (16, 64), of
attention rows and small vocabularies (1024) and of a row read in one go
(8192), on normal rows:

* sparsemax and entmax15 ≤ 3×, α-entmax at α = 1.3 and top-k exp ≤ 4×,
  top-k sigmoid and laplace ≤ 6× (k = 2) (the lean forwards);
* each reads its row once: at most 2 × the row's bytes at 8192, the
  candidate buffer included; a row wider than the registers hold (16384)
  three times for sparsemax and entmax15 (the lane maxima, one sweep, the
  write) and twice for α-entmax (the lane maxima, the candidates).
"""

import pytest
import torch
import triton
import triton.language as tl

from softk._backends.triton.function import FAMILY_IDS, forward_rows
from softk._backends.triton.softmax import softmax_rows
from softk._backends.triton.work import count

ROWS = {16: 512, 64: 512, 1024: 8, 8192: 8}  # rows per width: a few programs each
# (family, k, α, limit)
LIMITS = [("sparsemax", 1, 2.0, 3.0), ("entmax15", 1, 1.5, 3.0), ("entmax", 1, 1.3, 4.0), ("exp", 2, 1.5, 4.0),
          ("sigmoid", 2, 1.5, 6.0), ("laplace", 2, 1.5, 6.0)]


def _per_element(w, x):
    return w.alu / x.numel()


@pytest.fixture(scope="module")
def rows():
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(r, n, generator=g) for n, r in ROWS.items()}


@pytest.fixture(scope="module")
def softmax_work(rows):
    out = {}
    for n, x in rows.items():
        with count() as w:
            softmax_rows(x)
        out[n] = w
    return out


@triton.jit
def _known(X, Y):
    x = tl.load(X + tl.arange(0, 256)[None, :])  # 1 KiB
    y = tl.where(x > 0, x, 0.0)  # 2 × 256 operations
    tl.store(Y + tl.arange(0, 1)[None, :], tl.sum(y, 1, keep_dims=True))  # 256 reduced, 4 bytes


@triton.jit
def _known_dot(X, Y):
    a = tl.load(X + tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :])
    tl.store(Y + tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :], tl.dot(a, a))  # 2 · 16³ FLOPs


def test_the_counter_counts(rows):
    x, y = torch.randn(256), torch.zeros(256)
    with count() as w:
        _known[(2,)](x, y)  # two programs
    assert (w.launches, w.alu, w.reduce, w.load_bytes, w.store_bytes, w.dot_flops) == (1, 2 * 512, 2 * 256, 2048, 8, 0)
    with count() as w:
        _known_dot[(1,)](x, y)
    assert (w.dot_flops, w.load_bytes, w.store_bytes) == (2 * 16 ** 3, 1024, 1024)
    # softmax: one read and one write of every row
    x = rows[64]
    with count() as w:
        softmax_rows(x)
    assert (w.launches, w.load_bytes, w.store_bytes) == (1, 4 * x.numel(), 4 * x.numel())


@pytest.mark.parametrize("n", sorted(ROWS))
@pytest.mark.parametrize("fam, k, alpha, limit", LIMITS, ids=[f[0] for f in LIMITS])
def test_forward_work_per_element(rows, softmax_work, fam, k, alpha, limit, n):
    x = rows[n]
    with count() as w:
        p = forward_rows(x, FAMILY_IDS[fam], k, 1.0, alpha)
    assert torch.allclose(p.sum(-1), torch.full((x.shape[0],), float(k)), atol=1e-5 * k)  # a real answer
    ratio = _per_element(w, x) / _per_element(softmax_work[n], x)
    assert ratio <= limit, f"{fam} at n = {n}: {ratio:.2f} × softmax's element-wise work"
    assert w.launches == 1
    if n == 8192:
        assert w.load_bytes <= 2 * 4 * x.numel(), w.load_bytes / (4 * x.numel())


@pytest.mark.parametrize("fam, alpha, reads", [("sparsemax", 2.0, 3.0), ("entmax15", 1.5, 3.0), ("entmax", 1.3, 2.1)])
def test_wide_rows_reads(fam, alpha, reads):
    # sparsemax and entmax15: the lane maxima, one sweep from their bound (the
    # closed form is exact in it on normal rows), the write; α-entmax: the lane
    # maxima, then the candidates into a buffer (and its few slots' loads)
    x = torch.randn(4, 16384, generator=torch.Generator().manual_seed(2))
    with count() as w:
        p = forward_rows(x, FAMILY_IDS[fam], 1, 1.0, alpha)
    assert torch.allclose(p.sum(-1), torch.ones(4), atol=1e-5)
    assert w.load_bytes <= reads * 4 * x.numel(), w.load_bytes / (4 * x.numel())


@pytest.mark.parametrize("fam, alpha", [("sparsemax", 2.0), ("entmax15", 1.5), ("entmax", 1.3)])
def test_fused_loss_takes_the_lean_search(rows, fam, alpha):
    # the fused Fenchel–Young loss on rows held in registers: the lean search
    # (the default) against the general one (asked for by onchip=True), the
    # same loss and gradient to float32 rounding, for less work
    from softk._backends.triton.loss import fenchel_young_fused_rows

    x = rows[64][:64]
    t = torch.randint(0, 64, (64,), generator=torch.Generator().manual_seed(1))
    with count() as lean:
        loss, grad = fenchel_young_fused_rows(x, t, torch.ones(1), FAMILY_IDS[fam], 1, 1.0, alpha)
    with count() as general:
        loss_g, grad_g = fenchel_young_fused_rows(x, t, torch.ones(1), FAMILY_IDS[fam], 1, 1.0, alpha, onchip=True)
    assert torch.allclose(loss, loss_g, rtol=1e-5, atol=1e-6) and torch.allclose(grad, grad_g, atol=1e-6)
    assert lean.alu < 0.7 * general.alu, lean.alu / general.alu


@pytest.mark.parametrize("n", sorted(ROWS))
def test_cross_entropy_costs_softmax_plus_a_few_operations(rows, softmax_work, n):
    # softmax's fused loss with class indices (cross-entropy) runs the softmax
    # kernel's passes: its element-wise work is softmax's plus the gradient's
    # few operations (a compare with t, a subtraction, a scale, a select),
    # and it reads a row as often as softmax does (once up to 16384 entries);
    # the general loss kernel issued 70–82 operations an entry
    from softk._backends.triton.loss import fenchel_young_fused_rows

    x = rows[n]
    t = torch.randint(0, n, (x.shape[0],), generator=torch.Generator().manual_seed(3))
    with count() as w:
        loss, grad = fenchel_young_fused_rows(x, t, torch.ones(1), FAMILY_IDS["softmax"], 1, 1.0)
    lse = torch.logsumexp(x.double(), -1)
    assert torch.allclose(loss.double(), lse - x.double().gather(1, t[:, None])[:, 0], rtol=1e-5, atol=1e-5)
    extra = _per_element(w, x) - _per_element(softmax_work[n], x)
    assert extra <= 8, f"n = {n}: {extra:.1f} operations an entry beyond softmax's"
    assert w.launches == 1
    # + per row its class index (int64) and x_t, and the one float of SCALE per program (at most a row each)
    assert w.load_bytes <= softmax_work[n].load_bytes + 16 * x.shape[0]
    assert w.store_bytes <= softmax_work[n].store_bytes + 4 * x.shape[0]  # + the loss of each row
