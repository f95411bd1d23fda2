r"""DTensor in, DTensor out: the public maps and losses on tensor-parallel logits.

Under tensor parallelism the LM head's output is a DTensor sharded on the
class dimension (``Shard(-1)``, possibly also sharded on the batch or
replicated over other mesh dimensions).  Every public map (``softk.softmax``,
``log_softmax``, ``sparsemax``, ``entmax15``, ``entmax``, ``soft_topk``) and
loss (``softk.losses.cross_entropy``, ``softmax_loss``, ``sparsemax_loss``,
``entmax15_loss``, ``entmax_loss``, ``soft_topk_loss``,
``topk_softmax_cross_entropy``) takes it, with no context manager or inside
``torch.distributed.tensor.parallel.loss_parallel()``:

* the mesh dimension that shards the classes gives the process group, and
  the shard's global offset (``compute_local_shape_and_global_offset``, so
  uneven shards as DTensor makes them) gives ``vocab_start``; the local shard
  goes through :func:`vocab_parallel_map` / :func:`vocab_parallel_loss`, so no
  rank holds N×V;
* a map returns a DTensor with the input's placements; a loss with reduction
  "mean"/"sum" a replicated scalar DTensor, as ``F.cross_entropy`` under
  ``loss_parallel()``, "none" a DTensor of rows (batch shards kept, the class
  mesh dimension replicated); gradients come back as DTensors with the
  input's placements (``to_local`` / ``from_local`` carry autograd);
* with the classes not sharded (``Replicate``, ``Shard`` on a batch
  dimension) the function runs on the local shard; "mean"/"sum" over batch
  shards are reduced over the mesh (one all-reduce of the sum and the
  count, by DTensor);
* the other public maps (``hard_topk``, ``topk_softmax``, ``normmax``,
  ``budget_sparsemax``) and ``normmax_loss`` have no vocab-parallel form:
  on class-sharded logits they raise a ValueError naming the function and
  the placements; otherwise they run on the local shard;
* a ``Partial`` placement, classes sharded over two mesh dimensions, class
  indices sharded differently from the logits' rows, and options the
  vocab-parallel losses lack (class ``weight``, ``label_smoothing``, a tensor
  ``k``/``alpha``/``tau``) on class-sharded logits raise ValueError.

Labels may be DTensors (replicated over the class mesh dimension, sharded
like the logits' rows) or plain tensors: this rank's rows, or the global
target, which is sliced to this rank's rows (and, for a dense target, its
classes).

Collectives on class-sharded logits are those of the vocab-parallel
functions (see docs/guides/scaling.md): a loss's forward 1 all-reduce of
argument agreement + 2 all-reduces (softmax family) or 2 all-reduces and
1 all-gather (sparsemax, entmax, soft top-k "sparse"), 1 all-gather for
topk_softmax_cross_entropy; its backward none.  A map's forward the same, its
backward 1 all-reduce.

How the public functions reach this module: each carries a hook (one
``type(x) is Tensor`` test on a plain tensor) that ``softk.distributed``
fills on import and that imports this module on the first DTensor call,
since the import layers keep the losses and maps from importing
``softk.distributed``.
"""

from __future__ import annotations

import inspect
import numbers

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._validate import mean_of
from .._ops.sharding import register_new
from ..losses._registry import LOSSES
from .losses import VOCAB_PARALLEL_OPTIONS, vocab_parallel_loss
from .maps import vocab_parallel_map
from .rl import vocab_parallel_log_softmax

# The softk:: ops registered before this process's first DTensor get their sharding rules now.
register_new()

# The loss name of each public loss function (its DTensor entry's name).
_LOSSES = {kind.public_name: name for name, kind in LOSSES.items()}


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


def _loss(name, fn, a):
    x = a.pop("input")
    target = a.pop("target")
    _check_placements(x, "input")
    cdim = 1 if x.ndim > 1 else 0
    cmesh = _class_mesh_dim(x, cdim, "input")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a tensor, got {type(target).__name__}")
    dense = target.is_floating_point()
    t = _local_target(target, x, cdim, cmesh, dense)
    reduction = a.get("reduction", "mean")
    if reduction not in ("mean", "sum", "none"):
        return fn(x.to_local(), t, **a)  # the function's own error
    ignore_index = a.get("ignore_index", -100)
    keep = None if dense else t != ignore_index
    local = x.to_local()
    if cmesh is None:
        batch_sharded = any(isinstance(p, Shard) for p in x.placements)
        if not batch_sharded and reduction != "none":
            out = fn(local, t, **a)
            return DTensor.from_local(out, x.device_mesh, [Replicate()] * x.device_mesh.ndim)
        if a.get("weight") is not None and reduction == "mean":
            raise ValueError("cross_entropy with a class weight and reduction='mean' on batch-sharded logits is not "
                             "supported; use reduction='sum' and divide by the summed weights")
        a["reduction"] = "none"
        rows = fn(local, t, **a)
        return _reduce(rows, keep, reduction, x, cdim, cmesh)
    params = _SIGS[fn].parameters
    for p, value in a.items():  # an option the vocab-parallel loss lacks (cross-entropy's weight, label_smoothing)
        default = params[p].default
        if p not in VOCAB_PARALLEL_OPTIONS and p != "reduction" and not (
                value is default or (not isinstance(value, Tensor) and value == default)):
            raise ValueError(f"{name} on class-sharded logits takes no {p} (the vocab-parallel loss has none); "
                             f"leave it at {default!r}, or redistribute the classes to Replicate first")
    if isinstance(a.get("alpha"), Tensor):
        raise ValueError(f"{name} on class-sharded logits takes a float alpha, not a tensor")
    if "k" in a and not isinstance(a["k"], numbers.Integral):
        raise ValueError(f"{name} on class-sharded logits takes an int k, got {type(a['k']).__name__}")
    kw = {p: a[p] for p in a if p in VOCAB_PARALLEL_OPTIONS}
    mesh = x.device_mesh
    _, offset = compute_local_shape_and_global_offset(x.shape, mesh, x.placements)
    lx = local.movedim(cdim, -1)
    lt = t.movedim(cdim, -1) if dense else t
    rows = vocab_parallel_loss(lx, lt, _LOSSES[name], group=mesh.get_group(cmesh), vocab_start=offset[cdim],
                               reduction="none", **kw)
    return _reduce(rows, keep, reduction, x, cdim, cmesh)


def _map(name, fn, a):
    x = a.pop("x")
    _check_placements(x, "x")
    dim = a.get("dim", -1)
    if not isinstance(dim, numbers.Integral) or not -x.ndim <= dim < x.ndim:
        return fn(x.to_local(), **a)  # the function's own error
    cdim = dim % x.ndim
    cmesh = _class_mesh_dim(x, cdim, "x")
    mesh = x.device_mesh
    local = x.to_local()
    if cmesh is None:
        out = fn(local, **a)
    else:
        tau = a.get("tau", 1.0)
        if isinstance(tau, Tensor):
            raise ValueError(f"softk.{name} on class-sharded logits takes a float tau, not a tensor")
        group = mesh.get_group(cmesh)
        lx = local.movedim(cdim, -1)
        if name == "log_softmax":
            out = vocab_parallel_log_softmax(lx, tau=tau, group=group)
        else:
            kw = {}
            if name == "entmax":
                if isinstance(a["alpha"], Tensor):
                    raise ValueError("softk.entmax on class-sharded logits takes a float alpha, not a tensor")
                kw["alpha"] = a["alpha"]
            mp = name
            if name == "soft_topk":
                if not isinstance(a["k"], numbers.Integral):
                    raise ValueError(f"softk.soft_topk on class-sharded logits takes an int k, got {a['k']!r}")
                kw["k"] = int(a["k"])
                mp = a.get("method", "exp")
            out = vocab_parallel_map(lx, mp, tau=tau, group=group, **kw)
        out = out.movedim(-1, cdim)
    return DTensor.from_local(out, mesh, x.placements, shape=x.shape, stride=x.stride())


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


_SERVED = ("softk.softmax, log_softmax, sparsemax, entmax15, entmax, soft_topk and the losses cross_entropy, "
           "softmax_loss, sparsemax_loss, entmax15_loss, entmax_loss, soft_topk_loss, topk_softmax_cross_entropy")


def _local_only(kind, name, fn, a):
    """A public function with no vocab-parallel form: run on the local shard where the classes are whole."""
    first = next(iter(a))
    x = a.pop(first)
    _check_placements(x, first)
    if kind == "local map":
        dim = a.get("dim", -1)
        cdim = dim % x.ndim if isinstance(dim, numbers.Integral) and -x.ndim <= dim < x.ndim else None
    else:
        cdim = 1 if x.ndim > 1 else 0
    cmesh = None if cdim is None else _class_mesh_dim(x, cdim, first)
    if cmesh is not None:
        raise ValueError(
            f"softk.{name} has no vocab-parallel form: got a DTensor placed {list(x.placements)}, its class "
            f"dimension {cdim} sharded on mesh dimension {cmesh}; redistribute it to Replicate on that mesh "
            f"dimension first, or use one of {_SERVED}, which take class-sharded logits"
        )
    rest = {k: (v.to_local() if isinstance(v, DTensor) else v) for k, v in a.items()}
    out = fn(x.to_local(), **rest)
    mesh = x.device_mesh
    if kind == "local map" and isinstance(out, Tensor) and out.shape == x.to_local().shape:
        return DTensor.from_local(out, mesh, x.placements, shape=x.shape, stride=x.stride())
    if all(isinstance(p, Replicate) for p in x.placements):
        return DTensor.from_local(out, mesh, x.placements)
    raise ValueError(f"softk.{name} on a DTensor placed {list(x.placements)}: only replicated inputs are served "
                     f"(its result is not shaped like its input); pass x.to_local() and reduce yourself")


_SIGS = {}


def handle(kind, name, fn, args, kwargs):
    """The DTensor entry of ``softk.<name>`` (registered with :mod:`softk._dtensor`)."""
    sig = _SIGS.get(fn)
    if sig is None:
        sig = _SIGS[fn] = inspect.signature(fn)
    b = sig.bind(*args, **kwargs)
    b.apply_defaults()
    a = dict(b.arguments)
    if kind.startswith("local"):
        return _local_only(kind, name, fn, a)
    if kind == "map":
        first = next(iter(a))
        a["x"] = a.pop(first) if first != "x" else a["x"]
        return _map(name, fn, a)
    return _loss(name, fn, a)

