"""Backend selection: ``softk.backend()``, ``softk.use_backend(name)``, ``SOFTK_BACKEND``.

"auto" (default) runs CUDA tensors with the Triton kernels when triton is
installed, CPU tensors with the compiled CPU kernels ("native", see
:mod:`softk._backends.native`) when a C compiler works here, and everything else with
"torch", the reference PyTorch implementation (exact on every device).

"torch" forces the reference implementation.  "native" forces the compiled CPU
kernels (a ValueError where they cannot be built, or for a tensor that is not
on the CPU); they cover softmax, sparsemax, entmax15, entmax with 1 < α ≤ 2
and soft top-k "exp", and the other maps run on "torch" under it.  "triton"
forces the Triton kernels: asking for it where triton is not installed, or
for a CPU tensor without ``TRITON_INTERPRET=1`` (Triton's CPU interpreter,
used by the tests), is a ValueError.  ``_AVAILABLE`` says which settings
can run here (name -> function).  Which kernel then runs a call is
:func:`softk._backends.dispatch.pick`'s answer, from the setting, the
input and what each kernel serves (Triton computes in float32, so float64
inputs use "torch" under it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading


def _constant_under_compile(fn):
    """Mark ``fn`` as torch.compile's ``assume_constant_result`` does (its
    result is read once, when a graph is captured) without importing
    torch._dynamo, which would add seconds to ``import softk``."""
    fn._dynamo_marked_constant = True
    return fn


_triton_found = None


@_constant_under_compile
def triton_importable() -> bool:
    """True when the ``triton`` package is installed (not imported here;
    looked up once per process, and read once when a graph is captured)."""
    global _triton_found
    if _triton_found is None:
        _triton_found = importlib.util.find_spec("triton") is not None
    return _triton_found


def triton_interpreted() -> bool:
    """True when Triton's CPU interpreter is on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_native_ok = None


@_constant_under_compile
def native_available() -> bool:
    """True when the compiled CPU kernels load (compiling them on first use).

    Read once per process (``SOFTK_NATIVE`` included): the answer cannot
    change once the library has loaded or failed to."""
    global _native_ok
    if _native_ok is None:
        from .native import build

        _native_ok = build.enabled() and build.library() is not None
    return _native_ok


_AVAILABLE = {"auto": lambda: True, "torch": lambda: True, "native": native_available, "triton": triton_importable}
_state = threading.local()

if os.name == "posix" and isinstance(getattr(os.environ, "_data", None), dict):
    def _env_backend():
        # os.environ's own table (bytes keys): os.environ.get encodes the key on every call
        value = os.environ._data.get(b"SOFTK_BACKEND")
        return None if value is None else os.fsdecode(value)
else:  # pragma: no cover
    def _env_backend():
        return os.environ.get("SOFTK_BACKEND")


def _check(name: str, source: str) -> str:
    if name not in _AVAILABLE:
        raise ValueError(f"{source} must be one of {sorted(_AVAILABLE)}, got {name!r}")
    if not _AVAILABLE[name]():
        raise ValueError(
            f"{source}={name!r}: that backend cannot run on this machine"
            + (" (install it with: pip install 'softk[triton]')" if name == "triton" else "")
            + (" (it needs a C compiler: install gcc, or set SOFTK_CC; SOFTK_NATIVE=0 disables it)" if name == "native" else "")
        )
    return name


@_constant_under_compile
def backend() -> str:
    """The configured backend name: "auto" (default), "torch", "native" or "triton".

    >>> import softk
    >>> softk.backend() in ("auto", "torch", "native", "triton")
    True
    """
    name = getattr(_state, "name", None)
    if name is None:
        name = _env_backend()  # read on every call: a test or a launcher may set it at run time
        return "auto" if name is None or name == "auto" else _check(name, "SOFTK_BACKEND")
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
