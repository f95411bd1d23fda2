r"""Fused linear layer + loss: ``loss(input @ weight.T + bias, target)`` without the N×V logits.

An output layer over a vocabulary of V classes turns N hidden states (N, H)
into N×V logits, usually the largest tensor of a training step.  Here the
rows are processed in chunks (Liger-Kernel's FusedLinearCrossEntropy, Hsu et
al. 2024, arXiv:2410.10989, extended to every loss of :mod:`softk.losses`):

.. math:: Z_c = X_c W^\top + b,\qquad G_c = \partial L/\partial Z_c,\qquad
          \nabla_X = G W,\quad \nabla_W = \textstyle\sum_c G_c^\top X_c,\quad
          \nabla_b = \textstyle\sum_c \mathbf 1^\top G_c,

and each chunk's logits and G_c are freed before the next chunk.  For the
Fenchel–Young losses G = (p − y)/τ per row.

Reductions:

* "mean" and "sum": the gradients are computed during the forward (one matmul
  pass), kept, and scaled by the incoming gradient in the backward — the
  backward costs nothing, as in Liger.  "mean" divides by the number of rows
  whose target is not ``ignore_index`` (torch's rule), or with class weights
  by their sum Σ w[y] over those rows, in the value and the gradients alike;
  NaN when there is none (or the sum is 0), with zero gradients, eager and
  compiled.
* "none": the forward computes only the losses; the backward needs the
  per-row incoming gradient, so it recomputes every chunk's logits once more
  (two forward matmuls in all instead of one).

Half-precision weights (:data:`WALK_DTYPES`): the sum of Gᵀ X_c over chunks
would need a float32 accumulator of W's size.  For the losses whose record
has a tile form (:mod:`softk.losses._tiles`: cross-entropy, softmax,
sparsemax, entmax15, α-entmax away from α = 1, TS², every knob), the forward
keeps a few numbers per row and the backward walks the vocabulary in blocks,
writing each block of ∇W once in W's dtype (:mod:`softk._ops.fused_walk`),
for every reduction; the logits are formed in float32 on both passes.  They
take it whether or not the weight wants a gradient, so that evaluation and
a frozen head compute the loss training does.

The chunk loss is the public loss function itself, so each chunk runs on the
backend that loss takes for the chunk's logits: the fused loss kernels
(:mod:`softk._ops.fused_loss`: one pass per row writes the loss and its
gradient) on the CPU's compiled kernels and on Triton where softk has them
(see :mod:`softk._backends.registry`), torch's own cross-entropy for "cross_entropy",
the torch backend otherwise.
"""

from __future__ import annotations

import math

from typing import NamedTuple

import torch
from torch import Tensor

from .._dtensor import is_dtensor
from .._validate import check_input, mean_of
from .._ops import fused_linear as fused_linear_ops
from .._ops.fused_linear import FusedLinearLoss, checkpointed_pass
from ._options import loss_options
from ._registry import DEFAULT_LOSS
from .chunking import auto_chunk_size, chunk_loss_fn, tile_loss
from .targets import check_target_tensor


# The input dtypes the vocabulary walk serves (softk._ops.fused_walk): the
# half dtypes, whose row-chunk pass would need a float32 accumulator of W's
# size and would form the logits in half precision (so the walk serves them
# whether or not W wants a gradient).  For float32 and float64 the
# accumulator is the gradient itself.  (A module constant, so that tests can run the walk
# in float64 against the row-chunk pass.)
WALK_DTYPES = (torch.float16, torch.bfloat16)


def _check_linear(input, weight, bias):
    check_input(input, "input")
    if is_dtensor(weight) and not is_dtensor(input):
        raise ValueError(
            f"weight is a DTensor (placements {tuple(weight.placements)}) but input is a plain torch.Tensor: the "
            "output layer's weight is sharded (FSDP's fully_shard outside its unit's forward, or tensor "
            "parallelism); under FSDP compute the loss inside the head's unit with "
            "softk.integrations.fsdp.fsdp_fused_linear_loss(head, input, target, ...) (or apply_softk for a "
            "transformers model)")
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"weight must be a 2-D tensor (num_classes, in_features), got {shape}")
    if weight.shape[1] != input.shape[-1]:
        raise ValueError(
            f"weight has in_features={weight.shape[1]} but input's last dimension is {input.shape[-1]} "
            f"(input (..., H) needs weight (V, H))"
        )
    if weight.shape[0] == 0:
        raise ValueError("weight must have at least one class (row), got shape (0, H)")
    if weight.dtype != input.dtype or weight.device != input.device:
        raise TypeError(
            f"weight must have input's dtype and device ({input.dtype}, {input.device}), "
            f"got ({weight.dtype}, {weight.device})"
        )
    if bias is not None:
        if not isinstance(bias, Tensor) or bias.shape != (weight.shape[0],):
            shape = tuple(bias.shape) if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must be None or a tensor of shape ({weight.shape[0]},), got {shape}")
        if bias.dtype != input.dtype or bias.device != input.device:
            raise TypeError(f"bias must have input's dtype and device ({input.dtype}, {input.device}), got ({bias.dtype}, {bias.device})")


def fused_linear_loss(
    input: Tensor,
    weight: Tensor,
    target: Tensor,
    loss: str = DEFAULT_LOSS,
    bias=None,
    *,
    alpha=None,
    k: int = 1,
    method: str = "exp",
    tau: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    chunk_size=None,
    softcap=None,
    label_smoothing: float = 0.0,
    class_weight=None,
    z_loss: float = 0.0,
    suppression=None,
    adaptive: bool = False,
    return_stats: bool = False,
):
    r"""``loss(input @ weight.T + bias, target)`` computed a chunk of rows at a time.

    Args:
        input: hidden states (..., H), floating.
        weight: (V, H), the output layer's weight (input's dtype and device).
        target: class indices shaped ``input.shape[:-1]``, or a float tensor
            (..., V) of target distributions (multi-hot rows with k ones for
            "soft_topk"), exactly as the loss itself takes them.
        loss: "cross_entropy" (the default, as for torch's
            ``F.linear_cross_entropy`` and Liger-Kernel's fused linear
            cross-entropy), "softmax", "sparsemax", "entmax15", "entmax"
            (needs ``alpha``), "soft_topk" (``k``, ``method``) or
            "topk_softmax_ce" (``k``) or "ts2" (``suppression``, ``adaptive``);
            each is the function of the same name in :mod:`softk.losses` on
            the logits ("ts2": :func:`~softk.losses.ts2_loss`).
        bias: None or (V,).
        alpha, k, method, tau, ignore_index: passed to that loss.
        reduction: "mean" (over rows whose target is not ``ignore_index``),
            "sum" or "none" (shape ``input.shape[:-1]``).
        chunk_size: rows of logits held at once; None picks the largest power
            of two C with C·V ≤ max(N·H, 2²²) on the CPU, max(N·H, 2²⁷) on a GPU
            (:func:`~softk.losses.chunking.auto_chunk_size`): a chunk of logits then
            costs about what the input does; on the CPU at least 512 rows,
            or N/8 where that is fewer.
        softcap: None, or c > 0: the logits become c·tanh(z/c) before
            everything else (Gemma 2's final-logit soft-capping), its
            derivative in the gradients.
        label_smoothing: ε in [0, 1): the target becomes (1−ε)y + ε/V.  For
            "cross_entropy" the loss is ``F.cross_entropy(label_smoothing=ε)``,
            class weights included; for the Fenchel–Young losses ("softmax",
            "sparsemax", "entmax15", "entmax") it is the loss at the smoothed
            target.  Refused for the other losses.
        class_weight: None, or (V,) finite weights >= 0, ``F.cross_entropy``'s
            ``weight``: row i's loss is scaled by w[y_i] ("cross_entropy" with
            label smoothing: torch's formula, which weights the smoothing term
            by w_c), and "mean" divides by Σ w[y_i] over the kept rows, a
            sum that may be below 1 (value and gradients alike).  Where that
            sum is 0 (every kept target weighs 0) the mean is NaN with zero
            gradients, as with no kept row (torch's gradients are NaN there).
            Class indices only: refused with a dense target.
        z_loss: β >= 0: adds β·logsumexp(z)² per kept row (PaLM's z-loss,
            Liger's ``lse_square_scale``), z the logits after the softcap and
            before τ; not class-weighted, and "mean" averages it over the kept
            rows.
        suppression, adaptive: TS²'s penalty weight (None: 1.0) and its
            adaptive form, for loss="ts2" only.
        return_stats: also return a :class:`FusedLossStats` (computed chunk
            by chunk: one more solve of the map per chunk, no N×V tensor).

    Returns the loss, with gradients for ``input``, ``weight`` and ``bias``
    (not for ``target``); with ``return_stats``, ``(loss, stats)``.  Memory
    beyond the inputs: the gradients (N×H, V×H, V) and one chunk's logits and
    loss temporaries, never N×V; for half-precision weights no float32 buffer
    of W's size either (the module's docstring says how).  Equal to the unfused loss to rounding (the
    sum over chunks is ordered differently).  Under ``torch.compile`` each
    chunk is an activation checkpoint (the compiled backward recomputes its
    logits); under the ``torch.func`` transforms (``grad``, ``vmap``,
    ``jacrev``, ``jacfwd``) the chunks run as plain autograd and keep their
    logits.  The eager gradient is formed in the forward; a double backward
    (``create_graph=True``) recomputes the chunks as plain autograd, keeping
    their logits, and differentiates them.

    >>> import torch
    >>> torch.manual_seed(0) and None
    >>> x, w = torch.randn(6, 4, dtype=torch.float64), torch.randn(10, 4, dtype=torch.float64)
    >>> t = torch.tensor([0, 3, 9, 2, 2, 1])
    >>> from softk.losses import sparsemax_loss
    >>> fused = fused_linear_loss(x, w, t, "sparsemax", chunk_size=4)
    >>> bool(torch.isclose(fused, sparsemax_loss(x @ w.T, t)))
    True
    """
    _check_linear(input, weight, bias)
    o = loss_options(loss, alpha=alpha, k=k, method=method, tau=tau, ignore_index=ignore_index, reduction=reduction,
                     chunk_size=chunk_size, softcap=softcap, label_smoothing=label_smoothing,
                     class_weight=class_weight, z_loss=z_loss, suppression=suppression, adaptive=adaptive,
                     dense=target.is_floating_point() if isinstance(target, Tensor) else False,
                     vocab=weight.shape[0], device=weight.device, dtype=input.dtype)
    reduction, ignore_index, chunk = o.reduction, o.ignore_index, o.chunk_size
    check_target_tensor(target)
    lead = input.shape[:-1]
    x = input.reshape(-1, input.shape[-1])
    vocab = weight.shape[0]
    if target.is_floating_point():
        if target.shape != (*lead, vocab):
            raise ValueError(
                f"target of probabilities must have shape {(*lead, vocab)} (input's leading dims and V), "
                f"got {tuple(target.shape)}"
            )
        t = target.reshape(-1, vocab)
        n_kept: int | Tensor = x.shape[0]
    else:
        if target.shape != lead:
            raise ValueError(
                f"target of class indices must have shape {tuple(lead)} (input's shape without its last "
                f"dimension), got {tuple(target.shape)}"
            )
        t = target.reshape(-1)
        # a count on the device (no host sync): the mean's divisor
        n_kept = (t != ignore_index).sum()
    z_scale: float | Tensor
    n_rows, z_scale = n_kept, 1.0
    if o.class_weight is not None:
        # torch's weighted mean divides by Σ w[y] over the kept rows; the
        # z-loss is averaged over the rows themselves, so it is scaled by Σw/n.
        kept = t != ignore_index
        n_kept = torch.where(kept, o.class_weight[torch.where(kept, t, 0)], 0).sum()
        if reduction == "mean":
            # (n_rows is a count of rows: 0 only where Σw is 0 too, and no row has a z term)
            z_scale = n_kept / (n_rows.clamp(min=1) if isinstance(n_rows, torch.Tensor) else max(n_rows, 1))
    fn = chunk_loss_fn(o, z_scale=z_scale, stats=bool(return_stats))
    if chunk is None:
        chunk = auto_chunk_size(x.shape[0], x.shape[1], vocab, x.device.type)
    if x.shape[0] == 0:
        # No rows: the unfused loss of an empty batch (mean is NaN, as in torch).
        # (differentiable for every reduction, through the empty logits, in
        # the bias too)
        rows = fn(x @ weight.t() if bias is None else torch.addmm(bias, x, weight.t()), t)
        rows, extra = rows if return_stats else (rows, None)
        rows = rows.to(x.dtype)
        out = mean_of(rows.sum(), 0) if reduction == "mean" else (rows.sum() if reduction == "sum" else rows.reshape(lead))
        return (out, _stats(extra, n_rows, reduction, lead)) if return_stats else out
    grad_on = torch.is_grad_enabled()
    want = tuple(grad_on and a is not None and a.requires_grad for a in (input, weight, bias))
    rows_kept, extra = None, None
    # torch.compile and the torch.func transforms trace the loss as plain
    # autograd (neither runs an autograd.Function that forms its gradient in
    # the forward), and neither can read a value on the host
    compiling = torch.compiler.is_compiling()
    traced = compiling or torch._C._are_functorch_transforms_active()
    if x.is_cpu and not traced and not t.is_floating_point():
        # ignored rows add nothing: leave them out of the matmuls (on the CPU,
        # where reading the mask costs no device sync; a batch with no kept
        # row keeps its rows, for the mean's NaN with zero gradients)
        kept = t != ignore_index
        n = int(kept.sum())
        if 0 < n < kept.numel():
            rows_kept = kept.nonzero().squeeze(1)
            x, t = x.index_select(0, rows_kept), t.index_select(0, rows_kept)
    # half-precision weights: logits in float32 and per-row numbers in the
    # forward, the gradient one vocabulary block at a time in the backward (no
    # V×H float32 accumulator) — whether or not the weight wants a gradient,
    # so that evaluation (no grad, or a frozen weight) gives the loss training
    # does, never one of logits rounded to half precision (a NaN in float16
    # past 65504)
    # (a sparse loss under the explicit "triton" backend on CUDA keeps the
    # row-chunk pass, whose live-tile kernels skip its dead tiles there)
    tiles = None
    if x.dtype in WALK_DTYPES and not traced and not (
            o.sparse_grad and fused_linear_ops.live_tiles_kernel(x) is not None):
        tiles = tile_loss(o, vocab, z_scale=z_scale)
    if traced:
        # torch.compile does not trace torch.autograd.grad inside an autograd
        # rule, and the transforms need one with a setup_context: each chunk
        # is an activation checkpoint instead (under a transform, which takes
        # none, the chunks' logits are kept).
        rows, extra = checkpointed_pass(x, weight, bias, t, fn, chunk, recompute=compiling)
        out = rows if reduction == "none" else (mean_of(rows.sum(), n_kept) if reduction == "mean" else rows.sum())
        out = out.to(x.dtype)
    elif return_stats:
        out, extra = FusedLinearLoss.apply(x, weight, bias, t, fn, chunk, reduction, n_kept, want, True, tiles)
    else:
        out = FusedLinearLoss.apply(x, weight, bias, t, fn, chunk, reduction, n_kept, want, False, tiles)
    if rows_kept is not None and reduction == "none":
        out = out.new_zeros(math.prod(lead)).index_copy(0, rows_kept, out)
    if rows_kept is not None and return_stats and extra is not None and reduction == "none":
        extra = extra.new_zeros(math.prod(lead), extra.shape[-1]).index_copy(0, rows_kept, extra)
    out = out.reshape(lead) if reduction == "none" else out
    return (out, _stats(extra, n_rows, reduction, lead)) if return_stats else out


class FusedLossStats(NamedTuple):
    """What :func:`fused_linear_loss` reports with ``return_stats=True``, over
    the kept rows (those whose target is not ``ignore_index``), as detached
    tensors (no host sync):

    * ``support``: the mean number of classes with p > 0, p the loss's map at
      z/τ (sparsemax for "ts2"; for "cross_entropy" and "softmax" it is the
      count of p > 0 of the softmax, V unless some exp(z_j − lse) underflow;
      k for "topk_softmax_ce");
    * ``accuracy``: the share of rows whose argmax z is the target (argmax y
      for a dense target);
    * ``z_loss``: the z-loss term β·lse² as it enters the loss, reduced as the
      loss is (mean over kept rows, sum, or per row for "none"); 0 when β = 0.

    NaN means with no kept row, as the loss's mean.
    """

    support: Tensor
    accuracy: Tensor
    z_loss: Tensor


def _stats(extra, n_rows, reduction, lead) -> FusedLossStats:
    extra = extra.detach()
    sums = extra.sum(0)
    count = n_rows.to(sums.dtype) if isinstance(n_rows, Tensor) else torch.tensor(float(n_rows), dtype=sums.dtype)
    z = extra[:, 2].reshape(lead) if reduction == "none" else (sums[2] / count if reduction == "mean" else sums[2])
    return FusedLossStats(sums[0] / count, sums[1] / count, z)
