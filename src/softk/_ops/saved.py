"""What the threshold maps' autograd contract (:mod:`.op`, :mod:`.per_row_k`)
saves for its backward and jvp: the output p, and the input x as well for
the families whose slope p cannot give near p = 1 (``Family.slope_from_x``:
sigmoid and laplace, whose backward forms u from x,
:func:`softk._backends.torch.threshold.anchored_slope`).  The other maps
keep nothing of their input alive."""

from __future__ import annotations

from typing import Optional

from torch import Tensor


def save(ctx, family, x: Tensor, output: Tensor) -> None:
    """Save what ``family``'s backward and jvp read."""
    saved = (output, x) if family.slope_from_x else (output,)
    ctx.save_for_backward(*saved)
    ctx.save_for_forward(*saved)


def saved(ctx) -> tuple[Tensor, Optional[Tensor]]:
    """(p, x): the saved output, and the input where the family's backward
    reads it, else None."""
    p, *x = ctx.saved_tensors
    return p, (x[0] if x else None)
