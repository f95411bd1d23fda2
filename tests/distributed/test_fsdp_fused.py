"""softk's fused linear loss under FSDP2 (``fully_shard``) on 2 gloo CPU ranks: ``apply_softk`` on a
GPT-2 in the four layouts of its LM head, and ``fsdp_fused_linear_loss`` (tests/distributed/fsdp_cases.py).

Loss, every parameter's gradient (FSDP's sharded ``.grad``) and the number of
all-gathers are checked against one process and against FSDP's own count;
each spawn runs many checks to keep the process start-up cost down.
"""

from __future__ import annotations

import pytest
import torch

from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")
pytest.importorskip("transformers")


def _cases():
    from . import fsdp_cases  # imports torch.distributed.fsdp and transformers: only when a test runs

    return fsdp_cases


def test_four_layouts_two_ranks(tmp_path):
    run(2, _cases().default_checks, tmp_path)


@pytest.mark.slow
def test_every_layout_loss_and_tying_two_ranks(tmp_path):
    run(2, _cases().all_checks, tmp_path)
