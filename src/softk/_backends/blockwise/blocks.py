r"""Score blocks of the blockwise attention backend, recomputed on demand.

The query heads that share a key/value head (GQA: H = G·H_kv) are stacked
as rows, so query (B, H, L, E) becomes (B, H_kv, R = G·L, E) and one matmul
gives the scores of all of them against a block of keys:

.. math:: S_{r, j_0:j_1} = (\mathrm{scale}\cdot q_r)\,k_{j_0:j_1}^\top + M_{r, j_0:j_1},

M the additive mask (−inf where a boolean mask is False or, with
``causal``, where key j > query i).  With a soft cap c > 0 the scaled
product is capped to c·tanh(·/c) before M is added (Gemma 2's attention
logit soft-capping); :meth:`Blocks.cap_slope` is the cap's derivative.  Row r is query i = r mod L of head
h = h_kv·G + ⌊r / L⌋.  Everything is in the compute dtype (float32 for
half inputs, float64 for float64).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...threshold.rows import compute_dtype

NEG_INF = float("-inf")


ROWS = 2048  # query rows (batch × heads × queries) per chunk
MIN_QUERIES = 64  # queries per chunk at least (many heads: fewer, longer loops)


def query_chunks(q: Tensor):
    """(i0, i1) spans of queries: the backend runs on one chunk of queries at a
    time, so that its temporaries (a few per score of a block, the solver's
    sort among them) hold at most ~ROWS·(BLOCK + CAP) entries, whatever L."""
    B, H, L = q.shape[:3]
    step = max(MIN_QUERIES, ROWS // max(B * H, 1))
    return [(i, min(i + step, L)) for i in range(0, L, step)]


class Blocks:
    """The scores of a chunk of queries (``q`` is queries i0..i0+L−1, ``mask``
    sliced alike), a block of keys (or a set of rows) at a time; ``k`` and
    ``v`` already in the compute dtype."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, mask, scale: float, causal: bool, i0: int = 0,
                 softcap: float = 0.0):
        B, H, L, E = q.shape
        self.hkv = k.shape[1]
        # with causal, keys past the chunk's last query are hidden from all of its rows
        self.S = min(k.shape[2], i0 + L) if causal else k.shape[2]
        self.G, self.L, self.R = H // self.hkv, L, (H // self.hkv) * L
        self.ct = compute_dtype(q.dtype)
        self.scale, self.causal, self.mask, self.softcap = scale, causal, mask, softcap
        # scale·q, rows grouped by key/value head (a view when q is contiguous in float32/64)
        self.q = (q.to(self.ct) * scale).reshape(B, self.hkv, self.R, E)
        self.k, self.v = k, v
        self.qpos = (torch.arange(self.R, device=q.device) % L + i0).unsqueeze(-1)  # query index of each row
        self.i0 = i0  # the smallest query index: with causal, no key up to it is hidden

    def rows(self, t: Tensor) -> Tensor:
        """A (B, H, L, ...) tensor as (B, H_kv, R, ...)."""
        return t.reshape(t.shape[0], self.hkv, self.R, *t.shape[3:])

    def heads(self, t: Tensor) -> Tensor:
        """A (B, H_kv, R, ...) tensor back as (B, H, L, ...)."""
        return t.reshape(t.shape[0], self.hkv * self.G, self.L, *t.shape[3:])

    def per_row(self, a: Tensor) -> Tensor:
        """A per-head (H,) tensor as (1, H_kv, R, 1), one value per row."""
        return a.to(self.ct).reshape(1, self.hkv, self.G, 1).expand(1, self.hkv, self.G, self.L).reshape(
            1, self.hkv, self.R, 1)

    def spans(self, block: int):
        """(j0, j1) of each block of keys."""
        return [(j, min(j + block, self.S)) for j in range(0, self.S, block)]

    def scores(self, j0: int, j1: int, out: Tensor | None = None) -> Tensor:
        """(B, H_kv, R, j1 − j0): every row against keys j0..j1−1; with
        ``out`` (a flat buffer of at least that many entries, the compute
        dtype) written into its leading entries, so that a caller going over
        chunk after chunk reuses one buffer (a fresh score matrix per chunk
        is a fresh allocation of pages, and each further step a further
        pass over it: the cap, the mask and the causal mask are applied in
        place, the causal one only where a key can be hidden)."""
        kt = self.k[:, :, j0:j1].transpose(-1, -2)
        if out is None:
            s = self.q @ kt
        else:
            shape = (self.q.shape[0], self.hkv, self.R, j1 - j0)
            s = torch.matmul(self.q, kt, out=out[:shape[0] * shape[1] * shape[2] * shape[3]].view(shape))
        if self.softcap:
            s.div_(self.softcap).tanh_().mul_(self.softcap)
        if self.mask is not None:
            mb = self.mask[..., j0:j1].reshape(s.shape)
            if mb.dtype == torch.bool:
                s.masked_fill_(~mb, NEG_INF)
            else:
                s.add_(mb.to(self.ct))
        if self.causal:
            c0 = max(j0, min(j1, self.i0 + 1))  # keys up to the first query are visible to every row
            if c0 < j1:
                cols = torch.arange(c0, j1, device=s.device)
                s[..., c0 - j0:].masked_fill_(cols > self.qpos, NEG_INF)
        return s

    def row_scores(self, b: int, h: int, rows: Tensor) -> Tensor:
        """(n, S): rows ``rows`` of batch b, key/value head h against every key."""
        s = self._cap(self.q[b, h, rows] @ self.k[b, h, :self.S].transpose(-1, -2))
        i = self.qpos[rows, 0]
        if self.mask is not None:
            m = self.mask[b, h * self.G + torch.div(rows, self.L, rounding_mode="floor"), rows % self.L, :self.S]
            s = torch.where(m, s, NEG_INF) if m.dtype == torch.bool else s + m.to(self.ct)
        if self.causal:
            s = s.masked_fill(torch.arange(self.S, device=s.device) > i.unsqueeze(-1), NEG_INF)
        return s

    def _cap(self, s: Tensor) -> Tensor:
        return s if not self.softcap else self.softcap * torch.tanh(s / self.softcap)

    def cap_slope(self, j0: int, j1: int) -> Tensor:
        """d cap(s)/ds = 1 − tanh²(s/c) on the block's scaled products (1 without a cap)."""
        t = torch.tanh((self.q @ self.k[:, :, j0:j1].transpose(-1, -2)) / self.softcap)
        return 1 - t * t
