r"""The per-chunk pieces of :func:`softk.losses.fused_linear_loss`.

* :func:`auto_chunk_size`: how many rows of logits to hold at once;
* :func:`chunk_loss_fn`: the public loss named by ``loss``, per row;
* :func:`tile_loss`: the same loss's gradient one block of classes at a
  time, where the loss has that form (:mod:`softk.losses._tiles`).

The pass over the chunks and its autograd rule are
:mod:`softk._ops.fused_linear`'s.  The gradient of each chunk comes from the
public loss itself (``torch.autograd.grad`` on the chunk's logits), so the
chunk runs on whatever backend that loss dispatches to (compiled CPU
kernels, Triton on CUDA, or the PyTorch reference); for the Fenchel–Young
losses it is (p − y)/τ.
"""

from __future__ import annotations

import torch

from ._knobs import NO_KNOBS
from ._options import LossOptions
from ._tiles import TileLoss

# Below this many logits per chunk (4 Mi elements, 16 MiB in float32) the
# per-chunk matmuls get so small that their overhead dominates; above it the
# chunk is still a small fraction of the N×V logits of any large vocabulary.
MIN_CHUNK_ELEMENTS = 1 << 22
# On the CPU a chunk also has at least this many rows, up to an eighth of
# them: each chunk's Gᵀ X is added into the V×H float32 accumulator, a pass
# over V×H per chunk with a reduction over the chunk's rows, and with a few
# dozen rows that pass, not the flops, sets the time at small hidden sizes
# (BENCHMARKS.md, the fused cross-entropy against CCE's CPU path).
MIN_CHUNK_ROWS = 512
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
    128 Mi on any other device (``device_type`` other than "cpu").  On the
    CPU a chunk has at least :data:`MIN_CHUNK_ROWS` rows, or an eighth of
    them where that is fewer (a power of two).

    >>> auto_chunk_size(4096, 256, 65536)   # 2^22 / 2^16 = 64 logit rows; 512 rows
    512
    >>> auto_chunk_size(1024, 64, 32000)    # 2^22 / 32000 → 128, and N/8 = 128
    128
    >>> auto_chunk_size(8192, 4096, 131072)  # Liger's rule gives 256; the CPU's 512 rows
    512
    >>> auto_chunk_size(8192, 768, 50257, "cuda")  # GPT-2 on a GPU: 2^27 / 50257 → 2048
    2048
    """
    budget = max(rows * hidden, MIN_CHUNK_ELEMENTS if device_type == "cpu" else MIN_CHUNK_ELEMENTS_GPU)
    c = max(1, budget // max(vocab, 1))
    c = 1 << (c.bit_length() - 1)  # largest power of two <= c
    if device_type == "cpu":
        floor = min(MIN_CHUNK_ROWS, rows // 8)
        if floor > c:
            c = 1 << (floor.bit_length() - 1)
    return max(1, min(c, rows))


def chunk_loss_fn(o: LossOptions, *, z_scale=1.0, stats: bool = False):
    """The public loss of ``o`` (checked by :func:`softk.losses._options.loss_options`)
    as ``fn(logits (C, V), target) -> (C,)`` (reduction "none"), with its
    knobs applied:

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
    kind, tau, ignore_index = o.kind, o.tau, o.ignore_index
    base = kind.rows(o)
    sparse = o.sparse_grad
    if o.knobs == NO_KNOBS and not stats:
        base.sparse_grad = sparse  # type: ignore[attr-defined]  # what fused_linear reads off the function
        # cross-entropy and TS² with class indices: the rows and G in one pass; sparsemax and
        # entmax15: the rows and G's live columns in one pass (chunked_pass, on the CPU)
        if kind.in_place is not None:
            base.in_place = kind.in_place(o)  # type: ignore[attr-defined]
        if kind.live_in_place is not None:
            base.live_in_place = kind.live_in_place(o)  # type: ignore[attr-defined]
        return base
    cap, eps, weight, beta = o.knobs
    own = kind.torch_cross_entropy  # weighted and smoothed by torch's formula, in base itself
    fy_smooth = eps > 0 and not own
    family = kind.family(o) if fy_smooth else None
    row_weight = weight is not None and not own

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
            support = kind.support(o, zd).to(zd.dtype)
            guess = zd.argmax(-1)
            correct = (guess == (t.argmax(-1) if dense else idx)).to(zd.dtype)
            if keep is not None:
                support, correct = torch.where(keep, support, 0.0), torch.where(keep, correct, 0.0)
            # in float32 at least: a count of classes is not exact in a half dtype
            extra_rows = torch.stack([support, correct, zterm.detach().to(zd.dtype)], -1)
        return rows, extra_rows

    fn.sparse_grad = sparse  # type: ignore[attr-defined]
    return fn


def tile_loss(o: LossOptions, vocab: int, *, z_scale=1.0):
    """The gradient of ``o``'s loss (knobs included) over a vocabulary of
    ``vocab`` classes one block of classes at a time
    (:class:`~softk.losses._tiles.TileLoss`), or None where the loss's record
    has no such form for these options (:attr:`LossKind.tiles`)."""
    make = o.kind.tiles
    tmap = make(o) if make is not None else None
    return None if tmap is None else TileLoss(o, tmap, vocab, z_scale)
