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
alignment), or False in a boolean mask.

Shift before scale.  A tile holds t, the value whose row max is
the reference m, and every kernel works with z = s − max_j s_j formed by
:func:`_shift` from t and m:

* ``MASK_KIND`` 0 (no mask) and 1 (boolean mask), scale > 0: t = q·k, raw
  (pass 1 reads raw scores, m = max_j q·k_j) and z = (t − m)·scale, so the
  subtraction of two nearby float32 values is exact and a far-from-origin
  offset in q·k is never multiplied by the scale before it cancels;
* ``MASK_KIND`` 2 (additive float mask), and 3 / 4 (no mask / boolean mask
  with scale ≤ 0, where max q·k is not the row max of s): t = s and
  z = t − m.

Soft cap (``SOFTCAP``, a constexpr: the uncapped kernels are built without
it).  The scaled product is capped to c·tanh(scale·q·k / c) before the
mask (Gemma 2's attention logit soft-capping).  tanh is not linear, so the
raw max of q·k is not a reference for the capped scores: capped kernels run
``MASK_KIND`` 2, 3 or 4 (:func:`.attention._mask_args`), t = s = the capped
product + the mask and z = t − m; the capped product is bounded by c, so
no far-from-origin offset reaches z.  The backward multiplies dS by the
cap's slope 1 − tanh²(scale·q·k / c) (:func:`_cap_slope`), recomputed from
the q·k tile like everything else.
"""

import os

import triton
import triton.language as tl

from .family_math import _log1p

# Triton's CPU interpreter multiplies bfloat16 tiles wrongly in tl.dot (their
# bits, not their values; triton 3.9): there, and only there, the operands
# are widened to float32 first, which is exact (a bf16·bf16 product fits in
# float32), so the interpreter computes what the GPU's float32 accumulation does.
_WIDEN = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def _dot(a, b):
    """a @ b accumulated in float32, float32 operands not rounded to TF32."""
    if _WIDEN:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _shift(t, m, scale, MASK_KIND: tl.constexpr):
    """z = s − (row max of s) from a tile of t and the row reference m (module docstring)."""
    if MASK_KIND < 2:
        return (t - m) * scale
    return t - m


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
    if MASK_KIND == 1 or MASK_KIND == 4:
        keep = keep & (tl.load(Mb + rows * smm + cols * smn, mask=keep, other=0) != 0)
    return keep


@triton.jit
def _tanh(x):
    """tanh in float32, to about an ulp (Triton has no tanh that its
    interpreter runs; libdevice's does not): Cephes' tanhf, an odd
    polynomial below |x| = 0.625, and (1 − e)/(1 + e) with e = e^{−2|x|}
    above, where e < 0.29 keeps 1 − e from cancelling and nothing overflows."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    z = a * a
    poly = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z + 1.33314422036e-1) * z
            - 3.33332819422e-1) * z * a + a
    r = tl.where(a < 0.625, poly, (1.0 - e) / (1.0 + e))
    return tl.where(x < 0, -r, r)


@triton.jit
def _cap_slope(raw, scale, softcap):
    """The cap's derivative 1 − tanh²(x), x = scale·raw / c, on a tile of
    raw q·k, formed as 4e/(1 + e)² with e = e^{−2|x|}: 1 − t·t would lose
    the slope's relative precision where tanh rounds near ±1."""
    e = tl.exp(-2.0 * tl.abs(raw * (scale / softcap)))
    return 4.0 * e / ((1.0 + e) * (1.0 + e))


@triton.jit
def _scores(raw, rows, cols, L, S, scale, softcap, Mb, smm, smn, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
            SOFTCAP: tl.constexpr):
    """t (module docstring): raw, or s = scale·raw, capped to
    c·tanh(scale·raw / c) with ``SOFTCAP`` (+ the float mask); −inf where
    the key does not take part; ``raw`` is the float32 tile of q·k."""
    keep = _keep(rows, cols, L, S, Mb, smm, smn, MASK_KIND, CAUSAL)
    s = raw
    if SOFTCAP:
        s = softcap * _tanh(raw * (scale / softcap))
    elif MASK_KIND >= 2:
        s = raw * scale
    if MASK_KIND == 2:
        s = s + tl.load(Mb + rows * smm + cols * smn, mask=keep, other=0.0).to(tl.float32)
    return tl.where(keep, s, float("-inf"))


@triton.jit
def _qk_tile(q, Kb, skn, skd, start, rows, L, S, E, scale, softcap, Mb, smm, smn,
             MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, BN: tl.constexpr,
             EP: tl.constexpr):
    """The [BM, BN] tile t (see :func:`_scores`) of the loaded query block
    ``q`` against keys start … start + BN − 1 (rows: the [BM, 1] query indices)."""
    kidx = start + tl.arange(0, BN)[:, None]
    k = _load_2d(Kb, kidx, skn, skd, S, E, EP)
    raw = _dot(q, tl.trans(k))
    return _scores(raw, rows, start + tl.arange(0, BN)[None, :], L, S, scale, softcap, Mb, smm, smn, MASK_KIND,
                   CAUSAL, SOFTCAP)


# α − 1 below which α-entmax's kernels save the shifted threshold t = λ + 1/(α−1)
# (refined by :func:`.attention_search._refine_t`), at and above which λ itself
NEAR_ONE = tl.constexpr(0.125)


@triton.jit
def _p_entmax(z, th, am1):
    """α-entmax p from z = s − m and the row's saved threshold θ (what the
    kernels store for α-entmax, :mod:`.attention`), a = α − 1:

    * a < ``NEAR_ONE``: θ = t = λ + 1/a and p = (1 + a(z − t))_+^{1/a},
      formed as exp(log1p(a(z − t))/a), so that p keeps its relative
      precision as α → 1 (λ itself, of size 1/a, would round every p by eps/a);
    * a ≥ ``NEAR_ONE``: θ = λ and p = (a(z − λ))_+^{1/a}: here t would be the
      one to round, by eps·(1/a), an error 1 + a(z − t) cancels into where p
      is small (near α = 2 and on wide supports); z − λ rounds as
      sparsemax's z − λ does, by eps·max(|z|, |λ|) with |λ| ≤ 1/a ≤ 8.

    NaN stays NaN, z = −inf gives 0."""
    x = am1 * (z - th)
    if am1 < NEAR_ONE:
        inside = x > -1.0
        p = tl.exp(_log1p(tl.where(inside, x, 0.0)) / am1)
    else:
        inside = x > 0.0
        p = tl.exp(tl.log(tl.where(inside, x, 1.0)) / am1)
    return tl.where(inside, p, tl.where(x != x, x, 0.0))


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
