r"""When a call may skip the ``torch.library`` layer: the lean eager path.

softk's kernels sit behind custom ops (``torch.library.custom_op``) with fake
kernels and vmap rules, so that ``torch.compile(fullgraph=True)``,
``torch.func`` transforms, tensor subclasses and dispatch modes see one opaque
node.  That layer (argument binding, the op's autograd/redispatch/backend
keys, the ``disable`` wrapper) costs tens of microseconds a call, more than a
small map itself, and importing it pulls in ``torch._dynamo``.

In plain eager mode none of it is needed: the same kernels run under an
ordinary (old-style) ``torch.autograd.Function`` whose backward, double
backward and jvp are the same formulas.  :func:`eager` says when that is
allowed; every other call takes the library path, which stays the one that
compile, vmap and friends see.
"""

from __future__ import annotations

import threading

import torch
from torch.autograd import forward_ad

_LOCK = threading.Lock()
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functorch_active = torch._C._are_functorch_transforms_active
_dispatch_stack = torch._C._len_torch_dispatch_stack
_function_mode = torch._C._is_torch_function_mode_enabled
_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state  # torch.jit.trace (and the ONNX exporter built on it)


def eager(*tensors) -> bool:
    """True when a call on ``tensors`` may run the lean path: not while
    compiling (Dynamo, export) or tracing (``torch.jit.trace``: a kernel
    called through ctypes would be recorded as a constant), under no
    ``torch.func`` transform, with no dispatch or function mode active, and
    every tensor a plain ``torch.Tensor`` or ``Parameter`` (a subclass, e.g.
    a FakeTensor or a DTensor, takes the library path)."""
    if _compiling() or _functorch_active() or _dispatch_stack() or _function_mode() or _tracing():
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


def library(register):
    """Wrap ``register`` (a function that defines an op's ``torch.library``
    ops, see :func:`custom_op`) to run once, on the first call that takes the
    library path, so that eager users never pay for torch.library; the new
    ops then get their DTensor sharding rules (:mod:`softk._ops.sharding`)
    if the process uses DTensor already.  It is
    marked like ``torch.compiler.assume_constant_result``: while compiling,
    Dynamo runs it for real (registering the ops) instead of tracing it."""
    done = []

    def ensure() -> bool:
        if not done:
            with _LOCK:
                if not done:
                    register()
                    from .sharding import register_new  # the DTensor rules of the new ops

                    register_new(only_if_imported=True)
                    done.append(True)
        return True

    ensure._dynamo_marked_constant = True
    return ensure


def _front(t, bdim, size: int):
    return t.expand(size, *t.shape) if bdim is None else t.movedim(bdim, 0)


def custom_op(name: str, kernel, fake=None):
    """``torch.library.custom_op(name, kernel)`` with a fake kernel (default:
    ``empty_like`` of the first argument) and the vmap rule of an op that
    acts on the last dimension of its tensors: every batch dimension moves to
    the front (an unbatched tensor is expanded) and the op runs once."""
    op = torch.library.custom_op(name, kernel, mutates_args=())
    op.register_fake(fake or (lambda first, *_: torch.empty_like(first)))

    def rule(info, in_dims, *args):
        args = tuple(_front(a, d, info.batch_size) if isinstance(a, torch.Tensor) else a
                     for a, d in zip(args, in_dims))
        return op(*args), 0

    op.register_vmap(rule)
    return op


def twin(function: type, kernel) -> type:
    """The eager twin of the library path's autograd.Function ``function``
    (new style: ``forward(*inputs)``, ``setup_context``, ``backward``, ``jvp``):
    an old-style Function whose forward runs ``kernel(*inputs)`` (the kernel
    itself, no custom op) and then ``function.setup_context``, and whose
    backward and jvp are ``function``'s.  Old style, because ``apply`` of a
    Function with ``setup_context`` binds its arguments through
    ``inspect.signature`` on every call."""

    def forward(ctx, *inputs):
        out = kernel(*inputs)
        function.setup_context(ctx, inputs, out)
        return out

    body = {
        "forward": staticmethod(forward),
        "backward": staticmethod(function.backward),
        "jvp": staticmethod(function.jvp),  # torch's default raises, as it would for ``function``
    }
    cls = type(function.__name__ + "Eager", (torch.autograd.Function,), body)
    # Function.apply (Python) only adds the functorch checks, which eager() has
    # already made: call the C implementation it ends in.
    cls.fast_apply = _C_APPLY.__get__(None, cls)
    return cls


_C_APPLY = torch._C._FunctionBase.__dict__["apply"]


class Paths:
    """The paths of one op, chosen per call by :meth:`apply`.

    * eager (:func:`eager`): ``kernel(*inputs)`` alone when autograd cannot
      see the result (:func:`tracked`), else the old-style twin of
      ``function`` (:func:`twin`);
    * compiling: ``compiled`` (default ``function``; a parent of ``function``
      without its custom ``jvp``, which Dynamo does not trace), whose
      forward is the custom op;
    * otherwise (``torch.func`` transforms, subclasses, modes): ``function``,
      whose forward is the custom op and whose vmap rule is generated.

    ``tensors(*inputs)`` picks the inputs that decide the path (the tensors
    autograd could track)."""

    def __init__(self, function: type, kernel, tensors, compiled: type | None = None, register=None):
        self.function, self.kernel, self.tensors = function, kernel, tensors
        self.compiled = compiled or function
        self.register = register or (lambda: True)  # a library(...)-wrapped registration
        self.eager_function = twin(function, kernel)

    def apply(self, *inputs):
        ts = self.tensors(*inputs)
        if eager(*ts):
            for t in ts:
                if t is not None and tracked(t):
                    return self.eager_function.fast_apply(*inputs)
            return self.kernel(*inputs)
        self.register()
        return (self.compiled if _compiling() else self.function).apply(*inputs)
