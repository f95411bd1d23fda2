r"""The one registry of kernels: ``(op, backend) → Kernel``.

An *op* is one computation softk has more than one implementation of; a
*kernel* is one implementation, on one *backend*.  The backend names are one
vocabulary, the setting's (:mod:`softk._backends.registry`): ``"torch"``
(tensor code, every device), ``"native"`` (the CPU kernels) and ``"triton"``
(the GPU kernels).  Each kernel says what it serves: ``serves(x, *what)``
returns None when it runs this call, or a short reason why not (the device,
the dtype, the family, an option, a build that lacks it), which
:func:`softk.explain` shows.  :func:`softk._backends.dispatch.pick` tries the
kernels of an op in the order the setting gives and takes the first that
serves; ops look kernels up there and never compare backend names.

The ops:

===================  ===========================================================  =========
op                   what a kernel computes                                       fallback
===================  ===========================================================  =========
``threshold``        p = f(x/τ − λ), Σp = k on rows, and its backward from p      torch
                     (and x, for ``Family.slope_from_x``)
``fenchel_young``    the Fenchel–Young loss and its gradient, one pass per row    —
``log_softmax``      log softmax(x/τ) and τ·logsumexp(x/τ) on rows                —
``topk_softmax_ce``  Su's top-k softmax cross-entropy and its gradient            —
``live_tiles``       the fused linear loss's backward products on G's live tiles  —
``attention``        sparse attention's forward and backward over blocks of keys  native
===================  ===========================================================  =========

The fallback is tried after the backend the setting names.  Where no kernel
of an op serves a call (no fallback, or the setting "torch" for an op with
no torch kernel) the dispatcher answers None and the op runs its own
differentiable tensor code, the reference it is tested against: the unfused
loss, torch's log-softmax with softk's row conventions, the cross-entropy's
formula, the dense products, the attention scores materialised.  The
blockwise attention is torch code too, but it is the CPU's memory-efficient
kernel, so it is the ``native`` kernel of ``attention`` and serves every
device.

Each kernel's implementation is imported on first use (:attr:`Kernel.impl`),
so that ``import softk`` pulls in neither Triton nor the compiled library.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch

from ..threshold import attention_maps
from . import call_mode, registry
from .native.threshold import serves as _threshold_native
from .native.threshold import too_long as _native_too_long

BACKENDS = ("torch", "native", "triton")
_HALF = (torch.float16, torch.bfloat16)


class Op(NamedTuple):
    """One op: its name, the backends tried after the one the setting names,
    and what its kernels compute."""

    name: str
    fallback: tuple
    doc: str


class Kernel:
    """One implementation of ``op`` on ``backend``: ``serves(x, *what)`` is
    None when it runs the call and otherwise says why not; ``impl`` is the
    implementation (a module or object), imported on first use."""

    __slots__ = ("op", "backend", "serves", "_load", "_impl")

    def __init__(self, op: str, backend: str, serves: Callable, load: Callable):
        assert backend in BACKENDS, backend
        self.op, self.backend, self.serves, self._load, self._impl = op, backend, serves, load, None

    @property
    def impl(self):
        impl = self._impl
        if impl is None:
            impl = self._impl = self._load()
        return impl

    def __repr__(self) -> str:
        return f"Kernel({self.op!r}, {self.backend!r})"


# ----------------------------------------------------------------- what serves
def _native_built():
    return None if registry.native_available() else "the CPU kernels are not built here (no C compiler)"


def _triton_installed():
    return None if registry.triton_importable() else "triton is not installed"


def _threshold_triton(x, family):
    if family.kernel is None:
        return f"family {family.name!r} has no Triton kernel"
    if x.dtype == torch.float64:
        return "float64 (the Triton kernels compute in float32)"
    missing = _triton_installed()
    if missing or family.alpha_value is None:
        return missing
    global _triton_alpha
    if _triton_alpha is None:  # imported on the first call (importing triton costs seconds)
        from .triton.function import ALPHA_MAX, serves  # an α the float32 kernels cannot keep exact

        _triton_alpha = ALPHA_MAX, serves
    alpha_max, serves = _triton_alpha
    return None if serves(family.kernel, family.alpha_value) else f"alpha outside (1, {alpha_max:g}]"


_triton_alpha = None


def _compute_probe(x):
    # the rows as a fused kernel reads them: half inputs in float32
    return torch.empty(0, dtype=torch.float32, device=x.device) if x.dtype in _HALF else x


# The fused losses form Φ from λ, which for α-entmax lies near −1/(α − 1)
# and is known to eps/(α − 1) only, and so is the loss.  Below this α − 1
# the tensor path, whose ψ keeps its digits, serves the loss.
FUSED_ALPHA_MIN_GAP = 2.0**-3


def _fused_common(x, family, k):
    if family.kernel is None:
        return f"family {family.name!r} has no fused kernel"
    if x.numel() == 0:
        return "an empty input"
    a = family.alpha_value
    if a is not None and a - 1 < FUSED_ALPHA_MIN_GAP:
        return f"alpha within {FUSED_ALPHA_MIN_GAP:g} of 1 (the fused loss keeps eps/(alpha - 1) of its value)"
    if not call_mode.compiling() and call_mode.transformed():
        return "a torch.func transform (the unfused loss has the batching rules)"
    return None


def _fenchel_young_native(x, family, k):
    why = (_fused_common(x, family, k) or _native_too_long(family, x.shape[-1])
           or _threshold_native(_compute_probe(x), family))
    if why is None and isinstance(k, torch.Tensor):
        if call_mode.compiling() or k.requires_grad:
            return "one k per row under compile or with a gradient for k"
        if not torch.equal(k, k.floor()):
            return "one k per row that is not integral"
    return why


def _fenchel_young_triton(x, family, k):
    why = _fused_common(x, family, k) or _threshold_triton(_compute_probe(x), family)
    if why is None and isinstance(k, torch.Tensor):
        return "one k per row (the Triton loss kernel takes one k)"
    return why


def _log_softmax_triton(x, tau):
    if isinstance(tau, torch.Tensor):
        return "a tau that requires grad (the tensor code differentiates it)"
    if x.numel() == 0:
        return "an empty input"
    from ..threshold.families import SOFTMAX

    return _threshold_triton(x, SOFTMAX)


def _topk_softmax_ce_native(x, target):
    if x.numel() == 0:
        return "an empty input"
    if not x.is_cpu:
        return f"a tensor on {x.device}"
    if not call_mode.eager(x, target):
        return "not a plain eager call (the kernel has no library op)"
    return _native_built()


def _live_tiles_triton(x):
    if not x.is_cuda or x.dtype == torch.float64:
        return "not a float32 or half CUDA tensor"
    if registry.backend() != "triton":
        return "taken under an explicit 'triton' setting only (the dense products are the default)"
    missing = _triton_installed()
    if missing is None and live_tiles_module() is None:
        return "the live-tile kernels are not built here"
    return missing


def _attention_native(q, fam):
    # blocks of keys in tensor code: every device and dtype, the maps it has the row maths of
    return None if fam in attention_maps.KERNEL_MAPS else f"map id {fam} has no blockwise kernel"


def _attention_triton(q, fam):
    if fam not in attention_maps.KERNEL_MAPS:
        return f"map id {fam} has no Triton kernel"
    if q.dtype == torch.float64:
        return "float64 (the Triton kernels compute in float32)"
    if not triton_attention_ready():
        return "the Triton attention kernels are not built here"
    return None


# ---------------------------------------------------------- the implementations
def _torch_threshold():
    from .torch import threshold

    return threshold


def _native_threshold():
    from .native import threshold

    return threshold


def _triton_threshold():
    from .triton import threshold

    return threshold


def _native_fenchel_young():
    from .native import fenchel_young

    return fenchel_young


def _triton_fenchel_young():
    from .triton import fenchel_young

    return fenchel_young


def _native_topk_ce():
    from .native import topk_ce

    return topk_ce


def _triton_softmax():
    from .triton import softmax

    return softmax


def _blockwise():
    from .blockwise import kernel

    return kernel


@functools.lru_cache(maxsize=None)
def live_tiles_module():
    """softk._backends.triton.live_tiles, or None where it does not import (read once)."""
    try:
        from .triton import live_tiles
    except ImportError:
        return None
    return live_tiles


@functools.lru_cache(maxsize=None)
def triton_attention_module():
    """softk._backends.triton.attention, or None where it does not import (read once)."""
    try:
        from .triton import attention
    except ImportError:
        return None
    return attention


def triton_attention_ready() -> bool:
    return triton_attention_module() is not None


triton_attention_ready._dynamo_marked_constant = True  # type: ignore[attr-defined]  # read once when a graph is captured


# ---------------------------------------------------------------- the registry
OPS = {op.name: op for op in (
    Op("threshold", ("torch",), "p = f(x/τ − λ), Σp = k on rows, and its backward from p"),
    Op("fenchel_young", (), "the Fenchel–Young loss and its gradient in one pass per row"),
    Op("log_softmax", (), "log softmax(x/τ) and τ·logsumexp(x/τ) on rows, and their backward"),
    Op("topk_softmax_ce", (), "Su's top-k softmax cross-entropy and its gradient in one pass"),
    Op("live_tiles", (), "G W, Gᵀ X and Σ G on the live vocabulary tiles of a sparse gradient G"),
    Op("attention", ("native",), "sparse attention's forward and backward without the (L, S) scores"),
)}

KERNELS = {(k.op, k.backend): k for k in (
    Kernel("threshold", "torch", lambda x, family: None, _torch_threshold),
    Kernel("threshold", "native", _threshold_native, _native_threshold),
    Kernel("threshold", "triton", _threshold_triton, _triton_threshold),
    Kernel("fenchel_young", "native", _fenchel_young_native, _native_fenchel_young),
    Kernel("fenchel_young", "triton", _fenchel_young_triton, _triton_fenchel_young),
    Kernel("log_softmax", "triton", _log_softmax_triton, _triton_softmax),
    Kernel("topk_softmax_ce", "native", _topk_softmax_ce_native, _native_topk_ce),
    Kernel("live_tiles", "triton", _live_tiles_triton, live_tiles_module),
    Kernel("attention", "native", _attention_native, _blockwise),
    Kernel("attention", "triton", _attention_triton, triton_attention_module),
)}
assert all(op in OPS for op, _ in KERNELS), "every kernel belongs to an op"


def get(op: str, backend: str) -> Kernel:
    """The kernel of ``op`` on ``backend`` (a name the dispatcher gave)."""
    return KERNELS[op, backend]
