r"""One dispatch: which backend runs a call, decided once per call.

Every call that has more than one backend asks here, with one function per
kind of call; each turns the configured backend (:mod:`softk._backends.registry`:
``"auto"``, ``"torch"``, ``"native"`` or ``"triton"``) and the input (device,
dtype) into the backend that runs this call:

* :func:`resolve` (a threshold map, a loss or a potential that reaches λ
  through the maps): ``"torch"``, ``"native"`` or ``"triton"``.  The name is
  recorded by the autograd rule (:mod:`softk._ops.op`) so that the backward
  runs where the forward ran;
* :func:`log_softmax_backend` (log_softmax and logsumexp): ``"triton"`` or
  None (torch's own tensor code);
* :func:`fused_loss_backend` (the fused Fenchel–Young loss): ``"native"``,
  ``"triton"`` or None (the unfused loss through :func:`resolve`);
* :func:`topk_softmax_ce_backend` (Su's top-k softmax cross-entropy):
  ``"native"`` or None (its tensor code);
* :func:`live_tiles_backend` (the fused linear loss's backward products on
  a sparse gradient): ``"triton"`` or None (torch's products);
* :func:`attention_backend` (sparse attention): ``"reference"``,
  ``"blockwise"`` or ``"triton"``.

Each backend implements the same two functions on *rows* (the map's
dimension last, any leading shape):

* ``forward(family, x, k, tau) -> p`` with p = f((x − max)/τ − λ), Σp = k,
  returned in ``x.dtype`` and following the row conventions of
  :mod:`softk.threshold.rows`;
* ``backward(family, p, g, tau) -> dx``, the vector–Jacobian product
  d ⊙ (g − Σ(d⊙g)/Σd)/τ from the saved output alone.

A family says which kernels serve it (:attr:`softk.threshold.Family.kernel`
and ``Family.native``); a backend that does not serve a family (or a dtype:
the Triton kernels compute in float32, the compiled CPU kernels take
float32/float64) sends the call to ``"torch"``, the reference path, which
serves every family on every device.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from . import registry as _backend, native
from ..threshold.families import SOFTMAX, Family
from ..threshold.rows import compute_dtype, scaled_rows
from ..threshold import torch_path


def _in_compute_dtype(vjp, family: Family, p: Tensor, g: Tensor, tau: float) -> Tensor:
    """Run a backward in the compute dtype (half inputs: float32), return p's dtype."""
    ct = compute_dtype(p.dtype)
    if p.dtype == ct:
        return vjp(family, p, g if g.dtype == ct else g.to(ct), tau)
    return vjp(family, p.to(ct), g.to(ct), tau).to(p.dtype)


class TorchBackend:
    """The reference PyTorch implementation (every family, every device)."""

    name = "torch"

    @staticmethod
    def serves(family: Family, x: Tensor) -> bool:
        return True

    @staticmethod
    def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
        return torch_path.forward(family, scaled_rows(x, tau, family, k), k).to(x.dtype)

    @staticmethod
    def backward(family: Family, p: Tensor, g: Tensor, tau: float) -> Tensor:
        return _in_compute_dtype(torch_path.vjp, family, p, g, tau)


class NativeBackend:
    """The compiled CPU kernels (:mod:`softk._backends.native`)."""

    name = "native"

    @staticmethod
    def serves(family: Family, x: Tensor) -> bool:
        return family.native and x.is_cpu and (x.dtype == torch.float32 or x.dtype == torch.float64)

    @staticmethod
    def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
        # The kernels find λ relative to the row themselves; x/τ is formed
        # after the shift (τ ≠ 1), as on every path.  serves() took only
        # float32/float64, which the kernels compute in.
        return native.forward(family, x if tau == 1.0 else scaled_rows(x, tau, family, k), k)

    @staticmethod
    def backward(family: Family, p: Tensor, g: Tensor, tau: float) -> Tensor:
        return native.backward(family, p, g, tau)  # p is float32/float64, as serves() took


class TritonBackend:
    """The Triton kernels (:mod:`softk._backends.triton`), float32 arithmetic inside."""

    name = "triton"

    @staticmethod
    def serves(family: Family, x: Tensor) -> bool:
        if family.kernel is None or x.dtype == torch.float64:
            return False
        if family.alpha_value is None:
            return True
        from .triton.function import serves  # an α the float32 kernels cannot keep exact goes to torch

        return serves(family.kernel, family.alpha_value)

    @staticmethod
    def forward(family: Family, x: Tensor, k: int, tau: float) -> Tensor:
        from .triton.function import forward_rows

        rows = x.contiguous().view(-1, x.shape[-1])
        if family.kernel == 0 and k == 1:
            # softmax: the dedicated kernel (online max + sum, several rows per program)
            from .triton.softmax import softmax_rows

            return softmax_rows(rows, tau).view(x.shape)
        return forward_rows(rows, family.kernel, k, tau, family.alpha_value).view(x.shape)

    @staticmethod
    def backward(family: Family, p: Tensor, g: Tensor, tau: float) -> Tensor:
        from .triton.function import backward_rows

        n = p.shape[-1]
        p_rows, g_rows = p.contiguous().view(-1, n), g.to(p.dtype).contiguous().view(-1, n)
        if family.kernel == 0:  # softmax (k = 1 always): the dedicated kernel's backward
            from .triton.softmax import softmax_backward_rows

            return softmax_backward_rows(p_rows, g_rows, tau).view(p.shape)
        return backward_rows(p_rows, g_rows, family.kernel, tau, family.alpha_value).view(p.shape)


BACKENDS = {b.name: b for b in (TorchBackend, NativeBackend, TritonBackend)}


def resolve(x: Tensor, family: Family) -> str:
    """The backend that runs ``family`` on ``x`` under the current setting.

    Raises the ValueError of :func:`softk._backends.registry.resolve` for a backend
    that cannot run ``x`` at all (e.g. "native" for a CUDA tensor)."""
    name = _backend.resolve(x)
    backend = BACKENDS.get(name)
    if backend is None or not backend.serves(family, x):
        return "torch"
    return name


def log_softmax_backend(x: Tensor, tau) -> str | None:
    """"triton" when the Triton kernels run log_softmax/logsumexp of ``x``:
    :func:`resolve` picks "triton" for softmax and τ is a number (a τ that
    requires grad takes the tensor code, which differentiates it); else None."""
    if isinstance(tau, Tensor) or x.numel() == 0:
        return None
    return "triton" if resolve(x, SOFTMAX) == "triton" else None


_HALF = (torch.float16, torch.bfloat16)


def fused_loss_backend(x: Tensor, family: Family, k) -> str | None:
    """"native" or "triton" when a fused Fenchel–Young kernel serves this call, else None.

    The backend is the one :func:`resolve` picks for the rows in their
    compute dtype (as for the unfused loss).  Served: a family with a kernel
    on that backend; an int k, or on the CPU one integral k per row that
    needs no gradient; a non-empty input; no ``torch.func`` transform."""
    if family.kernel is None or x.numel() == 0:
        return None
    probe = torch.empty(0, dtype=torch.float32, device=x.device) if x.dtype in _HALF else x
    name = resolve(probe, family)
    if name not in ("native", "triton"):
        return None
    compiling = torch.compiler.is_compiling()
    if isinstance(k, Tensor) and (name == "triton" or compiling or k.requires_grad or not torch.equal(k, k.floor())):
        return None
    if compiling:
        return name
    if torch._C._are_functorch_transforms_active():
        return None
    return name


def topk_softmax_ce_backend(x: Tensor) -> str | None:
    """"native" when the compiled CPU kernel runs Su's top-k softmax
    cross-entropy of ``x`` (the configured backend resolves to "native" for
    it), else None.  The caller also requires a plain eager call."""
    return "native" if x.numel() and _backend.resolve(x) == "native" else None


@functools.lru_cache(maxsize=None)
def triton_live_tiles():
    """softk._backends.triton.live_tiles, or None where it is not built (read once)."""
    try:
        from .triton import live_tiles as module
    except ImportError:
        return None
    return module


def live_tiles_backend(x: Tensor) -> str | None:
    """"triton" when the fused linear loss runs its backward products on the
    live vocabulary tiles of a sparse gradient
    (:mod:`softk._backends.triton.live_tiles`) for inputs ``x``, else None.

    Only where the backend is set to "triton" explicitly, on a CUDA tensor
    in float32 or a half dtype, with the kernels built: under "auto" the
    dense products (cuBLAS) stay until a GPU has measured the crossover.
    A CPU tensor never takes it here (the CPU has its live columns); tests
    reach the kernels on CPU tensors through the interpreter directly."""
    if not x.is_cuda or x.dtype == torch.float64 or _backend.backend() != "triton":
        return None
    return "triton" if triton_live_tiles() is not None else None


@functools.lru_cache(maxsize=None)
def triton_attention():
    """softk._backends.triton.attention, or None where it is not built (read once)."""
    try:
        from .triton import attention as module
    except ImportError:
        return None
    return module


def _triton_attention_ready() -> bool:
    return triton_attention() is not None


_triton_attention_ready._dynamo_marked_constant = True  # read once when a graph is captured

ATTENTION_BACKENDS = ("reference", "blockwise", "triton")


def attention_backend(q: Tensor) -> str:
    """The backend that runs attention on ``q`` under the configured setting:

    * ``"reference"`` (setting "torch"): the scores materialised, softk's maps applied;
    * ``"blockwise"`` ("native", and "auto" on any device without Triton):
      blocks of keys (:mod:`softk._backends.blockwise`; it needs no C compiler);
    * ``"triton"`` ("triton", and "auto" on CUDA): the fused kernels of
      :mod:`softk._backends.triton.attention`; float64 inputs, or a build
      without triton, run "blockwise"."""
    configured = _backend.backend()
    name = _backend.resolve(q, native_ok=lambda: True)  # the blockwise backend needs no C compiler
    if name == "torch" and configured == "torch":
        return "reference"
    if name == "triton" and q.dtype != torch.float64 and _triton_attention_ready():
        return "triton"
    return "blockwise"


def get(name: str):
    """The backend object registered under ``name``."""
    return BACKENDS[name]
