r"""The blockwise backend on whole score rows: a chunk of queries against every key.

On a CPU a chunk of queries' whole score rows fits in cache, and the
threshold maps have fast row kernels.  So for S up to :data:`ROWS_MAX`
keys (or longer rows when a query's rows over the batch and heads hold at
most :data:`ROW_SCORES` scores: decoding), instead of the λ search over key
blocks (:mod:`.forward`), each chunk of queries (about :data:`CHUNK` scores
at a time, whatever L, and at least one query) computes

.. math:: S = \mathrm{scale}\cdot QK^\top + M \ (\text{capped, masked}), \qquad P = \mathrm{map}(S), \qquad O = PV,

with the map's row kernel (:mod:`softk._backends.native` where it serves
the family and dtype, else the PyTorch path) and PV over the support where
P is sparse enough (:mod:`.support`: decoding reads only the values of
the keys with p > 0; a prefill chunk's groups of query rows only their
live keys), and the backward recomputes P
the same way: dP = dO Vᵀ, dS = the map's vector–Jacobian product of dP
(d ⊙ (dP − Σ d dP / Σ d), from P alone), dQ = scale·dS K, dK = scale·dSᵀQ,
dV = PᵀdO (all four over each group's live keys where they are few enough,
:class:`.support.Live`: dS is 0 wherever p is), and for a per-head α,
Σ_j dP_j ∂p_j/∂α in the cancellation-free
form of :mod:`softk.threshold.entmax_alpha`.  The softmax with no soft cap
in float32 or float64 takes torch's fused kernel before this path
(:mod:`.fused`).  Memory is O(CHUNK) (one
query's rows, at most ROW_SCORES, where they are longer) beyond the inputs
and outputs (CHUNK_MAX where a chunk of CHUNK scores would hold few queries);
the saved statistics are, for α-entmax away from α = 1 where the rows have
no native kernel, the row maximum m and λ
(:func:`reads_threshold`: the backward forms p from them, elementwise,
instead of solving for it again), and otherwise m = lam = 0, which this
path does not read (a pass over the scores for them would be wasted).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..native import products as native_products
from ..native import threshold as native_rows
from ..torch import threshold as torch_rows
from ...threshold.attention_maps import ENTMAX_ID, SOFTMAX_ID, family
from ...threshold.entmax_alpha import dp_dalpha, entmax_log_d
from ...threshold.entmax_anchor import NEAR_ONE
from ...threshold.families import entmax_family
from ...threshold.rows import compute_dtype
from . import support
from .blocks import NEG_INF, Blocks

ROWS_MAX = 1 << 16  # keys at most for this path at any batch and head count
ROW_SCORES = 1 << 23  # ... or longer rows, when one query's rows over the batch and heads hold at most this many
CHUNK = 1 << 20  # scores per chunk of queries (4 MiB in float32)
# ... or more, up to CHUNK_MAX, for at least CHUNK_QUERIES queries per chunk: the chunk's products are
# matrix products with that many rows per head, and long rows at few heads left them a few dozen
CHUNK_QUERIES = 128
CHUNK_MAX = 1 << 22


def serves(q: Tensor, S: int) -> bool:
    """Whether the rows of queries ``q`` (B, H, L, E) against S keys take this
    path: S ≤ ROWS_MAX, or B·H·S ≤ ROW_SCORES (32 MiB of float32 scores per
    query position: decoding against a long cache, where the search over key
    blocks would read the keys twice and this path reads them once)."""
    return S <= ROWS_MAX or q.shape[0] * q.shape[1] * S <= ROW_SCORES


def _chunks(q: Tensor, S: int):
    """(i0, i1) spans of queries, the last first: with ``causal`` a chunk's
    rows get longer with i1, and allocating the largest first lets every
    later chunk reuse its freed memory (growing sizes left the allocator a
    new block per chunk: 140 MiB resident at L = 8192 for 4 MiB chunks)."""
    step = _step(q, S)
    return [(i, min(i + step, q.shape[2])) for i in range(0, q.shape[2], step)][::-1]


def _step(q: Tensor, S: int) -> int:
    """Queries per chunk: CHUNK scores, or up to CHUNK_MAX for CHUNK_QUERIES queries, at least one;
    a multiple of the live keys' group (:data:`.support.GROUP`) where it holds more, so that every
    chunk but the last splits into whole groups (a chunk that does not is one group, whose live
    keys are all its rows' together)."""
    B, H, L = q.shape[:3]
    row = max(B * H * max(S, 1), 1)  # scores of one query over the batch and heads
    step = max(1, CHUNK // row, min(CHUNK_QUERIES, CHUNK_MAX // row))
    if step > support.GROUP:
        step -= step % support.GROUP
    return min(max(L, 1), step)


def _workspace(q: Tensor, S: int, ct) -> Tensor:
    """A flat buffer for the largest chunk's scores (:func:`_chunks`), reused
    by every chunk of the call: one allocation instead of one per chunk."""
    return torch.empty(q.shape[0] * q.shape[1] * _step(q, S) * S, dtype=ct, device=q.device)


def _view(work: Tensor, shape) -> Tensor:
    n = 1
    for d in shape:
        n *= d
    return work[:n].view(shape)


def _accumulate(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc[:, :, :S] += aᵀ b for a (B, H_kv, R, S) and b (B, H_kv, R, E), in
    place (one product into the accumulator, not a product and a sum)."""
    B, Hkv, R, S = a.shape
    part = acc[:, :, :S]
    if part.shape[:2] == (B, Hkv) and acc.is_contiguous():
        part.view(B * Hkv, S, acc.shape[-1]).baddbmm_(a.reshape(B * Hkv, R, S).transpose(1, 2),
                                                      b.reshape(B * Hkv, R, b.shape[-1]))
    else:
        part += a.transpose(-1, -2) @ b


def _families(fam: int, alpha, blk: Blocks):
    """[(family, row slice)] covering the chunk's rows: one family, or one per
    query head for a per-head α (the row kernels take one α per call)."""
    if fam != ENTMAX_ID:
        return [(family(fam), slice(None))]
    a = alpha.detach().to(torch.float64).tolist()
    if len(set(a)) == 1:
        return [(entmax_family(a[0]), slice(None))]
    return [(entmax_family(a[h]), (h // blk.G, slice((h % blk.G) * blk.L, (h % blk.G + 1) * blk.L)))
            for h in range(len(a))]


def _backend(fam_obj, s: Tensor):
    # the rows' own threshold kernel, whatever the setting: the CPU's where it serves, else torch's
    return native_rows if native_rows.serves(s, fam_obj) is None else torch_rows


def _map(fams, s: Tensor, out: Tensor) -> Tensor:
    """P = map(S) on a chunk's scores, written into ``out`` (a workspace of s's
    shape, :func:`_view`) by the CPU's row kernel: a chunk's worth of fresh
    memory for each chunk cost a page fault per 4 KiB at its first writes."""
    if len(fams) == 1:
        f = fams[0][0]
        b = _backend(f, s)
        return b.forward(f, s, 1, 1.0, out=out) if b is native_rows else b.forward(f, s, 1, 1.0)
    for f, (hk, rows) in fams:
        part = s[:, hk, rows]
        out[:, hk, rows] = _backend(f, part).forward(f, part, 1, 1.0)
    return out


def _vjp(fams, p: Tensor, dp: Tensor, out: Tensor) -> Tensor:
    """dS from P and dP, written into ``out`` as :func:`_map` writes P."""
    if len(fams) == 1:
        f = fams[0][0]
        b = _backend(f, p)
        return b.backward(f, p, dp, 1.0, out=out) if b is native_rows else b.backward(f, p, dp, 1.0)
    for f, (hk, rows) in fams:
        out[:, hk, rows] = _backend(f, p[:, hk, rows]).backward(f, p[:, hk, rows], dp[:, hk, rows], 1.0)
    return out


def attention_forward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool, mask, fam: int, alpha,
                      softcap: float = 0.0):
    """(out (B, H, L, Ev) in q's dtype, m (B, H, L), lam (B, H, L)) in the compute dtype: the row
    maximum and λ where :func:`reads_threshold` holds, else 0 and 0."""
    ct = compute_dtype(q.dtype)
    kc, vc = k.to(ct).contiguous(), v.to(ct).contiguous()  # the live keys' rows are gathered from flat views
    outs, ms, ts = [], [], []
    closed = reads_threshold(fam, alpha, q.new_empty(0, dtype=ct))
    work, work_p = _workspace(q, k.shape[2], ct), _workspace(q, k.shape[2], ct)
    for i0, i1 in _chunks(q, k.shape[2]):
        blk = Blocks(q[:, :, i0:i1], kc, vc, None if mask is None else mask[:, :, i0:i1], scale, causal, i0, softcap)
        s = blk.scores(0, blk.S, out=work)
        p = _map(_families(fam, alpha, blk), s, _view(work_p, s.shape))
        outs.append(blk.heads(support.product(p, vc, fam != SOFTMAX_ID)))
        if closed:
            m, t = _threshold(s, p, blk.per_row(alpha) - 1)
            ms.append(blk.heads(m.squeeze(-1)))
            ts.append(blk.heads(t.squeeze(-1)))
    out = torch.cat(outs[::-1], 2)
    if closed:
        return out.to(q.dtype), torch.cat(ms[::-1], 2), torch.cat(ts[::-1], 2)
    # otherwise m and lam are not read back (the backward maps whole rows again): no pass over the scores for them
    m = out.new_zeros(out.shape[:3], dtype=ct)
    return out.to(q.dtype), m, torch.zeros_like(m)


def closed_form(fam: int, alpha) -> bool:
    """Whether the backward forms α-entmax's p from the forward's (m, λ)
    (:func:`_entmax_probs`) instead of mapping the rows again: α-entmax with
    every α − 1 in [NEAR_ONE, 1], where λ read off p holds p to its
    precision.  Closer to 1 p is a steep power of λ (the solvers refine the
    shifted threshold there, :func:`softk._backends.blockwise.forward.refine_t`);
    the row kernel maps the rows again."""
    if fam != ENTMAX_ID or alpha is None:
        return False
    am1 = alpha.detach().to(torch.float64) - 1
    return bool(((am1 >= NEAR_ONE) & (am1 <= 1)).all())


def reads_threshold(fam: int, alpha, scores: Tensor) -> bool:
    """Whether the backward forms α-entmax's p from the forward's (m, λ)
    (:func:`closed_form`) rather than mapping the rows again: where the
    closed form holds and scores of ``scores``' dtype and device have no
    native row kernel.  Where they have one it maps the rows again in less
    time than the closed form takes (a log and an exp per score, where the
    kernel raises to a power only the few candidates near the top of a row),
    gives the forward's p to the bit, and spares the forward the pass that
    finds (m, λ)."""
    if not closed_form(fam, alpha):
        return False
    return native_rows.serves(scores, entmax_family(float(alpha.reshape(-1)[0]))) is not None


def _threshold(s: Tensor, p: Tensor, am1: Tensor):
    """(m, λ) per row (…, 1) of α-entmax's scores s and weights p (a = α − 1
    per row, in [NEAR_ONE, 1]): m the row maximum (0 on a row with no key)
    and λ, p = (a(s − m − λ))_+^{1/a}.  The largest score has the largest
    weight p_max = (−aλ)^{1/a}, so λ = −p_max^a / a, to p_max's relative
    precision."""
    m = s.amax(-1, keepdim=True)
    top = p.amax(-1, keepdim=True)
    return torch.where(m > NEG_INF, m, 0.0), -torch.exp(am1 * torch.log(top)) / am1


def _entmax_probs(s: Tensor, m: Tensor, lam: Tensor, am1: Tensor) -> Tensor:
    """p = (a(s − m − λ))_+^{1/a} from the forward's (m, λ), formed in place
    in s (its scores are not read again), as
    :func:`softk._backends.blockwise.forward.entmax_p` forms it from λ (m
    and λ subtracted in turn: m + λ would round by an ulp of m, the same
    shift for every p of the row); s = −inf gives 0, NaN stays NaN."""
    return s.sub_(m).sub_(lam).mul_(am1).clamp_(min=0.0).log_().div_(am1).exp_()


def _live_grads(live, fams, blk: Blocks, p: Tensor, do: Tensor, kc: Tensor, vc: Tensor, dk: Tensor, dv: Tensor,
                dqs: list, softcap: float, work_ds: Tensor):
    """A chunk's share of the gradients over each group's live keys
    (:class:`.support.Live`): appends dq to ``dqs``, adds to dk and dv in
    place; (p, dP, dS) on the live keys, (B, H_kv, R, U), dS in ``work_ds``."""
    B, Hkv, n, g, U = live.shape
    flat = (B, Hkv, n * g, U)
    pl = live.weights(p)
    dog = do.reshape(B, Hkv, n, g, do.shape[-1])
    dp = (dog @ live.rows(vc).transpose(-1, -2)).reshape(flat)
    ds = _vjp(fams, pl.reshape(flat), dp, _view(work_ds, flat))
    if softcap:
        ds = ds * live.weights(blk.cap_slope(0, blk.S)).reshape(flat)
    dsg = ds.reshape(live.shape)
    dqs.append(blk.heads((dsg @ live.rows(kc)).reshape(B, Hkv, n * g, -1) * blk.scale))
    live.add(dk, dsg.transpose(-1, -2) @ blk.q.reshape(B, Hkv, n, g, -1))  # dk += dsᵀ (scale·q)
    live.add(dv, pl.transpose(-1, -2) @ dog)  # dv += pᵀ dO
    return pl.reshape(flat), dp, ds


def _row_grads(fams, blk: Blocks, p: Tensor, do: Tensor, kc: Tensor, vc: Tensor, dk: Tensor, dv: Tensor,
               dqs: list, softcap: float, work_dp: Tensor, work_ds: Tensor):
    """A chunk's share of the gradients over each row's nonzeros
    (:func:`.support.rows_sparse`): dP = dO Vᵀ on P's support (0 elsewhere,
    where the map's slope is 0), dS from it, then dq appended to ``dqs``
    and dk, dv added in place; returns (dP, dS)."""
    dp = native_products.sampled(p, do, vc, out=_view(work_dp, p.shape))
    ds = _vjp(fams, p, dp, _view(work_ds, p.shape))
    if softcap:
        ds = ds * blk.cap_slope(0, blk.S)
    dqs.append(blk.heads(native_products.mm(ds, kc) * blk.scale))
    native_products.mm_t_(dk, ds, blk.q)  # dk += dsᵀ (scale·q)
    native_products.mm_t_(dv, p, do)  # dv += pᵀ dO
    return dp, ds


def attention_backward(q, k, v, out, dout, m, lam, *, scale: float, causal: bool, mask, fam: int, alpha,
                       need_dalpha: bool, softcap: float = 0.0):
    """(dq, dk, dv, dalpha (H,) or None), each in its input's dtype (dalpha in the compute dtype)."""
    ct = compute_dtype(q.dtype)
    kc, vc = k.to(ct).contiguous(), v.to(ct).contiguous()  # the live keys' rows are gathered from flat views
    dk, dv = torch.zeros_like(kc), torch.zeros_like(vc)
    dqs: list[Tensor] = []
    dalpha = None
    need_dalpha = need_dalpha and fam == ENTMAX_ID and alpha is not None
    closed = reads_threshold(fam, alpha, q.new_empty(0, dtype=ct))
    work, work_dp, work_p, work_ds = (_workspace(q, k.shape[2], ct) for _ in range(4))
    for i0, i1 in _chunks(q, k.shape[2]):
        blk = Blocks(q[:, :, i0:i1], kc, vc, None if mask is None else mask[:, :, i0:i1], scale, causal, i0, softcap)
        S = blk.S
        fams = _families(fam, alpha, blk)
        s = blk.scores(0, S, out=work)
        if closed:
            p = _entmax_probs(s, blk.rows(m[:, :, i0:i1].to(ct)).unsqueeze(-1),
                              blk.rows(lam[:, :, i0:i1].to(ct)).unsqueeze(-1), blk.per_row(alpha) - 1)
        else:
            p = _map(fams, s, _view(work_p, s.shape))
        do = blk.rows(dout[:, :, i0:i1].to(ct))
        sparse = fam != SOFTMAX_ID
        if support.rows_sparse(p, sparse, do, vc):  # every product over each row's nonzeros
            dp, ds = _row_grads(fams, blk, p, do, kc, vc, dk, dv, dqs, softcap, work_dp, work_ds)
        elif (live := support.Live.of(p, sparse, support.LIVE_SHARE_BACKWARD)) is None:
            dp = torch.matmul(do, vc[:, :, :S].transpose(-1, -2), out=_view(work_dp, p.shape))
            ds = _vjp(fams, p, dp, _view(work_ds, p.shape))
            if softcap:
                ds = ds * blk.cap_slope(0, S)
            dqs.append(blk.heads((ds @ kc[:, :, :S]) * scale))
            _accumulate(dk, ds, blk.q)  # dk += dsᵀ (scale·q)
            _accumulate(dv, p, do)  # dv += pᵀ dO
        else:  # every product over each group's live keys: dS is 0 wherever p is
            p, dp, ds = _live_grads(live, fams, blk, p, do, kc, vc, dk, dv, dqs, softcap, work_ds)
        if need_dalpha:
            a = blk.per_row(alpha)
            row = (dp * dp_dalpha(p, a, entmax_log_d(p, a))).sum(-1, keepdim=True)
            da = row.reshape(row.shape[0], blk.hkv, blk.G, blk.L).sum((0, 3)).reshape(-1)
            dalpha = da if dalpha is None else dalpha + da
    return torch.cat(dqs[::-1], 2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dalpha
