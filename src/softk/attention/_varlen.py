r"""Packed variable-length attention: torch's ``varlen_attn`` with softk's maps.

Training packs documents into one row and inference batches ragged
requests; both hand the attention a packed (T, H, D) tensor and the
cumulative sequence offsets.  :func:`varlen_attn` takes torch's arguments
(``torch.nn.attention.varlen.varlen_attn``), the map, α and a soft cap, and
runs each sequence as one call of :func:`softk.attention.scaled_dot_product_attention`
on views of the packed tensors, so every backend, the learned α and the
gradients are those of that function.  Its cost is one call per sequence,
except for decoding from a paged cache (at most :data:`DECODE_QUERIES`
queries per sequence): the sequences' pages are gathered into one padded
batch with a mask, one call for all of them (the pages are copied either
way, and N calls would pay N times the per-call cost).
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from . import _context
from ._sdpa import scaled_dot_product_attention
from .checks import check_softcap

__all__ = ["varlen_attn"]

DECODE_QUERIES = 16  # queries per sequence at most for one padded call over a paged cache


def _offsets(cu: Tensor, name: str, total: int, n=None) -> list:
    if not isinstance(cu, Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be a 1-D int32 tensor of N + 1 cumulative offsets, got "
                         f"{cu.dtype if isinstance(cu, Tensor) else type(cu).__name__} of shape "
                         f"{tuple(cu.shape) if isinstance(cu, Tensor) else ()}")
    off = cu.tolist()
    if n is not None and len(off) != n + 1:
        raise ValueError(f"{name} must hold N + 1 = {n + 1} offsets (as cu_seq_q), got {len(off)}")
    if off[0] != 0 or any(b < a for a, b in zip(off, off[1:])) or (total is not None and off[-1] != total):
        raise ValueError(f"{name} must start at 0, never decrease and end at the packed length {total}, got {off}")
    return off


def _int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return int(value)


def window_keep(pos: Tensor, j: Tensor, window) -> Tensor:
    """True where key j is seen by the query at position ``pos`` (broadcast):
    pos − left ≤ j ≤ pos + right, −1 unbounded."""
    left, right = window
    keep = torch.ones(torch.broadcast_shapes(pos.shape, j.shape), dtype=torch.bool, device=j.device)
    if left >= 0:
        keep &= j >= pos - left
    if right >= 0:
        keep &= j <= pos + right
    return keep


def window_mask(lq: int, lk: int, window, device) -> Tensor:
    """(lq, lk) bool, True where key j is seen by query i, with pos = i + lk − lq
    (bottom-right alignment): :func:`window_keep`."""
    pos = torch.arange(lq, device=device).unsqueeze(-1) + (lk - lq)
    return window_keep(pos, torch.arange(lk, device=device), window)


def varlen_attn(query: Tensor, key: Tensor, value: Tensor, cu_seq_q: Tensor, cu_seq_k, max_q: int, max_k: int, *,
                return_aux=None, scale=None, window_size=(-1, -1), enable_gqa: bool = False, seqused_k=None,
                block_table=None, num_splits=None, map: str = "entmax15", alpha=None, softcap=None):
    r"""Attention over packed sequences with a sparse map, ``map="entmax15"`` by default (torch's is softmax).

    Sequence i holds queries ``query[cu_seq_q[i]:cu_seq_q[i+1]]`` and keys
    and values ``key[cu_seq_k[i]:cu_seq_k[i+1]]`` (its first
    ``seqused_k[i]`` of them where given); each sequence attends only to
    its own keys: O_t = Σ_j p_tj v_j with p_t = map(scale·q_t·K_iᵀ) over
    the keys its window lets it see.

    Args:
        query: (T_q, H, D).  key, value: (T_k, H_kv, D) and (T_k, H_kv, Dv),
            or with ``block_table`` a pool of pages (pages, page_size,
            H_kv, ·).  One floating dtype and device.
        cu_seq_q, cu_seq_k: (N + 1,) int32 cumulative offsets from 0 to
            T_q and T_k; ``cu_seq_k`` may be None with ``block_table``.
        max_q, max_k: ints at least as large as every sequence's query and
            key count (torch's kernels size their grid from them; here they
            are checked).
        return_aux: None, or torch's ``AuxRequest`` (any object with a bool
            ``lse``): with ``lse`` True the call returns (out, lse), lse
            (T_q, H) the log-sum-exp of each query's capped, scaled scores
            over the keys it sees (−inf where it sees none), for
            ``map="softmax"`` only, whose weights it normalises; the sparse
            maps have no such normaliser, and asking raises ValueError.
            It is formed from the scores apart from the attention.
        scale: the factor of q·k, default 1/√D.
        window_size: (left, right), FlashAttention's: key j is seen by query
            t iff pos − left ≤ j ≤ pos + right, pos = t + L_k − L_q (the
            queries aligned to the end of the keys) and −1 unbounded:
            (−1, −1) full, (−1, 0) causal, (W, 0) a causal sliding window.
        enable_gqa: H a multiple of H_kv (query head h reads key/value head
            h // (H / H_kv)).
        seqused_k: None or (N,) int32: sequence i uses its first
            ``seqused_k[i]`` keys (a KV cache larger than the sequence).
        block_table: None or (N, max_pages) int32: the pages of each
            sequence's keys in the pool ``key``/``value``, in order; needs
            ``seqused_k``.  Inference only: a paged cache takes no gradient.
        num_splits: None or an int >= 1: torch's split-KV setting, checked
            and otherwise unused: softk does not split a sequence's keys
            across programs.
        map, alpha, softcap: as :func:`softk.attention.scaled_dot_product_attention`.

    Returns:
        (T_q, H, Dv) in the query's dtype; a query that sees no key gets 0.
        With ``return_aux.lse``: (out, lse), above.

    >>> import torch
    >>> from softk.attention import varlen_attn
    >>> q = k = v = torch.eye(3).reshape(3, 1, 3)   # two sequences: tokens {0, 1} and {2}
    >>> cu = torch.tensor([0, 2, 3], dtype=torch.int32)
    >>> varlen_attn(q, k, v, cu, cu, 2, 2, window_size=(-1, 0), map="sparsemax", scale=0.5)[:, 0]
    tensor([[1.0000, 0.0000, 0.0000],
            [0.2500, 0.7500, 0.0000],
            [0.0000, 0.0000, 1.0000]])
    """
    if _context.current() is not None:
        raise ValueError("varlen_attn does not run under softk.distributed.context_parallel: packed sequences and "
                         "paged caches are not sharded over ranks; call softk.attention.scaled_dot_product_attention "
                         "on each rank's shard of one sequence, or varlen_attn outside the context")
    _context.refuse_foreign("softk.attention.varlen_attn")
    for t, name in ((query, "query"), (key, "key"), (value, "value")):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    paged = block_table is not None
    if paged and seqused_k is None:
        raise ValueError("block_table needs seqused_k: the number of keys each sequence uses")
    if query.dim() != 3 or key.dim() != (4 if paged else 3) or value.dim() != key.dim():
        want = "(pages, page_size, H_kv, ·)" if paged else "(T_k, H_kv, ·)"
        raise ValueError(f"query must be (T_q, H, D) and key, value {want}, got shapes {tuple(query.shape)}, "
                         f"{tuple(key.shape)}, {tuple(value.shape)}")
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or any(isinstance(w, bool) or not isinstance(w, numbers.Integral) or w < -1 for w in window_size)):
        raise ValueError(f"window_size must be (left, right), two ints >= -1 (-1: unbounded), got {window_size!r}")
    window = (int(window_size[0]), int(window_size[1]))
    max_q, max_k = _int(max_q, "max_q"), _int(max_k, "max_k")
    check_softcap(softcap)
    if num_splits is not None and _int(num_splits, "num_splits") < 1:
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits}")
    want_lse = _wants_lse(return_aux, map)
    qo = _offsets(cu_seq_q, "cu_seq_q", query.shape[0])
    n = len(qo) - 1
    used = None
    if seqused_k is not None:
        if not isinstance(seqused_k, Tensor) or seqused_k.dtype != torch.int32 or tuple(seqused_k.shape) != (n,):
            raise ValueError(f"seqused_k must be an int32 tensor of shape (N,) = ({n},)")
        used = seqused_k.tolist()
        if any(u < 0 for u in used):
            raise ValueError(f"seqused_k must be >= 0, got {used}")
    if paged:
        assert used is not None  # block_table needs seqused_k (checked above)
        if (not isinstance(block_table, Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2
                or block_table.shape[0] != n):
            raise ValueError(f"block_table must be an int32 tensor of shape (N, max_pages) with N = {n}")
        if torch.is_grad_enabled() and (key.requires_grad or value.requires_grad):
            raise ValueError("a paged KV cache (block_table) is for inference: key and value must not require grad "
                             "(detach them, or run under torch.no_grad())")
        page = key.shape[1]
        if any(u > page * block_table.shape[1] for u in used):
            raise ValueError(f"seqused_k asks for more keys than block_table's {block_table.shape[1]} pages of "
                             f"{page} hold")
        npages = torch.tensor([-(-u // page) for u in used], device=block_table.device)
        live = torch.arange(block_table.shape[1], device=block_table.device) < npages.unsqueeze(1)
        if bool(((block_table < 0) | (block_table >= key.shape[0]))[live].any()):
            raise ValueError(f"block_table's pages in use must index the pool of {key.shape[0]} pages")
        keys = None
        lk = used
    else:
        ko = _offsets(cu_seq_k, "cu_seq_k", key.shape[0], n)
        if value.shape[0] != key.shape[0]:
            raise ValueError(f"value must have as many rows T_k as key ({key.shape[0]}), got {value.shape[0]}")
        if used is not None and any(u > b - a for u, a, b in zip(used, ko, ko[1:])):
            raise ValueError("seqused_k must not exceed a sequence's keys in cu_seq_k")
        keys = [(a, a + (b - a if used is None else u)) for a, b, u in zip(ko, ko[1:], used or [0] * n)]
        lk = [b - a for a, b in keys]
    lq = [b - a for a, b in zip(qo, qo[1:])]
    if n and max(lq) > max_q:
        raise ValueError(f"max_q = {max_q} is smaller than a sequence's {max(lq)} queries")
    if n and max(lk) > max_k:
        raise ValueError(f"max_k = {max_k} is smaller than a sequence's {max(lk)} keys")

    kw = dict(scale=scale, enable_gqa=enable_gqa, map=map, alpha=alpha, softcap=softcap)
    if paged and n and max(lq) <= DECODE_QUERIES:
        return _paged_batch(query, key, value, qo, lq, lk, block_table, window, kw, want_lse)
    outs, lses = [], []
    for i in range(n):
        if lq[i] == 0:
            continue
        if paged:
            pages = block_table[i, : -(-lk[i] // key.shape[1])].long()
            k_i = key[pages].reshape(-1, *key.shape[2:])[: lk[i]]
            v_i = value[pages].reshape(-1, *value.shape[2:])[: lk[i]]
        else:
            k_i, v_i = key[keys[i][0]:keys[i][1]], value[keys[i][0]:keys[i][1]]  # type: ignore[index]  # set when not paged
        q_i = query[qo[i]:qo[i + 1]]
        causal = window == (-1, 0) and lq[i] == lk[i]  # top-left and bottom-right alignments agree
        mask = None if window == (-1, -1) or causal else window_mask(lq[i], lk[i], window, query.device)
        heads = (q_i.transpose(0, 1), k_i.transpose(0, 1), v_i.transpose(0, 1))
        outs.append(scaled_dot_product_attention(*heads, mask, is_causal=causal, **kw).transpose(0, 1))
        if want_lse:
            keep = window_mask(lq[i], lk[i], window, query.device) if window != (-1, -1) else None
            lses.append(_lse(heads[0], heads[1], keep, scale, softcap).transpose(0, 1))
    if not outs:
        out = query.new_zeros(query.shape[0], query.shape[1], value.shape[-1])
        return (out, query.new_full(query.shape[:2], float("-inf"))) if want_lse else out
    return (torch.cat(outs, 0), torch.cat(lses, 0)) if want_lse else torch.cat(outs, 0)


def _wants_lse(return_aux, map) -> bool:
    """Whether torch's ``return_aux`` asks for the log-sum-exp, which the softmax alone has."""
    if return_aux is None:
        return False
    lse = getattr(return_aux, "lse", None)
    if not isinstance(lse, bool):
        raise TypeError(f"return_aux must be None or torch.nn.attention.varlen.AuxRequest, got {return_aux!r}")
    if lse and map != "softmax":
        raise ValueError(f"return_aux=AuxRequest(lse=True) asks for the log-sum-exp that normalises softmax's "
                         f"weights; map={map!r} has none (its weights are a thresholded map of the scores)")
    return lse


def _lse(q: Tensor, k: Tensor, keep, scale, softcap) -> Tensor:
    """(…, H, L) log-sum-exp over the keys of the capped, scaled scores of q
    (…, H, L, D) and k (…, H_kv, S, D) (head h reads k's head h // (H/H_kv)),
    over the keys ``keep`` (…, L, S) lets each query see (None: all)."""
    h, hkv = q.shape[-3], k.shape[-3]
    if hkv != h:
        k = k.repeat_interleave(h // hkv, dim=-3)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if keep is not None:
        s = s.masked_fill(~keep.unsqueeze(-3), float("-inf"))
    return torch.logsumexp(s, -1)


def _paged_batch(query, key, value, qo, lq, lk, block_table, window, kw, want_lse):
    """Every sequence of a paged cache in one padded call: queries (N, H,
    max_q, D) and each sequence's pages (N, H_kv, pages·page_size, ·), with
    a mask that keeps key j for query t of sequence i iff j < seqused_k[i],
    t < L_q,i and the window sees it; padding rows see no key (output 0)."""
    dev = query.device
    n, mq, mk = len(lq), max(lq), max(max(lk), 1)
    page = key.shape[1]
    npg = -(-mk // page)
    lq_t, lk_t = torch.tensor(lq, device=dev), torch.tensor(lk, device=dev)
    t, j = torch.arange(mq, device=dev), torch.arange(npg * page, device=dev)
    qvalid = t < lq_t.unsqueeze(1)  # (N, max_q)
    rows = torch.clamp(torch.tensor(qo[:-1], device=dev).unsqueeze(1) + t, max=query.shape[0] - 1)
    pages = block_table[:, :npg].long()
    pages = torch.where(j[::page] < lk_t.unsqueeze(1), pages, 0)  # pages past a sequence's keys: never read
    k = key[pages].reshape(n, npg * page, *key.shape[2:])
    v = value[pages].reshape(n, npg * page, *value.shape[2:])
    # a page's unused tail may hold anything, NaN included, and a dense P·V
    # multiplies it by p = 0: the copies' padding is zeroed (keys need not be:
    # their scores are masked to −inf)
    v.masked_fill_((j >= lk_t.unsqueeze(1)).view(n, -1, *([1] * (v.dim() - 2))), 0.0)
    pos = t.view(1, mq, 1) + (lk_t - lq_t).view(n, 1, 1)  # bottom-right alignment
    keep = (j < lk_t.view(n, 1, 1)) & qvalid.unsqueeze(-1) & window_keep(pos, j, window)  # (N, max_q, keys)
    heads = (query[rows].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    out = scaled_dot_product_attention(*heads, keep.unsqueeze(1), **kw).transpose(1, 2)[qvalid]
    if not want_lse:
        return out
    return out, _lse(heads[0], heads[1], keep, kw["scale"], kw["softcap"]).transpose(1, 2)[qvalid]
