r"""The fused linear loss for half-precision weights: no V × H float32 buffer.

Accumulating ∇W = Σ_c G_cᵀ X_c over chunks of rows needs a float32
accumulator of W's size, twice a bfloat16 W.  Here the forward keeps per-row
numbers only, and the backward walks the vocabulary in blocks of B classes:

* :func:`row_stats` (forward): for each chunk of rows, the logits
  Z_c = X_c Wᵀ + b in float32, the rows' losses from the loss itself, the
  rows' numbers of :meth:`softk.losses._tiles.TileLoss.stats` and, for a
  sparse loss, which (row, block) tiles hold a class of the support or the
  target;
* :func:`walk` (backward): for each block b, Z_b = X W_bᵀ + b_b in float32
  for the rows (every row, or on the CPU the block's live rows of a sparse
  loss), G_b from the rows' numbers, then ∇W_b = G_bᵀ X written once in W's
  dtype, ∇X += G_b W_b in float32 and ∇b_b = Σ_rows G_b.

The logits are formed and reduced in float32 from the half inputs (upcast
block by block on the CPU; a float32-output product on CUDA), so the loss and
its gradients are rounded to the half dtype once, at the end.  The price is
one more product than the row-chunk pass (Z is formed twice); a sparse loss
skips the three products of every dead tile.  :func:`walk` takes any tile
form with ``grad(z, lo, stats, target, row_weights)``: the fused
log-probabilities and entropy (:class:`softk._ops.fused_policy.PolicyTiles`)
walk the same way.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Blocks narrower than this many classes make the products too thin to run
# at speed; the element budget then bounds the rows of a tile instead.
MIN_BLOCK = 64
# The smallest tile budget, in logits (1 MiB of float32): below it the
# products are too small to run at speed, whatever the input's size.
MIN_TILE = 1 << 18


def plan(rows: int, hidden: int, vocab: int, chunk: int) -> tuple[int, int, int]:
    """(B, R, C): classes per vocabulary block and rows per tile of the
    backward's walk, and rows per chunk of the forward.

    A tile holds at most as many logits as the input X has entries (N × H,
    at least :data:`MIN_TILE`), and never more than the row-chunk pass's
    ``chunk`` × ``vocab``: its float32 logits and G then cost what the
    float32 ∇X accumulator does.  B is the largest power of two with
    ``rows`` × B within that budget (at least :data:`MIN_BLOCK`, at most
    ``vocab``), R the rows that then fit.  The forward's chunks of whole
    rows keep to the same budget (C × V, at least one row): their logits and
    the loss's temporaries are resident while the weight gradient is not yet.

    >>> plan(2048, 1024, 32768, 128)  # every row against 1024 classes; 64 rows at once in the forward
    (1024, 2048, 64)
    >>> plan(1 << 20, 768, 50257, 16)  # a million rows: 64 classes, 12564 rows at once
    (64, 12564, 16)
    """
    budget = min(max(1, chunk) * vocab, max(rows * hidden, MIN_TILE))
    b = max(1, budget // max(rows, 1))
    b = min(max(1 << (b.bit_length() - 1), MIN_BLOCK), vocab)
    return b, max(1, min(rows, budget // b)), max(1, min(chunk, budget // vocab))


def _tensor_cores(x: Tensor) -> bool:
    return x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)


def _acc(x: Tensor) -> torch.dtype:
    """The walk's working dtype: float64 for float64 inputs, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _mm32(a: Tensor, b: Tensor) -> Tensor:
    """a @ b in the working dtype for operands already in it, or on CUDA in
    half: a half product with float32 output (tensor cores, float32
    accumulation, no rounding of the result)."""
    if _tensor_cores(a):
        try:
            return torch.mm(a, b.to(a.dtype), out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            # a torch without the float32-output product for these dtypes: float32 operands
            return torch.mm(a.float(), b.float())
    return torch.mm(a, b)


class WeightBlocks:
    """W's blocks of classes as the products take them: a half W on the CPU upcast
    into one reused buffer (the CPU's half products round their output to
    half; a fresh float32 block per use would leave the allocator's heap
    that much higher), on CUDA the half block itself."""

    def __init__(self, weight: Tensor, bias, x: Tensor, block: int):
        self.weight, self.bias = weight, bias
        self.upcast = not _tensor_cores(x) and weight.dtype != _acc(x)
        self.buf = torch.empty(min(block, weight.shape[0]), weight.shape[1], dtype=_acc(x),
                               device=x.device) if self.upcast else None

    def __call__(self, lo: int, hi: int) -> Tensor:
        """W[lo:hi] in the products' dtype (valid until the next call)."""
        wb = self.weight[lo:hi]
        if not self.upcast:
            return wb
        out = self.buf[:hi - lo]  # type: ignore[index]  # set whenever upcast
        out.copy_(wb)
        return out

    def logits(self, xs: Tensor, wb: Tensor, lo: int, hi: int) -> Tensor:
        """Z = xs W[lo:hi]ᵀ + b[lo:hi] in the working dtype, wb = self(lo, hi)."""
        z = _mm32(xs, wb.t())
        if self.bias is not None:
            z.add_(self.bias[lo:hi].to(z.dtype))
        return z


def add_at(g: Tensor, at: Tensor, inside: Tensor, c: Tensor) -> None:
    """g[r, at[r]] += c[r] for the rows r where ``inside`` (a target's column
    in this tile): indexed on the CPU, a scatter elsewhere (no host read)."""
    if g.is_cpu:
        rows = inside.nonzero().squeeze(1)
        g[rows, at[rows]] += c[rows]
    else:
        g.scatter_add_(1, at.clamp(0, g.shape[1] - 1).unsqueeze(1), torch.where(inside, c, 0.0).unsqueeze(1))


def rows_of(x: Tensor) -> Tensor:
    """X as the products take it: float32 on the CPU (upcast once), as is on CUDA."""
    return x if _tensor_cores(x) else x.to(_acc(x))


def row_stats(x, weight, bias, target, fn, tiles, chunk: int, block: int):
    """The forward: ``(losses (M,) in the working dtype, stats (M, k), live (M, ⌈V/B⌉) or
    None, extra)``, chunk by chunk of ``chunk`` rows, with ``fn`` the loss
    per row (as :func:`softk._ops.fused_linear.chunked_pass` takes it) and
    ``tiles`` its :class:`~softk.losses._tiles.TileLoss`.  ``live[i, b]``:
    row i's support or target has a class in block b (sparse losses)."""
    m, v = x.shape[0], weight.shape[0]
    xr = rows_of(x)
    nb = -(-v // block)
    acc = _acc(x)
    losses = torch.empty(m, dtype=acc, device=x.device)
    stats = live = extra = None
    blocks = WeightBlocks(weight, bias, x, block)
    for s in range(0, m, chunk):
        e = min(s + chunk, m)
        t = target[s:e]
        z = torch.empty(e - s, v, dtype=acc, device=x.device)
        for lo in range(0, v, block):
            hi = min(lo + block, v)
            z[:, lo:hi] = blocks.logits(xr[s:e], blocks(lo, hi), lo, hi)
        with torch.no_grad():
            out = fn(z, t)
            if isinstance(out, tuple):
                out, ex = out
                if extra is None:
                    extra = torch.empty(m, ex.shape[-1], dtype=acc, device=x.device)
                extra[s:e] = ex
            losses[s:e] = out
            st, sup = tiles.stats(z, t)
        if stats is None:
            stats = torch.empty(m, st.shape[1], dtype=acc, device=x.device)
        stats[s:e] = st
        if sup is not None and x.is_cpu:  # only the CPU's walk reads it (elsewhere: a host sync per chunk)
            if live is None:
                live = torch.empty(m, nb, dtype=torch.bool, device=x.device)
            live[s:e] = live_blocks(sup, t, block, nb)
        del z, sup
    return losses, stats, live, extra


def live_blocks(sup: Tensor, t: Tensor, block: int, nb: int) -> Tensor:
    """(C, nb): the blocks of ``block`` classes that hold a class of the row's
    support ``sup`` (C, V) or its target (class indices, or a dense target's
    positive entries)."""
    c, v = sup.shape
    if t.is_floating_point():
        sup = sup | (t > 0)
    pad = nb * block - v
    if pad:
        sup = torch.cat([sup, sup.new_zeros(c, pad)], 1)
    live = sup.view(c, nb, block).any(2)
    if not t.is_floating_point():
        inside = (t >= 0) & (t < v)
        live[inside.nonzero().squeeze(1), t[inside] // block] = True
    return live


def walk(x, weight, bias, target, tiles, stats, live, row_weight, grads, plan_: tuple[int, int, int]):
    """The backward: ``(grad_x, grad_w, grad_b)`` of Σ_i w_i L_i (``row_weight``
    w (M,), the working dtype) for the entries of ``grads`` = (want_x, want_w, want_b),
    None for the others, walking the vocabulary in blocks (``plan_`` = (B, R),
    :func:`plan`; its third entry is the forward's).  grad_w is written in W's dtype, one block at a time;
    grad_x is accumulated in the working dtype (float32, or float64 for
    float64 inputs) and rounded once; grad_b is in the working dtype."""
    m, h = x.shape
    v = weight.shape[0]
    block, tile_rows, _ = plan_
    want_x, want_w, want_b = grads
    xr = rows_of(x)
    acc = _acc(x)
    gx = torch.zeros(m, h, dtype=acc, device=x.device) if want_x else None
    gw = torch.empty_like(weight) if want_w else None
    gb = torch.zeros(v, dtype=acc, device=x.device) if want_b else None
    # the live rows of each block are read on the CPU only (elsewhere a host sync per block)
    use_live = live is not None and x.is_cpu
    blocks = WeightBlocks(weight, bias, x, block)
    for bi, lo in enumerate(range(0, v, block)):
        hi = min(lo + block, v)
        wb_r = blocks(lo, hi)
        dwb = torch.zeros(hi - lo, h, dtype=acc, device=x.device) if want_w else None
        sel_all = live[:, bi].nonzero().squeeze(1) if use_live else None
        count = m if sel_all is None else sel_all.numel()
        for r0 in range(0, count, tile_rows):
            r1 = min(r0 + tile_rows, count)
            sel = slice(r0, r1) if sel_all is None else sel_all[r0:r1]
            xs = xr[sel]
            t = target[sel] if not target.is_floating_point() else target[sel][:, lo:hi]
            g = tiles.grad(blocks.logits(xs, wb_r, lo, hi), lo, stats[sel], t, row_weight[sel])
            if gx is not None:
                if _tensor_cores(x):
                    prod = _mm32(g.to(x.dtype), wb_r)
                elif sel_all is None:
                    gx[sel].addmm_(g, wb_r)  # in place: no (R, H) temporary
                    prod = None
                else:
                    prod = torch.mm(g, wb_r)
                if prod is not None and sel_all is None:
                    gx[sel] += prod
                elif prod is not None:
                    gx.index_add_(0, sel, prod)  # type: ignore[arg-type]  # sel is a tensor here
            if dwb is not None:
                if _tensor_cores(x):
                    dwb += _mm32(g.t().to(x.dtype), xs)
                else:
                    dwb.addmm_(g.t(), xs)
            if gb is not None:
                gb[lo:hi] += g.sum(0)
            del g
        if gw is not None and dwb is not None:
            gw[lo:hi] = dwb
    return (None if gx is None else gx.to(x.dtype)), gw, gb
