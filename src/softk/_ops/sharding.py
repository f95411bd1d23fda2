r"""DTensor sharding rules of the ``softk::`` ops that act on rows of scores.

Every ``softk::`` op but attention's takes rows of scores, classes last, and
reduces each row over its last (class) dimension: the maps and their
backward (``threshold``, ``threshold_backward``, ``threshold_rowk``,
``entmax_alpha``, ``normmax``, ``gradtopk``, ``gradtopk_hvp``, ``log_ek``,
the Triton ``log_softmax_rows``/``logsumexp_rows`` and their backward) and
the fused Fenchel–Young loss (``fenchel_young_fused``).  A row's result
depends on that row alone, so a DTensor may carry such an op when no row is
split.  :func:`register_new` gives each of them one rule
(``torch.distributed.tensor.experimental.register_sharding``) that offers,
per mesh dimension:

* ``Replicate`` for every tensor, in and out: the op runs on the whole
  tensor on each rank;
* ``Shard(d)`` of any dimension d other than the class dimension (the
  batch, sequence or any other leading dimension of the first tensor
  argument x): every tensor laid out along x's rows (the same leading
  dimensions: the output p, a gradient, a per-row k or α, class-index
  targets, a loss per row) is sharded on d too, and a tensor that
  broadcasts along d (size 1 there) or is not laid out along the rows (a
  scalar) is replicated.  The op then runs on each rank's rows, and its
  outputs are placed like its input.  A loss reduced over the rows
  (``fenchel_young_fused`` with ``reduction="sum"``) comes out
  ``Partial("sum")``: its shards' sums add up to the loss.  With
  ``reduction="mean"`` a shard's mean, and its gradient's 1/#rows, are not
  the global ones, so batch shards are not offered: DTensor replicates the
  rows first;
* never ``Shard`` of the class dimension: a rank holding a slice of the
  classes cannot find a row's threshold alone (that is the job of the
  vocabulary-parallel functions of :mod:`softk.distributed`, which the
  public maps and losses call on class-sharded DTensors).  Offered no such
  strategy, DTensor redistributes class-sharded input to ``Replicate``
  (an all-gather of the classes) and returns ``Replicate`` output; a
  ``Partial`` input is all-reduced the same way.

``softk::attention`` and ``softk::attention_backward`` get no rule: their
rows are a query's scores against all keys, which no dimension of their
inputs holds, so "the last dimension" of q, k, v is not the one reduced.

The output shapes a rule needs (which outputs are laid out along the rows)
come from the op's own fake kernel, run on meta tensors shaped like the
inputs, so one rule serves every op without a table of signatures.

The rules are registered when an op is (the library path registers its ops
on first use, :func:`softk._ops.lean.library`) if the process has already
imported ``torch.distributed.tensor``, and otherwise for every op registered
so far when the first DTensor reaches a softk function (importing
:mod:`softk.distributed.dtensor`, which that call does, calls
:func:`register_new`).  A process that never
uses DTensor never imports it (about half a second) for softk's sake; the
eager path registers nothing.
"""

from __future__ import annotations

import sys
import threading

import torch

# Ops whose rows are not the last dimension of their inputs: no rule.
NOT_ROWS = frozenset({"attention", "attention_backward"})

_LOCK = threading.Lock()
_done: set[str] = set()


def _tensor_like(v) -> bool:
    return hasattr(v, "placements") and hasattr(v, "tensor_meta")


def _meta(spec):
    m = spec.tensor_meta
    return torch.empty(m.shape, dtype=m.dtype, device="meta")


def _aligned(shape, rows) -> bool:
    """True when a tensor of ``shape`` is laid out along ``rows`` (x's leading
    dimensions): it holds them first, each of x's size or 1, and at most one
    dimension more."""
    if len(shape) not in (len(rows), len(rows) + 1) or len(rows) == 0:
        return False
    return all(s == r or s == 1 for s, r in zip(shape, rows))


def rule_for(overload):
    """The sharding function of one ``softk::`` row op (see the module docstring)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    schema = overload._schema
    names = [a.name for a in schema.arguments]
    n_out = len(schema.returns)

    def rule(*args, **kwargs):
        values = list(args) + [kwargs[nm] for nm in names[len(args):] if nm in kwargs]
        bound = dict(zip(names, values))
        specs = [v if _tensor_like(v) else None for v in values]
        x = next((s for s in specs if s is not None), None)
        if x is None:
            return []
        shape = tuple(x.tensor_meta.shape)
        rows = shape[:-1]
        meta_args = [_meta(s) if s is not None else v for s, v in zip(specs, values)]
        outs = overload(*meta_args)
        if isinstance(outs, torch.Tensor):
            outs = (outs,)
        out_shapes = [tuple(o.shape) for o in outs]

        strategies = [([Replicate()] * n_out, [Replicate() if s is not None else None for s in specs])]
        for d in range(len(rows)):
            def place(s, output):
                if _aligned(s, rows):
                    return Shard(d) if s[d] == rows[d] else Replicate()
                if output and 0 not in s:  # a tensor reduced over the rows
                    return Partial("sum") if bound.get("reduction") == "sum" else None
                return Replicate()  # a scalar input, or an empty placeholder output

            out_p = [place(s, True) for s in out_shapes]
            if any(p is None for p in out_p):
                continue
            in_p = [place(tuple(s.tensor_meta.shape), False) if s is not None else None for s in specs]
            strategies.append((out_p, in_p))
        return strategies

    rule.__name__ = rule.__qualname__ = f"{schema.name.replace('::', '_')}_sharding"
    rule.__doc__ = f"The DTensor sharding of {schema.name}: see softk._ops.sharding."
    return rule


def register_new(only_if_imported: bool = False) -> list[str]:
    """Register the rule of every ``softk::`` row op that has none yet;
    return their names.  Nothing where torch has no ``torch.distributed``
    or no ``torch.distributed.tensor``, nor, with ``only_if_imported``, where
    this process has not imported ``torch.distributed.tensor`` yet."""
    if not torch.distributed.is_available():
        return []
    if only_if_imported and "torch.distributed.tensor" not in sys.modules:
        return []
    try:
        from torch.distributed.tensor.experimental import register_sharding
    except ImportError:
        return []
    new = []
    with _LOCK:
        for qualname in torch._C._dispatch_get_all_op_names():
            ns, _, name = qualname.partition("::")
            if ns != "softk" or name in _done or name in NOT_ROWS or not hasattr(torch.ops.softk, name):
                continue
            packet = getattr(torch.ops.softk, name)
            for overload_name in packet.overloads():
                overload = getattr(packet, overload_name)
                register_sharding(overload)(rule_for(overload))
            _done.add(name)
            new.append(name)
    return new
