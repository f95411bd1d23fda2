"""Host-side helpers shared by the Triton launchers: the grid, the rows a
launcher passes, and the one-element constants a kernel reads.

Each is a call on the host per launch, where a narrow map's launch costs the
host more than the kernel costs the GPU: none makes a torch call it can skip.
"""

from __future__ import annotations

import torch
from torch import Tensor

_CONSTANTS: dict = {}


def cdiv(a: int, b: int) -> int:
    """⌈a/b⌉ for the grid of a launch, in integer arithmetic: ``triton.cdiv``
    is a jit function whose host call costs more than the division."""
    return -(-a // b)


def rows(t: Tensor) -> Tensor:
    """``t`` as contiguous (r, n) rows of its last dimension: ``t`` itself when
    it is already (a router's (tokens, experts) scores), else a contiguous view."""
    return t if t.dim() == 2 and t.is_contiguous() else t.contiguous().view(-1, t.shape[-1])


def constant(device, dtype: torch.dtype, value: float) -> Tensor:
    """A one-element tensor holding ``value``, made once per (device, dtype,
    value): a kernel only reads it (a placeholder pointer, or a scale of 1)."""
    key = (device, dtype, value)
    buf = _CONSTANTS.get(key)
    if buf is None:
        buf = _CONSTANTS[key] = torch.full((1,), value, dtype=dtype, device=device)
    return buf
