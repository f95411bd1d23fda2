"""The vocab-parallel fused loss's backward on the live columns of each rank's
gradient, over gloo on CPU: 2 ranks with uneven slices, 3 with permuted ones
(one of them a single class).

∇X, ∇W and ∇b equal those of a float64 single-process unfused loss (logits =
x Wᵀ + b, then softk's per-row loss, itself checked against independent
references in tests/losses) to 1e-10, whichever products ran; each rank's live
columns per chunk are exactly the nonzero columns of its slice of the
reference gradient, and the dense products run where those are more than
``SPARSE_MAX_SHARE`` of its slice.  The collectives are those of the dense
products.
"""

from __future__ import annotations

import pytest
import torch

import softk._ops.fused_linear as FL

from .dist_cases import Counter, bounds, single_loss
from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")

D = torch.float64
CHUNK = 3
LOSSES = [("sparsemax", {}), ("entmax15", {}), ("topk_softmax_ce", {"k": 3})]


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=lambda m: f"{what}: {m}")


def _problem(sizes, order):
    """x (N, H), W (V, H), b (V,), target (N,) with the logits x Wᵀ + b laid out
    by hand: W = 2 Q has orthonormal rows Q, so x = (z − b) Q / 2 gives the
    logits z, and x has a part in W's null space that only ∇W sees."""
    v = sum(sizes)
    h = v + 6
    g = torch.Generator().manual_seed(5)
    q = torch.linalg.qr(torch.randn(h, h, dtype=D, generator=g))[0]
    w = 2 * q[:v]
    b = 0.05 * torch.randn(v, dtype=D, generator=g)
    slices = sorted(bounds(sizes, order), key=lambda s: s[0] - s[1])  # largest slice first
    a, bb = slices[0][0], slices[1][0]  # the first class of the largest and of the second slice
    single = [lo for lo, hi in slices if hi - lo == 1]
    n = 11
    z = torch.randn(n, v, dtype=D, generator=g) * 0.3 - 3  # far below every support
    c = single[0] if single else bb + 4
    z[0, [a, a + 1]] = torch.tensor([2.0, 1.6], dtype=D)      # support and target on one rank
    z[1, [bb, bb + 1]] = torch.tensor([2.0, 1.6], dtype=D)    # support on one rank, target on another
    z[2, [a + 2, bb + 2]] = torch.tensor([2.0, 1.7], dtype=D)  # support on two ranks
    z[3, a + 4] = 3.0                                         # p = e_y for sparsemax, entmax15
    z[4, [a + 5, bb + 3]] = 2.0                               # ignored
    z[5, [c, a + 6]] = torch.tensor([1.9, 2.0], dtype=D)
    z[6:9] = 0.01 * torch.randn(3, v, dtype=D, generator=g)   # flat: every class live
    z[9, [bb + 5, bb + 6]] = torch.tensor([2.0, 1.5], dtype=D)
    z[10, bb + 7] = 3.0                                       # ignored
    t = torch.tensor([a, a + 3, bb + 2, a + 4, -100, a + 6, a, bb, v - 1, bb + 5, -100])
    x = (z - b) @ q[:v] / 2 + 0.5 * torch.randn(n, h - v, dtype=D, generator=g) @ q[v:]
    return x, w, b, t


def _reference(loss, kw, x, w, b, t, reduction):
    """The unfused loss, its gradients for x, W, b, and G = ∂ Σ rows / ∂ logits."""
    xf, wf, bf = (a.clone().requires_grad_() for a in (x, w, b))
    logits = xf @ wf.T + bf
    rows = single_loss(loss, logits, t, reduction="none", **kw)
    (g,) = torch.autograd.grad(rows.sum(), logits, retain_graph=True)
    out = single_loss(loss, logits, t, reduction=reduction, **kw)
    return out.detach(), torch.autograd.grad(out, (xf, wf, bf)), g


def column_checks(rank, world, sizes, order):
    from softk.distributed import vocab_parallel_fused_linear_loss

    lo, hi = bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    x, w, b, t = _problem(sizes, order)
    n, vr = x.shape[0], hi - lo
    chunks = [(s, min(s + CHUNK, n)) for s in range(0, n, CHUNK)]
    real_columns, real_share = FL.live_columns, FL.SPARSE_MAX_SHARE
    seen = []

    def spy(g):
        cols = real_columns(g)
        seen.append(None if cols is None else cols.tolist())
        return cols

    FL.live_columns = spy
    try:
        for loss, kw in LOSSES:
            for reduction in ("mean", "sum"):
                ref, (gx, gw, gb), g = _reference(loss, kw, x, w, b, t, reduction)
                gl = g[:, lo:hi]
                live = [(gl[s:e] != 0).any(0).nonzero().squeeze(1).tolist() for s, e in chunks]
                if loss != "topk_softmax_ce":
                    # the cases are there: a row whose gradient (2 classes or more) sits on one
                    # rank's slice, rows whose gradient spreads over two ranks; ignored rows none
                    nz = g != 0
                    ranks = torch.stack([nz[:, l:h].any(1) for l, h in bounds(sizes, order)], 1).sum(1)
                    assert bool(((ranks == 1) & (nz.sum(1) >= 2)).any()) and bool((ranks >= 2).any()), loss
                    assert not bool(nz[t == -100].any())
                calls = {}
                for share in (1.0, 0.5, 0.0):
                    FL.SPARSE_MAX_SHARE = {"cpu": share}
                    what = f"{loss} {reduction} share {share} rank {rank}"
                    xl, wl, bl = x.clone().requires_grad_(), w[lo:hi].clone().requires_grad_(), b[lo:hi].clone().requires_grad_()
                    seen.clear()
                    with Counter() as fwd:
                        out = vocab_parallel_fused_linear_loss(xl, wl, t, loss, bl, vocab_start=lo if explicit else None,
                                                               reduction=reduction, chunk_size=CHUNK, **kw)
                    with Counter() as bwd:
                        hx, hw, hb = torch.autograd.grad(out, (xl, wl, bl))
                    _close(out, ref, what)
                    _close(hx, gx, what + " grad input")
                    _close(hw, gw[lo:hi], what + " grad weight")
                    _close(hb, gb[lo:hi], what + " grad bias")
                    # the products that ran: the live columns, or the dense ones past the share
                    expected = [c if share > 0 and len(c) <= share * vr else None for c in live]
                    assert seen == expected, (what, seen, expected)
                    calls[share] = fwd.calls
                    assert bwd.calls == [], (what, bwd.calls)
                assert calls[1.0] == calls[0.5] == calls[0.0], (loss, reduction, rank, calls)
                if loss != "topk_softmax_ce":
                    # at share 0.5 both kinds ran on this rank: the flat chunk (every class live) dense
                    half = [c if len(c) <= 0.5 * vr else None for c in live]
                    assert None in half and any(c is not None for c in half), (loss, rank, live)
    finally:
        FL.live_columns, FL.SPARSE_MAX_SHARE = real_columns, real_share


def test_two_ranks_uneven_slices(tmp_path):
    run(2, column_checks, tmp_path, [9, 23], [0, 1])


@pytest.mark.slow
def test_three_ranks_permuted_slices(tmp_path):
    # rank 0 holds the last slice, rank 2 the first, rank 1 a single class
    run(3, column_checks, tmp_path, [11, 1, 20], [2, 1, 0])
