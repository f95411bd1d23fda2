r"""Context-parallel attention by a ring of key/value blocks: exact λ, memory O(L_local).

Every rank keeps its queries and passes its key/value shard around the ring
of the group (rank r sends to r + 1 and receives from r − 1); after W steps
each rank has seen every shard once.  The blockwise kernel's passes
(:mod:`softk._backends.blockwise`) take blocks of keys in any order, and a
ring is such an order, so each pass of the single-device algorithm becomes
one trip round the ring:

* **softmax**: one trip, the online logsumexp;
* **sparsemax, entmax15, α-entmax** (f = 0 below 0):

  1. the λ search: adding keys only raises λ, so after each block the exact
     λ of the keys seen so far is a lower bound, and only the keys above it
     are kept as candidates; after the last block λ is the row's own;
  2. only if some row of some rank kept more than ``CAP`` candidates (a
     near-flat row: an all-reduce MAX decides, so every rank agrees): one
     more trip gathers those rows' whole score rows and solves them;
  3. α-entmax with α − 1 < 1/8 only: Newton on the shifted threshold, one
     trip per step, while any rank still moves (an all-reduce MAX per step);
  4. the output Σ_j p_j v_j.

* **backward**: one trip for the row sums Σd, Σd·v (and dα's; skipped for
  softmax in float32/64, where c = dO·O), then one trip in which each block
  travels with its dK and dV accumulators, every rank adding its queries'
  share; a last send brings each block's gradients home.

So a forward costs a trip of K (the λ search) and one of K and V (the
output; softmax: that one only), each of W − 1 sends in the inputs' dtype,
and the backward a trip of K and V and one of K, V, dK and dV (the
accumulators in the compute dtype) plus the send home.  The forward's trips
post the next block's transfer before working on the current one.  Memory per
rank: its own shard, one incoming block, the candidates (≤ CAP per row) and
a block of scores (``SCORES`` at most, the keys of a block taken in pieces).
α's gradient is this rank's queries' share; summed over the ranks (the
data-parallel reduction of a replicated parameter) it is one device's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .._backends.blockwise.backward import RowRule
from .._backends.blockwise.blocks import NEG_INF, Blocks
from .._backends.blockwise.forward import (CAP, OnlineSoftmax, Search, newton_step, newton_terms, probs, refining,
                                           saved_threshold, solve)
from .._ops.distributed import all_reduce
from ..threshold.attention_maps import ENTMAX_ID, SOFTMAX_ID
from .cp_plan import Plan

SCORES = 1 << 22  # scores of one piece of a block, over every local row
REFINE_STEPS = 6  # Newton steps at most on α-entmax's shifted threshold near α = 1


class Ring:
    """The ring of ``group``: blocks of every rank, one step at a time."""

    def __init__(self, plan: Plan, group):
        self.plan, self.group = plan, group
        r, w = plan.rank, plan.world
        glob = (lambda i: dist.get_global_rank(group, i)) if group is not None else (lambda i: i)
        self.next, self.prev = glob((r + 1) % w), glob((r - 1) % w)

    def _shift(self, tensors, src: int):
        """Send ``tensors`` to the next rank and post the receive of rank ``src``'s block from the previous one."""
        n = self.plan.lengths[src]
        bufs = [t.new_empty(*t.shape[:2], n, *t.shape[3:]) for t in tensors]
        # one batch: NCCL groups the sends and receives, so two ranks sending to each other do not wait
        # on each other's send
        ops = [dist.P2POp(dist.isend, t.contiguous(), self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group) for b in bufs]
        return dist.batch_isend_irecv(ops), bufs

    def blocks(self, *tensors):
        """(source rank, its tensors) for each of the W steps, starting with this rank's own; the next
        block's transfer runs while the caller works on the current one."""
        w, cur = self.plan.world, tensors
        for i in range(w):
            src = (self.plan.rank - i) % w
            pending = self._shift(cur, (src - 1) % w) if i < w - 1 else None
            yield src, cur
            if pending is not None:
                for req in pending[0]:
                    req.wait()
                cur = tuple(pending[1])

    def carry(self, fixed, acc, step):
        """The gradient trip: ``step(src, fixed, acc)`` adds to the accumulators ``acc`` of the block
        ``fixed``; the block travels on with them, and the last send brings each block's home."""
        w = self.plan.world
        for i in range(w):
            src = (self.plan.rank - i) % w
            step(src, fixed, acc)
            nxt = (src - 1) % w
            if i < w - 1:
                reqs, bufs = self._shift(tuple(fixed) + tuple(acc), nxt)
                for req in reqs:
                    req.wait()
                fixed, acc = tuple(bufs[:len(fixed)]), tuple(bufs[len(fixed):])
        if w == 1:
            return acc
        reqs, bufs = self._shift(acc, self.plan.rank)  # block rank+1's accumulators go home; ours arrive
        for req in reqs:
            req.wait()
        return bufs


class _Rows(Blocks):
    """The local queries as the blockwise kernel stacks them (rows (B, H_kv, R = G·L, ·)), and the scores
    of a piece of a block of keys, with the causal mask read off the global positions."""

    def __init__(self, plan: Plan, q: Tensor, k: Tensor, v: Tensor):
        call = plan.call
        super().__init__(q, k, v, None, call.scale, call.causal, 0, call.softcap or 0.0)
        self.plan = plan
        self.qpos = plan.positions(plan.rank, q.device)[torch.arange(self.R, device=q.device) % self.L].unsqueeze(-1)
        self.piece = max(64, SCORES // max(q.shape[0] * self.hkv * self.R, 1))

    def pieces(self, src: int, k: Tensor):
        """(j0, j1, scores) of each piece of rank ``src``'s block of keys ``k``."""
        kpos = self.plan.positions(src, k.device)
        for j0 in range(0, k.shape[2], self.piece):
            j1 = min(j0 + self.piece, k.shape[2])
            s = self._cap(self.q @ k[:, :, j0:j1].to(self.ct).transpose(-1, -2))
            if self.causal:
                s = s.masked_fill(kpos[j0:j1] > self.qpos, NEG_INF)
            yield j0, j1, s

    def cap_slope_of(self, k: Tensor) -> Tensor:
        """d cap(s)/ds on the scaled products with the keys ``k`` (:meth:`Blocks.cap_slope` for another rank's)."""
        t = torch.tanh((self.q @ k.to(self.ct).transpose(-1, -2)) / self.softcap)
        return 1 - t * t


def _any(flag: bool, device, group) -> bool:
    """Whether ``flag`` holds on some rank (an all-reduce MAX)."""
    return bool(all_reduce(torch.tensor([float(flag)], device=device), "max", group)[0] > 0)


def forward(plan: Plan, group, q, k, v, alpha):
    """(out (B, H, L, Ev) in q's dtype, m, lam (B, H_kv, R, 1) in the compute dtype)."""
    fam, ring = plan.call.fam, Ring(plan, group)
    rows = _Rows(plan, q, k, v)
    ct, dev = rows.ct, q.device
    shape = (q.shape[0], rows.hkv, rows.R, 1)
    if fam == SOFTMAX_ID:
        online = OnlineSoftmax(shape, v.shape[-1], ct, dev)
        for src, (kb, vb) in ring.blocks(k, v):
            for j0, j1, s in rows.pieces(src, kb):
                online.add(s, vb[:, :, j0:j1].to(ct))
        out, m, lam = online.result()
        return rows.heads(out).to(q.dtype), m, lam
    a = rows.per_row(alpha) if fam == ENTMAX_ID else None
    search = Search(shape, ct, dev, fam, a, CAP)
    for src, (kb,) in ring.blocks(k):
        for _j0, _j1, s in rows.pieces(src, kb):
            search.add(s)
    if _any(bool(search.dense.any()), dev, group):
        search.lam = _solve_dense(ring, rows, k, fam, a, search)
    m, lam = search.result()
    if fam == ENTMAX_ID:  # near α = 1 the shifted threshold t = λ + 1/(α−1), refined
        lam = _refine(ring, rows, k, a, m, saved_threshold(lam, a - 1), group)  # type: ignore[operator]  # entmax: a is set
    acc = torch.zeros(*shape[:3], v.shape[-1], dtype=ct, device=dev)
    for src, (kb, vb) in ring.blocks(k, v):
        for j0, j1, s in rows.pieces(src, kb):
            acc = acc + probs(fam, a, s, m, lam) @ vb[:, :, j0:j1].to(ct)
    return rows.heads(acc).to(q.dtype), m, lam


def _solve_dense(ring, rows, k, fam, a, search):
    """λ of the rows that overflowed ``CAP``, from their whole score rows (one more trip)."""
    flat = search.dense.reshape(-1).nonzero().squeeze(-1)
    parts = []
    for src, (kb,) in ring.blocks(k):
        for _j0, _j1, s in rows.pieces(src, kb):
            parts.append(s.reshape(-1, s.shape[-1])[flat])
    lam = search.lam.clone()
    if flat.numel():
        m = search.m.reshape(-1, 1)[flat]
        z = torch.cat(parts, -1) - torch.where(m > NEG_INF, m, 0.0)
        ar = None if a is None else a.expand(search.m.shape).reshape(-1, 1)[flat]
        lam.view(-1, 1)[flat] = solve(fam, ar, z, torch.full_like(m, NEG_INF))
    return lam


def _refine(ring, rows, k, a, m, t, group):
    """α-entmax's t to its own precision on the rows with α − 1 < 1/8 (Newton, one trip per step,
    while the rows of some rank still move)."""
    am1 = a - 1
    near = refining(am1, m, t)
    for _ in range(REFINE_STEPS):
        if not _any(bool(near.any()), t.device, group):
            break
        g, e = torch.zeros_like(t), torch.zeros_like(t)
        for src, (kb,) in ring.blocks(k):
            for _j0, _j1, s in rows.pieces(src, kb):
                dg, de = newton_terms(s - torch.where(m > NEG_INF, m, 0.0), t, am1)
                g, e = g + dg, e + de
        t, near = newton_step(t, near, g, e)
    return t


def backward(plan: Plan, group, q, k, v, out, dout, m, lam, alpha, need_dalpha: bool):
    """(dq, dk, dv, dα (H,) or None): this rank's shards' gradients, and its queries' share of dα."""
    fam, ring = plan.call.fam, Ring(plan, group)
    rows = _Rows(plan, q, k, v)
    ct = rows.ct
    a = rows.per_row(alpha) if fam == ENTMAX_ID else None
    rule = RowRule(fam, a, m, lam, rows.rows(dout.to(ct)), need_dalpha and a is not None)
    sums = rule.needs_sums(rows.rows(out))
    if sums:
        for src, (kb, vb) in ring.blocks(k, v):
            for j0, j1, s in rows.pieces(src, kb):
                rule.add_sums(s, vb[:, :, j0:j1].to(ct))
    rule.finish_sums(None if sums else rows.rows(out))
    dq = torch.zeros_like(rows.q)

    def step(src, fixed, acc):
        nonlocal dq
        kb, vb = fixed
        for j0, j1, s in rows.pieces(src, kb):
            kj = kb[:, :, j0:j1].to(ct)
            cap = rows.cap_slope_of(kj) if rows.softcap else None
            dq_b, dk_b, dv_b = rule.grads(s, kj, vb[:, :, j0:j1].to(ct), rows.q, cap)
            dq = dq + dq_b
            acc[0][:, :, j0:j1] += dk_b
            acc[1][:, :, j0:j1] += dv_b

    zeros = [torch.zeros(t.shape, dtype=ct, device=t.device) for t in (k, v)]  # dK, dV accumulate in ct
    dk, dv = ring.carry((k, v), tuple(zeros), step)
    da = rule.dalpha(rows.hkv, rows.G, rows.L) if rule.need_dalpha else None
    return rows.heads(dq * rows.scale).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), da


class RingAttention(torch.autograd.Function):
    """The ring's forward and backward as one autograd node (eager; the trips are host-driven)."""

    @staticmethod
    def forward(ctx, q, k, v, alpha, plan, group):
        a = alpha.detach() if alpha is not None else None
        out, m, lam = forward(plan, group, q, k, v, a)
        ctx.save_for_backward(q, k, v, out, m, lam, a)
        ctx.plan, ctx.group = plan, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, m, lam, a = ctx.saved_tensors
        need_dalpha = a is not None and bool(ctx.needs_input_grad[3])
        dq, dk, dv, da = backward(ctx.plan, ctx.group, q, k, v, out, dout.contiguous(), m, lam, a, need_dalpha)
        return dq, dk, dv, (da.to(a.dtype) if da is not None else None), None, None
