"""The knobs and loss="ts2" vocab-parallel, over gloo on CPU: 2 ranks with
uneven slices and 3 with permuted ones, against the single-device fused loss
(itself checked against unfused float64 references in test_fused_knobs.py)
and, for ts2, against the single-device ts2_loss on the full logits."""

from __future__ import annotations

import pytest
import torch

from softk.losses import fused_linear_loss, ts2_loss

from ..distributed.dist_cases import check_fused_against
from ..distributed.dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")

D = torch.float64


def _close(a, b, what):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"{what}: {m}")


def _bounds(sizes, order):
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [(starts[order[r]], starts[order[r]] + sizes[order[r]]) for r in range(len(order))]


CASES = [
    ("cross_entropy", dict(softcap=2.0, label_smoothing=0.1, class_weight=True, z_loss=0.01)),
    ("cross_entropy", dict(label_smoothing=0.2)),
    ("sparsemax", dict(softcap=2.5, label_smoothing=0.1, class_weight=True, z_loss=0.02)),
    ("entmax", dict(alpha=1.4, label_smoothing=0.15, z_loss=0.01)),
    ("softmax", dict(label_smoothing=0.1, class_weight=True)),
    ("ts2", dict(suppression=0.6, adaptive=True, tau=0.8, z_loss=0.01, class_weight=True)),
    ("ts2", dict(softcap=3.0)),
]


def knob_checks(rank, world, sizes, order):
    from softk.distributed import vocab_parallel_loss

    v = sum(sizes)
    lo, hi = _bounds(sizes, order)[rank]
    explicit = order != list(range(world))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(10, 4, dtype=D, generator=g) * 1.5
    w = torch.randn(v, 4, dtype=D, generator=g)
    b = torch.randn(v, dtype=D, generator=g)
    t = torch.randint(0, v, (10,), generator=g)
    t[3] = -100
    cw = torch.rand(v, dtype=D, generator=g) + 0.2
    for loss, kw in CASES:
        kw = dict(kw, class_weight=cw) if kw.get("class_weight") else kw
        for reduction in ("mean", "sum"):
            def ref(xf, wf, bf):
                return fused_linear_loss(xf, wf, t, loss, bf, reduction=reduction, **kw)

            check_fused_against(ref, x, w, b, t, (lo, hi), explicit, f"fused {loss} {sorted(kw)} {reduction} rank {rank}",
                                loss=loss, reduction=reduction, **kw)
    # bad knobs: every rank raises (the one that refused its own, the others because of it)
    from softk.distributed import vocab_parallel_fused_linear_loss as vpf

    for kw, match in ((dict(label_smoothing=0.1), "label_smoothing"), (dict(suppression=-1.0), "suppression")):
        try:
            vpf(x, w[lo:hi], t, "ts2", **kw)
        except ValueError as e:
            assert match in str(e), e
        else:
            raise AssertionError(f"no ValueError for {kw}")
    try:
        vpf(x, w[lo:hi], t, "sparsemax", z_loss=0.1 if rank == 0 else 0.0)
    except ValueError as e:
        assert "differ between ranks" in str(e), e
    else:
        raise AssertionError("no ValueError for z_loss differing between ranks")
    # dense targets: label smoothing on the sliced rows, softcap and z-loss
    y = torch.softmax(torch.randn(10, v, dtype=D, generator=g) * 2, -1)
    ky = torch.zeros(10, v, dtype=D)
    ky[:, [0, 5, v - 1]] = 1.0
    for loss, yt, kw in (("sparsemax", y, dict(label_smoothing=0.1, softcap=2.0, z_loss=0.01)),
                         ("cross_entropy", y, dict(label_smoothing=0.2, z_loss=0.01)),
                         ("soft_topk", ky, dict(k=3, method="sparse", softcap=2.0, z_loss=0.01))):
        def ref(xf, wf, bf):
            return fused_linear_loss(xf, wf, yt, loss, bf, **kw)

        check_fused_against(ref, x, w, b, yt, (lo, hi), explicit, f"fused dense {loss} rank {rank}", loss=loss, **kw)
    # vocab_parallel_loss itself, loss="ts2", with a clamped row (off-support
    # softmax mass > 0.99, which needs a few hundred classes): the slices × 25
    v = 25 * sum(sizes)
    lo, hi = _bounds([25 * s for s in sizes], order)[rank]
    z = torch.randn(6, v, dtype=D, generator=g)
    z[0] = _clamped_row(v)
    tz = torch.randint(0, v, (6,), generator=g)
    tz[0], tz[2] = 0, -100
    for adaptive in (False, True):
        for reduction in ("mean", "sum", "none"):
            zf = z.clone().requires_grad_()
            ref = ts2_loss(zf, tz, suppression=0.5, tau=0.25, adaptive=adaptive, reduction=reduction)
            (gz,) = torch.autograd.grad(ref.sum(), zf)
            zl = z[:, lo:hi].clone().requires_grad_()
            out = vocab_parallel_loss(zl, tz, "ts2", vocab_start=lo if explicit else None, suppression=0.5,
                                      tau=0.25, adaptive=adaptive, reduction=reduction)
            what = f"ts2 adaptive={adaptive} {reduction} rank {rank}"
            _close(out, ref, what)
            (hz,) = torch.autograd.grad(out.sum(), zl)
            _close(hz, gz[:, lo:hi], what + " grad")


def test_two_ranks_uneven_slices(tmp_path):
    run(2, knob_checks, tmp_path, [7, 13], [0, 1])


@pytest.mark.slow
def test_three_ranks_permuted_slices(tmp_path):
    run(3, knob_checks, tmp_path, [6, 1, 12], [2, 1, 0])


def _clamped_row(v):
    z = torch.zeros(v, dtype=D)
    z[0], z[1] = 0.5, 0.4
    return z


def test_clamped_row_is_clamped():
    """The ts2 row of knob_checks reaches the clamp: at τ = 0.25 its support is {0, 1}."""
    import softk

    z = _clamped_row(25 * 20)
    assert (softk.sparsemax(z, tau=0.25) > 0).sum() == 2
    assert torch.softmax(z, -1)[2:].sum() > 0.99
