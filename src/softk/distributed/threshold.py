r"""The threshold map p = f(z − λ), Σ_v p_v = k, over a vocabulary split between ranks.

Each rank holds the columns of its slice, z_r (M, V_r), already divided by τ.
Two algorithms, each with a fixed number of collectives, whatever the data:

**softmax** (p = e^{z − lse z}): 2 all-reduces, Megatron's three with the
target logit folded into the first.

1. MAX of (row max, "row holds NaN/+inf", extras such as the target logit);
2. SUM of (Σ_v e^{z_v − max}, number of finite entries, extras).

**f = 0 below 0** (sparsemax, entmax-α, soft top-k "sparse"): an all-reduce
MAX, an all-reduce SUM and one all-gather.

1. Every rank solves its own slice: λ_r, the λ of z_r alone.  Since
   g(λ) = Σ_v f(z_v − λ) only grows when entries are added, g(λ_r) ≥ k over
   the whole row, so the global λ ≥ λ_lo = max_r λ_r (one all-reduce MAX,
   together with the row max and the broken-row flag).
2. Entries ≤ λ_lo have f = 0 at the global λ: only the entries above λ_lo can
   be in the support.  Each rank counts its candidates; an all-reduce SUM
   gives every rank's count (and the loss's per-row sums), so all ranks pad
   to the same C = max count.
3. All-gather the (M, C) candidates; every rank solves the map exactly on the
   (M, world·C) gathered row with softk's own solver (it holds the whole
   support) and keeps its own columns.

The gathered candidates cost world·M·C values.  C is the largest number of
entries above λ_lo in any row of any slice: a few per row for peaked scores,
but as large as the slice for a flat row (all entries equal), so memory is
bounded by the slice size, not by the support size.  Exactness: λ is the one
single-device softk computes on the support, so p agrees to rounding.

Families without a compact support (sigmoid, laplace, soft top-k "exp" with
k > 1) give every class a positive share; their λ depends on every entry
non-linearly, and neither a fixed number of reductions nor a bounded gather
finds it exactly, so they are refused (:mod:`.maps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from ..threshold.families import Family
from ..threshold.rows import broken_rows, row_status
from .._backends.torch.threshold import map_rows
from .._ops.distributed import all_gather, all_reduce
from .._ops.potential import value_at
from ..threshold.solve import solve_lambda

NEG_INF = float("-inf")


@dataclass
class Forward:
    p: Tensor  # (M, V_r) this rank's slice of the map
    phi: Tensor  # (M, 1) the potential Φ(z − shift), the same on every rank
    shift: Tensor  # (M, 1) the global row max (0 where it is not finite)
    broken: Tensor  # (M, 1) bool: the row holds NaN or +inf somewhere
    max_extra: Optional[Tensor]  # reduced extras
    sum_extra: Optional[Tensor]


def _finite_max(z: Tensor) -> Tensor:
    ok = (z > NEG_INF) & (z < float("inf"))
    return torch.where(ok, z, NEG_INF).amax(-1, keepdim=True)


def _max_round(parts, group):
    return all_reduce(torch.cat(parts, -1), "max", group)


def softmax_forward(z: Tensor, group, max_extra=None, sum_extra: Optional[Callable] = None) -> Forward:
    """Softmax over the concatenated row in 2 all-reduces (see the module docstring).

    ``max_extra`` (M, j) is MAX-reduced with the row max; ``sum_extra(zs)``,
    given the shifted local scores, returns (M, j') values SUM-reduced with Σe.
    """
    dt = z.dtype
    nx = 0 if max_extra is None else max_extra.shape[-1]
    buf = _max_round([_finite_max(z), broken_rows(z).to(dt)] + ([max_extra] if nx else []), group)
    top, broken = buf[:, :1], buf[:, 1:2] > 0
    shift = torch.where(torch.isfinite(top), top, 0.0)
    zs = torch.where(broken, 0.0, z - shift)
    e = torch.exp(zs)
    extra = sum_extra(zs) if sum_extra is not None else None
    sums = torch.cat([e.sum(-1, keepdim=True), (z > NEG_INF).sum(-1, keepdim=True).to(dt)] + ([extra] if extra is not None else []), -1)
    sums = all_reduce(sums, "sum", group)
    s, count = sums[:, :1], sums[:, 1:2]
    p = torch.where(count > 0, e / torch.where(count > 0, s, 1.0), 0.0)
    p = torch.where(broken, float("nan"), p)
    # Φ(z) = lse z + 1 for softmax (ψ(p) = p log p − p); 0 for a row with no finite entry.
    phi = torch.where(count > 0, torch.log(torch.where(count > 0, s, 1.0)) + 1, 0.0)
    phi = torch.where(broken, float("nan"), phi)
    return Forward(p, phi, shift, broken, buf[:, 2:] if nx else None, sums[:, 2:] if extra is not None else None)


def local_lower_bound(family: Family, z: Tensor, k: int) -> Tensor:
    """λ of each row of this slice alone (−inf where the slice has ≤ k finite entries or is broken),
    moved down by a relative 2⁻¹² so that a λ found by Newton to rounding stays a lower bound."""
    _, active, _ = row_status(z, k)
    lam = torch.full(z.shape[:-1] + (1,), NEG_INF, dtype=z.dtype, device=z.device)
    if bool(active.any()):
        lam = torch.where(active, solve_lambda(family, torch.where(active, z, 0.0), k, active), NEG_INF)
    return lam - (1 + lam.abs()) * 2.0**-12


def sparse_forward(family: Family, z: Tensor, k: int, group, rank: int, world: int, max_extra=None, sum_extra=None) -> Forward:
    """A compact-support map over the concatenated row: 2 all-reduces and 1 all-gather."""
    dt, m, width = z.dtype, z.shape[0], z.shape[-1]
    nx = 0 if max_extra is None else max_extra.shape[-1]
    parts = [local_lower_bound(family, z, k), broken_rows(z).to(dt), _finite_max(z)]
    buf = _max_round(parts + ([max_extra] if nx else []), group)
    lam_lo, broken, top = buf[:, :1], buf[:, 1:2] > 0, buf[:, 2:3]
    shift = torch.where(torch.isfinite(top), top, 0.0)
    cand = (z > lam_lo) & (z < float("inf")) & ~broken
    zs = torch.where(broken, 0.0, z - shift)
    counts = torch.zeros(world, dtype=dt, device=z.device)
    counts[rank] = cand.sum(-1).max() if m else 0
    extra = sum_extra(zs) if sum_extra is not None else None
    sums = torch.cat([counts] + ([extra.reshape(-1)] if extra is not None else []))
    sums = all_reduce(sums, "sum", group)
    c = max(int(sums[:world].max()), 1)
    zz = torch.where(cand, z, NEG_INF)
    if width < c:
        zz = torch.cat([zz, zz.new_full((m, c - width), NEG_INF)], -1)
    vals, idx = torch.topk(zz, c, dim=-1, sorted=False)
    s = torch.cat(all_gather(vals, group, world), -1) - shift
    pc = map_rows(family, s, k)
    phi = torch.where(broken, float("nan"), value_at(family, s, pc))
    mine = pc[:, rank * c : (rank + 1) * c]
    p = torch.zeros(m, zz.shape[-1], dtype=dt, device=z.device)
    p.scatter_(-1, idx, torch.where(vals > NEG_INF, mine, 0.0))
    p = torch.where(broken, float("nan"), p[:, :width])
    sum_out = sums[world:].reshape(m, -1) if extra is not None else None
    return Forward(p, phi, shift, broken, buf[:, 3:] if nx else None, sum_out)


def distributed_forward(family: Family, z: Tensor, k: int, group, rank: int, world: int, **extra) -> Forward:
    """The algorithm for ``family``: softmax for the exp-family k = 1 maps, candidates otherwise."""
    if family.name in ("softmax", "exp"):
        return softmax_forward(z, group, **extra)
    return sparse_forward(family, z, k, group, rank, world, **extra)
