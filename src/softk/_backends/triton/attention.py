r"""Launchers for the fused attention kernels: the forward
(:mod:`.attention_kernels`) and the backward (:mod:`.attention_bwd`).

``softk.scaled_dot_product_attention`` calls these on its Triton backend; the
argument checks (shapes, dtypes, devices, α > 1) are its job, this module
only checks the contract it relies on.

Maths.  Scores s = scale·q·kᵀ + mask (the mask: a boolean keep-mask, True =
takes part, or an additive float mask; ``causal``: key j takes part for
query i iff j ≤ i, torch's top-left alignment), or with a soft cap c > 0
s = c·tanh(scale·q·kᵀ / c) + mask (Gemma 2's attention logit soft-capping),
and per query row

.. math:: p_j = f(z_j - \lambda), \quad z_j = s_j - \max_i s_i, \qquad \textstyle\sum_j p_j = 1,

with f the family's map (``fam``): 0 softmax (f = exp,
λ = log Σ e^{z}), 1 sparsemax ([u]_+), 2 entmax15 ([u/2]_+²), 3 entmax
with a per-head α ([(α−1)u]_+^{1/(α−1)}); out = Σ_j p_j v_j.

For α-entmax below α = 1.125 the saved threshold is t = λ + 1/(α−1), and
p_j = (1 + (α−1)(z_j − t))_+^{1/(α−1)} is formed through log1p
(:func:`.attention_tiles._p_entmax`): λ is of size 1/(α−1), and its
rounding would become a relative error of eps/(α−1) in every p, while t is
O(log n); t is refined by Newton passes after the search
(:func:`.attention_search._refine_t`), so p keeps float32's precision as
α → 1, as the blockwise backend does.  From α = 1.125 the saved threshold is
λ and p_j = ((α−1)(z_j − λ))_+^{1/(α−1)}: there t's rounding would be the one
that cancels, in 1 + (α−1)(z_j − t) where p_j is small (wide supports near
α = 2), and |λ| ≤ 1/(α−1) ≤ 8.

The kernels shift before they scale: without a float mask and
with scale > 0, the saved row reference m is the max of the raw q·k and
z = (q·k − m)·scale, so a far-from-origin offset in q·k cancels exactly
before the scale multiplies it; with a float mask (or scale ≤ 0, or a soft
cap, which is not linear in q·k) m is the row max of s and z = s − m
(:mod:`.attention_tiles`).

The backward recomputes p from q, k, m and λ.  With d = f′(z − λ)
(d = p for softmax, 1 on the support for sparsemax, √p for entmax15,
p^{2−α} for entmax α) the Jacobian of a row is diag(d) − d dᵀ/Σd, so with
dP_j = dO·v_j, δ = Σ_j d_j dP_j / Σd and dS_j = d_j (dP_j − δ):
dq = scale·Σ_j dS_j k_j, dk_j = scale·Σ_i dS_ij q_i, dv_j = Σ_i p_ij dO_i;
with a soft cap dS_j is first multiplied by the cap's slope
1 − tanh²(scale·q·k_j / c), recomputed from q·k (no L×S tensor is saved).
For a learned α (Correia et al. 2019), with a = α − 1, ℓ_j = log p_j,
H = Σ p ℓ, γ(y) = e^y − 1 − y and Γ = Σ_j p_j γ(−aℓ_j), per row
dα_row = [Γ(dO·out − a Σ_j p_j ℓ_j dP_j) − (1 − aH) Σ_j p_j γ(−aℓ_j) dP_j] / (a² Σd),
summed over the rows of the head: the form of
:mod:`softk.threshold.entmax_alpha` whose terms do not cancel as α → 1
(the textbook β²(dO·out − δ) − β(Σ p ℓ dP − H δ) is a difference of
terms of size 1/(α−1)).

Fully masked rows (no key takes part): out = 0, **m = 0 and λ = +inf**, so
that f(s − m − λ) = 0 for every key by the same formula (on such a row
m + λ is not a log-sum-exp); their gradients are 0.  torch's SDPA gives NaN
there.

Tile sizes (``BLOCK_M`` × ``BLOCK_N`` and the warps) have not been tuned:
they are what compiles for sm_90 (tests/backends/triton/test_triton_attention_build.py);
BENCHMARKS.md has their times.

The kernels run on CUDA tensors (or CPU tensors under ``TRITON_INTERPRET=1``:
tests/backends/triton/test_triton_attention.py); head dimensions are padded
to a power of two ≥ 16 for ``tl.dot``:

>>> from softk._backends.triton.attention import _pad
>>> _pad(1), _pad(64), _pad(80)
(16, 64, 128)
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention_bwd import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
from .attention_kernels import attn_fwd_kernel
from ...threshold.attention_maps import ENTMAX_ID, SOFTMAX_ID

BLOCK_M = 64
BLOCK_N = 64
NEWTON_CAP = 24  # Newton-type steps before pure bisection
MAXIT = 40  # λ-search passes at most
SLOTS = 64  # the candidate buffer of a query row (:mod:`.attention_gather`)
_ALPHA = {0: 1.5, 1: 2.0, 2: 1.5, 3: 1.5}  # α of the fixed maps (entmax α reads its tensor)


def _empty(shape, dtype, device) -> Tensor:
    # every output is allocated here (tests fill it with NaN, so that an
    # element the kernels fail to write cannot pass)
    return torch.empty(shape, dtype=dtype, device=device)


def _pad(n: int) -> int:
    # a power of two ≥ 16 (tl.dot's smallest operand width)
    return max(16, 1 << max(0, n - 1).bit_length())


def _warps(e: int) -> int:
    return 4 if e <= 64 else 8


def _check(q: Tensor, k: Tensor, v: Tensor, mask, fam: int, alpha) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (B, H, L, E), got {q.dim()}, {k.dim()}, {v.dim()} dimensions")
    B, H, L, E = q.shape
    if k.shape[0] != B or v.shape[:3] != k.shape[:3] or k.shape[3] != E or H % max(k.shape[1], 1):
        raise ValueError(f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"q, k, v must share a float32/float16/bfloat16 dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if fam not in (0, 1, 2, 3):
        raise ValueError(f"fam must be 0 (softmax), 1 (sparsemax), 2 (entmax15) or 3 (entmax α), got {fam}")
    if mask is not None and tuple(mask.shape) != (B, H, L, k.shape[2]):
        raise ValueError(f"mask must be expanded to {(B, H, L, k.shape[2])}, got {tuple(mask.shape)}")
    if fam == ENTMAX_ID and (not isinstance(alpha, Tensor) or alpha.shape != (H,) or alpha.dtype != torch.float32):
        raise ValueError(f"alpha must be a float32 tensor of shape ({H},) for fam 3")


def _mask_args(mask, like: Tensor, scale: float, softcap: float):
    """(tensor, MASK_KIND, 4 strides): 0 none, 1 boolean keep-mask (read as
    bytes), 2 additive float mask; 3 and 4 are 0 and 1 for scale ≤ 0 or a
    soft cap, where the kernels cannot shift by the raw max q·k before
    scaling (see :mod:`.attention_tiles`)."""
    late = 0 if scale > 0 and not softcap else 3
    if mask is None:
        return like, late, (0, 0, 0, 0)
    if mask.dtype == torch.bool:
        return mask.view(torch.uint8), 1 + late, mask.stride()
    return mask, 2, mask.stride()


def _alpha_arg(alpha, fam: int, like: Tensor) -> Tensor:
    return alpha.contiguous() if fam == ENTMAX_ID else like


def attention_forward(q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool, mask, fam: int, alpha,
                      softcap: float = 0.0, block_m: int | None = None, block_n: int | None = None,
                      skip: bool = True, stats: dict | None = None, return_tiles: bool = False):
    """(out (B, H, L, Ev) in q's dtype, m (B, H, L) float32 (the row
    reference: see the module docstring), λ (B, H, L) float32) for q (B, H, L, E), k (B, Hkv, S, E), v (B, Hkv, S, Ev); see
    the module docstring.  ``softcap`` c > 0 caps the scaled products to
    c·tanh(·/c) (0: none; the kernels are then built without the cap).
    ``block_m``/``block_n`` override the tile
    (powers of two ≥ 16), ``skip=False`` recomputes every block in every
    pass (for tests), and a ``stats`` dict receives the per-program counts
    (int64 tensors, one entry per query block and head): ``blocks`` (key
    blocks in range), ``passes`` (λ-search passes, besides the max pass and
    the p·V pass), ``visited`` (blocks recomputed over the search passes),
    ``pv`` (blocks that took a p·V product), ``searched`` (rows whose λ
    the general search found, the others' came from their candidate buffer:
    :mod:`.attention_gather`) and ``raised`` (raises of a buffer's bound), and for the sparse maps
    ``live`` (int8, per query block and head, per key block: 0 where p is
    exactly zero on the tile).  ``return_tiles`` appends that tile mask (flat,
    in the backward's layout; one byte for softmax, which has none) to the
    result, for :func:`attention_backward`'s ``tiles``."""
    _check(q, k, v, mask, fam, alpha)
    B, H, L, E = q.shape
    Hkv, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    out = _empty((B, H, L, Ev), q.dtype, q.device)
    m = _empty((B, H, L), torch.float32, q.device)
    lam = _empty((B, H, L), torch.float32, q.device)
    if B * H * L == 0:
        return (out, m, lam, torch.zeros(0, dtype=torch.int8, device=q.device)) if return_tiles else (out, m, lam)
    BM, BN = block_m or BLOCK_M, block_n or BLOCK_N
    nqb, nkb = -(-L // BM), max(1, -(-S // BN))
    flags = torch.empty(B * H * nqb * nkb if fam else 1, dtype=torch.int8, device=q.device)
    live = torch.empty(B * H * nqb * nkb if fam else 1, dtype=torch.int8, device=q.device)
    slots = B * H * nqb * BM * SLOTS if fam and skip else 1
    sz = torch.empty(slots, dtype=torch.float32, device=q.device)
    si = torch.empty(slots, dtype=torch.int32, device=q.device)
    st = torch.zeros((B * H * nqb * 6) if stats is not None else 1, dtype=torch.int32, device=q.device)
    mk, kind, ms = _mask_args(mask, q, scale, softcap)
    attn_fwd_kernel[(nqb, B * H)](
        q, k, v, mk, _alpha_arg(alpha, fam, q), out, m, lam, flags, live, sz, si, st,
        *q.stride(), *k.stride(), *v.stride(), *ms,
        H, H // Hkv, L, S, E, Ev, nkb, float(scale), float(softcap or 1.0), _ALPHA[fam],
        FAM=fam, MASK_KIND=kind, CAUSAL=bool(causal), SOFTCAP=bool(softcap), SKIP=bool(skip),
        WITH_STATS=stats is not None,
        BM=BM, BN=BN, EP=_pad(E), EVP=_pad(Ev), NEWTON_CAP=NEWTON_CAP, MAXIT=MAXIT, C=SLOTS,
        num_warps=_warps(max(E, Ev)),
    )
    if stats is not None:
        st = st.view(B * H * nqb, 6).long()
        stats.update(blocks=st[:, 0], passes=st[:, 1], visited=st[:, 2], pv=st[:, 3], searched=st[:, 4],
                     raised=st[:, 5])
        if fam:
            stats.update(live=live.view(B * H * nqb, nkb).clone())
    return (out, m, lam, live) if return_tiles else (out, m, lam)


def attention_backward(q: Tensor, k: Tensor, v: Tensor, out: Tensor, dout: Tensor, m: Tensor, lam: Tensor, *,
                       scale: float, causal: bool, mask, fam: int, alpha, need_dalpha: bool,
                       softcap: float = 0.0, block_m: int | None = None, block_n: int | None = None,
                       skip: bool = True, stats: dict | None = None, tiles: Tensor | None = None,
                       deterministic: bool | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    r"""(dq, dk (B, Hkv, S, E), dv (B, Hkv, S, Ev), dα (H,) float32 or None)
    from the forward's inputs (``softcap`` the forward's), its (out, m, λ)
    and dout = ∂L/∂out; dα only for ``fam`` 3 with ``need_dalpha``.  Fully
    masked rows get zero gradients.  ``block_m``/``block_n``/``skip`` as in
    :func:`attention_forward`; a ``stats`` dict receives ``live`` (int8, per
    query block and head, per key block: 1 where the tile took part).

    dq takes one sweep over the key blocks (:mod:`.attention_bwd`): δ =
    Σ d·dP / Σd is known only at its end, so the sweep accumulates
    Σ_j d_j (dP_j − δ̂) k_j and Σ_j d_j k_j with δ̂ = dO·out, and
    dq = scale·(the first − (δ − δ̂)·the second).

    ``tiles``: the live-tile flags of the forward, when it has them, so that
    the backward need not find them: an int8 tensor of B·H·nqb·nkb entries
    (nqb, nkb: the query and key blocks of *these* block sizes), entry
    (b·H + h)·nqb·nkb + qb·nkb + kb 1 where some p > 0 in the tile and 0
    only where p is exactly 0 on it (a dead tile is skipped, a live one with
    p = 0 costs work but changes nothing).  The dq kernel then computes no
    q·kᵀ on a dead tile; without them it decides each tile from p and writes
    the flags the dk/dv kernel reads.  Softmax reads none.

    ``deterministic`` (default: ``torch.are_deterministic_algorithms_enabled()``,
    torch's own switch): True gives the dq sweep above, whose every sum runs
    in a fixed order.  False lets the dk/dv kernel, which forms dS on every
    live tile anyway, add dS·k to dq by float32 atomics (as
    FlashAttention-2 does), and the dq kernel only finds δ and dα: one q·kᵀ
    and two products fewer per live tile (none of its sweep at all for
    softmax with a float32 out), dq equal up to the order of the float32
    additions."""
    _check(q, k, v, mask, fam, alpha)
    if need_dalpha and fam != ENTMAX_ID:
        raise ValueError(f"need_dalpha needs fam 3 (entmax with a per-head alpha), got fam {fam}")
    B, H, L, E = q.shape
    Hkv, S, Ev = k.shape[1], k.shape[2], v.shape[3]
    if out.shape != (B, H, L, Ev) or dout.shape != out.shape or m.shape != (B, H, L) or lam.shape != m.shape:
        raise ValueError(f"out, dout must be {(B, H, L, Ev)} and m, lam {(B, H, L)}, got {tuple(out.shape)}, "
                         f"{tuple(dout.shape)}, {tuple(m.shape)}, {tuple(lam.shape)}")
    BM, BN = block_m or BLOCK_M, block_n or BLOCK_N
    nqb, nkb = -(-L // BM), -(-S // BN)
    if tiles is not None and (tiles.numel() != B * H * nqb * nkb or tiles.dtype != torch.int8):
        raise ValueError(f"tiles must be an int8 tensor of B·H·nqb·nkb = {B * H * nqb * nkb} entries "
                         f"(blocks of {BM}×{BN}), got {tiles.numel()} of {tiles.dtype}")
    dq = _empty((B, H, L, E), q.dtype, q.device)
    dk = _empty((B, Hkv, S, E), k.dtype, k.device)
    dv = _empty((B, Hkv, S, Ev), v.dtype, v.device)
    dalpha = None
    if B * H * L == 0 or S == 0:  # nothing takes part: every gradient is 0
        for t in (dq, dk, dv):
            t.zero_()
        return dq, dk, dv, (torch.zeros(H, dtype=torch.float32, device=q.device) if need_dalpha else None)
    m, lam = m.contiguous().float(), lam.contiguous().float()
    dout = dout.to(q.dtype)
    delta = _empty((B, H, L), torch.float32, q.device)
    darow = _empty((B, H, L) if need_dalpha else (1,), torch.float32, q.device)
    out_f32 = out.dtype == torch.float32
    # the live-tile flags of the sparse maps: the caller's (read by both
    # kernels), or written by the dq kernel for the dk/dv kernel (all 1
    # without ``skip``, which computes every tile whatever the caller knows)
    read = tiles is not None and fam != SOFTMAX_ID and skip
    if read and tiles is not None:
        flags = tiles.reshape(-1)
    else:
        flags = torch.empty(1 if fam == SOFTMAX_ID else B * H * nqb * nkb, dtype=torch.int8, device=q.device)
    mk, kind, ms = _mask_args(mask, q, scale, softcap)
    al = _alpha_arg(alpha, fam, q)
    warps = _warps(max(E, Ev))
    common = dict(FAM=fam, MASK_KIND=kind, CAUSAL=bool(causal), SOFTCAP=bool(softcap), BM=BM, BN=BN, EP=_pad(E),
                  EVP=_pad(Ev), num_warps=warps)
    cap = float(softcap or 1.0)  # (read only by capped kernels)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    # the atomics' float32 rows of dq, padded to the kernels' width
    acc = q if deterministic else torch.zeros((B * H * L, _pad(E)), dtype=torch.float32, device=q.device)
    attn_bwd_dq_kernel[(nqb, B * H)](
        q, k, v, mk, al, out, dout, m, lam, dq, delta, darow, flags,
        *q.stride(), *k.stride(), *v.stride(), *ms, *out.stride(), *dout.stride(),
        H, H // Hkv, L, S, E, Ev, nkb, float(scale), cap, _ALPHA[fam],
        SKIP=(2 if read else 1) if skip else 0, NEED_DALPHA=bool(need_dalpha), OUT_F32=out_f32,
        DQ_HERE=bool(deterministic), **common,
    )
    attn_bwd_dkdv_kernel[(nkb, B * Hkv)](
        q, k, v, mk, al, dout, m, lam, delta, dk, dv, flags, acc,
        *q.stride(), *k.stride(), *v.stride(), *ms, *dout.stride(),
        H, Hkv, H // Hkv, L, S, E, Ev, nqb, nkb, float(scale), cap, _ALPHA[fam], ATOMIC_DQ=not deterministic,
        **common,
    )
    if not deterministic:
        dq.copy_(acc[:, :E].view(B, H, L, E))
    if need_dalpha:
        dalpha = darow.sum(dim=(0, 2))
    if stats is not None and fam:
        stats.update(live=flags.view(B * H * nqb, nkb).clone())
    return dq, dk, dv, dalpha


# ------------------------------------------------ the interface of op "attention"
def _alphas(q: Tensor, alpha):
    # one float32 α per query head; the kernels read it for α-entmax only
    return alpha.detach().float() if alpha is not None else q.new_full((q.shape[1],), 1.5, dtype=torch.float32)


def tiles_numel(q: Tensor, k: Tensor, fam: int):
    """The size of :func:`forward`'s tile mask (what a fake kernel allocates)."""
    B, H, L = q.shape[0], q.shape[1], q.shape[2]
    if fam == SOFTMAX_ID:
        return 1 if B * H * L else 0
    return B * H * -(-L // BLOCK_M) * max(1, -(-k.shape[2] // BLOCK_N))


def forward(q, k, v, mask, alpha, scale, causal, fam, softcap):
    """(out, m, λ, tiles): :func:`attention_forward` in the interface of
    :mod:`softk._backends.kernels` (``alpha`` the per-head tensor or None);
    ``tiles`` is the tile mask the backward reads."""
    return attention_forward(q, k, v, scale=scale, causal=causal, mask=mask, fam=fam, alpha=_alphas(q, alpha),
                             softcap=softcap, return_tiles=True)


def backward(q, k, v, out, dout, m, lam, tiles, mask, alpha, scale, causal, fam, need_dalpha, softcap):
    """(dq, dk, dv, dα): :func:`attention_backward` in the same interface,
    reading the forward's tile mask (softmax has none, and with no keys
    there is nothing to read)."""
    read = fam != SOFTMAX_ID and k.shape[2] > 0 and tiles.numel() > 0
    return attention_backward(q, k, v, out, dout, m, lam, scale=scale, causal=causal, mask=mask, fam=fam,
                              alpha=_alphas(q, alpha), need_dalpha=need_dalpha, softcap=softcap,
                              tiles=tiles if read else None)
