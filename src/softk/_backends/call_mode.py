"""What kind of call this is: plain eager, or seen by a compiler, a transform or a mode.

A kernel that runs only in plain eager mode (one called through ctypes with
no custom op around it) says so in what it serves, and the autograd rules of
:mod:`softk._ops` take their lean eager path on the same answer
(:mod:`softk._ops.lean`), so both questions are asked here, once.
"""

from __future__ import annotations

import torch
from torch.autograd import forward_ad

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_active = torch._C._are_functorch_transforms_active
_dispatch_stack = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled
_tracing = torch._C._get_tracing_state  # torch.jit.trace (and the ONNX exporter built on it)
compiling = torch.compiler.is_compiling


def eager(*tensors) -> bool:
    """True when a call on ``tensors`` may run the lean path: not while
    compiling (Dynamo, export) or tracing (``torch.jit.trace``: a kernel
    called through ctypes would be recorded as a constant), under no
    ``torch.func`` transform, with no dispatch or function mode active, and
    every tensor a plain ``torch.Tensor`` or ``Parameter`` (a subclass, e.g.
    a FakeTensor or a DTensor, takes the library path)."""
    if compiling() or _functorch_active() or _dispatch_stack() or _function_mode() or _tracing():
        return False
    for t in tensors:
        if t is not None and type(t) not in _PLAIN:
            return False
    return True


def tracked(x: torch.Tensor) -> bool:
    """True when autograd can see a result computed from ``x``: reverse mode
    (x requires grad and grad mode is on) or a forward-mode dual level is open
    (x may carry a tangent).  Otherwise the lean path calls the kernel with
    no autograd.Function at all."""
    return (x.requires_grad and torch.is_grad_enabled()) or forward_ad._current_level >= 0


def transformed() -> bool:
    """True under a ``torch.func`` transform (vmap, grad, jvp), whose wrapped
    tensors a kernel without a batching rule cannot take."""
    return _functorch_active()
