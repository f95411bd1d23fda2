"""Backend selection: ``softk.backend()``, ``softk.use_backend(name)``, ``SOFTK_BACKEND``.

"auto" picks the fastest backend available for a tensor; "torch" is the
reference PyTorch implementation, exact on every device.  More backends
register themselves in ``_AVAILABLE`` (name -> function telling whether it can
run here).
"""

from __future__ import annotations

import contextlib
import os
import threading

_AVAILABLE = {"auto": lambda: True, "torch": lambda: True}
_state = threading.local()


def _check(name: str, source: str) -> str:
    if name not in _AVAILABLE:
        raise ValueError(f"{source} must be one of {sorted(_AVAILABLE)}, got {name!r}")
    if not _AVAILABLE[name]():
        raise ValueError(f"{source}={name!r}: that backend cannot run on this machine")
    return name


def backend() -> str:
    """The configured backend name: "auto" (default), "torch", ...

    >>> import softk
    >>> softk.backend() in ("auto", "torch")
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
    return "torch" if name == "auto" else name
