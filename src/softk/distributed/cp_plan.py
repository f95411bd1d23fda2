r"""What every rank of a context-parallel attention call agrees on, in one collective.

Each rank holds a shard of the sequence: its queries, keys and values, the
same tokens for the three.  Where the shard sits in the sequence is the
*layout*:

* ``"contiguous"``: rank r holds tokens [o_r, o_r + L_r), o_r = Σ_{s<r} L_s,
  any lengths (uneven too);
* ``"head_tail"``: torch's load-balanced layout for causal attention
  (``context_parallel``'s ``_HeadTailLoadBalancer``): the sequence of T
  tokens is cut into 2W chunks of T/(2W) and rank r holds chunks r and
  2W − 1 − r, in that order, so that every rank has the same share of the
  causal mask's work.  Every rank holds T/W tokens, an even number.

The positions only matter to the causal mask (key j is seen by query i iff
pos(j) ≤ pos(i)); without it attention does not depend on the keys' order.

As in :mod:`.checks`, every local check is caught and published with the
call's metadata in one all-reduce of a (world, F) table, and every rank
raises the same error or none, so that no rank waits in a collective that a
peer skipped: a rank whose own arguments are bad, and between ranks the
batch, heads, head dims, dtype, map, α (its values, per head), scale,
soft cap, causal flag, layout and strategy, and shards whose query and
key/value lengths differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_choice
from ..attention.checks import Call, check_call
from .checks import comm_device, publish, resolve_group

LAYOUTS = ("contiguous", "head_tail")
# The arguments a local error can name (its message starts with the name), published as an index
# so that the other ranks' error names it too.
_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa", "map", "alpha",
         "softcap", "layout", "strategy")
STRATEGIES = ("allgather", "ring")
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
# Columns of the table.
(_ERR, _B, _H, _HKV, _E, _EV, _LQ, _LK, _DTYPE, _FAM, _CAUSAL, _LAYOUT, _STRATEGY, _SCALE, _SOFTCAP, _A1, _A2,
 _AGRAD) = range(18)
_F = 18


@dataclass
class Plan:
    """A checked call and where this rank's tokens sit."""

    call: Call
    rank: int
    world: int
    lengths: list  # tokens per rank
    layout: str
    strategy: str
    map_name: str

    def positions(self, rank: int, device) -> torch.Tensor:
        """The global positions (L_r,) of rank ``rank``'s tokens."""
        return positions(self.layout, self.lengths, rank, device)


def positions(layout: str, lengths: list, rank: int, device) -> torch.Tensor:
    """Global positions of rank ``rank``'s tokens under ``layout`` (see the module docstring)."""
    if layout == "contiguous":
        start = sum(lengths[:rank])
        return torch.arange(start, start + lengths[rank], device=device)
    world, chunk = len(lengths), lengths[rank] // 2
    head = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    return torch.cat([head, head + (2 * world - 1 - 2 * rank) * chunk])


def agree(query, key, value, *, group, attn_mask, dropout_p, is_causal, scale, enable_gqa, map, alpha, softcap,
          layout, strategy) -> Plan:
    """Check the call on every rank of ``group`` and return its :class:`Plan`, or raise the same error everywhere."""
    rank, world = resolve_group(group)
    row = torch.zeros(_F, dtype=torch.float64)
    error, call = None, None
    try:
        layout = check_choice(layout, LAYOUTS, "layout")
        strategy = check_choice(strategy, STRATEGIES, "strategy")
        if attn_mask is not None:
            raise ValueError("attn_mask must be None under context parallelism: an explicit mask is not sharded "
                             "over the ranks (is_causal gives the causal mask of the whole sequence)")
        call = check_call(query, key, value, None, dropout_p, is_causal, scale, enable_gqa, map, alpha, softcap)
        if len(call.out_shape) < 3:
            raise ValueError(f"query must be (…, H, L, E) with a head dimension under context parallelism, got "
                             f"shape {tuple(query.shape)}")
    except (TypeError, ValueError) as exc:
        error = exc
    if error is not None:
        named = [i for i, a in enumerate(_ARGS) if str(error).startswith(a + " ")]
        row[_ERR] = 1 + (named[0] if named else len(_ARGS))
    if call is not None:
        (b, h, lq, e), (_, hkv, lk, ev) = call.q.shape, call.v.shape
        row[[_B, _H, _HKV, _E, _EV, _LQ, _LK]] = torch.tensor([b, h, hkv, e, ev, lq, lk], dtype=torch.float64)
        row[_DTYPE] = _DTYPES.index(call.q.dtype)
        row[_FAM], row[_CAUSAL] = call.fam, call.causal
        row[_LAYOUT], row[_STRATEGY] = LAYOUTS.index(layout), STRATEGIES.index(strategy)
        # floats as they are: the table is float64 and only this rank writes its row, so the SUM carries them exactly
        row[_SCALE], row[_SOFTCAP] = call.scale, call.softcap or 0.0
        if call.alpha is not None:
            a = call.alpha.detach().double().cpu()
            row[_A1] = float((a * torch.arange(1, a.numel() + 1)).sum())
            row[_A2] = float((a * a).sum())
            row[_AGRAD] = call.learnable
    table = publish(row, rank=rank, world=world, group=group, device=comm_device(query, group), local_error=error,
                    names=_ARGS)
    assert call is not None  # no rank erred

    def same(col, what):
        vals = table[:, col]
        if not bool((vals == vals[0]).all()):
            raise ValueError(f"{what} differs between ranks (every rank must pass the same): "
                             f"{[int(x) if col not in (_SCALE, _SOFTCAP, _A1, _A2) else 'differs' for x in vals]}")

    same(_B, "the batch size (query's leading dimensions)")
    same(_H, "the number of query heads H")
    same(_HKV, "the number of key/value heads")
    same(_E, "the query/key head dimension E")
    same(_EV, "the value head dimension Ev")
    same(_DTYPE, "the dtype")
    same(_FAM, "the map")
    same(_A1, "alpha (the α of each head)")
    same(_A2, "alpha (the α of each head)")
    same(_AGRAD, "alpha.requires_grad")
    same(_SCALE, "scale")
    same(_SOFTCAP, "softcap")
    same(_CAUSAL, "is_causal")
    same(_LAYOUT, "layout")
    same(_STRATEGY, "strategy")
    lengths: list = table[:, _LQ].long().tolist()
    keys: list = table[:, _LK].long().tolist()
    if lengths != keys:
        raise ValueError(f"the query shard and the key/value shard of a rank must hold the same tokens: query "
                         f"lengths {lengths} and key lengths {keys} by rank")
    if layout == "head_tail" and (len(set(lengths)) != 1 or lengths[0] % 2):
        raise ValueError(f"layout='head_tail' needs the same even number of tokens on every rank (the sequence cut "
                         f"into 2·world = {2 * world} equal chunks), got lengths {lengths} by rank; use "
                         f"layout='contiguous' for uneven shards")
    return Plan(call, rank, world, lengths, layout, strategy, map)
