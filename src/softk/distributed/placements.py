"""Where a DTensor's rows and classes lie: the placement helpers of the
DTensor entry (:mod:`.dtensor`) and of the RL functions on DTensor logits
(:mod:`.rl`, through :func:`rows_entry`).  Imports ``torch.distributed.tensor``,
so :mod:`.rl` imports this module only when a DTensor reaches it."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._validate import mean_of


def _check_placements(x, what):
    for i, p in enumerate(x.placements):
        if isinstance(p, Partial):
            raise ValueError(
                f"{what} is a DTensor with placement {type(p).__name__} ({p}) on mesh dimension {i}: a pending reduction; softk takes "
                f"Shard or Replicate placements (redistribute to Replicate or Shard first)"
            )


def _class_mesh_dim(x, cdim, what):
    """The one mesh dimension that shards dimension ``cdim`` of ``x``, or None."""
    dims = [i for i, p in enumerate(x.placements) if isinstance(p, Shard) and p.dim % x.ndim == cdim]
    if len(dims) > 1:
        raise ValueError(
            f"{what} shards its class dimension {cdim} over mesh dimensions {dims} ({list(x.placements)}); "
            f"softk needs a single mesh dimension sharding the classes"
        )
    return dims[0] if dims else None


def _slice_plain(t, gshape, lshape, offset, what):
    """This rank's part of a plain tensor given either locally (lshape) or globally (gshape)."""
    if tuple(t.shape) == tuple(lshape):
        return t
    if tuple(t.shape) == tuple(gshape):
        for d, (o, n) in enumerate(zip(offset, lshape)):
            if n != gshape[d]:
                t = t.narrow(d, o, n)
        return t
    raise ValueError(f"{what} must have this rank's shape {tuple(lshape)} or the global shape {tuple(gshape)}, "
                     f"got {tuple(t.shape)}")


def _rows_placements(placements, cdim, cmesh):
    """Placements of the per-row result: the class dimension removed, its mesh dimension replicated."""
    out = []
    for i, p in enumerate(placements):
        if i == cmesh or not isinstance(p, Shard):
            out.append(Replicate())
        else:
            out.append(Shard(p.dim - 1 if p.dim > cdim else p.dim))
    return out


def _norm(placements, ndim):
    return [Shard(p.dim % ndim) if isinstance(p, Shard) else p for p in placements]


def _local_target(target, x, cdim, cmesh, dense):
    """This rank's part of the target of the DTensor logits ``x``."""
    lshape, offset = compute_local_shape_and_global_offset(x.shape, x.device_mesh, x.placements)
    if dense:
        want = _norm(x.placements, x.ndim)
        if isinstance(target, DTensor):
            _check_placements(target, "target")
            if _norm(target.placements, target.ndim) != want:
                raise ValueError(f"a target of probabilities must be placed like the logits, {list(x.placements)}, "
                                 f"got {list(target.placements)}")
            return target.to_local()
        return _slice_plain(target, x.shape, lshape, offset, "target")
    gl = [n for d, n in enumerate(x.shape) if d != cdim] if x.ndim > 1 else []
    ll = [n for d, n in enumerate(lshape) if d != cdim] if x.ndim > 1 else []
    of = [n for d, n in enumerate(offset) if d != cdim] if x.ndim > 1 else []
    if isinstance(target, DTensor):
        _check_placements(target, "target")
        if target.device_mesh != x.device_mesh:
            raise ValueError("target is a DTensor on another device mesh than the logits")
        want = _norm(_rows_placements(x.placements, cdim, cmesh), max(target.ndim, 1))
        got = _norm(target.placements, max(target.ndim, 1))
        if got != want:
            where = "" if cmesh is None else f" (the classes are sharded on mesh dimension {cmesh}: class indices must be replicated there)"
            raise ValueError(f"target (class indices) is a DTensor placed {list(target.placements)}; the logits "
                             f"{list(x.placements)} need {want}{where}")
        return target.to_local()
    return _slice_plain(target, gl, ll, of, "target")


def _reduce(rows, keep, reduction, x, cdim, cmesh):
    """The DTensor of the loss: rows, or their sum / mean over the whole batch."""
    mesh = x.device_mesh
    rp = _rows_placements(x.placements, cdim, cmesh)
    if reduction == "none":
        gshape = [n for d, n in enumerate(x.shape) if d != cdim] if x.ndim > 1 else []
        return DTensor.from_local(rows, mesh, rp, shape=torch.Size(gshape),
                                  stride=torch.empty(gshape, device="meta").stride())
    part = [Partial() if isinstance(p, Shard) else Replicate() for p in rp]
    rep = [Replicate()] * mesh.ndim

    def total(t):
        d = DTensor.from_local(t, mesh, part)
        return d.redistribute(mesh, rep) if any(isinstance(p, Partial) for p in part) else d

    if reduction == "sum":
        return total(rows.sum())
    n = keep.sum() if keep is not None else torch.tensor(rows.numel(), device=rows.device)
    both = total(torch.stack([rows.sum(), n.to(rows.dtype).detach()]))  # one all-reduce for the sum and the count
    return mean_of(both[0], both[1])


def rows_entry(x, labels=None):
    """(local (…, V_r), local labels, group, vocab_start, finish) for a DTensor ``x`` sharded on its last
    dimension: ``finish(rows)`` wraps this rank's per-row results as a DTensor (class mesh dimension
    replicated).  Used by the RL functions of :mod:`.rl`."""
    _check_placements(x, "local_logits")
    cdim = x.ndim - 1
    cmesh = _class_mesh_dim(x, cdim, "local_logits")
    if cmesh is None:
        raise ValueError(f"local_logits is a DTensor placed {list(x.placements)}: its last (class) dimension must "
                         f"be sharded (Shard(-1)) on one mesh dimension")
    mesh = x.device_mesh
    _, offset = compute_local_shape_and_global_offset(x.shape, mesh, x.placements)
    t = None if labels is None else _local_target(labels, x, cdim, cmesh, False)
    return x.to_local(), t, mesh.get_group(cmesh), offset[cdim], lambda rows: _reduce(rows, None, "none", x, cdim, cmesh)
