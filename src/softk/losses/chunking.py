r"""The per-chunk pieces of :func:`softk.losses.fused_linear_loss`.

* :func:`auto_chunk_size`: how many rows of logits to hold at once;
* :func:`chunk_loss_fn`: the public loss named by ``loss``, per row.

The pass over the chunks and its autograd rule are
:mod:`softk._ops.fused_linear`'s.  The gradient of each chunk comes from the
public loss itself (``torch.autograd.grad`` on the chunk's logits), so the
chunk runs on whatever backend that loss dispatches to (compiled CPU
kernels, Triton on CUDA, or the PyTorch reference); for the Fenchel–Young
losses it is (p − y)/τ.
"""

from __future__ import annotations

import torch

from .._maps.simplex import entmax, entmax15, softmax, sparsemax
from .._maps.soft_topk import soft_topk
from .._validate import LOSSES
from ..threshold.families import ENTMAX15, SOFTMAX, SPARSEMAX, entmax_by_alpha
from ._knobs import NO_KNOBS, Knobs
from ._ts2 import ts2_in_place, ts2_loss
from ._fy_live import live_in_place
from ._one_pass import exp_
from ._cross_entropy import cross_entropy
from .simplex_losses import entmax15_loss, entmax_loss, softmax_loss, sparsemax_loss
from .targets import index_target
from .topk_loss import soft_topk_loss
from ._topk_softmax_ce import topk_softmax_cross_entropy

# Below this many logits per chunk (4 Mi elements, 16 MiB in float32) the
# per-chunk matmuls get so small that their overhead dominates; above it the
# chunk is still a small fraction of the N×V logits of any large vocabulary.
MIN_CHUNK_ELEMENTS = 1 << 22
# On a GPU the floor is 128 Mi logits (256 MiB in bfloat16).  Every chunk
# adds its V×H weight-gradient product into the float32 accumulator, a pass
# over V×H that costs as much as the chunk's matmuls when the chunk has a few
# hundred rows; with this floor a chunk has about a thousand rows or more at
# the vocabularies of today's language models, and is still a small part of
# the N×V logits.
MIN_CHUNK_ELEMENTS_GPU = 1 << 27


def auto_chunk_size(rows: int, hidden: int, vocab: int, device_type: str = "cpu") -> int:
    """Rows per chunk: the largest power of two C with C·V ≤ max(N·H, floor), clamped to [1, N].

    The budget is Liger-Kernel's (its fused linear cross-entropy takes the
    next power of two ≥ N / ⌈V/H⌉): one chunk of logits costs about as much
    memory as the input X itself.  Here the power of two is rounded down, so
    the chunk stays within the budget, and the budget has a floor so that
    small hidden sizes do not give tiny matmuls: 4 Mi logits on the CPU,
    128 Mi on any other device (``device_type`` other than "cpu").

    >>> auto_chunk_size(4096, 256, 65536)   # max(2^20, 2^22) / 2^16
    64
    >>> auto_chunk_size(8192, 4096, 131072)  # Liger's rule gives the same 256
    256
    >>> auto_chunk_size(8192, 768, 50257, "cuda")  # GPT-2 on a GPU: 2^27 / 50257 → 2048
    2048
    """
    budget = max(rows * hidden, MIN_CHUNK_ELEMENTS if device_type == "cpu" else MIN_CHUNK_ELEMENTS_GPU)
    c = max(1, budget // max(vocab, 1))
    c = 1 << (c.bit_length() - 1)  # largest power of two <= c
    return max(1, min(c, rows))


# The per-row loss of each name of softk._validate.LOSSES, as
# ``make(alpha, k, method, tau, ignore_index, extra) -> fn(logits (C, V), target) -> (C,)``,
# ``extra`` the options of one loss: cross-entropy's class weight and label
# smoothing (torch's own formula), TS²'s suppression and adaptive.
_CHUNK_LOSSES = {
    "cross_entropy": lambda a, k, m, tau, ii, x: lambda z, t: cross_entropy(
        z, t, weight=x.get("weight"), ignore_index=ii, reduction="none", label_smoothing=x.get("label_smoothing", 0.0),
        tau=tau),
    "softmax": lambda a, k, m, tau, ii, x: lambda z, t: softmax_loss(z, t, ii, "none", tau),
    "sparsemax": lambda a, k, m, tau, ii, x: lambda z, t: sparsemax_loss(z, t, ii, "none", tau),
    "entmax15": lambda a, k, m, tau, ii, x: lambda z, t: entmax15_loss(z, t, ii, "none", tau),
    "entmax": lambda a, k, m, tau, ii, x: lambda z, t: entmax_loss(z, t, a, ii, "none", tau),
    "soft_topk": lambda a, k, m, tau, ii, x: lambda z, t: soft_topk_loss(z, t, k, m, tau, "none"),
    "topk_softmax_ce": lambda a, k, m, tau, ii, x: lambda z, t: topk_softmax_cross_entropy(z, t, k, ii, "none", tau),
    "ts2": lambda a, k, m, tau, ii, x: lambda z, t: ts2_loss(
        z, t, suppression=x["suppression"], tau=tau, adaptive=x["adaptive"], ignore_index=ii, reduction="none"),
}
assert set(_CHUNK_LOSSES) == set(LOSSES), "every loss name has a chunk loss"

# The losses whose gradient p − y is exactly 0 outside the union of the
# supports and targets (soft top-k with method "sparse" only): the fused
# pass then runs its backward products on those columns (fn.sparse_grad).
_SPARSE_GRAD = {"sparsemax", "entmax15", "entmax", "topk_softmax_ce", "soft_topk"}


def has_sparse_grad(loss: str, method: str = "sparse", knobs: Knobs = NO_KNOBS) -> bool:
    """Whether the gradient of ``loss`` (with ``knobs``) is exactly 0 outside
    the union of the rows' supports and targets, so that the fused losses'
    backward may run on those columns only (:func:`softk._ops.fused_linear.live_columns`).
    Label smoothing and the z-loss give every class a gradient; the softcap
    and class weights keep zeros zero."""
    return (loss in _SPARSE_GRAD and (loss != "soft_topk" or method == "sparse")
            and not knobs.label_smoothing and not knobs.z_loss)


def _ce_in_place(ignore_index: int, tau: float):
    """Cross-entropy's rows and its gradient in one pass over the logits:
    ``f(z, t, w) -> rows`` overwrites z (C, V), float32/float64, with
    G = w·(softmax(z/τ) − e_t)/τ (0 on ignored rows), the gradient of Σ w_i L_i,
    where L_i = logsumexp(z_i/τ) − z_{i,t_i}/τ: no autograd graph and no
    buffer beside the logits."""

    def f(z, t, w):
        idx, keep = index_target(z, t, ignore_index)  # the losses' own range check and message
        idx = idx.unsqueeze(1)
        if tau != 1.0:
            z.mul_(1.0 / tau)
        torch.log_softmax(z, 1, out=z)  # one fused kernel, in place (logsumexp is several)
        rows = torch.where(keep, -z.gather(1, idx).squeeze(1), 0.0)
        exp_(z)  # (underflowing terms exact zeros first, on the CPU)
        z.scatter_add_(1, idx, torch.full_like(rows, -1.0).unsqueeze(1))
        scale = (w.to(z.dtype) if w is not None else torch.ones_like(rows)) / tau
        z.mul_(torch.where(keep, scale, 0.0).unsqueeze(1))
        if not z.is_cpu or not bool(keep.all()):  # (no host read on a GPU)
            z.masked_fill_(~keep.unsqueeze(1), 0.0)  # a fully masked ignored row: NaN · 0 above
        return rows

    return f


# The Fenchel–Young family of each FY loss name (label smoothing's Ω(q)).
_FY_FAMILY = {"softmax": lambda a: SOFTMAX, "sparsemax": lambda a: SPARSEMAX, "entmax15": lambda a: ENTMAX15,
              "entmax": entmax_by_alpha}


def chunk_loss_fn(loss: str, *, alpha, k: int, method: str, tau: float, ignore_index: int,
                  knobs: Knobs = NO_KNOBS, suppression: float = 1.0, adaptive: bool = False,
                  z_scale=1.0, stats: bool = False):
    """The public loss ``loss`` (a name of :data:`softk._validate.LOSSES`, checked)
    as ``fn(logits (C, V), target) -> (C,)`` (reduction "none"), with the
    ``knobs`` (checked by :func:`softk.losses._knobs.check_knobs`) applied:

    * softcap c: the loss (and everything below) sees c·tanh(z/c);
    * label smoothing ε: cross-entropy takes torch's ``label_smoothing``; a
      Fenchel–Young loss with class indices adds L(q) − L(e_y) =
      ε(z_y − mean_j z_j)/τ + Ω(q) − ψ(1), q = (1−ε)e_y + ε/V, to its row
      (a dense target y becomes (1−ε)y + ε/V);
    * class weight w: cross-entropy takes torch's ``weight``; every other loss
      multiplies row i by w[y_i];
    * z-loss β: adds β·logsumexp(z)²·``z_scale`` to each kept row (z the
      capped logits, before τ); ``z_scale`` is Σw[y]/(kept rows) for a class-weighted
      "mean" (whose divisor is Σw[y]), so that the term is averaged over rows.

    With ``stats`` the function returns ``(rows, extra)``, extra (C, 3) detached:
    the row's support size (classes with p > 0), whether argmax z is the
    target, and its z-loss term β·lse² (0 at ignored rows).
    """
    extra = {"suppression": suppression, "adaptive": adaptive}
    if loss == "cross_entropy":
        extra.update(weight=knobs.class_weight, label_smoothing=knobs.label_smoothing)
    base = _CHUNK_LOSSES[loss](alpha, k, method, tau, ignore_index, extra)
    sparse = has_sparse_grad(loss, method, knobs)
    plain = knobs == NO_KNOBS and not stats
    if plain:
        base.sparse_grad = sparse
        # cross-entropy and TS² with class indices: the rows and G in one pass; sparsemax and
        # entmax15: the rows and G's live columns in one pass (chunked_pass, on the CPU)
        if loss in ("cross_entropy", "softmax"):
            base.in_place = _ce_in_place(ignore_index, tau)
        elif loss == "ts2":
            base.in_place = ts2_in_place(ignore_index, tau, suppression, adaptive)
        elif loss in ("sparsemax", "entmax15"):
            base.live_in_place = live_in_place(loss, ignore_index, tau)
        return base
    cap, eps, weight, beta = knobs
    fy_smooth = eps > 0 and loss in _FY_FAMILY
    family = _FY_FAMILY[loss](alpha) if fy_smooth else None
    row_weight = weight is not None and loss != "cross_entropy"

    def fn(z, t):
        if cap is not None:
            z = cap * torch.tanh(z / cap)
        dense = t.is_floating_point()
        if fy_smooth and dense:
            t = (1 - eps) * t + eps / z.shape[-1]
        rows = base(z, t)
        if dense:
            keep, idx = None, None
        else:
            keep = t != ignore_index
            idx = torch.where(keep, t, 0)
        zc = z if z.dtype in (torch.float32, torch.float64) else z.float()
        if fy_smooth and not dense:
            v = zc.shape[-1]
            # Ω(q) − ψ(1) as a tensor (no host read: torch.compile traces it)
            psi = family.psi(zc.new_tensor([1 - eps + eps / v, eps / v, 1.0]))
            const = psi[0] + (v - 1) * psi[1] - psi[2]
            lin = zc.gather(-1, idx.unsqueeze(-1)).squeeze(-1) - zc.mean(-1)
            rows = rows + torch.where(keep, eps * lin / tau + const, 0.0).to(rows.dtype)
        if row_weight:
            rows = rows * weight.to(rows.dtype)[idx]
        zterm = None
        if beta or stats:
            lse = torch.logsumexp(zc, -1)
            zterm = beta * lse * lse
            if keep is not None:
                zterm = torch.where(keep, zterm, 0.0)
            if beta:
                rows = rows + (zterm * z_scale).to(rows.dtype)
        if not stats:
            return rows
        with torch.no_grad():
            zd = zc.detach()
            support = _support(loss, zd, alpha, k, method, tau)
            guess = zd.argmax(-1)
            correct = (guess == (t.argmax(-1) if dense else idx)).to(zd.dtype)
            if keep is not None:
                support, correct = torch.where(keep, support, 0.0), torch.where(keep, correct, 0.0)
            # in float32 at least: a count of classes is not exact in a half dtype
            extra_rows = torch.stack([support, correct, zterm.detach().to(zd.dtype)], -1)
        return rows, extra_rows

    fn.sparse_grad = sparse
    return fn


def _support(loss, z, alpha, k, method, tau):
    """The number of classes with p > 0 in each row of z (C, V), p the loss's map at z/τ."""
    if loss == "topk_softmax_ce":
        return torch.full(z.shape[:-1], float(min(k, z.shape[-1])), dtype=z.dtype, device=z.device)
    if loss in ("cross_entropy", "softmax"):
        p = softmax(z, tau=tau)
    elif loss in ("sparsemax", "ts2"):
        p = sparsemax(z, tau=tau)
    elif loss == "entmax15":
        p = entmax15(z, tau=tau)
    elif loss == "entmax":
        p = entmax(z, alpha, tau=tau)
    else:
        p = soft_topk(z, k, tau=tau, method=method)
    return (p > 0).sum(-1).to(z.dtype)
