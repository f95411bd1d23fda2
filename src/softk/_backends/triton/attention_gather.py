r"""The sparse attention forward's λ from a per-row buffer of candidates,
for a block of ``BM`` query rows: the keys that can reach the support are
gathered while the scores are swept anyway, λ is solved on the buffer
(:func:`.lean._lean_search`, the row kernels' search), and only the p·V
sweep is left.

Why a buffer suffices.  p_j = f(z_j − λ) vanishes for z_j ≤ λ, so λ is a
function of the entries above it, and any lower bound b of λ splits the row
into entries that cannot carry mass (≤ b) and candidates.  Two bounds, in
the units of the tile's t (:mod:`.attention_tiles`), per row:

* the running max alone carries 1 at max − 1/(α−1), so λ ≥ m − 1/(α−1)
  (relative to the final max m, a fortiori to the running one);
* the root of g over any subset of the row is ≤ λ (g only loses terms):
  a buffer is such a subset, and so are the maxima of groups of keys.

Sweeps (:func:`_gather_pass`):

* sparsemax, whose support is a few keys: the max sweep gathers the keys
  above both bounds (each lowered by a few ulps of its own rounding);
* entmax15 and α-entmax (1.5 ≤ α ≤ 2), whose support is wider: the max
  sweep gathers the maxima of groups of ``GROUP_KEYS`` neighbouring keys,
  whose root is a close lower bound of λ, and a second sweep the keys above
  that root.

When a block's candidates would overfill a row's ``C`` slots, that row's
bound is raised to the root over its buffer (:func:`_raise_bound`, from
the left), the buffer keeps only what lies above it (in key order), and the
block is filtered again; a row that still cannot fit, or whose buffer stays
more than half full, is *over*: its λ comes from the general search over key
blocks (:func:`.attention_search._search`).  Every decision is per row, so
a row's buffer, and its λ, do not depend on the rows sharing its program.

After the last sweep a row's buffer holds every key above its final bound,
and ``_lean_search`` from that bound gives λ as the row kernels do
(Michelot for sparsemax, the closed form or Newton on √g for entmax15,
Newton on g^{α−1} for α-entmax); below α = 1.5 and above 2 the general
search serves every row.  The keys' indices travel with their values, so
the tiles holding the support are marked without another sweep
(:func:`_buffer_lambda`): the p·V sweep visits those alone.
"""

import triton
import triton.language as tl

from .attention_tiles import _any, _qk_tile, _shift
from .lean import _lean_search
from .prelude import EPS

LEAN_ALPHA_MIN = tl.constexpr(1.5)  # below, the support is wide: the general search serves it
LEAN_ALPHA_MAX = tl.constexpr(2.0)
GROUP_KEYS = tl.constexpr(16)  # the group of the entmax maps' first sweep


@triton.jit
def _t_bound(m, lam, scale, MASK_KIND: tl.constexpr):
    """The t-value (:mod:`.attention_tiles`) of z = ``lam`` against the row
    reference ``m``, lowered by a margin above the rounding of the sum: a
    key with t above it may reach z > lam, one below cannot."""
    if MASK_KIND < 2:
        d = lam / scale
    else:
        d = lam
    th = m + d
    return th - 8.0 * EPS * (tl.abs(m) + tl.abs(d))


@triton.jit
def _z_bound(bound, m, lo0, scale, MASK_KIND: tl.constexpr):
    """A start for a search from the left: the bound in t as z against m,
    a few ulps lower (its rounding), and never below max − 1/(α−1)."""
    zb = _shift(bound, m, scale, MASK_KIND)
    return tl.maximum(zb - 4.0 * EPS * (tl.abs(zb) + 1.0), lo0)


@triton.jit
def _raise_bound(SZ, SI, base, cnt, bound, need, m, lo0, am1, scale, FAM: tl.constexpr, MASK_KIND: tl.constexpr,
                 C: tl.constexpr, MAXIT: tl.constexpr, KEYS: tl.constexpr):
    """For the rows ``need``: the bound raised to the root over the row's
    buffer, the buffer compacted to the entries above it (in key order), and
    the new count; the other rows keep theirs."""
    tl.debug_barrier()  # the slots of the blocks before are written
    jj = tl.arange(0, C)[None, :]
    valid = jj < cnt
    tb = tl.load(SZ + base + jj, mask=valid, other=float("-inf"))
    # the buffer holds every entry seen above the bound, so its root is at
    # or above the bound: the search starts there
    lam, _ = _lean_search(_shift(tb, m, scale, MASK_KIND), _z_bound(bound, m, lo0, scale, MASK_KIND), need, 1.0,
                          am1, FAM, MAXIT)
    lam = lam - 4.0 * EPS * tl.abs(lam)  # a few ulps lower: the search's rounding
    bound = tl.where(need, tl.maximum(bound, _t_bound(m, lam, scale, MASK_KIND)), bound)
    keep = valid & (tb > bound)
    ci = keep.to(tl.int32)
    at = SZ + (base - 1)
    slot = tl.cumsum(ci, 1)
    if KEYS:
        ib = tl.load(SI + base + jj, mask=valid, other=0)
    tl.debug_barrier()  # every slot is read before any is rewritten
    tl.store(at + slot, tb, mask=keep & need)
    if KEYS:
        tl.store((SI + (base - 1)) + slot, ib, mask=keep & need)
    tl.debug_barrier()
    return tl.where(need, tl.sum(ci, 1, keep_dims=True), cnt), bound


@triton.jit
def _gather_pass(q, Kb, skn, skd, rows, L, S, E, scale, softcap, Mb, smm, smn, nkb, lo0, am1, FL, SZ, SI, base,
                 m, bound, fits, FAM: tl.constexpr, MASK_KIND: tl.constexpr, CAUSAL: tl.constexpr,
                 SOFTCAP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, EP: tl.constexpr, C: tl.constexpr,
                 MAXIT: tl.constexpr, G: tl.constexpr, FIRST: tl.constexpr):
    """A sweep gathering, for the rows ``fits``, the entries above their
    bounds (``G`` = 1: values t in ``SZ`` and key indices in ``SI``, slots
    ``base`` … ``base`` + C − 1), or the maxima of groups of ``G``
    neighbouring keys (a subset of the row whose root bounds λ from below).
    Returns (m, count, fits, bound, the number of bound raises).  ``FIRST``: the sweep that finds m (a
    running max; ``m`` given as −inf) and sets bit 0 of every block's flag
    where an entry lies above the running max − 1/(α−1), as
    :func:`.attention_search._max_pass` does, for the general search of the
    rows that are over; otherwise ``m`` is the row's and only the blocks
    with that bit are visited."""
    cnt = tl.zeros([BM, 1], tl.int32)
    raised = tl.full((), 0, tl.int32)
    for j in range(0, nkb):
        go = nkb > 0
        if not FIRST:
            go = (tl.load(FL + j).to(tl.int32) & 1) != 0
        if go:
            t = _qk_tile(q, Kb, skn, skd, j * BN, rows, L, S, E, scale, softcap, Mb, smm, smn, MASK_KIND, CAUSAL,
                         SOFTCAP, BN, EP)
            if FIRST:
                tm = tl.max(t, 1, keep_dims=True)
                m = tl.maximum(m, tm)
            loose = _t_bound(m, lo0, scale, MASK_KIND)  # −inf while the row has seen no key
            if FIRST:
                tl.store(FL + j, tl.where(_any(tm > loose), 1, 0).to(tl.int8))
            if G > 1:
                t = tl.max(tl.reshape(t, [BM, BN // G, G]), 2)
            # rows that are over take nothing: their threshold is +inf
            ok = t > tl.where(fits, tl.maximum(loose, bound), float("inf"))
            nnew = tl.sum(ok.to(tl.int32), 1, keep_dims=True)
            need = cnt + nnew > C
            if _any(need):
                cnt, bound = _raise_bound(SZ, SI, base, cnt, bound, need, m, lo0, am1, scale, FAM, MASK_KIND, C,
                                          MAXIT, G == 1)
                raised += 1
                # a row whose buffer stays more than half full above its
                # subset's root has a wide support: the general search serves
                # it better than a compaction at every later block
                nnew = tl.sum((t > tl.maximum(loose, bound)).to(tl.int32), 1, keep_dims=True)
                fits = fits & ~(need & ((cnt + nnew > C) | (cnt > C // 2)))
                ok = t > tl.where(fits, tl.maximum(loose, bound), float("inf"))
                nnew = tl.where(fits, nnew, 0)
            # each entry's slot: the row's count plus its prefix count, in key order
            at = base + cnt - 1
            slot = tl.cumsum(ok.to(tl.int32), 1)
            tl.store((SZ + at) + slot, t, mask=ok)
            if G == 1:
                tl.store((SI + at) + slot, tl.broadcast_to(j * BN + tl.arange(0, BN)[None, :], [BM, BN]), mask=ok)
            cnt += nnew
    return m, cnt, fits, bound, raised


@triton.jit
def _buffer_lambda(SZ, SI, base, cnt, fits, bound, m, lo0, am1, scale, FL, FAM: tl.constexpr,
                   MASK_KIND: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, C: tl.constexpr, MAXIT: tl.constexpr,
                   MARK: tl.constexpr):
    """The root (relative to m) over the buffers of the rows ``fits``,
    searched from their bounds; the other rows get ``lo0``.  ``MARK`` (a
    buffer of keys, whose root is λ): both bits of the flag of every block
    holding a key of the support are set (the p·V sweep reads bit 1; the
    general search, for the rows that are over, reads bit 0, which the first
    sweep set on these blocks already)."""
    tl.debug_barrier()  # the sweep's slots and flags are written
    jj = tl.arange(0, C)[None, :]
    valid = fits & (jj < cnt)
    tb = tl.load(SZ + base + jj, mask=valid, other=float("-inf"))
    z = _shift(tb, m, scale, MASK_KIND)
    lam, _ = _lean_search(z, _z_bound(bound, m, lo0, scale, MASK_KIND), fits, 1.0, am1, FAM, MAXIT)
    lam = tl.where(fits, lam, lo0)
    if MARK:
        # a key within a few ulps of λ marks its block too: p·V decides on p itself
        sup = valid & (z > lam - 4.0 * EPS * (tl.abs(lam) + 1.0))
        ib = tl.load(SI + base + jj, mask=sup, other=0)
        tl.store(FL + ib // BN, tl.full([BM, C], 3, tl.int8), mask=sup)
    tl.debug_barrier()
    return lam
