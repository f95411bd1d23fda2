r"""P·V over the support: the attention output without the keys whose weight is exactly zero.

A sparse map gives p_rj = 0 to every key with s_rj ≤ λ_r, so

.. math:: O_r = \sum_j p_{rj} v_j = \sum_{j \in \mathrm{supp}(p_r)} p_{rj} v_j

reads only the values of the support.  Two forms of it:

* **the gathered sum** (:func:`product` when :func:`gathers`): when a call
  has few query rows per key/value head (decoding: one query against a long
  cache) the dense P·V is a matrix–vector product bound by reading all of V,
  and the gathered sum reads nnz(P) rows of V instead.  It is taken when
  nnz(P) ≤ :data:`GATHER_SHARE` · B·H_kv·S (the V rows the dense product
  reads).  GATHER_SHARE is set from the crossover measured by
  ``benchmarks/cpu/attention_support.py`` (BENCHMARKS.md, "CPU: P·V over
  the support"): the gather wins by far at one query per head and a small
  support, and loses to a GEMM-sized chunk unless P is almost empty.
* **each row's nonzeros** (:func:`rows_sparse`, the CPU kernels of
  :mod:`softk._backends.native.products`): a chunk of many query rows
  (prefill) whose rows weight at most :data:`ROW_SHARE` · S keys each, on
  rows sampled across the chunk, takes P·V as a pass over each row to list
  its nonzeros and E multiply-adds per nonzero, and its backward the same
  way: dP = dO·Vᵀ only on P's support (all that the sparse maps'
  vector–Jacobian product reads), dQ = dS·K, dK += dSᵀQ and dV += PᵀdO
  over the nonzeros.  Rows weight different keys, so a group's union of
  live keys can be most of S (entmax α = 1.3 on N(0, 1) scores: about 7 %
  of 2048 keys a row, three quarters of them live in a group of 16 rows)
  where each row's own share is small.
* **the live keys of a group of rows** (:class:`Live`), where those kernels
  are not built: a chunk of many
  query rows (prefill) splits into groups of :data:`GROUP` consecutive rows
  per key/value head; a key that no row of its group weights is dropped
  from the group's products, which stay matrix products over the group's
  live keys (the union of its rows' supports, padded to the largest group's
  count with keys the group does not weight, p = 0 there).  The same keys
  serve the backward: dP, dS (zero wherever p is), dQ = dS K, dK += dSᵀQ
  and dV += PᵀdO all run over them.  It is taken when every group has at
  most :data:`LIVE_SHARE` · S live keys (:data:`LIVE_SHARE_BACKWARD` · S
  in the backward, which compacts four products where the forward
  compacts one); otherwise, and for the softmax (no
  zeros), the dense products run.  Exact: the dropped terms are products
  with p = 0 (or, in the backward, with dS = 0), so only the order of the
  sums changes (and a value that is inf or NaN at a key no row of the group
  weights no longer turns the group's output NaN through 0·inf).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..native import products as native_products

GATHER_SHARE = 1 / 32  # nonzeros of P per V row read by the dense product, at most, for the gather
GROUP = 16  # query rows per group sharing one set of live keys: fewer rows, fewer live keys, thinner products
# live keys per group, at most this share of S, for the compacted products: the forward compacts one product
# (P·V), the backward four (dP, dQ, dK, dV), so the backward's gathers pay off at wider supports
LIVE_SHARE = 1 / 8
LIVE_SHARE_BACKWARD = 1 / 4
# nonzeros per row, at most this share of S on the rows sampled, for the products over each row's nonzeros
ROW_SHARE = 1 / 8
ROW_SAMPLE = 16  # rows sampled across a chunk for that count


def product(p: Tensor, v: Tensor, sparse: bool) -> Tensor:
    """P V for p (B, H_kv, R, S) and v (B', H_kv', S', Ev) broadcastable to
    (B, H_kv, S ≤ S', Ev) (only its first S rows are read), both in the
    compute dtype; ``sparse``: the map can give exact zeros."""
    B, Hkv, R, S = p.shape
    if not gathers(p, sparse):
        if rows_sparse(p, sparse, v):
            return native_products.mm(p, v)
        live = Live.of(p, sparse)
        return p @ v[:, :, :S] if live is None else live.product(p, v)
    rows, j = p.reshape(-1, S).nonzero(as_tuple=True)  # row index over (B, H_kv, R), key index
    bh = torch.div(rows, R, rounding_mode="floor")
    b, h = torch.div(bh, Hkv, rounding_mode="floor"), bh % Hkv
    vb = v.expand(B, Hkv, *v.shape[2:])  # a view: broadcast batch or heads are not copied
    terms = vb[b, h, j] * p.reshape(-1, S)[rows, j].unsqueeze(-1)
    out = torch.zeros(B * Hkv * R, v.shape[-1], dtype=p.dtype, device=p.device)
    out.index_add_(0, rows, terms)
    return out.reshape(B, Hkv, R, v.shape[-1])


def rows_sparse(p: Tensor, sparse: bool, *others: Tensor) -> bool:
    """Whether the products with p (…, R, S) run over each row's nonzeros
    (:mod:`softk._backends.native.products`): a sparse map, the CPU kernels
    built and serving p's dtype (and ``others``'), and at most ROW_SHARE·S
    nonzeros a row on ROW_SAMPLE rows spread over the chunk (a count over
    them, not over P)."""
    if not sparse or p.numel() == 0 or not native_products.serves(p, *others):
        return False
    flat = p.reshape(-1, p.shape[-1])
    sample = flat[::max(1, flat.shape[0] // ROW_SAMPLE)][:ROW_SAMPLE]
    return int(torch.count_nonzero(sample)) <= ROW_SHARE * p.shape[-1] * sample.shape[0]


class Live:
    """The live keys of each group of ``g`` consecutive query rows of a chunk
    p (B, H_kv, R, S): ``keys`` (B, H_kv, R / g, U), each group's live keys
    (in order) and then keys it does not weight, up to U, the largest
    group's count.  :meth:`weights` gathers a (B, H_kv, R, S) tensor on them,
    :meth:`rows` the rows of a key or value tensor, :meth:`add` scatters a
    sum over them back onto every key."""

    def __init__(self, keys: Tensor, g: int, S: int):
        self.keys, self.g, self.S = keys, g, S
        B, Hkv, n, U = keys.shape
        self.shape = (B, Hkv, n, g, U)
        self._flat_cols: Tensor | None = None

    @classmethod
    def of(cls, p: Tensor, sparse: bool, share: float | None = None) -> "Live | None":
        """The live keys of p's groups, or None where the dense products run:
        the softmax, a group with more than ``share``·S live keys
        (LIVE_SHARE by default), or no live key at all (every row fully
        masked: p = 0, and the dense products give the zeros)."""
        if not sparse or p.numel() == 0:
            return None
        B, Hkv, R, S = p.shape
        g = GROUP if R % GROUP == 0 else R
        limit = (LIVE_SHARE if share is None else share) * S
        # the first group alone decides where it is over the limit (U is the
        # largest group's count), for a g-th of a pass over the chunk: a wide
        # support then costs no count of every group it does not use
        if int((p[0, 0, :g] != 0).any(0).sum()) > limit:
            return None
        # p ≥ 0: a key is live where some row of the group weights it (a NaN weight counts: NaN != 0)
        live = p.reshape(B, Hkv, R // g, g, S).amax(-2) != 0
        count = live.sum(-1, keepdim=True)
        U = int(count.max())
        if U > limit or U == 0:
            return None
        # a stable partition of 0..S−1 per group: the live keys first, the rest after, each in order
        order = live.cumsum(-1)
        j = torch.arange(S, device=p.device).expand_as(order)
        slot = torch.where(live, order - 1, count + j - order)
        keys = torch.empty_like(order).scatter_(-1, slot, j)[..., :U]
        return cls(keys.contiguous(), g, S)

    def weights(self, t: Tensor) -> Tensor:
        """t (B, H_kv, R, S) on the live keys: (B, H_kv, R / g, g, U)."""
        B, Hkv, n, g, U = self.shape
        cols = self._flat_cols
        if cols is None:
            grp = torch.arange(B * Hkv * n, device=t.device).view(-1, 1, 1) * (g * self.S)
            row = torch.arange(g, device=t.device).view(1, g, 1) * self.S
            cols = self._flat_cols = (self.keys.view(-1, 1, U) + grp + row).reshape(-1)
        return t.reshape(-1).index_select(0, cols).view(self.shape)

    def _flat_rows(self, x: Tensor) -> Tensor:
        B, Hkv = self.shape[:2]
        return (self.keys + torch.arange(B * Hkv, device=x.device).view(B, Hkv, 1, 1) * x.shape[2]).reshape(-1)

    def rows(self, x: Tensor) -> Tensor:
        """The rows of x (B', H_kv', S' ≥ S, E) broadcastable to (B, H_kv, S', E) at
        each group's live keys: (B, H_kv, R / g, U, E)."""
        B, Hkv, n, g, U = self.shape
        x = x.expand(B, Hkv, *x.shape[2:]).contiguous()  # a copy only where x is broadcast or strided
        return x.view(-1, x.shape[-1]).index_select(0, self._flat_rows(x)).view(B, Hkv, n, U, x.shape[-1])

    def add(self, acc: Tensor, t: Tensor) -> None:
        """acc (B, H_kv, S', E), contiguous, += t (B, H_kv, R / g, U, E) on each group's live keys."""
        acc.view(-1, acc.shape[-1]).index_add_(0, self._flat_rows(acc), t.reshape(-1, t.shape[-1]))

    def product(self, p: Tensor, v: Tensor) -> Tensor:
        """P V (B, H_kv, R, Ev) over the live keys."""
        B, Hkv, R, _ = p.shape
        return (self.weights(p) @ self.rows(v)).reshape(B, Hkv, R, v.shape[-1])


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
