"""softk.distributed under torch.compile over gloo on CPU: 2 ranks, uneven slices (tests/distributed/compile_cases.py)."""

from __future__ import annotations

import pytest
import torch

from . import compile_cases as K
from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


# one spawn for every loss, reduction and map: each spawn pays for starting torch and Dynamo on both ranks
@pytest.mark.slow
def test_compiled_losses_and_maps_equal_eager_two_ranks_uneven_slices(tmp_path):
    run(2, K.compile_checks, tmp_path, [7, 13], [0, 1], "aot_eager")
