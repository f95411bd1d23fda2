r"""softk's losses in torchtitan's loss slot, shaped like its ``BaseLoss``.

torchtitan (``torchtitan/components/loss.py``) calls a loss object as
``loss_fn(pred, labels, global_valid_tokens) -> (loss, metrics)``, with
``pred`` (B, L, V), classes last, and ``labels`` (B, L): the loss is
*summed* over tokens (``IGNORE_INDEX = -100`` rows give 0), computed in
float32 for half logits, and divided by ``global_valid_tokens`` when given;
each loss class has a ``Config`` whose ``build(compile_config=...)`` makes
the loss object (``ChunkedLossWrapper`` builds its inner ``loss_fn`` so).
:class:`SoftkLoss` does the same for every softk loss:

* ``pred`` (..., V) plain logits (the leading dimensions are flattened into
  rows, as torchtitan does, since softk's losses read an N-d input with
  torch's convention, classes on dimension 1); half logits are computed in
  float32, as torchtitan's;
* ``pred`` a DTensor sharded on the vocabulary (``Shard(-1)``, as
  torchtitan's tensor-parallel LM head makes it), which goes through softk's
  DTensor entry (vocab-parallel, no rank holds T×V);
* ``pred`` (..., V/tp) this rank's plain slice with ``group=`` the
  tensor-parallel group, through :func:`softk.distributed.vocab_parallel_loss`
  (slices contiguous in rank order, as torchtitan's ceil-division sharding);
* the loss comes back a plain tensor, as torchtitan's own, except with
  DTensor labels, where torchtitan's (``local_map``) returns a DTensor and so
  does this one (replicated);
* with torchtitan's ``compile_config`` asking for it (``enable``, ``"loss"``
  in ``components``) the loss runs under ``torch.compile`` with its
  ``backend``: the whole loss of plain logits, whole or sliced (the
  vocab-parallel collectives are traced as functional collectives); for
  DTensor logits sharded on the classes, the vocab-parallel loss of the
  local shard, with the mesh, the placements and the shard's offset read
  eagerly around it and the sum over rows left to DTensor (Dynamo cannot
  yet carry a view of a DTensor input across the graph break that reading
  the shard's offset makes).  DTensor logits not sharded on the classes,
  and dense DTensor targets, stay eager.

torchtitan is not imported: the class is duck-typed on ``BaseLoss``
(``Config`` with ``build``, ``fn``, ``__call__``).  The tests compare it with
torchtitan 0.3's ``cross_entropy_loss`` (plain and vocabulary-sharded
logits) and run it as ``ChunkedLossWrapper``'s ``loss_fn``, where torchtitan
is installed (the ``torchtitan`` extra).

>>> import torch
>>> loss_fn = SoftkLoss(SoftkLoss.Config(loss="sparsemax"))
>>> loss_fn(torch.tensor([[0.0, 0.0], [0.0, 3.0]]), torch.tensor([0, 1]), torch.tensor(2.0))
(tensor(0.1250), {})
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from .. import _dtensor
from ..distributed import vocab_parallel_loss
from ..distributed.losses import vocab_parallel_options
from ..losses._options import loss_options

__all__ = ["SoftkLoss", "IGNORE_INDEX"]

#: torchtitan's ignore index (torch's default).
IGNORE_INDEX = -100


class SoftkLoss:
    """A softk loss with torchtitan's loss-object interface (sum reduction, ``global_valid_tokens``)."""

    @dataclass(kw_only=True)
    class Config:
        """Which softk loss, and its options.

        Attributes:
            loss: a name of :func:`softk.distributed.vocab_parallel_loss`.
            alpha: α of "entmax" (needed there); k of "soft_topk" /
                "topk_softmax_ce"; method of "soft_topk" ("exp" by default, as
                on one device: vocabulary-sharded logits need "sparse" for
                k > 1); suppression and adaptive of "ts2"; tau the temperature.
                Checked at construction, as :func:`softk.losses.fused_linear_loss`
                checks them.
            global_vocab_size: checked against the classes of whole or DTensor
                logits when given (torchtitan's field of the same name); plain
                slices agree on the vocabulary among themselves.
        """

        loss: str = "cross_entropy"
        alpha: float | None = None
        k: int = 1
        method: str = "exp"
        tau: float = 1.0
        global_vocab_size: int | None = None
        suppression: float | None = None
        adaptive: bool = False

        def build(self, **kwargs) -> "SoftkLoss":
            """The loss object, as torchtitan's ``Config.build``: ``kwargs``
            (``compile_config``, ``group``) go to :class:`SoftkLoss`."""
            return SoftkLoss(config=replace(self), **kwargs)

    def __init__(self, config: Config | None = None, *, group=None, compile_config=None):
        """``group``: the tensor-parallel process group of plain (T, V/tp) slices (None: plain logits are whole).
        ``compile_config``: torchtitan's; with ``enable`` and ``"loss"`` in its
        ``components``, the loss runs under ``torch.compile`` (its
        ``backend``), as torchtitan compiles its own (for class-sharded
        DTensor logits, the vocab-parallel loss of the local shard: see the
        module docstring)."""
        self.config = config = config if config is not None else self.Config()
        # torchtitan's ignore index, and its sum over tokens
        self.options = o = loss_options(config.loss, alpha=config.alpha, k=config.k, method=config.method,
                                        tau=config.tau, suppression=config.suppression, adaptive=config.adaptive,
                                        ignore_index=IGNORE_INDEX, reduction="sum")
        self.group = group
        fn, kw = o.kind.function, o.kind.arguments(o)
        self._single = lambda x, y: fn(x, y, **kw)  # the public loss (whole logits, or through its DTensor entry)
        self._vocab_parallel = vocab_parallel_options(o)
        self._compiled = self._compiled_rows = None
        if (compile_config is not None and getattr(compile_config, "enable", False)
                and "loss" in getattr(compile_config, "components", ())):
            # as torchtitan's BaseLoss._maybe_compile; for class-sharded DTensor logits, the local vocab-parallel loss
            backend = getattr(compile_config, "backend", "inductor")
            self._compiled = torch.compile(self._loss, backend=backend)
            self._compiled_rows = torch.compile(self._local_rows, backend=backend)
        self.fn = self._loss if self._compiled is None else self._compiled_loss

    def _rows(self, pred: Tensor, labels: Tensor):
        """pred and labels as torchtitan's loss sees them: float32 for half logits, (B, L, V) flattened to rows."""
        c = self.config
        if pred.dtype in (torch.float16, torch.bfloat16):
            pred = pred.float()  # as torchtitan: the summed loss in float32
        if pred.dim() > 2:  # (B, L, V): rows, as torchtitan's flatten
            labels = labels.flatten() if labels.dim() < pred.dim() else labels.flatten(0, -2)  # indices or dense
            pred = pred.flatten(0, -2)
        if (self.group is None or _dtensor.is_dtensor(pred)) and c.global_vocab_size is not None \
                and pred.shape[-1] != c.global_vocab_size:
            raise ValueError(f"pred has {pred.shape[-1]} classes, global_vocab_size is {c.global_vocab_size}")
        return pred, labels

    def _compiled_loss(self, pred: Tensor, labels: Tensor) -> Tensor:
        if not _dtensor.is_dtensor(pred) and not _dtensor.is_dtensor(labels):
            return self._compiled(pred, labels)  # type: ignore[misc]  # set whenever self.fn is this method
        if not _dtensor.is_dtensor(pred) or labels.is_floating_point():
            return self._loss(pred, labels)
        from torch.distributed.tensor import Replicate, Shard

        if not any(isinstance(p, Shard) and p.dim % pred.dim() == pred.dim() - 1 for p in pred.placements):  # type: ignore[attr-defined]
            return self._loss(pred, labels)  # classes whole on every rank: the single-device loss, eager
        from ..distributed.placements import rows_entry

        pred, labels = self._rows(pred, labels)
        x, t, group, start, finish = rows_entry(pred, labels)  # eager: the mesh and the shard's offset
        out = finish(self._compiled_rows(x, t, group, start)).sum()  # type: ignore[misc]  # set with self._compiled
        if not all(isinstance(p, Replicate) for p in out.placements):  # rows sharded over the batch: their sum
            out = out.redistribute(out.device_mesh, [Replicate()] * out.device_mesh.ndim)
        return out if _dtensor.is_dtensor(labels) else out.to_local()

    def _local_rows(self, x: Tensor, t: Tensor, group, start: int) -> Tensor:
        return vocab_parallel_loss(x, t, self.options.loss, group=group, vocab_start=start, reduction="none",
                                   **self._vocab_parallel)

    def _loss(self, pred: Tensor, labels: Tensor) -> Tensor:
        pred, labels = self._rows(pred, labels)
        if _dtensor.is_dtensor(pred):
            out = self._single(pred, labels)
            if _dtensor.is_dtensor(out) and not _dtensor.is_dtensor(labels):
                return out.to_local()
            return out
        if self.group is None:
            return self._single(pred, labels)
        return vocab_parallel_loss(pred, labels, self.options.loss, group=self.group, reduction="sum",
                                   **self._vocab_parallel)

    def __call__(self, pred: Tensor, labels: Tensor, global_valid_tokens: Tensor | None = None,
                 **kwargs: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """(the summed loss / ``global_valid_tokens``, {}), as torchtitan's ``BaseLoss.__call__``."""
        del kwargs
        loss = self.fn(pred, labels)
        if global_valid_tokens is not None:
            loss = loss / global_valid_tokens
        return loss, {}
