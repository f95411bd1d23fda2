r"""Tile helpers shared by the attention kernels (:mod:`.attention_kernels`,
:mod:`.attention_search`, :mod:`.attention_bwd`).

A tile is the scores of a block of queries against a block of keys.  The
helpers take the query and key indices as broadcastable index tensors
(``rows`` and ``cols``), so the same code builds a [queries, keys] tile
(the forward and the dq kernel: rows [BM, 1], cols [1, BN]) and a
[keys, queries] tile (the dk/dv kernel: rows [1, BM], cols [BN, 1]).

Scores are s = scale·(q·k) + mask in float32 (``tl.dot`` with
``input_precision="ieee"``, so float32 inputs are not rounded to TF32), and
−inf where a key does not take part: past the end of the sequence, above the
causal diagonal (key j takes part for query i iff j ≤ i, torch's top-left
alignment), or False in a boolean mask.  Every kernel then works with
s − m, m the row max (exact for the entries near m), so a far-from-origin
offset in q·k costs only the float32 rounding of s itself.
"""

import triton
import triton.language as tl


@triton.jit
def _load_2d(base, idx, sr, sc, n, width, WIDTH: tl.constexpr):
    """The rows ``idx`` (a [R, 1] column of indices, < n) of a (n, width)
    matrix with strides (sr, sc), padded with zeros to WIDTH columns."""
    c = tl.arange(0, WIDTH)[None, :]
    return tl.load(base + idx * sr + c * sc, mask=(idx < n) & (c < width), other=0.0)


@triton.jit
def _keep(rows, cols, L, S, Mb, smm, smn, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr):
    """Whether key ``cols`` takes part for query ``rows`` (before a float mask)."""
    keep = (rows < L) & (cols < S)
    if CAUSAL:
        keep = keep & (cols <= rows)
    if MASK_KIND == 1:
        keep = keep & (tl.load(Mb + rows * smm + cols * smn, mask=keep, other=0) != 0)
    return keep


@triton.jit
def _scores(raw, rows, cols, L, S, scale, Mb, smm, smn, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr):
    """s = scale·raw (+ the float mask), −inf where the key does not take part;
    ``raw`` is the float32 tile of q·k."""
    keep = _keep(rows, cols, L, S, Mb, smm, smn, MASK_KIND, CAUSAL)
    s = raw * scale
    if MASK_KIND == 2:
        s = s + tl.load(Mb + rows * smm + cols * smn, mask=keep, other=0.0).to(tl.float32)
    return tl.where(keep, s, float("-inf"))


@triton.jit
def _qk_tile(q, Kb, skn, skd, start, rows, L, S, E, scale, Mb, smm, smn,
             MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr):
    """The [BM, BN] scores of the loaded query block ``q`` against keys
    start … start + BN − 1 (rows: the [BM, 1] query indices)."""
    kidx = start + tl.arange(0, BN)[:, None]
    k = _load_2d(Kb, kidx, skn, skd, S, E, EP)
    raw = tl.dot(q, tl.trans(k), input_precision="ieee")
    return _scores(raw, rows, start + tl.arange(0, BN)[None, :], L, S, scale, Mb, smm, smn, MASK_KIND, CAUSAL)


@triton.jit
def _key_blocks(qstart, S, CAUSAL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """How many key blocks the query block starting at ``qstart`` can see
    (causal: none past the diagonal of its last row)."""
    kend = S
    if CAUSAL:
        kend = tl.minimum(S, qstart + BM)
    return tl.cdiv(kend, BN)


@triton.jit
def _any(cond):
    # a scalar: whether any entry of a 2-D block holds
    return tl.max(tl.max(cond.to(tl.int32), 1), 0) > 0
