r"""P·V over the support: the attention output without the keys whose weight is exactly zero.

A sparse map gives p_rj = 0 to every key with s_rj ≤ λ_r, so

.. math:: O_r = \sum_j p_{rj} v_j = \sum_{j \in \mathrm{supp}(p_r)} p_{rj} v_j

reads only the values of the support.  When a call has few query rows per
key/value head (decoding: one query against a long cache) the dense P·V is
a matrix–vector product bound by reading all of V, and the gathered sum
reads nnz(P) rows of V instead.  :func:`product` takes it when
nnz(P) ≤ :data:`GATHER_SHARE` · B·H_kv·S (the V rows the dense product
reads); otherwise, and for the softmax (no zeros), the dense matmul runs.

GATHER_SHARE is set from the crossover measured by
``benchmarks/cpu/attention_support.py`` (BENCHMARKS.md, "CPU: P·V over
the support"): the gather wins by far at one query per head and a small
support, and loses to a GEMM-sized chunk unless P is almost empty; a chunk
of R query rows per head takes it only below 1/(32·R) nonzeros.
"""

from __future__ import annotations

import torch
from torch import Tensor

GATHER_SHARE = 1 / 32  # nonzeros of P per V row read by the dense product, at most, for the gather


def product(p: Tensor, v: Tensor, sparse: bool) -> Tensor:
    """P V for p (B, H_kv, R, S) and v (B', H_kv', S', Ev) broadcastable to
    (B, H_kv, S ≤ S', Ev) (only its first S rows are read), both in the
    compute dtype; ``sparse``: the map can give exact zeros."""
    B, Hkv, R, S = p.shape
    if not gathers(p, sparse):
        return p @ v[:, :, :S]
    rows, j = p.reshape(-1, S).nonzero(as_tuple=True)  # row index over (B, H_kv, R), key index
    bh = torch.div(rows, R, rounding_mode="floor")
    b, h = torch.div(bh, Hkv, rounding_mode="floor"), bh % Hkv
    vb = v.expand(B, Hkv, *v.shape[2:])  # a view: broadcast batch or heads are not copied
    terms = vb[b, h, j] * p.reshape(-1, S)[rows, j].unsqueeze(-1)
    out = torch.zeros(B * Hkv * R, v.shape[-1], dtype=p.dtype, device=p.device)
    out.index_add_(0, rows, terms)
    return out.reshape(B, Hkv, R, v.shape[-1])


def gathers(p: Tensor, sparse: bool) -> bool:
    """Whether :func:`product` forms P V (p (B, H_kv, R, S)) from the support:
    a sparse map, and nnz(P) ≤ GATHER_SHARE · B·H_kv·S.  Chunks of more than
    GATHER_SHARE·S rows per head are not counted (a count over P took a fifth
    of a prefill chunk's time): with a key or more per row they are over."""
    if not sparse or p.numel() == 0:
        return False
    B, Hkv, R, S = p.shape
    if R > GATHER_SHARE * S:  # a row has a key at least: nnz(P) ≥ B·H_kv·R, over budget (and no count to pay)
        return False
    return int(torch.count_nonzero(p)) <= GATHER_SHARE * B * Hkv * S


def skipped(p: Tensor, page: int = 16) -> tuple[float, float]:
    """(share of keys, share of pages of ``page`` consecutive keys) whose
    value no query row of p (…, R, S) reads, over every (batch, head): what
    an exact sparse P·V skips.  For benchmarks and logs."""
    live = (p != 0).any(-2)  # (…, S): the key's value is read by some row
    S = live.shape[-1]
    if S == 0:
        return 0.0, 0.0
    pad = (-S) % page
    pages = torch.nn.functional.pad(live, (0, pad)).reshape(*live.shape[:-1], -1, page).any(-1)
    return 1.0 - live.float().mean().item(), 1.0 - pages.float().mean().item()
