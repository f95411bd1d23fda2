r"""The autograd rules of :mod:`softk.distributed`: a vocabulary split between ranks.

* :class:`VocabParallelMap`: this rank's slice of p = map(z); its backward
  needs the two sums Σd and Σd⊙g over the whole row, one all-reduce;
* :class:`RowLoss`: a per-row loss whose local gradient (p − y)/τ was
  computed in the forward; its backward runs no collective;
* :class:`VocabParallelLogSoftmax`: this rank's slice of log softmax(z);
  its backward needs Σg over the whole row, one all-reduce;
* :class:`ReplicatedSum`: a per-row sum over the ranks' slices whose result
  every rank holds and uses alike (so its backward is the identity, with no
  collective: summing the gradients of a replicated value would count it
  once per rank);
* :class:`ChunkedLinearLoss`: the fused linear layer + loss over chunks of
  rows, whose gradients (∇X all-reduced over the group) are computed in the
  forward, on the live columns of each chunk's local gradient for a sparse
  loss on the CPU (as the single-process fused loss does); its backward only
  scales them.

The collectives that find λ and the loss of a chunk live in
:mod:`softk.distributed`; they come in as functions (``solve``, ``loss_rows``),
so this package needs only ``torch.distributed`` itself.

The collectives of :mod:`softk.distributed`'s maps and losses go through
:func:`all_reduce` and :func:`all_gather`: c10d's in-place collectives when
eager, PyTorch's functional collectives while ``torch.compile`` traces,
which Dynamo and AOT autograd put in the graph as ops (also inside the
rules' forward and backward), so a compiled loss runs the same collectives,
in the same order.  (The all-reduces of the maps' and losses' argument
checks run eagerly, outside the graph.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._validate import mean_of, mean_scale
from ..threshold.rows import compute_dtype
from . import fused_linear

_OPS = {"sum": "SUM", "max": "MAX"}


def all_reduce(t, op: str, group):
    """``t`` reduced (``op`` "sum" or "max") over the ranks of ``group`` (None: the world).

    Eager: c10d's in-place all-reduce, which returns ``t`` itself; while
    ``torch.compile`` traces: a functional all-reduce, which returns a new
    tensor (so callers always use the result)."""
    if torch.compiler.is_compiling():
        from torch.distributed import _functional_collectives as funcol

        return funcol.all_reduce(t, op, group if group is not None else dist.group.WORLD)  # type: ignore[arg-type]  # WORLD: set once initialised
    dist.all_reduce(t, op=getattr(dist.ReduceOp, _OPS[op]), group=group)
    return t


def all_gather(t, group, world: int):
    """The ``world`` tensors ``t`` of the ranks of ``group``, in rank order (a list);
    c10d's all-gather when eager, a functional one while ``torch.compile`` traces."""
    t = t.contiguous()
    if torch.compiler.is_compiling():
        from torch.distributed import _functional_collectives as funcol

        return list(funcol.all_gather_tensor(t, 0, group if group is not None else dist.group.WORLD).chunk(world))  # type: ignore[arg-type]
    blocks = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(blocks, t, group=group)
    return blocks


def _solved(x, solve, tau):
    """``solve(x/τ)`` with x in the compute dtype (half precision: float32)."""
    z = x.to(compute_dtype(x.dtype))
    return solve(z / tau if tau != 1.0 else z)


class VocabParallelMap(torch.autograd.Function):
    """This rank's columns of p = map(x/τ) in x's dtype; ``solve(z)`` gives
    them in the compute dtype (the forward's collectives)."""

    @staticmethod
    def forward(ctx, x, solve, family, tau, group):
        p = _solved(x, solve, tau)
        ctx.family, ctx.tau, ctx.group = family, tau, group
        out = p.to(x.dtype)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, g):
        (out,) = ctx.saved_tensors
        ct = compute_dtype(out.dtype)
        d = ctx.family.d_from_p(out.to(ct))
        g = g.to(ct)
        # The Jacobian-vector product d⊙(g − Σd⊙g / Σd)/τ needs the two sums
        # over the whole row: one all-reduce.
        sums = all_reduce(torch.cat([d.sum(-1, keepdim=True), (d * g).sum(-1, keepdim=True)], -1), "sum", ctx.group)
        sd, sdg = sums[:, :1], sums[:, 1:]
        coef = torch.where(sd > 0, sdg / torch.where(sd > 0, sd, 1.0), 0.0)
        grad = (g - coef) * d / ctx.tau
        # A NaN row (NaN or +inf scores) has a NaN gradient, as on one device.
        grad = torch.where(torch.isnan(out).any(-1, keepdim=True), float("nan"), grad)
        return grad.to(out.dtype), None, None, None, None


class VocabParallelLogSoftmax(torch.autograd.Function):
    """This rank's columns of log softmax(x/τ) in x's dtype; ``solve(z)`` gives
    them in the compute dtype (the forward's collectives)."""

    @staticmethod
    def forward(ctx, x, solve, tau, group):
        logp = _solved(x, solve, tau)
        ctx.tau, ctx.group, ctx.x_dtype = tau, group, x.dtype
        ctx.save_for_backward(logp)
        return logp.to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        (logp,) = ctx.saved_tensors
        g = g.to(logp.dtype)
        # d log p_i / d z_j = δ_ij − p_j: the gradient g − p Σg needs Σg over the whole row.
        # A masked entry (log p = −inf) has p = 0 and its g may be anything: leave it out of Σg.
        g = torch.where(logp > float("-inf"), g, 0.0)
        sg = all_reduce(g.sum(-1, keepdim=True), "sum", ctx.group)
        grad = (g - torch.exp(logp) * sg) / ctx.tau
        return grad.to(ctx.x_dtype), None, None, None


class ReplicatedSum(torch.autograd.Function):
    """Σ over the ranks of ``x`` (an all-reduce SUM); every rank then holds the
    same value and uses it alike, so each rank's ∂/∂x is the incoming gradient."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), "sum", group)

    @staticmethod
    def backward(ctx, g):
        return g, None


class RowLoss(torch.autograd.Function):
    """Per-row loss whose gradient (M, V_r) was computed in the forward."""

    @staticmethod
    def forward(ctx, x, rows, grad):
        ctx.save_for_backward(grad)
        ctx.x_dtype = x.dtype
        return rows.clone()

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return (grad * g.unsqueeze(-1).to(grad.dtype)).to(ctx.x_dtype), None, None


class ChunkedLinearLoss(torch.autograd.Function):
    """The loss of x Wᵀ + b (W this rank's rows), a chunk of rows at a time:
    ``loss_rows(logits, rows)`` gives the per-row loss of one chunk's
    logits (``rows`` the chunk's slice); ``want`` says which of x, W, b
    get a gradient; ``mean`` divides by ``n_kept``.

    Where ``loss_rows.sparse_grad`` is true (G = (p − y)/τ is exactly 0
    outside the union of the chunk's supports and targets), each rank runs
    G_r W_r, G_rᵀ X_c and Σ G_r on the live columns of its own G_r
    (:func:`softk._ops.fused_linear.live_columns`, the share rule counted in
    its slice's V_r) and the dense products above that share; under the
    "triton" backend on CUDA, on the live vocabulary tiles of G_r
    (:func:`softk._ops.fused_linear.sparse_products`, as the single-device
    pass).  The choice is local to each rank and chunk: it adds no
    collective."""

    @staticmethod
    def forward(ctx, x, w, b, loss_rows, chunk, n_kept, mean, want, group):
        m = x.shape[0]
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        total = torch.zeros((), dtype=acc, device=x.device)
        gx = torch.zeros(x.shape, dtype=acc, device=x.device) if want[0] else None
        gw = torch.zeros(w.shape, dtype=acc, device=x.device) if want[1] else None
        gb = torch.zeros(w.shape[0], dtype=acc, device=x.device) if want[2] else None
        sparse = bool(getattr(loss_rows, "sparse_grad", False))
        tiles = fused_linear.live_tiles_kernel(x) if sparse and acc == torch.float32 else None
        for s in range(0, m, chunk):
            e = min(s + chunk, m)
            xc = x[s:e]
            with torch.no_grad():
                logits = xc @ w.t() if b is None else torch.addmm(b, xc, w.t())
            with torch.enable_grad():
                logits.requires_grad_(True)
                rows = loss_rows(logits, slice(s, e))
                (g,) = torch.autograd.grad(rows.sum(), logits)
            total += rows.detach().sum().to(acc)
            g = g.to(acc)
            # (through the module, so that tests may watch which products ran)
            fused_linear.products(g, w, xc, None if gx is None else gx[s:e], gw, gb, acc, False, sparse, tiles)
        if gx is not None:
            gx = all_reduce(gx, "sum", group)  # Σ_r G_r W_r
        ctx.save_for_backward(gx, gw, gb)
        ctx.n_kept, ctx.mean = n_kept, mean
        return (mean_of(total, n_kept) if mean else total).to(x.dtype)

    @staticmethod
    def backward(ctx, go):
        gx, gw, gb = ctx.saved_tensors
        # the forward's divisor (a row count or Σ w[y], below 1 as well), 0 when it is 0
        s = mean_scale(go, ctx.n_kept) if ctx.mean else go
        f = lambda g: None if g is None else (g * s.to(g.dtype)).to(go.dtype)  # noqa: E731
        return f(gx), f(gw), f(gb), None, None, None, None, None, None
