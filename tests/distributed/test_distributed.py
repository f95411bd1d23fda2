"""softk.distributed over gloo on CPU: 2 and 3 processes, even, uneven and permuted slices.

Each spawn runs many checks (tests/dist_cases.py) to keep the process start-up
cost down; a rank that hangs fails the test after the harness's deadline.
"""

from __future__ import annotations

import pytest
import torch

from softk.distributed import vocab_parallel_loss, vocab_parallel_map

from . import dist_cases as C
from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


@pytest.mark.slow
def test_two_ranks_uneven_slices(tmp_path):
    run(2, C.all_checks, tmp_path, [7, 13], [0, 1])


@pytest.mark.slow
def test_three_ranks_permuted_slices_errors_and_subgroup(tmp_path):
    # Rank 0 holds the last slice, rank 2 the first, rank 1 a single class;
    # then the error cases (contiguous slices) and a sub-group of ranks 0 and 2.
    run(3, C.all_checks, tmp_path, [6, 1, 12], [2, 1, 0])


def test_uninitialised_group_is_a_clear_error():
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError, match="not initialised"):
        vocab_parallel_loss(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="not initialised"):
        vocab_parallel_map(torch.zeros(2, 3))
