"""Argument checks that every rank agrees on, in one small collective.

A rank that raises before a collective its peers have entered makes them wait
forever.  So every local check (argument types, target range, dense-target
domain) is *caught*, turned into a flag, and published with the call's
metadata in one all-reduce of a (world, F) int64 table (each rank writes its
own row; SUM over ranks is an all-gather).  Every rank then runs the same
cross-rank checks on the same table and raises the same error, or none:

* a rank whose local checks failed (it raises its own message, the others say
  which rank failed);
* leading shape, dtype, k, τ, the loss/map, or the class-index target
  differing between ranks;
* vocabulary slices: contiguous in rank order when every rank passes
  ``vocab_start=None``; otherwise every rank must pass it and the slices
  [start, start + V_r) must tile [0, V) exactly;
* k larger than the global vocabulary; a class index ≥ V.

Only an uninitialised torch.distributed (no collective possible at all) is
raised before the exchange.

These checks read tensors' values on the host and branch on them, so under
``torch.compile`` the maps and losses run them eagerly outside the graph
(:func:`outside_graph`); the collectives of the computation that follows
are traced.  The RL functions and the fused loss call them inline: Dynamo
traces into them and breaks the graph at each host read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch
import torch.distributed as dist

_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# Columns of the metadata table.
_ERR, _NDIM, _LEAD, _LEADHASH, _DTYPE, _V, _START, _K, _TAU, _WHAT, _TSUM, _THASH, _TKIND, _TMAX = range(14)
_F = 14


def outside_graph(fn):
    """``fn`` itself when eager; while ``torch.compile`` traces, ``fn`` run eagerly
    outside the graph (one graph break), as the host-side checks must be."""
    return torch.compiler.disable(fn) if torch.compiler.is_compiling() else fn


def resolve_group(group):
    """(rank, world size) in ``group``; a clear error when there is no usable group."""
    if not dist.is_available():
        raise ValueError("group: torch.distributed is not available in this torch build")
    if not dist.is_initialized():
        raise ValueError(
            "group: torch.distributed is not initialised; call torch.distributed.init_process_group(...) "
            "on every rank first (softk.distributed runs collectives on it)"
        )
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the given process group")
    return rank, dist.get_world_size(group)


def comm_device(x, group) -> torch.device:
    """Where the collectives' tensors live: the input's device, else the backend's default."""
    if isinstance(x, torch.Tensor):
        return x.device
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def publish(row: torch.Tensor, *, rank: int, world: int, group, device, local_error, names: tuple = ()):
    """Every rank's ``row`` in one all-reduce, as a (world, F) table on the CPU.

    Column 0 of a row is its verdict: 0 (its arguments passed its own
    checks), or 1 + i (its error names the argument ``names[i]``), or more
    (an error naming none of them).  This rank raises its own error; every
    other rank then raises one that names the first failing rank (and the
    argument, where known); or, none failing, the table is returned."""
    table = torch.zeros(world, row.numel(), dtype=row.dtype, device=device)
    table[rank] = row.to(device)
    dist.all_reduce(table, op=dist.ReduceOp.SUM, group=group)
    table = table.cpu()
    if local_error is not None:
        raise local_error
    bad = [r for r in range(world) if table[r, 0] != 0]
    if bad:
        code = int(table[bad[0], 0]) - 1
        what = f"its argument {names[code]}" if 0 <= code < len(names) else "its arguments"
        raise ValueError(f"rank {bad[0]} of the group rejected {what} (its own error says why); no rank went on")
    return table


@dataclass
class Agreed:
    """What every rank knows after the exchange."""

    rank: int
    world: int
    vocab: int  # global V
    start: int  # this rank's first global class index
    local_vocab: int


def _tau_bits(tau) -> int:
    try:
        return struct.unpack("<q", struct.pack("<d", float(tau)))[0]
    except (TypeError, ValueError):
        return 0


def _target_fingerprint(target, ignore_index):
    """(kind, Σt, Σ t·(i mod 1009 + 1), max kept t) of a class-index target; kind 0 = none, 1 = index, 2 = dense."""
    if not isinstance(target, torch.Tensor):
        return 0, 0, 0, -1
    if target.is_floating_point():
        return 2, 0, 0, -1
    t = target.reshape(-1).long()
    if t.numel() == 0:
        return 1, 0, 0, -1
    w = torch.arange(t.numel(), device=t.device) % 1009 + 1
    kept = t[t != ignore_index]
    return 1, int(t.sum()), int((t * w).sum()), int(kept.max()) if kept.numel() else -1


def exchange(x, target, *, group, rank, world, vocab_start, k, tau, what: int, local_error, ignore_index=-100) -> Agreed:
    """Publish this rank's metadata and local verdict; raise the same error on every rank, or return."""
    row = torch.zeros(_F, dtype=torch.int64)
    row[_ERR] = 1 if local_error is not None else 0
    if isinstance(x, torch.Tensor) and x.dim() >= 1:
        lead = tuple(x.shape[:-1])
        row[_NDIM] = x.dim()
        row[_LEAD] = int(torch.tensor(lead, dtype=torch.int64).prod()) if lead else 1
        row[_LEADHASH] = sum((i + 1) * 7919 * d for i, d in enumerate(lead))
        row[_DTYPE] = _DTYPES.index(x.dtype) if x.dtype in _DTYPES else -1
        row[_V] = x.shape[-1]
    row[_START] = -1 if vocab_start is None or local_error is not None else int(vocab_start)
    row[_K] = int(k) if isinstance(k, int) else -1
    row[_TAU] = _tau_bits(tau)
    row[_WHAT] = what
    if local_error is None:
        kind, s1, s2, tmax = _target_fingerprint(target, ignore_index)
        row[_TKIND], row[_TSUM], row[_THASH], row[_TMAX] = kind, s1, s2, tmax
    table = publish(row, rank=rank, world=world, group=group, device=comm_device(x, group), local_error=local_error)

    def same(col, what_, show=lambda v: v):
        vals = table[:, col]
        if not bool((vals == vals[0]).all()):
            shown = [show(int(v)) for v in vals]
            raise ValueError(f"{what_} differs between ranks: {shown} by rank (every rank must pass the same)")

    same(_NDIM, "local_logits.dim()")
    same(_LEAD, "the number of rows of local_logits (all but its last dimension)")
    same(_LEADHASH, "local_logits' shape without its last dimension")
    same(_DTYPE, "local_logits' dtype", lambda v: str(_DTYPES[v]) if 0 <= v < len(_DTYPES) else "?")
    same(_K, "k")
    same(_TAU, "tau")
    same(_WHAT, "the loss or map (and its alpha/method)")
    same(_TKIND, "the kind of target (class indices or dense)")
    if int(table[0, _TKIND]) == 1:
        same(_TSUM, "target (class indices must be the same global indices on every rank; their sums)")
        same(_THASH, "target (class indices must be the same global indices on every rank)")
    sizes = table[:, _V].tolist()
    starts = table[:, _START].tolist()
    vocab = int(sum(sizes))
    if all(s == -1 for s in starts):
        start = int(sum(sizes[:rank]))
    elif any(s == -1 for s in starts):
        raise ValueError(f"vocab_start must be given on every rank or on none, got {starts} (-1: not given)")
    else:
        order = sorted(range(world), key=lambda r: starts[r])
        pos = 0
        for r in order:
            if starts[r] != pos:
                raise ValueError(
                    f"vocab_start and the slice sizes disagree: rank {r} starts at {starts[r]} but the slices "
                    f"before it end at {pos} (starts {starts}, sizes {sizes}; the slices must tile [0, {vocab}))"
                )
            pos += sizes[r]
        start = starts[rank]
    kk = int(table[0, _K])
    if kk > vocab:
        raise ValueError(f"k must be in [1, V] = [1, {vocab}] for the global vocabulary of {vocab} classes, got {kk}")
    tmax = int(table[0, _TMAX])
    if int(table[0, _TKIND]) == 1 and tmax >= vocab:
        raise ValueError(
            f"target holds class index {tmax}, outside [0, {vocab}) for the global vocabulary of {vocab} classes "
            f"(and not ignore_index={ignore_index})"
        )
    return Agreed(rank=rank, world=world, vocab=vocab, start=start, local_vocab=sizes[rank])
