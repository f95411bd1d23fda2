r"""When a call may skip the ``torch.library`` layer: the lean eager route.

softk's kernels sit behind custom ops (``torch.library.custom_op``) with fake
kernels and vmap rules, so that ``torch.compile(fullgraph=True)``,
``torch.func`` transforms, tensor subclasses and dispatch modes see one opaque
node.  That layer (argument binding, the op's autograd/redispatch/backend
keys, the ``disable`` wrapper) costs tens of microseconds a call, more than a
small map itself, and importing it pulls in ``torch._dynamo``.

In plain eager mode none of it is needed: the same kernels run under an
ordinary (old-style) ``torch.autograd.Function`` whose backward, double
backward and jvp are the same formulas.  :func:`eager` says when that is
allowed; every other call takes the library route, which stays the one that
compile, vmap and friends see.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_active = torch._C._are_functorch_transforms_active
_dispatch_stack = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled
_compiling = torch.compiler.is_compiling


def eager(*tensors) -> bool:
    """True when a call on ``tensors`` may run the lean route: not while
    compiling (Dynamo, export), under no ``torch.func`` transform, with no
    dispatch or function mode active, and every tensor a plain
    ``torch.Tensor`` or ``Parameter`` (a subclass, e.g. a FakeTensor or a
    DTensor, takes the library route)."""
    if _compiling() or _functorch_active() or _dispatch_stack() or _function_mode():
        return False
    for t in tensors:
        if t is not None and type(t) not in _PLAIN:
            return False
    return True


def tracked(x: torch.Tensor) -> bool:
    """True when autograd can see a result computed from ``x``: reverse mode
    (x requires grad and grad mode is on) or a forward-mode dual level is open
    (x may carry a tangent).  Otherwise the lean route calls the kernel with
    no autograd.Function at all."""
    return (x.requires_grad and torch.is_grad_enabled()) or forward_ad._current_level >= 0
