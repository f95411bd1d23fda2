"""Launchers for the softmax kernels (:mod:`.softmax_kernels`) on contiguous
(R, n) rows: softmax, log_softmax, logsumexp and their backward passes.

:mod:`.threshold` runs :func:`softmax_rows` for the softmax family;
:mod:`softk._ops.log_softmax` runs the others inside its custom ops (the
"triton" kernel of op "log_softmax").

Tile shape (:func:`config`), a heuristic that has not been tuned
(BENCHMARKS.md has its times: on par with ``torch.softmax`` on wide rows,
slower on narrow ones).

* Rows of at most :data:`SINGLE_MAX` entries are read once: BLOCK is the
  next power of two ≥ n (at least 4); 16,384 entries at 16 warps are 32 per
  thread.  Wider rows loop over blocks of
  :data:`LOOP_BLOCK` (two reads of x).
* Narrow rows share a program: ROWS = TILE // BLOCK rows per program
  (at most the row count, rounded up to a power of two), so that a program
  handles about :data:`TILE` entries.
* Warps: one per 512 entries of the tile, between 1 and 16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .launch import cdiv
from .softmax_kernels import softmax_bwd_kernel, softmax_fwd_kernel, softmax_index_loss_kernel

SINGLE_MAX = 16384
LOOP_BLOCK = 4096
TILE = 2048

# what softmax_fwd_kernel writes (its OUT constexpr)
OUT_P, OUT_LOGP, OUT_LSE, OUT_GP = 0, 1, 2, 3


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _new(like: Tensor, shape=None) -> Tensor:
    # every output is allocated here (tests fill it with NaN first, so that
    # an element the kernel fails to write cannot pass)
    return torch.empty(like.shape if shape is None else shape, dtype=like.dtype, device=like.device)


def config(n: int, r: int, block: int | None = None, rows: int | None = None):
    """(single, BLOCK, ROWS, warps) for r rows of n entries; ``block``
    forces the looped variant with that block and ``rows`` the rows of a
    tile (tests use them on small rows)."""
    if block is None and n <= SINGLE_MAX:
        single, blk = True, max(4, _pow2(n))
    else:
        single, blk = False, block or LOOP_BLOCK
    rows = rows or max(1, min(TILE // blk, _pow2(max(r, 1))))
    warps = max(1, min(16, rows * blk // 512))
    return single, blk, rows, warps


def _launch_fwd(rows: Tensor, out: Tensor, g: Tensor | None, tau: float, mode: int, block: int | None):
    r, n = rows.shape
    if r:
        single, blk, nrows, warps = config(n, r, block)
        softmax_fwd_kernel[(cdiv(r, nrows),)](
            rows, out, rows if g is None else g, r, n, 1.0 / tau, float(tau),
            OUT=mode, ROWS=nrows, BLOCK=blk, SINGLE=single, num_warps=warps,
        )
    return out


def index_loss_rows(x: Tensor, target: Tensor, scale: Tensor, tau: float, *, want_grad: bool, ce_rows: bool,
                    block: int | None = None, rows_per_program: int | None = None):
    """Softmax's fused loss with class indices (cross-entropy) on contiguous
    (r, n) ``x``: (loss per row in float32 (r,), gradient scale·(p − e_t)/τ in
    x's dtype (r, n), or an empty tensor without ``want_grad``), ``target``
    (r,) with −1 on ignored rows, ``scale`` one float32 (see
    :func:`softk._backends.triton.loss.fenchel_young_fused_rows`).  The
    tiles of :func:`config`; ``block`` forces the looped variant and
    ``rows_per_program`` the rows of a tile (tests)."""
    r, n = x.shape
    loss = torch.empty(r, dtype=torch.float32, device=x.device)
    grad = torch.empty_like(x) if want_grad else torch.empty(0, dtype=x.dtype, device=x.device)
    if r:
        single, blk, rows, warps = config(n, r, block, rows_per_program)
        softmax_index_loss_kernel[(cdiv(r, rows),)](
            x, target, grad if want_grad else x, loss, scale, r, n, 1.0 / tau,
            ROWS=rows, BLOCK=blk, SINGLE=single, WANT_GRAD=want_grad, CE_ROWS=ce_rows, num_warps=warps,
        )
    return loss, grad


def softmax_rows(rows: Tensor, tau: float = 1.0, *, log: bool = False, block: int | None = None) -> Tensor:
    """softmax (or log_softmax with ``log``) of each row of contiguous (r, n)
    ``rows`` at temperature ``tau``, in ``rows.dtype``."""
    return _launch_fwd(rows, _new(rows), None, tau, OUT_LOGP if log else OUT_P, block)


def logsumexp_rows(rows: Tensor, tau: float = 1.0, *, block: int | None = None) -> Tensor:
    """τ·logsumexp(x/τ) of each row of contiguous (r, n) ``rows``: shape (r,)."""
    out = _new(rows, rows.shape[:1])
    return _launch_fwd(rows, out, None, tau, OUT_LSE, block)


def logsumexp_backward_rows(rows: Tensor, g: Tensor, tau: float = 1.0, *, block: int | None = None) -> Tensor:
    """g[i]·softmax(x_i/τ): the gradient of :func:`logsumexp_rows` (τ cancels),
    recomputed from x (one fused pass where the row fits on chip)."""
    return _launch_fwd(rows, _new(rows), g.contiguous(), tau, OUT_GP, block)


def softmax_backward_rows(y: Tensor, g: Tensor, tau: float = 1.0, *, log: bool = False,
                          block: int | None = None) -> Tensor:
    """dx for contiguous (r, n) saved outputs ``y`` (p, or log p with ``log``)
    and incoming gradients ``g`` (same shape and dtype)."""
    dx = _new(y)
    r, n = y.shape
    if r:
        single, blk, nrows, warps = config(n, r, block)
        softmax_bwd_kernel[(cdiv(r, nrows),)](
            y, g, dx, r, n, 1.0 / tau, LOG=log, ROWS=nrows, BLOCK=blk, SINGLE=single, num_warps=warps,
        )
    return dx
