r"""Fused linear layer + vocab-parallel loss: W sharded by vocabulary, logits a chunk of rows at a time.

Megatron's output layer with softk's losses.  Every rank holds the same
hidden states X (N, H) and its rows of the weight, W_r (V_r, H) (and b_r).
For each chunk of rows it computes its slice of the logits
X_c W_rᵀ + b_r and the chunk's loss with :func:`vocab_parallel_loss`,
whose gradient G_r = (p − y)/τ is local.  It then accumulates

.. math:: \nabla_{W_r} \mathrel{+}= G_r^\top X_c,\qquad
          \nabla_{b_r} \mathrel{+}= \mathbf 1^\top G_r,\qquad
          \nabla_X = \textstyle\sum_r G_r W_r \ (\text{one all-reduce at the end}).

No rank ever holds more than one chunk of its own slice of the logits.
For the sparse losses G_r is exactly 0 outside the union of the chunk's
supports and targets, and the three products run on those columns of G_r
(rows of W_r) only, as in :func:`softk.losses.fused_linear_loss`: on the
CPU, and on CUDA under the "triton" backend as live vocabulary tiles.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .._ops.distributed import ChunkedLinearLoss
from .._validate import check_input
from ..losses._knobs import NO_KNOBS
from ..losses._options import loss_options
from ..losses._registry import DEFAULT_LOSS
from ..losses.chunking import auto_chunk_size
from ._knobs import knobbed_rows
from .checks import comm_device, resolve_group
from .families import what_code
from .losses import vocab_parallel_loss, vocab_parallel_options


def vocab_parallel_fused_linear_loss(
    input, local_weight, target, loss: str = DEFAULT_LOSS, local_bias=None, *, group=None, vocab_start=None,
    alpha=None, k: int = 1, method: str = "exp", tau: float = 1.0, ignore_index: int = -100,
    reduction: str = "mean", chunk_size=None, softcap=None, label_smoothing: float = 0.0, class_weight=None,
    z_loss: float = 0.0, suppression=None, adaptive: bool = False,
):
    r"""``vocab_parallel_loss(input @ local_weight.T + local_bias, target, loss)``, a chunk of rows at a time.

    Args:
        input: (N, H) hidden states, the same on every rank of ``group``.
        local_weight: (V_r, H), this rank's rows of the output weight (its vocabulary slice).
        target: global class indices (N,), the same on every rank, or a dense
            target (N, V_r) sliced like the weight.
        local_bias: None or (V_r,).
        chunk_size: rows per chunk; None takes :func:`softk.losses.chunking.auto_chunk_size`
            with the largest slice, so every rank runs the same number of chunks.
        softcap, label_smoothing, class_weight, z_loss: the knobs of
            :func:`softk.losses.fused_linear_loss`, over the whole vocabulary
            (``class_weight`` the full (V,) weights, the same on every rank).
        The rest: as in :func:`vocab_parallel_loss` (``loss`` default
            "cross_entropy", "ts2" with ``suppression`` and ``adaptive``);
            reduction is "mean" or "sum".

    The gradient of ``input`` is the full one, Σ_r G_r W_r, all-reduced over
    the group during the forward (do not all-reduce it again).

    For the sparse losses (sparsemax, entmax15, α-entmax, soft top-k
    "sparse", the top-k softmax cross-entropy; not with label smoothing or
    the z-loss, which give every class a gradient) each chunk's local
    gradient G_r is exactly 0 outside the union of its rows' supports and
    targets.  On the CPU each rank then computes its part of ∇X and its rows
    of ∇W and ∇b from the live columns of its own G_r only, the same sums
    without their zero terms, and falls back to the dense products when that
    union is above a set share of its slice, as the single-process fused loss
    does (on a GPU the products stay dense, or run on the live vocabulary
    tiles under the explicit "triton" backend).  Each rank chooses for itself:
    no collective is added.

    Collectives: 1 all-reduce (slice sizes and argument agreement), then per
    chunk those of :func:`vocab_parallel_loss` (at most 4), then 1 all-reduce of
    the (N, H) input gradient when ``input`` requires grad.  The knobs add per
    chunk: label smoothing 2 all-reduces (4 for cross-entropy with class
    weights), z-loss 2.  Backward: none.

    >>> import torch, torch.distributed as dist, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "pg")
    >>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    >>> x, w = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]])
    >>> vocab_parallel_fused_linear_loss(x, w, torch.tensor([2]), "sparsemax")  # logits (0, 1, 3)
    tensor(0.)
    >>> dist.destroy_process_group()
    """
    rank, world = resolve_group(group)
    err = None
    try:
        check_input(input, "input")
        if input.dim() != 2:
            raise ValueError(f"input must be (N, H), got shape {tuple(input.shape)}")
        if not isinstance(local_weight, torch.Tensor) or local_weight.dim() != 2 or local_weight.shape[1] != input.shape[1]:
            raise ValueError(f"local_weight must be (V_r, H) with H = {input.shape[1]}")
        if local_weight.dtype != input.dtype:
            raise TypeError(f"local_weight must have input's dtype {input.dtype}, got {local_weight.dtype}")
        if local_bias is not None and (not isinstance(local_bias, torch.Tensor) or local_bias.shape != (local_weight.shape[0],)):
            raise ValueError(f"local_bias must be None or ({local_weight.shape[0]},)")
        o = loss_options(loss, alpha=alpha, k=k, method=method, tau=tau, ignore_index=ignore_index,
                         reduction=reduction, chunk_size=chunk_size, softcap=softcap, label_smoothing=label_smoothing,
                         class_weight=class_weight, z_loss=z_loss, suppression=suppression, adaptive=adaptive,
                         dense=isinstance(target, torch.Tensor) and target.is_floating_point(), device=input.device,
                         dtype=input.dtype)
        if o.reduction == "none":
            raise ValueError("reduction must be 'mean' or 'sum' here (the gradients are computed in the forward)")
    except (TypeError, ValueError) as e:
        err = e
    # One table (world, 5) of [error, V_r, N, H, knobs]: every rank must run the
    # same number of chunks, so N (and H) must agree before the first chunk, and
    # the same collectives, so the knobs must agree too.
    table = torch.zeros(world, 5, dtype=torch.int64, device=comm_device(input, group))
    if err is None:
        cw = None if class_weight is None else tuple(class_weight.shape)
        code = what_code(softcap, label_smoothing, cw, z_loss)
        table[rank] = torch.tensor([0, local_weight.shape[0], *input.shape, code])
    else:
        table[rank, 0] = 1
    dist.all_reduce(table, op=dist.ReduceOp.SUM, group=group)
    table = table.cpu()
    if err is not None:
        raise err
    if bool(table[:, 0].any()):
        raise ValueError("another rank of the group rejected its arguments (its own error says why); no rank went on")
    for col, what in ((2, "the number of rows N of input"), (3, "the hidden size H of input")):
        if not bool((table[:, col] == table[0, col]).all()):
            raise ValueError(f"{what} differs between ranks: {table[:, col].tolist()} (input must be the same on every rank)")
    if not bool((table[:, 4] == table[0, 4]).all()):
        raise ValueError("softcap, label_smoothing, class_weight's shape or z_loss differ between ranks")
    vocab = int(table[:, 1].sum())
    if o.class_weight is not None and o.class_weight.shape[0] != vocab:
        raise ValueError(f"class_weight must have one weight per class of the whole vocabulary, ({vocab},), "
                         f"got {tuple(o.class_weight.shape)}")
    # this rank's first global class (contiguous slices in rank order when not given)
    start = int(table[:rank, 1].sum()) if vocab_start is None else int(vocab_start)
    info = table[:, 1].max()
    n, h = input.shape
    chunk = o.chunk_size or auto_chunk_size(n, h, int(info), input.device.type)
    z_scale = 1.0
    if target.is_floating_point():
        n_kept = n
    else:
        kept = target != o.ignore_index
        n_kept = int(kept.sum())
        if o.class_weight is not None:
            # torch's weighted mean: divided by Σ w[y] over the kept rows; the
            # z-loss is averaged over the rows, so it is scaled by Σw/n.
            n_rows, n_kept = n_kept, float(torch.where(kept, o.class_weight[torch.where(kept, target, 0)], 0).sum())
            z_scale = n_kept / n_rows if o.reduction == "mean" and n_rows else 1.0
    kwargs = dict(loss=o.loss, vocab_start=vocab_start, **vocab_parallel_options(o))
    on = torch.is_grad_enabled()
    want = tuple(on and a is not None and a.requires_grad for a in (input, local_weight, local_bias))
    knobs = o.knobs
    eps, cap = knobs.label_smoothing, knobs.softcap

    def loss_rows(logits, rows):
        t = target[rows]
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        if eps and t.is_floating_point():
            t = (1 - eps) * t + eps / vocab
        out = vocab_parallel_loss(logits, t, group=group, reduction="none", **kwargs)
        if knobs == NO_KNOBS or (cap is not None and knobs._replace(softcap=None) == NO_KNOBS):
            return out
        return knobbed_rows(out, logits, t, o, start=start, vocab=vocab, z_scale=z_scale, group=group)

    loss_rows.sparse_grad = o.sparse_grad  # type: ignore[attr-defined]  # what fused_linear reads off the function
    return ChunkedLinearLoss.apply(input, local_weight, local_bias, loss_rows, chunk, n_kept, o.reduction == "mean",
                                   want, group)
