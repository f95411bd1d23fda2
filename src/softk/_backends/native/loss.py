r"""Launcher of the fused Fenchel–Young loss kernel (``kernels_loss.h``) on
contiguous (rows, n) CPU tensors in float32/float64.

Per row the kernel finds λ with the forward's own solver (so p is the
forward's to the bit), then in one pass writes the loss

.. math:: L = \sum_i F(u_i) - \langle u, y\rangle + \Omega(y), \qquad u = z - \lambda,

and the gradient s·(p − y) (s = 1/τ, times 1/#kept rows for the mean), in
z's dtype.  The target is checked on the way (class indices in range, dense
rows in the map's domain); a bad one comes back as a status for the caller
to explain (:func:`softk._ops.fused_loss`).  Rows are split between OpenMP
threads as in the forward.

>>> import torch
>>> from softk.threshold.families import SPARSEMAX
>>> loss, grad = fenchel_young_fused_rows(torch.tensor([[0.0, 0.0]]), torch.tensor([0]), SPARSEMAX, 1)
>>> loss, grad  # p = (½, ½): L = ⟨z, p⟩ − ½‖p‖² + ½ − z₀ = ¼, ∇ = p − e₀
(tensor(0.2500), tensor([[-0.5000,  0.5000]]))
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _PARALLEL_MIN, entry

BAD_INDEX, BAD_DENSE = 1, 2


def _empty(shape, like: Tensor) -> Tensor:
    # Every element is written by the kernel; tests swap this for a NaN fill.
    return like.new_empty(shape)


class BadTarget(ValueError):
    """The kernel found a target value outside the map's domain (``kind``:
    BAD_INDEX or BAD_DENSE); the caller re-runs the Python check for the message."""

    def __init__(self, kind: int):
        super().__init__(f"softk: invalid target values (kind {kind})")
        self.kind = kind


def fenchel_young_fused_rows(z: Tensor, target: Tensor, family, k, *, k_rows: Tensor | None = None,
                             inv_tau: float = 1.0, ignore_index: int = -100, reduction: str = "mean",
                             want_grad: bool = True, tol: float = -1.0):
    """(loss, gradient (r, n) or None), in z's dtype.

    The loss is per row (r,) for ``reduction="none"``, else one value (0-d):
    the rows' sum ("sum") or the sum over the #rows kept ("mean"), summed in
    double.  ``z``: contiguous (r, n) scores, float32/float64 on the CPU
    (already shifted/scaled when τ ≠ 1; ``inv_tau`` scales the gradient).
    ``target``: contiguous int64 class indices (r,) (``ignore_index`` marks
    ignored rows), or dense (r, n) rows in z's dtype.  ``k``: an int, or
    ``k_rows`` (r,) in z's dtype, one integral k per row.  The gradient is
    that of the reduced loss.  ``tol`` ≥ 0: check dense rows (finite, ≥ 0,
    ≤ 1 for capped families, |Σy − k| ≤ k·tol).  Raises :class:`BadTarget`.
    """
    r, n = z.shape
    dense = target.dim() == 2
    none = reduction == "none"
    out = _empty((r,) if none else (), z)
    grad = _empty((r, n), z) if want_grad else None
    if r or not none:
        threads = 1 if r * n < _PARALLEL_MIN else max(1, min(torch.get_num_threads(), r))
        ptr = out.data_ptr()
        rc = entry("fy_loss_threads", z.dtype)(
            family.kernel, z.data_ptr(), None if dense else target.data_ptr(), target.data_ptr() if dense else None,
            None if k_rows is None else k_rows.data_ptr(), None if grad is None else grad.data_ptr(),
            ptr if none else None, None if none else ptr, r, n, k, family.alpha_value, inv_tau, ignore_index,
            reduction == "mean", tol, family.capped, threads)
        if rc == -3:
            raise ValueError(f"softk native kernel: rows of {n} entries (at most 2**31 - 1 for {family.name})")
        if rc < 0:
            raise MemoryError(f"softk native kernel: no scratch memory for rows of {n} entries")
        if rc:
            raise BadTarget(rc)
    return out, grad


def topk_ce_rows(x: Tensor, target: Tensor, k: int, *, inv_tau: float = 1.0, ignore_index: int = -100,
                 reduction: str = "mean", want_grad: bool = True):
    """Su's sparse-softmax cross-entropy (``kernels_topk_ce.h``): (loss,
    gradient (r, n) or None), in x's dtype, with the loss and the
    arguments as in :func:`fenchel_young_fused_rows` (class indices only);
    ``k`` the number of largest scores the normaliser keeps."""
    r, n = x.shape
    none = reduction == "none"
    out = _empty((r,) if none else (), x)
    grad = _empty((r, n), x) if want_grad else None
    if r or not none:
        threads = 1 if r * n < _PARALLEL_MIN else max(1, min(torch.get_num_threads(), r))
        ptr = out.data_ptr()
        rc = entry("topk_ce_threads", x.dtype)(
            x.data_ptr(), target.data_ptr(), None if grad is None else grad.data_ptr(), ptr if none else None,
            None if none else ptr, r, n, k, inv_tau, ignore_index, reduction == "mean", threads)
        if rc < 0:
            raise MemoryError(f"softk native kernel: no scratch memory for rows of {n} entries")
        if rc:
            raise BadTarget(rc)
    return out, grad
