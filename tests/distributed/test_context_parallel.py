"""Context-parallel attention (softk.distributed.context_parallel_attention) on 2–4 gloo ranks.

Each spawned group runs a case of tests/distributed/cp_cases.py: outputs and
gradients against one device's float64 attention at 1e-12, every map, causal
or not, contiguous uneven shards and torch's head–tail layout, both
strategies; the ring's overflow and Newton trips; bad input raised on every
rank; torch's own context; a transformers Llama.  The layouts and the causal
runs are checked without processes.
"""

from __future__ import annotations

import pytest
import torch

from softk.distributed.cp_gather import _runs
from softk.distributed.cp_plan import positions

from . import cp_cases
from .dist_harness import run

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")


@pytest.mark.parametrize("world", [2, 3, 4])
def test_head_tail_is_torchs_layout(world):
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

    total = 2 * world * 3
    torch_order = _HeadTailLoadBalancer(total, world, "cpu")._generate_indices()[0]
    ours = torch.cat([positions("head_tail", [total // world] * world, r, "cpu") for r in range(world)])
    assert ours.tolist() == torch_order.tolist()


def test_contiguous_layout_tiles_the_sequence_in_rank_order():
    lengths = [3, 0, 5, 1]
    ours = torch.cat([positions("contiguous", lengths, r, "cpu") for r in range(4)])
    assert ours.tolist() == list(range(9))


def test_causal_runs_follow_consecutive_positions():
    pos = torch.tensor([0, 1, 2, 9, 10, 11, 12])
    assert list(_runs(pos, 3)) == [(0, 3), (3, 6), (6, 7)]
    assert list(_runs(pos, 100)) == [(0, 3), (3, 7)]


def test_needs_an_initialised_group():
    from softk.distributed import context_parallel_attention

    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
        context_parallel_attention(q, q, q)


@pytest.mark.parametrize("strategy", ["allgather", "ring"])
def test_every_map_equals_one_device(strategy, tmp_path):
    run(2, cp_cases.every_map, tmp_path, strategy)


@pytest.mark.slow
@pytest.mark.parametrize("world", [3, 4])
@pytest.mark.parametrize("strategy", ["allgather", "ring"])
def test_every_map_equals_one_device_on_more_ranks(world, strategy, tmp_path):
    run(world, cp_cases.every_map, tmp_path, strategy)


def test_ring_edges_equal_one_device(tmp_path):
    run(3, cp_cases.edges, tmp_path, "ring")


@pytest.mark.slow
def test_allgather_edges_equal_one_device(tmp_path):
    run(3, cp_cases.edges, tmp_path, "allgather")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["allgather", "ring"])
def test_half_precision_is_as_close_as_one_device(strategy, tmp_path):
    run(3, cp_cases.half, tmp_path, strategy)


def test_bad_input_raises_on_every_rank(tmp_path):
    run(2, cp_cases.bad_inputs, tmp_path)


def test_torchs_context(tmp_path):
    run(2, cp_cases.inside_torch_context, tmp_path)


def test_transformers_llama_under_context_parallel(tmp_path):
    pytest.importorskip("transformers")
    run(2, cp_cases.llama, tmp_path, "allgather", 16)  # head–tail: 16 = 4 chunks of 4


@pytest.mark.slow
def test_transformers_llama_ring_uneven_contiguous(tmp_path):
    pytest.importorskip("transformers")
    run(2, cp_cases.llama, tmp_path, "ring", 15)  # 15 % 4 ≠ 0: torch shards contiguously (8, 7)


@pytest.mark.parametrize("learnable", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_torchtitan_llama_under_context_parallel(learnable, tmp_path):
    pytest.importorskip("torchtitan.models.llama3", reason="torchtitan is not installed (the torchtitan extra)")
    run(2, cp_cases.torchtitan_llama, tmp_path, "ring" if learnable else "allgather", learnable)


def test_random_calls_equal_one_device(tmp_path):
    run(3, cp_cases.random_calls, tmp_path, 30, 1)
