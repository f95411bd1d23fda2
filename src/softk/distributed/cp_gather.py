r"""Context-parallel attention by an all-gather of K and V: the local kernels on the whole sequence.

Each rank gathers every rank's key/value shard (one all-gather of K and V
together, the shards padded to the longest), puts the keys in sequence order, and runs
softk's attention (the fused Triton
kernels on CUDA, the blockwise kernel elsewhere) for its own queries against
all of them: each query row sees its whole row of keys, so λ and the output
are one device's.  With the causal mask, the queries go in runs of
consecutive positions (one run for ``"contiguous"``, two for
``"head_tail"``, cut further to at most ``MASK`` mask entries), each against
the keys up to its last position, with the mask of its run.

The backward sums every rank's dK and dV (one all-reduce of the gathered
gradients; each rank keeps its own shard's), so every rank must run the
backward, as with any context parallelism.  Memory per rank: K and V of
the whole sequence, O(T·E), as in torch's all-gather context parallelism.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._ops.distributed import all_gather, all_reduce
from ..attention._sdpa import local_attention
from .cp_plan import Plan

MASK = 1 << 24  # mask entries (queries × keys) of one causal run at most


class GatherSequence(torch.autograd.Function):
    """Every rank's shard (B, H, L_r, E) in rank order along dim 2; the backward sums the ranks' gradients."""

    @staticmethod
    def forward(ctx, x, plan: Plan, group):
        longest = max(plan.lengths)
        pad = x.new_zeros(*x.shape[:2], longest - x.shape[2], *x.shape[3:])
        parts = all_gather(torch.cat([x, pad], 2), group, plan.world)
        ctx.plan, ctx.group = plan, group
        return torch.cat([p[:, :, :n] for p, n in zip(parts, plan.lengths)], 2)

    @staticmethod
    def backward(ctx, g):
        plan = ctx.plan
        g = all_reduce(g.contiguous().clone(), "sum", ctx.group)
        start = sum(plan.lengths[:plan.rank])
        return g[:, :, start:start + plan.lengths[plan.rank]], None, None


def _runs(pos: Tensor, width: int):
    """(i0, i1) spans of queries with consecutive positions, at most ``width`` each."""
    cuts = [0] + ((pos[1:] != pos[:-1] + 1).nonzero().squeeze(-1) + 1).tolist() + [pos.numel()]
    for a, b in zip(cuts, cuts[1:]):
        for i0 in range(a, b, width):
            yield i0, min(i0 + width, b)


def attention(plan: Plan, group, q: Tensor, k: Tensor, v: Tensor, alpha) -> Tensor:
    """The output (B, H, L_r, Ev) of this rank's queries."""
    call = plan.call
    e = k.shape[-1]
    # one collective for both (and one in the backward): the same order on every rank whatever autograd's
    kvall = GatherSequence.apply(torch.cat([k, v], -1), plan, group)
    kall, vall = kvall[..., :e], kvall[..., e:]
    kpos = torch.cat([plan.positions(r, q.device) for r in range(plan.world)])
    if plan.layout != "contiguous":  # sequence order (contiguous shards gather in it)
        order = torch.argsort(kpos)
        kall, vall = kall[:, :, order], vall[:, :, order]
    opts = dict(scale=call.scale, enable_gqa=k.shape[1] != q.shape[1], map=plan.map_name, alpha=alpha,
                softcap=call.softcap)
    if not call.causal or q.shape[2] == 0:  # (an empty shard still joins the backward's all-reduce)
        return local_attention(q, kall, vall, **opts)
    qpos = plan.positions(plan.rank, q.device)
    outs = []
    for i0, i1 in _runs(qpos, max(1, MASK // max(kall.shape[2], 1))):
        last = int(qpos[i1 - 1]) + 1
        mask = torch.arange(last, device=q.device) <= qpos[i0:i1].unsqueeze(-1)
        outs.append(local_attention(q[:, :, i0:i1], kall[:, :, :last], vall[:, :, :last], attn_mask=mask, **opts))
    return torch.cat(outs, 2)

