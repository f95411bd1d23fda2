"""softk's attention in torchtitan's inner-attention slot (softk.integrations.torchtitan_attention).

In one process: softmax through the slot is torchtitan's own SDPA module, the
sparse maps are softk's attention on the transposed tensors, and bad calls are
refused by name.  The context-parallel swap on a torchtitan Llama 3 runs in
tests/distributed/test_context_parallel.py.
"""

from __future__ import annotations

import pytest
import torch

import softk.attention as sa
from softk.integrations.torchtitan_attention import SoftkInnerAttention, apply_softk_attention


def _qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 7, h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2)]  # (B, L, N, H)


def test_softmax_is_torchtitans_own_sdpa():
    attention = pytest.importorskip("torchtitan.models.common.attention", reason="torchtitan is not installed")
    q, k, v = _qkv()
    own = attention.ScaledDotProductAttention(attention.ScaledDotProductAttention.Config())
    theirs = own(q, k, v, scale=0.3, enable_gqa=True)
    ours = SoftkInnerAttention("softmax")(q, k, v, scale=0.3, enable_gqa=True)
    assert ours.shape == theirs.shape == (2, 7, 4, 8)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("map_name", ["sparsemax", "entmax15"])
def test_sparse_maps_are_softks_attention_transposed(map_name):
    q, k, v = _qkv(1)
    out = SoftkInnerAttention(map_name)(q, k, v, enable_gqa=True)
    want = sa.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True,
                                           enable_gqa=True, map=map_name).transpose(1, 2)
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_learned_alpha_per_head_gets_its_gradient():
    q, k, v = _qkv(2)
    slot = SoftkInnerAttention("entmax", 1.3, num_heads=4, learnable=True)
    slot(q.float(), k.float(), v.float(), enable_gqa=True).sum().backward()
    grad = slot.attention.alpha_raw.grad
    assert grad is not None and grad.shape == (4,) and bool(torch.isfinite(grad).all()) and bool((grad != 0).any())


def test_refusals():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="attention_masks"):
        SoftkInnerAttention()(q, k, v, attention_masks=object(), enable_gqa=True)
    with pytest.raises(ValueError, match="load_balancer_type"):
        apply_softk_attention(torch.nn.Module(), load_balancer_type="ptrr")
    with pytest.raises(ValueError, match="no torchtitan decoder blocks"):
        apply_softk_attention(torch.nn.Linear(2, 2))


def test_every_block_is_swapped():
    class Attn(torch.nn.Module):
        n_heads = 4

        def __init__(self):
            super().__init__()
            self.inner_attention = torch.nn.Identity()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = Attn()

    model = torch.nn.Module()
    model.layers = torch.nn.ModuleDict({str(i): Block() for i in range(3)})
    assert apply_softk_attention(model, "entmax", 1.2, learnable=True) == 3
    for block in model.layers.values():
        slot = block.attention.inner_attention
        assert isinstance(slot, SoftkInnerAttention) and slot.attention.alpha.shape == (4,)
