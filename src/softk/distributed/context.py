r"""Context-parallel attention: the sequence sharded over ranks, softk's maps exact across them.

A sparse map's threshold λ needs every key of a row.  Each rank of a process
group holds a shard of the sequence (queries, keys and values of the same
tokens, placed by a layout: :mod:`.cp_plan`), and
:func:`context_parallel_attention` gives its queries' output, equal to one
device's attention over the whole sequence, by one of two exact strategies:

* ``"allgather"`` (:mod:`.cp_gather`): gather K and V, run the local kernels
  (Triton on CUDA) on the whole row; memory O(T·E) per rank;
* ``"ring"`` (:mod:`.cp_ring`): pass the key/value shards round the ring and
  run the blockwise kernel's passes on each as it arrives; memory O(L_local).

:func:`context_parallel` is torch's ``context_parallel`` context with softk's
attention in it: it shards the buffers as torch does (head–tail for causal
training) and routes every call of softk's attention through the group.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from ..attention import _context
from . import cp_gather, cp_ring
from .cp_plan import LAYOUTS, STRATEGIES, agree

__all__ = ["context_parallel_attention", "context_parallel", "LAYOUTS", "STRATEGIES"]


@torch.compiler.disable
def context_parallel_attention(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
                               scale=None, enable_gqa: bool = False, *, group=None, layout: str = "contiguous",
                               strategy: str = "allgather", map: str = "entmax15", alpha=None, softcap=None):
    r"""Attention over a sequence sharded on its length over the ranks of ``group``, with softk's maps.

    Every rank passes its shard: ``query`` (…, H, L_r, E), ``key``
    (…, H_kv, L_r, E) and ``value`` (…, H_kv, L_r, Ev), the same L_r tokens
    for the three, and gets its queries' rows of

    .. math:: O = \mathrm{map}(\mathrm{scale}\cdot QK^\top + M)\,V

    over the whole sequence of T = Σ_r L_r tokens: the same output and
    gradients (q, k, v and α) as :func:`softk.attention.scaled_dot_product_attention`
    on one device, to rounding.

    ``dropout_p``, ``scale``, ``enable_gqa``, ``map``, ``alpha`` and
    ``softcap`` are those of :func:`softk.attention.scaled_dot_product_attention`.

    Args:
        query: (…, H, L_r, E), this rank's queries.
        key: (…, H_kv, L_r, E), the keys of the same tokens.
        value: (…, H_kv, L_r, Ev), their values.
        is_causal: the causal mask of the whole sequence (key j seen by
            query i iff pos(j) ≤ pos(i), the positions read off ``layout``).
        attn_mask: must be None (an explicit mask is not sharded by this
            function; a ValueError says so).
        group: the process group (None: the default group).
        layout: where each rank's tokens sit in the sequence:
            ``"contiguous"`` (rank order, any lengths) or ``"head_tail"``
            (torch's load-balanced causal layout: chunks r and 2W − 1 − r of
            2W equal chunks; every rank the same even length).
        strategy: ``"allgather"`` (K and V gathered, the local kernels; one
            all-gather in the forward, one all-reduce in the backward) or ``"ring"`` (K and V passed round the ring: 2 trips
            forward, 1 for softmax, and 2 backward, W − 1 sends per trip;
            memory O(L_r)).

    Returns:
        (…, H, L_r, Ev), this rank's rows.  α's gradient is this rank's
        queries' share: the data-parallel reduction that sums a replicated
        parameter's gradients over the ranks gives one device's.

    Every rank checks the call in one all-reduce before any other
    collective: a bad argument on one rank, or a batch, head count, dtype,
    map, α, scale, soft cap, flag, layout or strategy that differs between
    ranks, or query and key/value shards of different lengths, raises the
    same ValueError on every rank.  Every rank must run the backward too
    (its collectives serve the other ranks' keys).  The collectives run
    eagerly (under ``torch.compile`` this function is a graph break).
    """
    plan = agree(query, key, value, group=group, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 scale=scale, enable_gqa=enable_gqa, map=map, alpha=alpha, softcap=softcap, layout=layout,
                 strategy=strategy)
    call = plan.call
    if plan.strategy == "allgather":
        out = cp_gather.attention(plan, group, call.q, call.k, call.v, call.alpha_value)
    else:
        out = cp_ring.RingAttention.apply(call.q, call.k, call.v, call.alpha, plan, group)
    return out.reshape(call.out_shape)


@contextlib.contextmanager
def context_parallel(mesh=None, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None, group=None,
                     layout: str | None = None, strategy: str = "allgather"):
    """Run softk's attention context-parallel inside the block.

    With ``mesh`` (a 1-D DeviceMesh): torch's
    ``torch.distributed.tensor.experimental.context_parallel(mesh, buffers=...,
    buffer_seq_dims=..., no_restore_buffers=...)`` is entered as it is (the
    buffers sharded in place on their sequence dimension, head–tail when
    torch balances the load, torch's SDPA rerouted), and every call of
    :func:`softk.attention.scaled_dot_product_attention` in the block goes
    to :func:`context_parallel_attention` on the mesh's group, in the layout
    torch chose.  Without ``mesh``: the caller has sharded the sequence
    (``layout``, default ``"contiguous"``) and ``group`` is the process group.

    The model's attention calls then take this rank's shard: ``is_causal``
    means the whole sequence's causal mask, an explicit ``attn_mask`` is
    refused, and :func:`softk.attention.varlen_attn` (packed sequences,
    paged caches) raises.
    """
    if mesh is None:
        route = functools.partial(_routed, group=group, layout=layout or "contiguous", strategy=strategy)
        previous = _context.set_route(route)
        try:
            yield
        finally:
            _context.set_route(previous)
        return
    if group is not None or layout is not None:
        raise ValueError("context_parallel takes either mesh (torch's context: the group and layout are the "
                         "mesh's and torch's) or group and layout, not both")
    from torch.distributed.tensor.experimental import context_parallel as torch_context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options

    with torch_context_parallel(mesh, buffers=buffers, buffer_seq_dims=buffer_seq_dims,
                                no_restore_buffers=no_restore_buffers):
        # torch balances the load (head–tail) exactly when it found a load balancer for the buffers
        chosen = "head_tail" if _cp_options.enable_load_balance else "contiguous"
        route = functools.partial(_routed, group=mesh.get_group(), layout=chosen, strategy=strategy)
        previous = _context.set_route(route)
        try:
            yield
        finally:
            _context.set_route(previous)


def _routed(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, *, map, alpha, softcap, group,
            layout, strategy):
    return context_parallel_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                      group=group, layout=layout, strategy=strategy, map=map, alpha=alpha,
                                      softcap=softcap)
