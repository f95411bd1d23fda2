r"""The fused linear loss's backward products on the live vocabulary tiles of a
sparse gradient (:func:`softk._ops.fused_linear.chunked_pass` on CUDA under
the "triton" backend).

For one chunk of rows, with G = ∂(Σ_i w_i L_i)/∂logits (C, V), W (V, H) and
the chunk's inputs X_c (C, H), the pass needs

    ∇X_c = G W,        ∇W += Gᵀ X_c,        ∇b += Σ_rows G.

For a sparse loss (sparsemax, entmax, top-k: G = (p − y)/τ) a column j of G
is exactly zero unless class j is in some row's support or is some row's
target.  Cut the vocabulary into tiles of :data:`BLOCK_V` classes; a tile is
*live* when some entry of G in it is not zero.  A dead tile's columns add
exactly nothing to any of the three sums (a product with an exact 0 is 0, a
sum of zeros is 0), so

    G W = Σ_{live t} G[:, t] W[t, :],    (Gᵀ X_c)[t, :] = G[:, t]ᵀ X_c for live t,

and the rows of ∇W and entries of ∇b in dead tiles receive nothing.  The
kernels below run only those terms: the same sums without their zero terms,
so the skip is exact, not an approximation.  On a GPU a tile of classes, not
a single column, is the unit because ``tl.dot`` works on blocks (a gather of
single columns would leave the tensor cores idle); for a trained model the
union of a chunk's supports is a few classes per row, so most tiles are dead
and the products read a small part of W.

Both kernels accumulate in float32.  ∇X_c is rounded once to its output's
dtype; ∇W and ∇b are added in float32 to the float32 accumulators, so a
half-precision chunk's Gᵀ X_c is not rounded to the half dtype before the
addition (the dense route rounds it once: the two differ by that rounding).
Operands of one dtype enter ``tl.dot`` as they are (bfloat16/float16 on the
tensor cores; float32 with ``input_precision="ieee"``, not rounded to
TF32); operands of two dtypes are both widened to float32, which is exact.
"""

from __future__ import annotations

import torch
from torch import Tensor

import triton
import triton.language as tl

from .attention_tiles import _dot
from .launch import cdiv

# Block sizes: a first choice of tensor-core tile, not tuned
# (benchmarks/gpu/fused_live_tiles.py times the tiles against the dense
# products).  Each is a power of two ≥ 16, the smallest operand width of tl.dot.
BLOCK_V = 64  # classes per vocabulary tile, the unit that is skipped
BLOCK_C = 64  # rows of the chunk per block
BLOCK_H = 64  # hidden features per block

# The live tiles run up to this share of the V/BLOCK_V tiles; above it
# :func:`products` declines and the dense products run.  1.0: the tiles at
# every share.
MAX_LIVE_SHARE = 1.0


def live_tiles(g: Tensor, block_v: int = BLOCK_V) -> Tensor:
    """The tiles of ``block_v`` classes in which some entry of G (C, V) is not
    zero, as increasing int32 indices (the tile t covers the classes
    t·block_v … (t+1)·block_v − 1, the last one cut at V).  One read over G
    and a host sync per chunk: the kernels' grid needs the count."""
    live = (g != 0).any(0)
    pad = -live.numel() % block_v
    if pad:
        live = torch.nn.functional.pad(live, (0, pad))
    return live.view(-1, block_v).any(1).nonzero().squeeze(1).to(torch.int32)


@triton.jit
def _grad_x_kernel(G, W, GX, tiles, n_tiles, C, V, H,
                   sgc, sgv, swv, swh, sxc, sxh,
                   WIDEN: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """GX[rows, hblock] = Σ_{live t} G[rows, t] W[t, hblock]: one program per
    (block of rows, block of H), looping over the live tiles only; a program
    with no live tile writes zeros."""
    rows = (tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)[:, None]  # [BC, 1]
    hs = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)[None, :]  # [1, BH]
    lanes = tl.arange(0, BLOCK_V).to(tl.int64)
    acc = tl.zeros((BLOCK_C, BLOCK_H), dtype=tl.float32)
    for i in range(0, n_tiles):
        v = tl.load(tiles + i).to(tl.int64) * BLOCK_V + lanes
        g = tl.load(G + rows * sgc + v[None, :] * sgv, mask=(rows < C) & (v[None, :] < V), other=0.0)
        w = tl.load(W + v[:, None] * swv + hs * swh, mask=(v[:, None] < V) & (hs < H), other=0.0)
        if WIDEN:
            g = g.to(tl.float32)
            w = w.to(tl.float32)
        acc += _dot(g, w)
    tl.store(GX + rows * sxc + hs * sxh, acc.to(GX.dtype.element_ty), mask=(rows < C) & (hs < H))


@triton.jit
def _grad_w_kernel(G, X, GW, GB, tiles, C, V, H,
                   sgc, sgv, sxc, sxh, swv, swh,
                   HAS_W: tl.constexpr, HAS_B: tl.constexpr, WIDEN: tl.constexpr,
                   BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """GW[t, hblock] += G[:, t]ᵀ X[:, hblock] and GB[t] += Σ_rows G[:, t] for
    the live tile t = tiles[program 0]: one program per (live tile, block of
    H), looping over the C rows in blocks.  Each (tile, block) is one
    program's, so the read-add-write of the accumulator needs no atomics;
    the bias sums are written by the programs of the first H block."""
    vb = tl.load(tiles + tl.program_id(0)).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V).to(tl.int64)
    v = vb[:, None]  # [BV, 1]
    # the bias sums are written by the first H block's program only: V elsewhere reads as 0
    v_b = tl.where(tl.program_id(1) == 0, V, 0)
    hs = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)[None, :]  # [1, BH]
    acc = tl.zeros((BLOCK_V, BLOCK_H), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_V,), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        rows = c0 + tl.arange(0, BLOCK_C).to(tl.int64)
        # G[rows, t] read as its transpose, [BV, BC]
        gt = tl.load(G + rows[None, :] * sgc + v * sgv, mask=(rows[None, :] < C) & (v < V), other=0.0)
        if HAS_B:
            acc_b += tl.sum(gt.to(tl.float32), 1)
        if HAS_W:
            x = tl.load(X + rows[:, None] * sxc + hs * sxh, mask=(rows[:, None] < C) & (hs < H), other=0.0)
            if WIDEN:
                gt = gt.to(tl.float32)
                x = x.to(tl.float32)
            acc += _dot(gt, x)
    if HAS_W:
        at = GW + v * swv + hs * swh
        keep = (v < V) & (hs < H)
        tl.store(at, tl.load(at, mask=keep, other=0.0) + acc, mask=keep)
    if HAS_B:
        at_b = GB + vb
        keep_b = vb < v_b
        tl.store(at_b, tl.load(at_b, mask=keep_b, other=0.0) + acc_b, mask=keep_b)


def products(g: Tensor, weight: Tensor, xc: Tensor, gx: Tensor | None, gw: Tensor | None, gb: Tensor | None,
             *, max_share: float | None = None, block_v: int = BLOCK_V, block_c: int = BLOCK_C,
             block_h: int = BLOCK_H) -> bool:
    """G W into ``gx`` (C, H), Gᵀ X_c added into ``gw`` (V, H) and Σ_rows G
    added into ``gb`` (V,) on the live tiles of G (C, V) only; each of
    ``gx``, ``gw``, ``gb`` skipped when None.  ``gw`` and ``gb`` are float32
    accumulators (their dead tiles are left as they were); ``gx`` is written
    in full (zeros where G's row is zero) in its own dtype.  G is float32 or
    the inputs' half dtype; ``weight`` is (V, H), ``xc`` (C, H).

    Returns False, having written nothing, when the live tiles are more than
    ``max_share`` (default :data:`MAX_LIVE_SHARE`) of the tiles: the caller
    then runs the dense products.  CUDA tensors, or CPU tensors under
    ``TRITON_INTERPRET=1`` (how the tests run it).  The block sizes are
    keywords so that tests can cut small shapes into several blocks."""
    for b in (block_v, block_c, block_h):
        if b < 16 or b & (b - 1):
            raise ValueError(f"block sizes must be powers of two ≥ 16 (tl.dot), got {(block_v, block_c, block_h)}")
    c, v = g.shape
    h = weight.shape[1]
    tiles = live_tiles(g, block_v)
    n = tiles.numel()
    share = MAX_LIVE_SHARE if max_share is None else max_share
    if n > share * cdiv(v, block_v):
        return False
    if gx is not None and c and h:
        _grad_x_kernel[(cdiv(c, block_c), cdiv(h, block_h))](
            g, weight, gx, tiles, n, c, v, h, g.stride(0), g.stride(1), weight.stride(0), weight.stride(1),
            gx.stride(0), gx.stride(1), WIDEN=g.dtype != weight.dtype,
            BLOCK_C=block_c, BLOCK_V=block_v, BLOCK_H=block_h)
    if (gw is not None or gb is not None) and n and c:
        has_w = gw is not None and h > 0
        hb = cdiv(h, block_h) if has_w else 1
        if has_w or gb is not None:
            ref_w = gw if gw is not None else gb  # a placeholder pointer where the kernel writes no ∇W
            _grad_w_kernel[(n, hb)](
                g, xc, ref_w, gb if gb is not None else ref_w, tiles, c, v, h,
                g.stride(0), g.stride(1), xc.stride(0), xc.stride(1),
                gw.stride(0) if gw is not None else 0, gw.stride(1) if gw is not None else 0,
                HAS_W=has_w, HAS_B=gb is not None, WIDEN=g.dtype != xc.dtype,
                BLOCK_C=block_c, BLOCK_V=block_v, BLOCK_H=block_h)
    return True
