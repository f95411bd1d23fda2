"""softk.distributed under torch.compile over gloo on CPU: 2 ranks, uneven slices (tests/distributed/compile_cases.py)."""

from __future__ import annotations

import pytest
import torch

from . import compile_cases as K
from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


# one part per test, so that the compilations spread over the test run's workers
@pytest.mark.slow
@pytest.mark.parametrize("part", K.PARTS)
def test_compiled_losses_and_maps_equal_eager_two_ranks_uneven_slices(tmp_path, part):
    run(2, K.compile_checks, tmp_path, [7, 13], [0, 1], "aot_eager", part)
