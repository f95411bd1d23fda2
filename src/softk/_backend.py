"""Backend selection: ``softk.backend()``, ``softk.use_backend(name)``, ``SOFTK_BACKEND``.

"auto" (default) runs CUDA tensors with the Triton kernels when triton is
installed and everything else with "torch", the reference PyTorch
implementation (exact on every device).  "triton" forces the kernels: asking
for it where triton is not installed, or for a CPU tensor without
``TRITON_INTERPRET=1`` (Triton's CPU interpreter, used by the tests), is a
ValueError.  Backends register themselves in ``_AVAILABLE`` (name -> function
telling whether it can run here).  Triton computes in float32, so float64
inputs always use "torch".
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading


def triton_importable() -> bool:
    """True when the ``triton`` package is installed (not imported here)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreted() -> bool:
    """True when Triton's CPU interpreter is on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_AVAILABLE = {"auto": lambda: True, "torch": lambda: True, "triton": triton_importable}
_state = threading.local()


def _check(name: str, source: str) -> str:
    if name not in _AVAILABLE:
        raise ValueError(f"{source} must be one of {sorted(_AVAILABLE)}, got {name!r}")
    if not _AVAILABLE[name]():
        raise ValueError(
            f"{source}={name!r}: that backend cannot run on this machine"
            + (" (install it with: pip install 'softk[triton]')" if name == "triton" else "")
        )
    return name


def backend() -> str:
    """The configured backend name: "auto" (default), "torch" or "triton".

    >>> import softk
    >>> softk.backend() in ("auto", "torch", "triton")
    True
    """
    name = getattr(_state, "name", None)
    if name is None:
        return _check(os.environ.get("SOFTK_BACKEND", "auto"), "SOFTK_BACKEND")
    return name


@contextlib.contextmanager
def use_backend(name: str):
    """Use backend ``name`` inside a ``with`` block (thread-local).

    >>> import softk
    >>> with softk.use_backend("torch"):
    ...     softk.backend()
    'torch'
    """
    _check(name, "name")
    previous = getattr(_state, "name", None)
    _state.name = name
    try:
        yield name
    finally:
        _state.name = previous


def resolve(x) -> str:
    """The concrete backend that runs ``x`` under the current setting."""
    name = backend()
    runnable = x.is_cuda or triton_interpreted()
    if name == "auto":
        return "triton" if x.is_cuda and triton_importable() else "torch"
    if name == "triton" and not runnable:
        raise ValueError(
            f"backend 'triton' runs CUDA tensors (or CPU tensors under TRITON_INTERPRET=1), "
            f"got a tensor on {x.device}; use softk.use_backend('torch') or move x to a GPU"
        )
    return name
