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
