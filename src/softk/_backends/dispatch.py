r"""The one dispatcher: which kernel runs a call, decided once per call.

:func:`pick` turns the configured backend (:mod:`softk._backends.registry`:
``"auto"``, ``"torch"``, ``"native"`` or ``"triton"``) and the call into one
kernel of the registry (:mod:`softk._backends.kernels`), in one vocabulary:

* the order: under ``"auto"`` the device's own backend first (``"triton"``
  for a CUDA tensor, ``"native"`` elsewhere), under a named backend that
  one; then the op's fallback.  The setting ``"torch"`` asks for the
  reference: the op's torch kernel, or its own tensor code where it has none;
* the first kernel in that order that serves the call
  (``Kernel.serves(x, *what)`` is None) runs it;
* None when none does: the op's own differentiable tensor code runs.

A named backend that cannot run the tensor at all ("native" for a CUDA
tensor, "triton" for a CPU tensor without ``TRITON_INTERPRET=1``) is a
ValueError, whatever the op.  The kernel's backend name travels with the
call (an autograd rule records it), so the backward runs where the forward
ran.  :func:`softk.explain` records each choice with the reason every
kernel passed over gave.
"""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

from torch import Tensor

from . import call_mode, registry
from .kernels import KERNELS, OPS, Kernel

_TORCH = ("torch",)


def _orders() -> dict:
    """(op, first backend) → the backends to try, the op's fallback after the first."""
    out = {}
    for op in OPS.values():
        for first in ("native", "triton"):
            out[op.name, first] = tuple(dict.fromkeys((first, *op.fallback)))
    return out


_ORDER = _orders()


def order(op: str, x: Tensor) -> tuple:
    """The backends :func:`pick` tries for ``op`` on ``x``, under the current setting.

    Under ``torch.compile`` the setting is read once, when a graph is
    captured (``registry.backend`` is marked as a constant)."""
    name = registry.backend()
    if name == "auto":
        return _ORDER[op, "triton" if x.is_cuda else "native"]
    if name == "torch":
        return _TORCH
    if name == "native" and not x.is_cpu:
        raise ValueError(
            f"backend 'native' runs CPU tensors, got a tensor on {x.device}; "
            "use softk.use_backend('auto') or move x to the CPU"
        )
    if name == "triton" and not (x.is_cuda or registry.triton_interpreted()):
        raise ValueError(
            f"backend 'triton' runs CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), "
            f"got a tensor on {x.device}; use softk.use_backend('torch') or move x to a GPU"
        )
    return _ORDER[op, name]


def pick(op: str, x: Tensor, *what) -> Kernel | None:
    """The kernel that runs ``op`` on ``x`` (and ``what``, the op's other
    arguments that decide it: the family, k, τ, the target) under the current
    setting, or None: the op's own tensor code runs.  Raises the ValueError
    of :func:`order` for a named backend that cannot run ``x``."""
    tried: tuple[tuple[str, str], ...] | None = None
    for name in order(op, x):
        kernel = KERNELS.get((op, name))
        why = f"no {name} kernel" if kernel is None else kernel.serves(x, *what)
        if why is None:
            if _explaining:
                _record(op, x, what, kernel, tried)
            return kernel
        tried = ((name, why),) if tried is None else (*tried, (name, why))
    if _explaining:
        _record(op, x, what, None, tried)
    return None


# ------------------------------------------------------------------ explain
class Choice(NamedTuple):
    """One dispatch decision, as :func:`softk.explain` records it."""

    op: str
    what: str  # the family (or nothing) the op ran for
    shape: tuple
    dtype: str
    device: str
    setting: str
    backend: str | None  # None: the op's own tensor code
    passed: tuple  # ((backend, why it did not serve), ...), in the order tried

    def __str__(self) -> str:
        ran = self.backend or "its tensor code (no kernel serves)"
        head = f"{self.op}{self.what} on {self.dtype} {tuple(self.shape)} {self.device} [setting {self.setting!r}]: {ran}"
        return head + "".join(f"\n    not {b}: {why}" for b, why in self.passed)


_LOG = threading.local()
_explaining = 0  # how many explain() blocks are open, in any thread (a plain call reads only this)


def _record(op, x, what, kernel, tried) -> None:
    if call_mode.compiling():  # (first: a compiled graph never reads the thread-local log)
        return
    log = getattr(_LOG, "choices", None)
    if log is None:
        return
    family = next((getattr(w, "name", None) for w in what if hasattr(w, "kernel")), None)
    log.append(Choice(op, f"[{family}]" if family else "", tuple(x.shape), str(x.dtype).replace("torch.", ""),
                      str(x.device), registry.backend(), None if kernel is None else kernel.backend, tried or ()))


@contextlib.contextmanager
def explain():
    """Record which kernel runs each call inside a ``with`` block, and why
    the kernels tried before it did not (thread-local; eager calls).

    Yields a list that fills with one :class:`Choice` per decision (a map's
    forward, a loss, an attention call; the backward runs where its forward
    ran), printable one per line.

    >>> import torch, softk
    >>> with softk.use_backend("torch"), softk.explain() as choices:
    ...     _ = softk.sparsemax(torch.zeros(2, 5))
    >>> print(choices[0])
    threshold[sparsemax] on float32 (2, 5) cpu [setting 'torch']: torch
    """
    global _explaining
    previous = getattr(_LOG, "choices", None)
    _LOG.choices = choices = []
    _explaining += 1
    try:
        yield choices
    finally:
        _explaining -= 1
        _LOG.choices = previous
