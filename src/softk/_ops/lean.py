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

import functools
import threading

import torch

from .._backends.call_mode import compiling, eager, tracked

_LOCK = threading.Lock()
_compiling = compiling


def function(with_jvp: type[torch.autograd.Function], without_jvp: type[torch.autograd.Function]):
    """The autograd.Function a call applies: ``with_jvp`` (forward mode
    through its custom jvp), or under ``torch.compile`` its parent
    ``without_jvp`` (Dynamo does not trace a Function with a custom jvp), or,
    under ``torch.compile`` around a ``torch.func`` transform, ``with_jvp``'s
    formulas as tensor code (:func:`through_transform`)."""
    if _compiling():
        if _differentiated_inside_compile():
            return _ThroughTransform(with_jvp)
        return without_jvp
    if _forward_over_forward():
        return _ThroughTransform(with_jvp)
    return with_jvp


def _differentiated_inside_compile() -> bool:
    """Whether Dynamo is tracing a ``torch.func`` transform that
    differentiates (grad, jvp, and jacfwd, jacrev, hessian built on them),
    at any depth, inside the compiled function: it traces a Function's
    forward and differentiates what it traced, so a custom op there, which
    has no forward-mode formula, would get a zero tangent (jvp gave 0), and
    reverse mode through it failed to trace.  A vmap alone is served by the
    ops' vmap rules; AOTAutograd's functionalization is no such transform."""
    return any(key in _DIFFERENTIATING for key in _transforms())


def _forward_over_forward() -> bool:
    """Whether two or more forward-mode transforms (``jvp``, ``jacfwd``) are
    active: functorch applies a Function's custom jvp at the innermost one
    but does not differentiate that formula at the outer ones, so the
    second derivative in forward-over-forward (``jacfwd(jacfwd(f))``) came
    out 0 where the op's formulas run as tensor code (:func:`through_transform`)
    give it exactly."""
    return sum(key == torch._C._functorch.TransformType.Jvp for key in _transforms()) >= 2


def _transforms() -> list:
    """The active functorch transforms, innermost first (each one's
    ``lower()`` steps beneath it, which Dynamo traces)."""
    if not torch._C._are_functorch_transforms_active():
        return []
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter

    interpreter = retrieve_current_functorch_interpreter()
    with interpreter.lower():
        return [interpreter.key()] + _transforms()


_DIFFERENTIATING = (torch._C._functorch.TransformType.Grad, torch._C._functorch.TransformType.Jvp)


class _Ctx:
    """What a Function's ``setup_context`` and ``jvp`` use of their ctx."""

    needs_input_grad = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    save_for_forward = save_for_backward

    def mark_non_differentiable(self, *_):
        pass

    def set_materialize_grads(self, _):
        pass


def _plus(a, b, scale=1.0):
    if isinstance(a, tuple):
        return tuple(_plus(u, v, scale) for u, v in zip(a, b))
    return a if b is None else a + scale * b


def through_transform(function: type[torch.autograd.Function], inputs: tuple):
    """``function.apply(*inputs)`` as tensor code a transform differentiates:
    the op's value p̄ at the detached inputs (the custom op, which no
    transform then needs to see through), plus its own jvp formula J applied
    to δ = θ − θ̄ (0 in value, the inputs' derivative):

        f(θ) = p̄ + ½ [J(θ̄, p̄) + J(θ, p̃)] δ,    p̃ = p̄ + J(θ̄, p̄) δ.

    f = p̄, f' = J and f'' = dJ/dθ at θ = θ̄ (the two halves make the
    second derivative exact, where p̄ + J(θ, p̃)δ alone would double it), so
    forward and reverse mode, and their second orders, are the op's."""
    bare = tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in inputs)
    out = function.forward(*bare)
    # δ = 0 (with the inputs' derivative) on the finite entries; a masked
    # one (−inf − −inf = NaN) has none, as the map is constant in it
    delta = tuple(torch.where(torch.isfinite(t.detach()), t - t.detach(), 0.0)
                  if isinstance(t, torch.Tensor) and t.is_floating_point() else None for t in inputs)
    ctx = _Ctx()
    function.setup_context(ctx, bare, out)
    first = function.jvp(ctx, *delta)
    ctx = _Ctx()
    function.setup_context(ctx, inputs, _plus(out, first))
    second = function.jvp(ctx, *delta)
    return _plus(out, _plus(first, second), 0.5)


_NO_TRANSFORM = ("softk: {} has no forward-mode formula for a torch.func transform traced inside "
                 "torch.compile; apply torch.compile inside the transform (torch.func.jvp(torch.compile(f), ...)) "
                 "or leave the transform uncompiled")


_NO_NESTED_JVP = ("softk: {} has no second-order forward-mode formula; for second derivatives use reverse mode "
                  "on the outside (torch.func.hessian, jacrev(jacfwd(f)) or jacrev(jacrev(f)))")


class _ThroughTransform:
    """An ``apply`` that runs :func:`through_transform`."""

    def __init__(self, function):
        self.function = function

    def apply(self, *inputs):
        return through_transform(self.function, inputs)


def call(tensors: tuple, kernel, library, register, *args):
    """``kernel(*args)`` in a plain eager call on ``tensors`` (:func:`eager`),
    else ``library(*args)``, the same computation through the op's
    ``torch.library`` ops (after ``register()``, its :func:`library`
    registration): the choice every backward with a kernel makes, in one
    place."""
    if eager(*tensors):
        return kernel(*args)
    register()
    return library(*args)


def route(tensors: tuple, eager_apply, kernel, library, register, *args):
    """The eager-or-library choice of an op that is not a :class:`Paths`
    (several outputs, no vmap rule): in a plain eager call on ``tensors``,
    ``eager_apply(*args)`` (its old-style autograd.Function) when autograd
    can see the result, else ``kernel(*args)`` alone; every other call
    ``library(*args)``, the op's ``torch.library`` path (after
    ``register()``)."""
    if eager(*tensors):
        for t in tensors:
            if t is not None and tracked(t):
                return eager_apply(*args)
        return kernel(*args)
    register()
    return library(*args)


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


def _laid_out_like_first(kernel):
    """``kernel`` whose output has the layout of ``empty_like`` of its first
    argument, which the default fake kernel promises: a compiled graph reads
    the output by the fake's strides.  A kernel that writes contiguous rows
    (Triton's) for a permuted input (a map along a dimension other than the
    last, moved last) has its output copied into that layout."""

    @functools.wraps(kernel)
    def run(first, *args):
        out = kernel(first, *args)
        if first.is_contiguous() and out.is_contiguous():
            return out
        like = torch.empty_like(first)
        return out if like.stride() == out.stride() else like.copy_(out)

    return run


def custom_op(name: str, kernel, fake=None):
    """``torch.library.custom_op(name, kernel)`` with a fake kernel (default:
    ``empty_like`` of the first argument, and the kernel's output laid out
    so) and the vmap rule of an op that acts on the last dimension of its
    tensors: every batch dimension moves to the front (an unbatched tensor is
    expanded) and the op runs once."""
    if fake is None:  # the schema from the kernel itself (its annotations name its module's types)
        schema = torch.library.infer_schema(kernel, mutates_args=())
        op = torch.library.custom_op(name, _laid_out_like_first(kernel), mutates_args=(), schema=schema)
    else:
        op = torch.library.custom_op(name, kernel, mutates_args=())
    op.register_fake(fake or (lambda first, *_: torch.empty_like(first)))

    def rule(info, in_dims, *args):
        args = tuple(_front(a, d, info.batch_size) if isinstance(a, torch.Tensor) else a
                     for a, d in zip(args, in_dims))
        return op(*args), 0

    op.register_vmap(rule)
    return op


def twin(function: type[torch.autograd.Function], kernel) -> type[torch.autograd.Function]:
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
    cls.fast_apply = _C_APPLY.__get__(None, cls)  # type: ignore[attr-defined]  # a class built by type()
    return cls


_C_APPLY = torch._C._FunctionBase.__dict__["apply"]


class Paths:
    """The paths of one op, chosen per call by :meth:`apply`.

    * eager (:func:`eager`): ``kernel(*inputs)`` alone when autograd cannot
      see the result (:func:`tracked`), else the old-style twin of
      ``function`` (:func:`twin`);
    * compiling: ``compiled`` (default ``function``; a parent of ``function``
      without its custom ``jvp``, which Dynamo does not trace), whose
      forward is the custom op; compiling a ``torch.func`` transform:
      ``function``'s formulas as tensor code (:func:`through_transform`)
      under one that differentiates, or with ``through=False`` (an op
      without second derivatives) a ``NotImplementedError`` there;
    * otherwise (``torch.func`` transforms, subclasses, modes): ``function``,
      whose forward is the custom op and whose vmap rule is generated.

    ``tensors(*inputs)`` picks the inputs that decide the path (the tensors
    autograd could track)."""

    def __init__(self, function: type[torch.autograd.Function], kernel, tensors,
                 compiled: type[torch.autograd.Function] | None = None, register=None, through: bool = True):
        self.function, self.kernel, self.tensors, self.through = function, kernel, tensors, through
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
        if _compiling():
            if _differentiated_inside_compile():
                if not self.through:
                    raise NotImplementedError(_NO_TRANSFORM.format(self.function.__name__))
                return through_transform(self.function, inputs)
            return self.compiled.apply(*inputs)
        if _forward_over_forward():
            if not self.through:
                raise NotImplementedError(_NO_NESTED_JVP.format(self.function.__name__))
            return through_transform(self.function, inputs)
        return self.function.apply(*inputs)
