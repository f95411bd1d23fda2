r"""Per-token log-probabilities, log-softmax and entropies over a vocabulary split between ranks.

For RL fine-tuning (PPO, GRPO): the log-probability of the sampled token and
the entropy of the policy, computed from each rank's slice of the logits with
a few all-reduces, never gathering the vocabulary (torchtitan's
``compute_logprobs`` all-gathers it).

Entropies (z = x/τ, p = map(z)), each 0 on a one-hot p:

* softmax: Shannon, H(p) = −Σ p_v log p_v;
* entmax-α (α > 1; sparsemax α = 2, entmax15 α = 1.5): Tsallis,
  H_α(p) = (1 − Σ p_v^α) / (α(α − 1)), which tends to Shannon as α → 1.
  Each map maximises ⟨z, p⟩ + H(p) over the simplex, so H is the entropy
  the map regularises with.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import _dtensor
from .._ops.distributed import ReplicatedSum, VocabParallelLogSoftmax, all_reduce
from .._maps.simplex import log_softmax
from .._validate import check_input, check_tau
from ..losses import targets as tg
from .checks import exchange, resolve_group
from .families import map_family, what_code
from .losses import vocab_parallel_loss
from .maps import vocab_parallel_map
from .threshold import NEG_INF, softmax_forward


def vocab_parallel_log_softmax(local_logits: Tensor, *, tau: float = 1.0, group=None) -> Tensor:
    r"""This rank's slice of ``log_softmax`` of the logits concatenated over the ranks of ``group``.

    A masked (−inf) entry gives −inf, a fully masked row −inf everywhere with a
    zero gradient, a row holding NaN or +inf NaN, as ``softk.log_softmax``.

    Collectives: forward 1 all-reduce (argument agreement) + 2 all-reduces;
    backward 1 all-reduce (Σg over the row).

    >>> import torch, torch.distributed as dist, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "pg")
    >>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    >>> vocab_parallel_log_softmax(torch.tensor([[0.0, 0.0]]))
    tensor([[-0.6931, -0.6931]])
    >>> dist.destroy_process_group()
    """
    if _dtensor.is_dtensor(local_logits):
        return log_softmax(local_logits, -1, tau)  # the public entry: the same placements back
    rank, world = resolve_group(group)
    err = None
    try:
        check_input(local_logits, "local_logits")
        tau = check_tau(tau)
    except (TypeError, ValueError) as e:
        err = e
    exchange(local_logits, None, group=group, rank=rank, world=world, vocab_start=None,
             k=1, tau=tau, what=what_code("map", "log_softmax"), local_error=err)
    lead = local_logits.shape[:-1]
    x = local_logits.reshape(-1, local_logits.shape[-1])
    if x.shape[0] == 0:
        return local_logits * 0

    def solve(z):
        fwd = softmax_forward(z, group)
        lse = torch.where(fwd.phi > 0, fwd.phi - 1, 0.0)  # log Σ e^{z − shift}; 0 on an empty row
        logp = torch.where(fwd.phi > 0, z - fwd.shift - lse, NEG_INF)
        return torch.where(fwd.broken, float("nan"), logp)

    return VocabParallelLogSoftmax.apply(x, solve, tau, group).reshape(*lead, -1)


def vocab_parallel_logprobs(
    local_logits: Tensor, labels: Tensor, group=None, *, vocab_start=None, map: str = "softmax", alpha=None,
    tau: float = 1.0, ignore_index: int = -100,
) -> Tensor:
    r"""log p_t, the log-probability of each row's label under ``map``, from this rank's vocabulary slice.

    Args:
        local_logits: (..., V_r) this rank's slice of the logits (a DTensor
            sharded on its last dimension is also accepted: see
            :mod:`softk.distributed.dtensor`).
        labels: (...) global class indices, the same on every rank.
        group, vocab_start: as in :func:`vocab_parallel_loss`.
        map: "softmax" (the default), "sparsemax", "entmax15" or "entmax"
            (with ``alpha``); under a sparse map a label outside the support
            has log p_t = −inf.
        tau: temperature (p = map(x/τ)).
        ignore_index: rows with this label give 0.

    A fully masked row (every logit −inf) gives NaN under softmax (it is
    −cross_entropy, whose convention that is, as torch's) and −inf under the
    sparse maps (p = 0 there).

    Returns (...) log p_t, the same on every rank, with gradients to
    ``local_logits``.  Nothing of size N×V is gathered.

    Collectives: softmax is ``−cross_entropy`` (forward 1 + 2 all-reduces,
    backward none); the sparse maps run :func:`vocab_parallel_map` (forward
    1 + 2 all-reduces + 1 all-gather) and 1 all-reduce of p_t; backward 1
    all-reduce; +1 all-reduce of the slice sizes when ``vocab_start`` is None.

    >>> import torch, torch.distributed as dist, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "pg")
    >>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    >>> vocab_parallel_logprobs(torch.tensor([[0.0, 0.0]]), torch.tensor([1]))
    tensor([-0.6931])
    >>> dist.destroy_process_group()
    """
    if _dtensor.is_dtensor(local_logits):
        from .placements import rows_entry  # (imports torch.distributed.tensor: on the first DTensor)

        x, t, grp, start, finish = rows_entry(local_logits, labels)
        return finish(vocab_parallel_logprobs(x, t, grp, vocab_start=start, map=map, alpha=alpha, tau=tau,
                                              ignore_index=ignore_index))
    if map == "softmax" and alpha is None:
        return -vocab_parallel_loss(local_logits, labels, "cross_entropy", group=group, vocab_start=vocab_start,
                                    tau=tau, ignore_index=ignore_index, reduction="none")
    map_family(map, 1, alpha)  # the same refusal on every rank, before any collective
    ignore_index = tg.check_ignore_index(ignore_index)
    p = vocab_parallel_map(local_logits, map, tau=tau, alpha=alpha, group=group)
    rank, world = resolve_group(group)
    sizes = torch.zeros(world, dtype=torch.int64, device=p.device)
    start = vocab_start
    if start is None:  # contiguous slices in rank order, as vocab_parallel_map's agreement found them
        sizes[rank] = p.shape[-1]
        sizes = all_reduce(sizes, "sum", group)
        start = int(sizes[:rank].sum())
    t = labels.to(p.device).long()
    keep = t != ignore_index
    local = t - start
    owned = keep & (local >= 0) & (local < p.shape[-1])
    pt = torch.where(owned, p.gather(-1, torch.where(owned, local, 0).unsqueeze(-1)).squeeze(-1), 0.0)
    pt = ReplicatedSum.apply(pt, group)
    return torch.where(keep, torch.log(pt), 0.0)


def vocab_parallel_entropy(local_logits: Tensor, map: str = "softmax", *, alpha=None, tau: float = 1.0,
                           group=None) -> Tensor:
    r"""The entropy of each row of ``map(x/τ)``, the logits split over the ranks of ``group``.

    Shannon :math:`H(p) = -\sum_i p_i \log p_i` for "softmax"; Tsallis
    :math:`H_\alpha(p) = (1 - \sum_i p_i^\alpha)/(\alpha(\alpha-1))`
    for "sparsemax" (α = 2), "entmax15" (α = 1.5) and "entmax" (``alpha`` > 1);
    both are 0 on a one-hot p, and each map maximises ⟨z, p⟩ + H(p).  Returns (...), the
    same on every rank, with gradients to ``local_logits``; a fully masked row
    gives 0.

    Collectives: forward those of :func:`vocab_parallel_map` + 1 all-reduce;
    backward 1 all-reduce.

    >>> import torch, torch.distributed as dist, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "pg")
    >>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    >>> vocab_parallel_entropy(torch.tensor([[0.0, 0.0]]), "sparsemax")  # (1 − 2·¼)/2
    tensor([0.2500])
    >>> dist.destroy_process_group()
    """
    if _dtensor.is_dtensor(local_logits):
        from .placements import rows_entry  # (imports torch.distributed.tensor: on the first DTensor)

        x, _, grp, _, finish = rows_entry(local_logits)
        return finish(vocab_parallel_entropy(x, map, alpha=alpha, tau=tau, group=grp))
    a = _alpha(map, alpha)
    p = vocab_parallel_map(local_logits, map, tau=tau, alpha=alpha, group=group)
    if a == 1.0:
        part = -torch.where(p > 0, p * torch.log(torch.where(p > 0, p, 1.0)), 0.0).sum(-1)
        return ReplicatedSum.apply(part, group)
    part = torch.where(p > 0, p, 0.0).pow(a).sum(-1)
    total = ReplicatedSum.apply(part, group)
    empty = total == 0  # a fully masked row: p = 0 everywhere
    return torch.where(empty, 0.0, (1 - total) / (a * (a - 1)))


def _alpha(map, alpha) -> float:
    map_family(map, 1, alpha)
    if map == "softmax":
        return 1.0
    if map in ("sparsemax", "entmax15"):
        return {"sparsemax": 2.0, "entmax15": 1.5}[map]
    if map == "entmax" and float(alpha) >= 1:
        return float(alpha)
    raise ValueError(f"map must be softmax, sparsemax, entmax15 or entmax for an entropy, got {map!r}")
