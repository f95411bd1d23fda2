r"""The fused linear loss's pass over chunks of rows and its autograd rule.

:func:`chunked_pass` forms logits = X_c Wᵀ + b one chunk of rows at a time,
the per-row loss, and (optionally) the gradients G = ∂(Σ_i w_i L_i)/∂logits
pushed straight into grad_X = G W, grad_W += Gᵀ X_c, grad_b += Σ_rows G, so no
more than one chunk's (rows × V) logits ever exist.  :class:`FusedLinearLoss`
is the autograd rule of :func:`softk.losses.fused_linear_loss` around it;
:func:`checkpointed_pass` is the same pass for ``torch.compile`` (which does
not trace ``torch.autograd.grad`` inside an autograd rule): each chunk an
activation checkpoint.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .._backends import dispatch
from . import fused_walk
from .._backends.kernels import Kernel
from .._validate import mean_of, mean_scale


# The gradient's live columns (classes), as a share of V, up to which the
# backward products run on those columns only (``fn.sparse_grad``), per
# device type: on the CPU at every share (BENCHMARKS.md: the columns were
# never slower), elsewhere never.  A GPU's form of the skip is the live
# vocabulary tiles (:func:`live_tiles_kernel`), which the "live_tiles"
# kernel serves under the explicit "triton" setting only; under "auto" a
# CUDA pass runs the dense products.
SPARSE_MAX_SHARE = {"cpu": 1.0}


def live_tiles_kernel(x: Tensor) -> Kernel | None:
    """The kernel that runs a pass's backward products on G's live
    vocabulary tiles for inputs ``x`` (op "live_tiles" of
    :mod:`softk._backends.kernels`), or None: read once per pass (a module
    function, so that tests can force it on CPU tensors under Triton's
    interpreter)."""
    return dispatch.pick("live_tiles", x)


def chunked_pass(x, weight, bias, target, fn, chunk: int, row_weight, grads):
    """One pass over the rows of ``x`` (M, H) in chunks of ``chunk`` rows.

    Returns ``(loss (M,), grad_x, grad_w, grad_b, extra)`` with the per-row losses in
    float32 (float64 for float64 input) and the gradients of Σ_i w_i L_i
    (``row_weight`` w (M,), or all ones when None) for the entries of
    ``grads = (want_x, want_w, want_b)``, None for the others.  Weight and bias
    gradients are accumulated in float32 for half inputs.  On a GPU each
    chunk's weight-gradient product Gᵀ X runs in the inputs' half precision
    (tensor cores, float32 accumulation inside the product, rounded once to
    the inputs' dtype before it is added); on the CPU it runs in float32.
    ``fn`` may return ``(rows, extra)``, extra (C, k) per-row numbers that
    are gathered into ``extra`` (M, k) (None when ``fn`` returns rows only).

    Where ``fn.sparse_grad`` is true (a sparse loss: G is exactly 0 outside
    the union of the chunk's supports and targets) and that union holds at
    most the device's :data:`SPARSE_MAX_SHARE` of the classes, G W, Gᵀ X and
    Σ G run on those columns of G and rows of W only: the same sums without
    their zero terms.  Under the "triton" backend on CUDA
    (:func:`live_tiles_kernel`) they run instead on the live vocabulary tiles
    of G (tiles of classes where G is not all zero), the same exact skip in
    blocks that a GPU's matrix units take.  Where the live columns are always
    taken (the CPU) and ``fn.live_in_place`` is set (sparsemax, entmax15:
    :mod:`softk.losses._fy_live`), it gives the rows and G on its live
    columns from the support directly, and G (C, V) is never formed.
    """
    m = x.shape[0]
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    losses = torch.empty(m, dtype=acc, device=x.device)
    want_x, want_w, want_b = grads
    any_grad = want_x or want_w or want_b
    gx = torch.empty_like(x) if want_x else None
    gw = torch.zeros(weight.shape, dtype=acc, device=x.device) if want_w else None
    gb = torch.zeros(weight.shape[0], dtype=acc, device=x.device) if want_b else None
    wt = weight.t()
    half_product = acc == torch.float32 and x.dtype != torch.float32 and x.device.type != "cpu"
    extra = None
    sparse = bool(getattr(fn, "sparse_grad", False))
    # the tile kernels accumulate in float32: float64 keeps the torch products
    tiles = live_tiles_kernel(x) if sparse and any_grad and acc == torch.float32 else None
    # where the live columns are always taken (the CPU), a loss that yields them from its support
    live_in_place = getattr(fn, "live_in_place", None) if SPARSE_MAX_SHARE.get(x.device.type, 0.0) >= 1 else None
    for s in range(0, m, chunk):
        e = min(s + chunk, m)
        xc = x[s:e]
        with torch.no_grad():
            logits = xc @ wt if bias is None else torch.addmm(bias, xc, wt)
        in_place = getattr(fn, "in_place", None)
        one_pass = any_grad and logits.dtype in (torch.float32, torch.float64) and not target.is_floating_point()
        if one_pass and live_in_place is not None:
            # the loss's rows and G on its live columns straight from the support (no G of C×V)
            lrow, gs, cols = live_in_place(logits, target[s:e], None if row_weight is None else row_weight[s:e])
            losses[s:e] = lrow
            del logits
            live_products(gs, cols, weight, xc, None if gx is None else gx[s:e], gw, gb, acc, half_product)
            continue
        if one_pass and in_place is not None:
            # the loss's own one-pass form: the logits become G
            losses[s:e] = in_place(logits, target[s:e], None if row_weight is None else row_weight[s:e])
            g = logits
        else:
            with torch.enable_grad():
                logits.requires_grad_(any_grad)
                lrow = fn(logits, target[s:e])
                if isinstance(lrow, tuple):
                    lrow, ex = lrow
                    if extra is None:
                        extra = torch.empty(m, ex.shape[-1], dtype=acc, device=x.device)
                    extra[s:e] = ex
                if any_grad:
                    w = torch.ones_like(lrow) if row_weight is None else row_weight[s:e].to(lrow.dtype)
                    (g,) = torch.autograd.grad(lrow, logits, grad_outputs=w)
            losses[s:e] = lrow.detach()
            del lrow
        del logits
        if not any_grad:
            continue
        products(g, weight, xc, None if gx is None else gx[s:e], gw, gb, acc, half_product, sparse, tiles)
        del g
    return losses, gx, gw, gb, extra


def products(g, weight, xc, gx, gw, gb, acc, half_product, sparse: bool, tiles) -> None:
    """G W into ``gx``, Gᵀ X into ``gw`` and Σ G into ``gb`` (each skipped when
    None) for a chunk's gradient G (C, V): on its live tiles or columns when
    ``sparse`` (:func:`sparse_products`), else the dense products.  ``gw`` and
    ``gb`` are accumulators (``acc``); with ``half_product`` Gᵀ X runs in X's
    half precision.  Shared by :func:`chunked_pass` and the vocab-parallel
    loss (:class:`softk._ops.distributed.ChunkedLinearLoss`)."""
    if sparse and sparse_products(g, weight, xc, gx, gw, gb, acc, half_product, tiles):
        return
    if gx is not None:
        torch.mm(g, weight.to(g.dtype), out=gx)
    if gw is not None:
        if half_product:
            gw += torch.mm(g.t().to(xc.dtype), xc)
        else:
            gw.addmm_(g.t().to(acc), xc.to(acc))
    if gb is not None:
        gb += g.sum(0, dtype=acc)


def sparse_products(g, weight, xc, gx, gw, gb, acc, half_product, tiles) -> bool:
    """G W into ``gx``, Gᵀ X into ``gw`` and Σ G into ``gb`` (each skipped
    when None) for a sparse gradient G (C, V) on its live vocabulary tiles
    (with ``tiles`` the live-tile kernel, while they are at most its
    ``MAX_LIVE_SHARE`` of the tiles) or else its live columns (while they are
    at most :data:`SPARSE_MAX_SHARE`); False, having written nothing, when
    neither applies and the dense products are the caller's to run
    (:func:`products`)."""
    if tiles is not None and tiles.impl.products(g, weight, xc, gx, gw, gb):
        return True
    cols = live_columns(g)
    if cols is None:
        return False
    live_products(g[:, cols], cols, weight, xc, gx, gw, gb, acc, half_product)
    return True


def live_columns(g: Tensor):
    """The live columns of a chunk's gradient G (C, V): the classes where some
    row of G is not zero, as indices (K,), when they are at most the device's
    :data:`SPARSE_MAX_SHARE` of the V columns; None otherwise (then the dense
    products run).  For a sparse loss (G = p − y) they are the union of the
    rows' supports and targets.  V is the columns G has: on a rank of the
    vocab-parallel loss, its own slice of the vocabulary."""
    share = SPARSE_MAX_SHARE.get(g.device.type, 0.0)
    if share <= 0:
        return None
    live = (g != 0).any(0)
    if int(live.sum()) > share * live.numel():
        return None
    return live.nonzero().squeeze(1)


def live_products(gs, cols, weight, xc, gx, gw, gb, acc, half_product):
    """G W into ``gx``, Gᵀ X into ``gw`` and Σ G into ``gb`` (each skipped
    when None) from G's live columns ``gs`` = G[:, cols] and the rows ``cols``
    of W only: the dense products without their zero terms.  ``gw`` and
    ``gb`` are accumulators (``acc``); with ``half_product`` Gᵀ X runs in
    X's half precision."""
    if gx is not None:
        torch.mm(gs, weight.index_select(0, cols).to(gs.dtype), out=gx)
    if gw is not None:
        gw.index_add_(0, cols, torch.mm(gs.t().to(xc.dtype), xc).to(acc) if half_product
                      else torch.mm(gs.t().to(acc), xc.to(acc)))
    if gb is not None:
        gb.index_add_(0, cols, gs.sum(0, dtype=acc))


def checkpointed_pass(x, weight, bias, target, fn, chunk: int, recompute: bool = True):
    """The per-row losses of ``x`` (M, H) in chunks, for torch.compile: each
    chunk's logits and loss are one activation checkpoint, so autograd keeps
    only the chunk's inputs and recomputes its logits in the backward (one
    chunk at a time).  Returns ``(rows (M,), extra)`` as :func:`chunked_pass`
    does, differentiable for x, weight and bias.  ``recompute=False`` (the
    torch.func transforms, which take no checkpoint) keeps every chunk's
    logits for the backward instead."""
    rows, extras = [], []
    for s in range(0, x.shape[0], chunk):
        e = min(s + chunk, x.shape[0])
        if recompute:
            out = checkpoint(_chunk_rows, x[s:e], weight, bias, target[s:e], fn, use_reentrant=False)
        else:
            out = _chunk_rows(x[s:e], weight, bias, target[s:e], fn)
        if isinstance(out, tuple):
            out, ex = out
            extras.append(ex)
        rows.append(out)
    return torch.cat(rows), (torch.cat(extras) if extras else None)


def _chunk_rows(xc, weight, bias, target, fn):
    logits = xc @ weight.t() if bias is None else torch.addmm(bias, xc, weight.t())
    return fn(logits, target)


class FusedLinearLoss(torch.autograd.Function):
    """loss(x Wᵀ + b, target) over chunks of rows, the gradients written during the forward (reductions "mean" and "sum")
    or recomputed in the backward ("none"); with ``tiles`` (half-precision weights,
    :mod:`softk._ops.fused_walk`) the forward keeps the rows' numbers and the backward
    walks the vocabulary in blocks; see :func:`softk.losses.fused_linear_loss`."""

    @staticmethod
    def forward(ctx, x, weight, bias, target, fn, chunk, reduction, n_kept, want, stats=False, tiles=None):
        """Returns the reduced loss, and with ``stats`` also ``fn``'s per-row extra (M, k), not differentiable."""
        ctx.fn, ctx.chunk, ctx.reduction, ctx.n_kept, ctx.tiles = fn, chunk, reduction, n_kept, tiles
        ctx.want = want
        if tiles is not None:
            ctx.plan = fused_walk.plan(x.shape[0], x.shape[1], weight.shape[0], chunk)
            block, _, rows_at_once = ctx.plan
            losses, row_numbers, live, extra = fused_walk.row_stats(x, weight, bias, target, fn, tiles,
                                                                    rows_at_once, block)
            ctx.save_for_backward(x, weight, bias, target, row_numbers, live)
            out = losses.to(x.dtype) if reduction == "none" else _reduced(losses, reduction, n_kept, x.dtype)
        elif reduction == "none":
            losses, _, _, _, extra = chunked_pass(x, weight, bias, target, fn, chunk, None, (False, False, False))
            ctx.save_for_backward(x, weight, bias, target)
            out = losses.to(x.dtype)
        else:
            losses, gx, gw, gb, extra = chunked_pass(x, weight, bias, target, fn, chunk, None, want)
            ctx.save_for_backward(x, weight, bias, target, gx, gw, gb)
            out = _reduced(losses, reduction, n_kept, x.dtype)
        if not stats:
            return out
        ctx.mark_non_differentiable(extra)
        return out, extra

    @staticmethod
    def backward(ctx, go, *_):
        if torch.is_grad_enabled():
            # create_graph: the gradients of the chunks as plain autograd,
            # themselves differentiable (the ones formed in the forward are
            # numbers, with no graph to differentiate again)
            return _differentiable_grads(ctx, go)
        if ctx.tiles is not None:
            x, weight, bias, target, row_numbers, live = ctx.saved_tensors
            m = x.shape[0]
            if ctx.reduction == "none":
                row_weight = go.reshape(m).to(row_numbers.dtype)
            else:
                scale = go if ctx.reduction == "sum" else mean_scale(go, ctx.n_kept)
                row_weight = scale.to(row_numbers.dtype).expand(m)
            gx, gw, gb = fused_walk.walk(x, weight, bias, target, ctx.tiles, row_numbers, live, row_weight,
                                         ctx.want, ctx.plan)
        elif ctx.reduction == "none":
            x, weight, bias, target = ctx.saved_tensors
            _, gx, gw, gb, _ = chunked_pass(x, weight, bias, target, ctx.fn, ctx.chunk, go, ctx.want)
        else:
            gx, gw, gb = ctx.saved_tensors[4:]
            # the forward's divisor (a row count or Σ w[y], below 1 as well), 0 when it is 0
            scale = go if ctx.reduction == "sum" else mean_scale(go, ctx.n_kept)
            gx, gw, gb = (None if g is None else _scaled(g, scale, go.dtype) for g in (gx, gw, gb))
        cast = lambda g, ref: None if g is None else g.to(ref.dtype)  # noqa: E731
        return cast(gx, go), cast(gw, go), cast(gb, go), None, None, None, None, None, None, None, None


def _differentiable_grads(ctx, go):
    """FusedLinearLoss's gradients for a double backward: the loss again
    through :func:`checkpointed_pass` (logits kept), differentiated with
    ``create_graph``."""
    x, weight, bias, target = ctx.saved_tensors[:4]
    rows, _ = checkpointed_pass(x, weight, bias, target, ctx.fn, ctx.chunk, recompute=False)
    out = rows.to(x.dtype) if ctx.reduction == "none" else _reduced(rows, ctx.reduction, ctx.n_kept, x.dtype)
    wanted = [a for a, w in zip((x, weight, bias), ctx.want) if w]
    got = iter(torch.autograd.grad(out, wanted, go, create_graph=True, allow_unused=True, materialize_grads=True))
    gx, gw, gb = (next(got) if w else None for w in ctx.want)
    return gx, gw, gb, None, None, None, None, None, None, None, None


def _reduced(losses: Tensor, reduction: str, n_kept, dtype: torch.dtype) -> Tensor:
    """The rows' losses summed, or averaged over ``n_kept``, in ``dtype``."""
    total = losses.sum()
    return (mean_of(total, n_kept) if reduction == "mean" else total).to(dtype)


def _scaled(g: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """g · scale, rounded once to ``dtype``: the product is computed in g's
    (accumulation) precision and written straight into a ``dtype`` tensor, so
    a half-precision weight gradient needs no float32 temporary of its size
    (the float32 accumulator is the only one: V×H float32 at the peak, not 2×).
    Under ``create_graph`` with a ``scale`` that needs a gradient, the plain
    differentiable product."""
    if scale.requires_grad and torch.is_grad_enabled():
        return (g * scale.to(g.dtype)).to(dtype)
    out = torch.empty(g.shape, dtype=dtype, device=g.device)
    return torch.mul(g, scale.to(g.dtype), out=out)
