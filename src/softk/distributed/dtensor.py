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
from typing import Callable

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._ops.sharding import register_new
from ..losses._registry import LOSSES
from .losses import VOCAB_PARALLEL_OPTIONS, vocab_parallel_loss
from .maps import vocab_parallel_map
from .rl import vocab_parallel_log_softmax
from .placements import _check_placements, _class_mesh_dim, _local_target, _reduce

# The softk:: ops registered before this process's first DTensor get their sharding rules now.
register_new()

# The loss name of each public loss function (its DTensor entry's name).
_LOSSES = {kind.public_name: name for name, kind in LOSSES.items()}


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


_SIGS: dict[Callable, inspect.Signature] = {}


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

