"""benchmarks/gpu/attention.py's block sparsity (the report's column: the
share of visible 64×64 (query, key) tiles where every weight is 0) on inputs
whose zeros are known: queries and keys in two clusters of 64, each looking
only at its own, so sparsemax and 1.5-entmax zero the two off-diagonal
tiles (half of four; one of the three a causal mask leaves) and softmax
none; GQA, lengths that are not multiples of the tile."""


import pytest
import torch

from . import gpu_scripts


def _script():
    return gpu_scripts.load("attention")


def _clusters(heads, n=128):
    # score 100·scale within a cluster, 0 across: far past the maps' support gap
    x = torch.nn.functional.one_hot(torch.arange(n) // 64, 2).float() * 10
    return x[None, None].repeat(1, heads, 1, 1)


@pytest.mark.parametrize("name,zero,zero_causal", [("softmax", 0.0, 0.0), ("sparsemax", 0.5, 1 / 3),
                                                   ("entmax15", 0.5, 1 / 3)])
def test_block_sparsity_counts_the_tiles_of_zeros(name, zero, zero_causal):
    block_sparsity = _script().block_sparsity
    q, k = _clusters(4), _clusters(2)  # GQA: two query heads per key head
    assert block_sparsity(q, k, k, name, False) == pytest.approx(zero)
    assert block_sparsity(q, k, k, name, True) == pytest.approx(zero_causal)


def test_block_sparsity_of_ragged_lengths():
    # 100 queries and keys: tiles of 64 and 36; every query sees its own cluster's keys
    q = _clusters(2, 100)
    assert _script().block_sparsity(q, q, q, "sparsemax", False) == pytest.approx(0.5)
    assert _script().block_sparsity(q, q, q, "sparsemax", True) == pytest.approx(1 / 3)
