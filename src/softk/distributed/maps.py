r"""``vocab_parallel_map``: this rank's slice of p = map(concatenated logits)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .._validate import check_input, check_k, check_tau
from ..threshold.rows import compute_dtype
from .checks import exchange, resolve_group
from .families import map_family, what_code
from .threshold import distributed_forward


class _VocabParallelMap(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, family, k, tau, group, rank, world):
        z = x.to(compute_dtype(x.dtype))
        if tau != 1.0:
            z = z / tau
        p = distributed_forward(family, z, k, group, rank, world).p
        ctx.family, ctx.tau, ctx.group = family, tau, group
        out = p.to(x.dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        ct = compute_dtype(out.dtype)
        d = ctx.family.d_from_p(out.to(ct))
        g = g.to(ct)
        # The Jacobian-vector product d⊙(g − Σd⊙g / Σd)/τ needs the two sums
        # over the whole row: one all-reduce.
        sums = torch.cat([d.sum(-1, keepdim=True), (d * g).sum(-1, keepdim=True)], -1)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=ctx.group)
        sd, sdg = sums[:, :1], sums[:, 1:]
        coef = torch.where(sd > 0, sdg / torch.where(sd > 0, sd, 1.0), 0.0)
        grad = (g - coef) * d / ctx.tau
        # A NaN row (NaN or +inf scores) has a NaN gradient, as on one device.
        grad = torch.where(torch.isnan(out).any(-1, keepdim=True), float("nan"), grad)
        return grad.to(out.dtype), None, None, None, None, None, None


def vocab_parallel_map(local_logits: Tensor, map: str = "sparsemax", *, k: int = 1, tau: float = 1.0, alpha=None, group=None) -> Tensor:
    r"""This rank's slice of ``map`` applied to the logits concatenated over the ranks of ``group``.

    Each rank passes ``local_logits`` (..., V_r), the scores of its own slice of
    the vocabulary on the last dimension (any slice order: a map does not care
    which global index a column has); the result is this rank's columns of
    p = f(z/τ − λ), Σ_v p_v = k over the whole vocabulary, equal (to rounding)
    to the single-device map on the concatenated logits, with the same
    conventions for ``-inf`` masks, fully masked rows and NaN rows.

    Args:
        local_logits: (..., V_r) floating; every rank the same leading shape and dtype.
        map: "softmax", "sparsemax", "entmax15", "entmax" (with ``alpha``),
            "sparse" (soft top-k ``clip(z − λ, 0, 1)``, any k) or "exp" (k = 1).
        k, tau, alpha: as in the single-device maps.
        group: the process group (default: the world), e.g. a tensor-parallel group.

    Collectives per call, the same on every rank and for any data: 1 all-reduce
    of a (world, 14) int64 table (argument agreement, :mod:`.checks`), then
    softmax/"exp": 2 all-reduces; sparsemax, entmax15, entmax, "sparse": 2
    all-reduces + 1 all-gather (:mod:`.threshold`).  The backward: 1
    all-reduce of two (M,) sums, so every rank must run it.

    Refused: soft top-k sigmoid/laplace and "exp" with k > 1 (no compact
    support, see :mod:`.threshold`).

    >>> import torch, torch.distributed as dist, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "pg")
    >>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    >>> vocab_parallel_map(torch.tensor([[0.0, 1.0, 3.0]]), "sparsemax")
    tensor([[0., 0., 1.]])
    >>> dist.destroy_process_group()
    """
    rank, world = resolve_group(group)
    err, family = None, None
    try:
        check_input(local_logits, "local_logits")
        k = check_k(k)
        tau = check_tau(tau)
        family = map_family(map, k, alpha)
        if local_logits.shape[-1] < 1:
            raise ValueError("local_logits must hold at least one class on its last dimension")
    except (TypeError, ValueError) as e:
        err = e
    code = what_code("map", map, alpha)
    exchange(local_logits, None, group=group, rank=rank, world=world, vocab_start=None,
             k=k, tau=tau, what=code, local_error=err)
    lead = local_logits.shape[:-1]
    x = local_logits.reshape(-1, local_logits.shape[-1])
    if x.shape[0] == 0:
        return local_logits * 0
    out = _VocabParallelMap.apply(x, family, k, tau, group, rank, world)
    return out.reshape(*lead, -1)
