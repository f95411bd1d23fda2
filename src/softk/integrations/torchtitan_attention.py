r"""softk's attention in torchtitan's inner-attention slot, context-parallel when asked.

torchtitan's decoders (``torchtitan.models.common``: Llama 3, Qwen 3, …) hold
in each block's attention an ``inner_attention`` module called as
``inner_attention(q, k, v, attention_masks=..., scale=..., enable_gqa=...)``
with q, k, v in (B, L, N, H) and returning (B, L, N, H); its SDPA version
runs ``F.scaled_dot_product_attention`` causally and takes no mask.
:func:`apply_softk_attention` puts :class:`SoftkInnerAttention` in that slot
in every block: the same call on softk's map, with α fixed or learned per
head (``softk.nn.ScaledDotProductAttention``).

**Context parallelism.**  torchtitan's CP (``apply_cp_to_forward``) wraps
the SDPA module's forward so that torch's ring SDPA sees DTensors; it
knows nothing of softk's maps, and refuses a module it does not know.  So
with ``cp_mesh`` (torchtitan's ``parallel_dims.get_mesh("cp")``) the swap
does the CP itself: each call runs inside
:func:`softk.distributed.context_parallel` on the mesh's group, in the
layout of torchtitan's ``prepare_context_parallel_input``
(``load_balancer_type="headtail"`` → ``"head_tail"``, ``None`` →
``"contiguous"``).  Call it on a model to which torchtitan applied no CP of
its own (or after, since it replaces the wrapped modules).  torchtitan is not
imported here: the slot is duck-typed.
"""

from __future__ import annotations

import torch

from ..distributed import context_parallel
from ..nn.attention import ScaledDotProductAttention

_LAYOUTS = {"headtail": "head_tail", None: "contiguous"}


class SoftkInnerAttention(torch.nn.Module):
    """torchtitan's inner attention (q, k, v in (B, L, N, H)) with softk's ``map``.

    Args:
        map, alpha, learnable, num_heads: as :class:`softk.nn.ScaledDotProductAttention`.
        cp_mesh: None, or the 1-D context-parallel DeviceMesh: the call's q, k, v
            are then this rank's shard of the sequence in ``layout``.
        layout, strategy: of :func:`softk.distributed.context_parallel_attention`.
    """

    def __init__(self, map: str = "entmax15", alpha=None, *, num_heads: int | None = None, learnable: bool = False,
                 cp_mesh=None, layout: str = "head_tail", strategy: str = "allgather"):
        super().__init__()
        self.attention = ScaledDotProductAttention(map, alpha, num_heads=num_heads, learnable=learnable)
        self.cp_group = None if cp_mesh is None else cp_mesh.get_group()
        self.layout, self.strategy = layout, strategy

    def forward(self, q_BLNH, k_BLNH, v_BLNH, *, attention_masks=None, scale=None, enable_gqa: bool = False,
                is_causal: bool = True, **kwargs):
        if attention_masks is not None:
            raise ValueError("softk's inner attention takes no attention_masks (it runs causal or full attention, "
                             "as torchtitan's SDPA backend does); use attn_backend='sdpa' in the model config")
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        if self.cp_group is None:
            out = self.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        else:
            with context_parallel(group=self.cp_group, layout=self.layout, strategy=self.strategy):
                out = self.attention(q, k, v, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)


def apply_softk_attention(model: torch.nn.Module, map: str = "entmax15", alpha=None, *, learnable: bool = False,
                          cp_mesh=None, load_balancer_type: str | None = "headtail",
                          strategy: str = "allgather") -> int:
    """Put :class:`SoftkInnerAttention` in the inner-attention slot of every block of a torchtitan
    decoder (``model.layers``' ``attention.inner_attention``); returns how many.

    ``learnable=True`` gives each block its own α per head (``map="entmax"``;
    the parameters are on the CPU in float32: move the model after).
    ``cp_mesh`` and ``load_balancer_type`` are those torchtitan's trainer
    shards the batch with (``prepare_context_parallel_input``).
    """
    if load_balancer_type not in _LAYOUTS:
        raise ValueError(f"load_balancer_type must be 'headtail' or None (torchtitan's 'ptrr' is not a layout "
                         f"softk's context-parallel attention takes), got {load_balancer_type!r}")
    layers = getattr(model, "layers", None)
    blocks = list(layers.values()) if isinstance(layers, torch.nn.ModuleDict) else list(layers or [])
    slots = [b.attention for b in blocks if hasattr(getattr(b, "attention", None), "inner_attention")]
    if not slots:
        raise ValueError(f"{type(model).__name__} has no torchtitan decoder blocks (model.layers[i].attention."
                         f"inner_attention) to put softk's attention in")
    for attn in slots:
        slot = SoftkInnerAttention(map, alpha, num_heads=getattr(attn, "n_heads", None), learnable=learnable,
                                   cp_mesh=cp_mesh, layout=_LAYOUTS[load_balancer_type], strategy=strategy)
        setattr(attn, "inner_attention", slot)
    return len(slots)
