r"""Count the work the Triton kernels issue, in Triton's interpreter.

A kernel's cost on a GPU is decided by the GPU, but the work it *issues* is
fixed by the program: the tensor-core FLOPs of every ``tl.dot``, the
elements produced by every other tensor operation (the CUDA-core work: the
whole cost of a latency-bound λ search), and the bytes it loads and stores.
Under ``TRITON_INTERPRET=1`` every program instance runs in NumPy through one
builder; :func:`count` wraps that builder and adds up, for whatever runs
inside it:

* ``dot_flops``: 2·M·N·K per ``tl.dot``;
* ``alu``: the elements of every other operation's result with more than
  one element (exp, where, compares, casts, reductions, ...): a per-row
  scalar of a one-row program is free, as a scalar register is on a GPU;
* ``reduce``: the elements fed to every reduction and scan (``tl.sum``,
  ``tl.max``, ``tl.cumsum``, ...), kept apart from ``alu`` because the
  interpreter runs them in NumPy, outside the builder: a GPU spends about
  one operation per element on them, in shuffles;
* ``load_bytes`` / ``store_bytes``: the bytes under each load's and store's
  mask;
* ``launches``: kernel launches.

The counts are exact and the same on every machine, so two designs of a
kernel can be compared, and pinned in a test, without a GPU
(``tests/backends/triton/test_triton_work.py``).  Address arithmetic, range,
broadcast and reshape operations are not counted: a GPU folds them into its
loads.

>>> import os; os.environ.get("TRITON_INTERPRET") == "1" or print("needs TRITON_INTERPRET=1")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator

import numpy as np


@dataclasses.dataclass
class Work:
    """What the kernels run inside :func:`count` issued."""

    dot_flops: int = 0
    alu: int = 0
    reduce: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    launches: int = 0


_STACK: list[Work] = []
_INSTALLED = False
# Builder calls that make no arithmetic of their own: addresses, ranges,
# shapes and the memory and dot operations counted by their own fields.
_NOT_ALU = frozenset({
    "create_dot", "create_masked_load", "create_load", "create_store", "create_masked_store",
    "create_make_range", "create_splat", "create_broadcast", "create_reshape", "create_expand_dims",
    "create_trans", "create_addptr", "create_int_to_ptr", "create_ptr_to_int", "create_bitcast",
    "create_get_program_id", "create_get_num_programs", "create_make_block_ptr", "create_advance",
})


def _add(field: str, n: int) -> None:
    for w in _STACK:
        setattr(w, field, getattr(w, field) + n)


def _counting(fn):
    def wrapped(self, *args, **kwargs):
        r = fn(self, *args, **kwargs)
        data = getattr(r, "data", None)
        if isinstance(data, np.ndarray) and data.size > 1:
            _add("alu", int(data.size))
        return r
    return wrapped


def _install() -> None:
    global _INSTALLED
    if _INSTALLED:
        return
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("counting the Triton work needs TRITON_INTERPRET=1 set before triton is imported")
    import triton.runtime.interpreter as interp

    B = interp.InterpreterBuilder
    dot, load, store, call = B.create_dot, B.create_masked_load, B.create_masked_store, interp.GridExecutor.__call__

    def _dot(self, a, b, d, *args):
        m = int(np.prod(a.data.shape[:-1]))
        _add("dot_flops", 2 * m * a.data.shape[-1] * b.data.shape[-1])
        return dot(self, a, b, d, *args)

    def _load(self, ptrs, mask, other, *args):
        r = load(self, ptrs, mask, other, *args)
        _add("load_bytes", int(np.asarray(mask.data).sum()) * r.data.itemsize)
        return r

    def _store(self, ptrs, value, mask, *args):
        _add("store_bytes", int(np.asarray(mask.data).sum()) * np.asarray(value.data).itemsize)
        return store(self, ptrs, value, mask, *args)

    def _reducing(apply_impl):
        def wrapped(self, inputs):
            _add("reduce", sum(int(np.asarray(t.handle.data).size) for t in inputs))
            return apply_impl(self, inputs)
        return wrapped

    def _call(self, *args, **kwargs):
        _add("launches", 1)
        return call(self, *args, **kwargs)

    for name in dir(B):
        if name.startswith("create_") and name not in _NOT_ALU and callable(getattr(B, name)):
            setattr(B, name, _counting(getattr(B, name)))
    B.create_dot, B.create_masked_load, B.create_masked_store = _dot, _load, _store
    interp.GridExecutor.__call__ = _call
    interp.ReduceOps.apply_impl = _reducing(interp.ReduceOps.apply_impl)
    interp.ScanOps.apply_impl = _reducing(interp.ScanOps.apply_impl)
    _INSTALLED = True


@contextlib.contextmanager
def count() -> Iterator[Work]:
    """The work the Triton kernels issue inside the block (blocks nest)."""
    _install()
    w = Work()
    _STACK.append(w)
    try:
        yield w
    finally:
        _STACK.remove(w)
