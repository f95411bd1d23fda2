r"""Where a DTensor enters the public maps and losses: a hook that :mod:`softk.distributed` fills.

Each public map (``softk.softmax``, ``log_softmax``, ``sparsemax``,
``entmax15``, ``entmax``, ``soft_topk``) and loss (``cross_entropy``,
``softmax_loss``, ``sparsemax_loss``, ``entmax15_loss``, ``entmax_loss``,
``soft_topk_loss``, ``topk_softmax_cross_entropy``) is wrapped by
:func:`entry`.  A call whose first argument is a plain ``torch.Tensor`` pays
one ``type(x) is Tensor`` test and goes on; a DTensor goes to the handler
that :mod:`softk.distributed.dtensor` registers, which runs the
vocab-parallel machinery with the group and slice offset read from the mesh
and placements (or the function itself on the local shard when the classes
are not sharded).

Why a hook and not an import: the import layers (``.importlinter``, see
docs/architecture.md) put ``softk.distributed`` above ``softk.losses`` and
``softk._maps``, so those may not import it, not even inside a function.
This module imports nothing of softk; the package root (``softk/__init__``,
above every floor) gives it a loader that imports ``softk.distributed``,
which registers the handler.  The first DTensor that reaches an entry calls
it, so that ``import softk`` does not pay for the distributed package (a
sizeable share of the import) and a plain call never does.
"""

from __future__ import annotations

import functools

from torch import Tensor

_handler = None
_loader = None
_dtensor_cls = None


def register(handler) -> None:
    """``handler(kind, name, fn, args, kwargs)`` serves every call whose first argument is a DTensor."""
    global _handler
    _handler = handler


def set_loader(loader) -> None:
    """``loader()`` imports the package that registers the handler (called
    once, by the first DTensor that finds none)."""
    global _loader
    _loader = loader


def is_dtensor(x) -> bool:
    """True for a ``torch.distributed.tensor.DTensor`` (False for plain tensors at the cost of one test)."""
    global _dtensor_cls
    if type(x) is Tensor or not isinstance(x, Tensor):
        return False
    if _dtensor_cls is None:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # a torch without torch.distributed
            DTensor = ()  # type: ignore[misc, assignment]  # isinstance(x, ()) is always False
        _dtensor_cls = DTensor
    return isinstance(x, _dtensor_cls)


def entry(kind: str, name: str):
    """Decorate the public map or loss ``name`` (``kind`` "map" or "loss") with the DTensor entry."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            x = args[0] if args else next(iter(kwargs.values()), None)
            if type(x) is Tensor or not is_dtensor(x):
                return fn(*args, **kwargs)
            if _handler is None and _loader is not None:
                _loader()  # registers the handler (see the module docstring)
            if _handler is None:
                raise RuntimeError(f"softk.{name} got a DTensor, but softk.distributed did not register its entry")
            return _handler(kind, name, fn, args, kwargs)

        return wrapper

    return deco
