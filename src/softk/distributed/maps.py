r"""``vocab_parallel_map``: this rank's slice of p = map(concatenated logits)."""

from __future__ import annotations

from torch import Tensor

from .._ops.distributed import VocabParallelMap
from .._validate import check_input, check_k, check_tau
from .checks import exchange, outside_graph, resolve_group
from .families import map_family, what_code
from .threshold import distributed_forward


def _agree(local_logits, map, k, tau, alpha, group):
    """The local checks, then the agreement of the ranks (:mod:`.checks`): (rank, world, k, tau, family),
    or the same error on every rank."""
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
    return rank, world, k, tau, family


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
    rank, world, k, tau, family = outside_graph(_agree)(local_logits, map, k, tau, alpha, group)
    lead = local_logits.shape[:-1]
    x = local_logits.reshape(-1, local_logits.shape[-1])
    if x.shape[0] == 0:
        return local_logits * 0
    out = VocabParallelMap.apply(x, lambda z: distributed_forward(family, z, k, group, rank, world).p, family, tau,
                                 group)
    return out.reshape(*lead, -1)
