r"""``vocab_parallel_loss``: a softk loss of logits whose vocabulary is split between ranks.

With z = x/τ the concatenated row and Φ the map's potential (the same on
every rank after :mod:`.threshold`'s forward),

* Fenchel–Young, class index t:  L = Φ(z) − z_t + ψ(1);  dense y:  L = Φ(z) + Σ_v ψ(y_v) − ⟨z, y⟩;
* cross_entropy: L = lse(z) − z_t, or lse(z) − ⟨z, y⟩;
* topk_softmax_ce: L = log Σ_{top-k} e^{z} − z_t;

z_t reaches every rank in the first all-reduce MAX (−inf from the ranks that
do not own t) and the dense sums in the all-reduce SUM, so the losses cost no
collective beyond the map's, but one: at τ ≠ 1 every loss but cross_entropy
shifts the row by its max before dividing by τ, as the single-device losses
do (x/τ first would round each entry to ulp(x/τ)), which takes one more
all-reduce MAX of a number per row.  The gradient (p − y)/τ (for topk_softmax_ce:
the softmax over the global top k minus e_t) is local to each slice, so the
backward runs no collective at all.
"""

from __future__ import annotations

import inspect
import numbers

import torch
from torch import Tensor

from .._ops.distributed import RowLoss, all_gather, all_reduce
from .._ops.topk_softmax_ce import lse_minus_target
from .._validate import check_input, check_k, mean_of, sum_tolerance
from ..losses import targets as tg
from ..losses._options import FIELDS, LossOptions, loss_options
from ..losses._registry import DEFAULT_LOSS
from ..threshold.rows import broken_rows, compute_dtype, shift_over_tau
from .checks import exchange, outside_graph, resolve_group
from ._knobs import ts2_penalty
from .families import loss_family, what_code
from .threshold import NEG_INF, _finite_max, distributed_forward


def _local_checks(x, target, loss, k, tau, alpha, method, reduction, ignore_index, vocab_start, suppression, adaptive):
    check_input(x, "local_logits")
    if x.shape[-1] < 1:
        raise ValueError("local_logits must hold at least one class on its last dimension")
    # (the vocab-parallel loss takes no knobs and no chunk size; its k is a count, never fractional)
    o = loss_options(loss, alpha=alpha, k=check_k(k), method=method, tau=tau, ignore_index=ignore_index,
                     reduction=reduction, suppression=suppression, adaptive=adaptive)
    family = loss_family(o)
    if vocab_start is not None and (isinstance(vocab_start, bool) or not isinstance(vocab_start, numbers.Integral) or vocab_start < 0):
        raise ValueError(f"vocab_start must be None or an int >= 0 (this slice's first global class), got {vocab_start!r}")
    tg.check_target_tensor(target)
    if target.is_floating_point():
        if o.kind.targets == "index":
            raise TypeError(f"target must hold class indices for {loss}, got dtype {target.dtype}")
        if ignore_index != -100:
            raise ValueError("ignore_index applies to class-index targets only")
        if target.shape != x.shape:
            raise ValueError(
                f"target of probabilities must be sliced like local_logits, shape {tuple(x.shape)}, got {tuple(target.shape)}"
            )
        if not bool(torch.isfinite(target).all()) or bool((target < 0).any()):
            raise ValueError("target must be finite and >= 0 everywhere")
        if family is not None and family.capped and bool((target > 1).any()):
            raise ValueError(f"target entries must lie in [0, 1] for a top-k loss, got {float(target.max())}")
    else:
        if o.kind.targets == "dense":
            raise TypeError(f"target must be a float tensor (rows summing to k) for {loss}, got dtype {target.dtype}")
        if target.shape != x.shape[:-1]:
            raise ValueError(
                f"target of class indices must have shape {tuple(x.shape[:-1])} (local_logits' shape without its "
                f"last dimension), got {tuple(target.shape)}"
            )
        neg = (target < 0) & (target != ignore_index)
        if bool(neg.any()):
            raise ValueError(f"target holds class index {int(target[neg][0])}, outside [0, V) (and not ignore_index={ignore_index})")
    return o, family


def _agree(x, target, loss, group, vocab_start, alpha, k, method, tau, ignore_index, reduction, suppression, adaptive):
    """The local checks, then the agreement of the ranks (:mod:`.checks`): (the checked
    :class:`~softk.losses._options.LossOptions`, family, Agreed), or the same error on every rank."""
    rank, world = resolve_group(group)
    err, o, family = None, None, None
    try:
        o, family = _local_checks(
            x, target, loss, k, tau, alpha, method, reduction, ignore_index, vocab_start, suppression, adaptive
        )
        k, tau, ignore_index = o.k, o.tau, o.ignore_index
    except (TypeError, ValueError) as e:
        err = e
    own = () if o is None else tuple(getattr(o, name) for name in o.kind.options)  # the loss's own options
    code = what_code("loss", loss, reduction, ignore_index, *own)
    agreed = exchange(x, target, group=group, rank=rank, world=world, vocab_start=vocab_start,
                      k=k, tau=tau, what=code, local_error=err, ignore_index=ignore_index)
    return o, family, agreed


def _topk_ce(z, index, owned, zt_local, k, group, rank, world):
    """Su's top-k softmax cross-entropy over the concatenated row: 1 all-gather."""
    m, width = z.shape
    zz = z if width >= k else torch.cat([z, z.new_full((m, k - width), NEG_INF)], -1)
    vals, idx = torch.topk(zz, k, dim=-1, sorted=False)
    block = torch.cat([vals, zt_local], -1).contiguous()
    blocks = all_gather(block, group, world)
    allv = torch.cat([b[:, :k] for b in blocks], -1)
    zt = torch.stack([b[:, k] for b in blocks], -1).amax(-1, keepdim=True)
    top, pos = torch.topk(allv, k, dim=-1, sorted=False)
    rows = lse_minus_target(top, zt)
    q = torch.softmax(top, -1)
    mine = (pos >= rank * k) & (pos < (rank + 1) * k)
    cols = idx.gather(-1, (pos - rank * k).clamp(0, k - 1))
    grad = torch.zeros(m, zz.shape[-1], dtype=z.dtype, device=z.device)
    grad.scatter_add_(-1, cols, torch.where(mine, q, 0.0))
    # a row holding NaN or +inf on any rank is NaN, loss and gradient on every
    # entry, as on one device (topk ranks both above every number, so the
    # gathered top values show it on every rank)
    broken = broken_rows(allv)
    rows = torch.where(broken.squeeze(-1), float("nan"), rows)
    return rows, torch.where(broken, float("nan"), grad[:, :width])


def vocab_parallel_loss(
    local_logits: Tensor,
    target: Tensor,
    loss: str = DEFAULT_LOSS,
    *,
    group=None,
    vocab_start=None,
    alpha=None,
    k: int = 1,
    method: str = "exp",
    tau: float = 1.0,
    ignore_index: int = -100,
    reduction: str = "mean",
    suppression=None,
    adaptive: bool = False,
) -> Tensor:
    r"""``loss`` of the logits concatenated over the vocabulary slices of the ranks of ``group``.

    Args:
        local_logits: (..., V_r), this rank's slice of the classes on the last
            dimension; every rank the same leading shape and dtype.  Slices
            are contiguous in rank order, or placed by ``vocab_start``.
        target: global class indices shaped ``local_logits.shape[:-1]`` (the
            same on every rank), or a dense target sliced like the logits.
        loss: "cross_entropy" (the default, as for
            :func:`softk.losses.fused_linear_loss` and Megatron's
            vocab-parallel cross-entropy), "softmax", "sparsemax", "entmax15", "entmax"
            (``alpha``), "soft_topk" (dense targets; ``method`` "exp", the
            default as on one device, with k = 1 only, since its λ needs every
            entry, or "sparse" with any k), "topk_softmax_ce" (``k``) or "ts2"
            (:func:`softk.losses.ts2_loss`, with ``suppression`` (None: 1.0)
            and ``adaptive``).
        group: the process group (default: the world).
        vocab_start: this rank's first global class index; None on every
            rank means contiguous slices in rank order.  Uneven slices are fine.
        alpha, k, method, tau, ignore_index, reduction: as in :mod:`softk.losses`.

    Returns the loss, equal (to rounding) to the single-device loss on the
    concatenated logits, with its gradient for ``local_logits``.

    Collectives per call, fixed: 1 all-reduce of a (world, 14) int64 table
    (argument agreement, :mod:`.checks`), then
    cross_entropy/softmax: 2 all-reduces (MAX, SUM);
    sparsemax/entmax15/entmax/soft_topk "sparse": 2 all-reduces + 1 all-gather;
    topk_softmax_ce: 1 all-gather; ts2: those of sparsemax + 3 all-reduces
    (4 with ``adaptive``).  Backward: none.

    >>> import torch, torch.distributed as dist, tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "pg")
    >>> dist.init_process_group("gloo", init_method=f"file://{f}", rank=0, world_size=1)
    >>> vocab_parallel_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([0]), "sparsemax")
    tensor(0.2500)
    >>> dist.destroy_process_group()
    """
    o, family, agreed = outside_graph(_agree)(
        local_logits, target, loss, group, vocab_start, alpha, k, method, tau, ignore_index, reduction, suppression,
        adaptive
    )
    k, tau, ignore_index, reduction = o.k, o.tau, o.ignore_index, o.reduction
    rank, world = agreed.rank, agreed.world
    lead = local_logits.shape[:-1]
    x = local_logits.reshape(-1, local_logits.shape[-1])
    ct = compute_dtype(x.dtype)
    z = x.detach().to(ct)
    if tau != 1.0 and o.kind.torch_cross_entropy:
        z = z / tau  # cross_entropy(x/τ), as torch forms it
    elif tau != 1.0:
        # shifted by the concatenated row's max before dividing, as every
        # single-device loss is: x/τ first rounds each entry to ulp(x/τ)
        # (an offset of 1e6 at τ = 0.3 in float32 moved the loss by 1 %)
        top = all_reduce(_finite_max(z), "max", group)
        z = shift_over_tau(z, torch.where(torch.isfinite(top), top, 0.0), tau, check=False)
    m = z.shape[0]
    dense = target.is_floating_point()
    if dense:
        y = target.reshape(m, -1).to(ct)
        keep = None
    else:
        t = target.reshape(-1).to(z.device).long()
        keep = t != ignore_index
        local = t - agreed.start
        owned = keep & (local >= 0) & (local < agreed.local_vocab)
        li = torch.where(owned, local, 0).unsqueeze(-1)
        zt_local = torch.where(owned.unsqueeze(-1), z.gather(-1, li), NEG_INF)
    if m == 0:
        rows = z.sum(-1)
        out = mean_of(rows.sum(), 0) if reduction == "mean" else (rows.sum() if reduction == "sum" else rows.reshape(lead))
        return (out + local_logits.sum() * 0).to(local_logits.dtype)
    if family is None:  # no threshold map: Su's top-k softmax cross-entropy
        rows, grad = _topk_ce(z, t, owned, zt_local, k, group, rank, world)
        grad.scatter_add_(-1, li, -owned.unsqueeze(-1).to(grad.dtype))  # − e_t on the owner (no data-dependent shape)
        # an ignored row has no gradient: not the NaN of softmax over a row
        # with no finite score (padding masked with −inf), times its weight 0
        assert keep is not None  # class indices: the top-k CE takes no dense target
        grad = torch.where(keep.unsqueeze(-1), grad, 0.0)
    else:
        ce = o.kind.torch_cross_entropy  # −log p_y: no Ω(y) term
        extra: dict = {}  # sum_extra (a function) or max_extra (a tensor)
        if dense:
            def sums(zs):
                # cross_entropy's ⟨z, y⟩ is torch's: 0·(−inf) = NaN on a masked class
                zy = (zs * y if ce else torch.where(y != 0, zs * y, 0.0)).sum(-1, keepdim=True)
                reg = 0.0 if ce else family.psi(y).sum(-1, keepdim=True)
                return torch.cat([reg - zy, y.sum(-1, keepdim=True)], -1)
            extra["sum_extra"] = sums
        else:
            extra["max_extra"] = zt_local
        fwd = distributed_forward(family, z, k, group, rank, world, **extra)
        if dense:
            assert fwd.sum_extra is not None  # given sum_extra, distributed_forward sums it
            ysum = fwd.sum_extra[:, 1]
            tol = sum_tolerance(k, agreed.vocab, target.dtype)
            if bool(((ysum - k).abs() > tol).any()):
                raise ValueError(
                    f"target row sums over the whole vocabulary lie in [{float(ysum.min()):.6g}, {float(ysum.max()):.6g}]; "
                    f"rows must sum to k={k} (normalise multi-hot labels first)"
                )
            rest = fwd.sum_extra[:, :1]
            grad = fwd.p - y
        else:
            assert fwd.max_extra is not None  # given max_extra, distributed_forward reduces it
            rest = -(fwd.max_extra - fwd.shift) + (0.0 if ce else family.psi(torch.ones_like(fwd.shift)))
            grad = fwd.p.clone()
            grad.scatter_add_(-1, li, -owned.unsqueeze(-1).to(grad.dtype))
        if ce:
            # Φ = lse + 1 ≥ 1 on a row with a finite entry (the shift is its max), 0 on a fully masked row.
            lse = torch.where(fwd.phi > 0, fwd.phi - 1, NEG_INF)
            rows = (lse + rest).squeeze(-1)
            # torch's log-softmax of a fully masked row is NaN, and so is its gradient.
            grad = torch.where(fwd.phi > 0, grad, float("nan"))
        else:
            rows = torch.clamp(fwd.phi + rest, min=0.0).squeeze(-1)
        rows = torch.where(fwd.broken.squeeze(-1), float("nan"), rows)
    if tau != 1.0:
        grad = grad / tau
    rows = RowLoss.apply(x, rows, grad) if local_logits.requires_grad else rows
    if o.suppression is not None:  # TS²: the sparsemax loss above, plus the penalty on the softmax of x (not x/τ)
        rows = rows + ts2_penalty(x.to(ct), fwd.p, owned, li.squeeze(-1), keep, o.suppression, o.adaptive, group)
    if keep is not None:
        rows = torch.where(keep, rows, 0.0)
    if reduction == "none":
        return rows.reshape(lead).to(local_logits.dtype)
    total = rows.sum()
    if reduction == "mean":
        total = mean_of(total, keep.sum() if keep is not None else m)
    return total.to(local_logits.dtype)


#: The options :func:`vocab_parallel_loss` takes beside the name and the reduction.
VOCAB_PARALLEL_OPTIONS = tuple(p for p in inspect.signature(vocab_parallel_loss).parameters
                               if p in FIELDS and p not in ("loss", "reduction"))


def vocab_parallel_options(o: LossOptions) -> dict:
    """The keyword arguments of :func:`vocab_parallel_loss` that carry the options ``o``:
    those its public loss takes (none of a dense-target loss's is ``ignore_index``)."""
    return {p: v for p, v in o.kind.arguments(o).items() if p in VOCAB_PARALLEL_OPTIONS}
