"""Whether a tensor's values may be read on the host to choose a path."""

from __future__ import annotations

import torch
from torch import Tensor


def readable(t: Tensor) -> bool:
    """A plain tensor, outside a compiler and a torch.func transform: neither
    can branch on a value (Dynamo's fullgraph and vmap refuse the read), so
    under them a choice made from the data takes the branch that serves every
    value instead."""
    return (type(t) is Tensor and not torch.compiler.is_compiling()
            and not torch._C._are_functorch_transforms_active())
