"""softk.integrations.torchtitan: torchtitan's loss-object interface, on whole logits, DTensor logits and slices.

Sum reduction and division by global_valid_tokens, against the single-process
softk loss; 2 gloo ranks for the tensor-parallel forms (without torchtitan).
"""

from __future__ import annotations

import pytest
import torch

from softk import losses as L
from softk.integrations.torchtitan import IGNORE_INDEX, SoftkLoss

from ..distributed.dist_harness import run

D = torch.float64


def _data(v=11):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, v, dtype=D, generator=g) * 2
    t = torch.randint(0, v, (6,), generator=g)
    t[2] = IGNORE_INDEX
    return z, t


def test_whole_logits_sum_over_global_valid_tokens():
    z, t = _data()
    for loss, ref in (("cross_entropy", L.cross_entropy), ("sparsemax", L.sparsemax_loss), ("entmax15", L.entmax15_loss)):
        out, metrics = SoftkLoss(SoftkLoss.Config(loss=loss))(z, t, torch.tensor(5.0, dtype=D))
        assert metrics == {}
        torch.testing.assert_close(out, ref(z, t, reduction="sum") / 5)
    with pytest.raises(ValueError, match="global_vocab_size"):
        SoftkLoss(SoftkLoss.Config(global_vocab_size=12))(z, t)
    with pytest.raises(ValueError, match="loss must be one of"):
        SoftkLoss(SoftkLoss.Config(loss="sparsmax"))


def _ranks(rank, world):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    z, t = _data()
    lo, hi = (0, 6) if rank == 0 else (6, 11)  # torchtitan's ceil-division shards, as DTensor's
    for loss, kw, ref in (("cross_entropy", {}, lambda x: L.cross_entropy(x, t, reduction="sum")),
                          ("entmax", {"alpha": 1.3}, lambda x: L.entmax_loss(x, t, 1.3, reduction="sum")),
                          ("topk_softmax_ce", {"k": 3}, lambda x: L.topk_softmax_cross_entropy(x, t, 3, reduction="sum"))):
        zf = z.clone().requires_grad_()
        want = ref(zf) / 4
        (gf,) = torch.autograd.grad(want, zf)
        cfg = SoftkLoss.Config(loss=loss, global_vocab_size=11, **kw)
        zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
        got, _ = SoftkLoss(cfg)(zd, t, torch.tensor(4.0, dtype=D))
        assert type(got) is torch.Tensor, type(got)
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-10)
        (gd,) = torch.autograd.grad(got, zd)
        torch.testing.assert_close(gd.full_tensor(), gf, rtol=1e-10, atol=1e-10)
        zl = z[:, lo:hi].clone().requires_grad_()
        got2, _ = SoftkLoss(cfg, group=dist.group.WORLD)(zl, t, torch.tensor(4.0, dtype=D))
        torch.testing.assert_close(got2, want.detach(), rtol=1e-10, atol=1e-10)
        (gl,) = torch.autograd.grad(got2, zl)
        torch.testing.assert_close(gl, gf[:, lo:hi], rtol=1e-10, atol=1e-10)


@pytest.mark.slow
def test_dtensor_and_slices_on_two_ranks(tmp_path):
    run(2, _ranks, tmp_path)


def test_against_torchtitan_itself():
    pytest.importorskip("torchtitan.components.loss", reason="torchtitan is not installed (an optional extra)")
    from torchtitan.components.loss import cross_entropy_loss

    z, t = _data()
    out, _ = SoftkLoss(SoftkLoss.Config(loss="cross_entropy"))(z.float(), t)
    torch.testing.assert_close(out, cross_entropy_loss(z.float(), t))
