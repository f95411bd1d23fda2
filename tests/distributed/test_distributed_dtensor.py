"""softk's public maps and losses on DTensor logits over gloo: 2 ranks (19 classes: 10, 9) and 3 ranks (7, 7, 5).

Each spawn runs every check of tests/distributed/dtensor_cases.py, to keep the
process start-up cost down.
"""

from __future__ import annotations

import pytest
import torch

from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


def _all(rank, world, v):
    from . import dtensor_cases as C

    C.all_checks(rank, world, v)


@pytest.mark.slow
def test_dtensor_two_ranks(tmp_path):
    run(2, _all, tmp_path, 19)


@pytest.mark.slow
def test_dtensor_three_ranks_uneven(tmp_path):
    run(3, _all, tmp_path, 19)


def test_plain_tensors_skip_the_dtensor_entry():
    import softk
    from softk import _dtensor

    x = torch.randn(3, 5)
    assert not _dtensor.is_dtensor(x) and not _dtensor.is_dtensor(torch.nn.Parameter(x))
    torch.testing.assert_close(softk.sparsemax(x), softk.sparsemax.__wrapped__(x))


def _mesh_2d(rank, world, v):
    from . import dtensor_cases as C

    C.mesh_2d_checks(rank, world, v)


@pytest.mark.slow
def test_dtensor_two_by_two_mesh_rows_and_classes_sharded(tmp_path):
    run(4, _mesh_2d, tmp_path, 13)


def test_one_rank_mesh_in_process(tmp_path):
    """The DTensor entry in the default (fast) run: a one-rank gloo mesh in this process."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    import softk
    from softk import losses as L

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        z = torch.randn(4, 6, dtype=torch.float64)
        t = torch.tensor([0, 5, -100, 2])
        zd = distribute_tensor(z, mesh, [Shard(-1)]).requires_grad_()
        loss = L.entmax15_loss(zd, t)
        assert isinstance(loss, DTensor) and loss.placements == (Replicate(),)
        torch.testing.assert_close(loss.to_local(), L.entmax15_loss(z, t), rtol=1e-12, atol=1e-12)
        loss.backward()
        assert zd.grad.placements == (Shard(1),)
        p = softk.entmax(zd, alpha=1.3)
        assert p.placements == (Shard(1),)
        torch.testing.assert_close(p.to_local(), softk.entmax(z, alpha=1.3), rtol=1e-12, atol=1e-12)
        with pytest.raises(ValueError, match="Partial"):
            softk.sparsemax(DTensor.from_local(z, mesh, [Partial()]))
        # maps without a vocab-parallel form: a clear error on class shards, the local result otherwise
        with pytest.raises(ValueError, match=r"softk.hard_topk has no vocab-parallel form.*Shard\(dim=1\)"):
            softk.hard_topk(zd, 2)
        with pytest.raises(ValueError, match="softk.normmax_loss has no vocab-parallel form"):
            L.normmax_loss(zd, t)
        rows = softk.normmax(distribute_tensor(z, mesh, [Shard(0)]))
        assert rows.placements == (Shard(0),)
        torch.testing.assert_close(rows.to_local(), softk.normmax(z))
    finally:
        dist.destroy_process_group()
