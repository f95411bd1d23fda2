"""Implementations timed by ``benchmarks/gpu/gpu.py`` and checked by ``gpu_correctness.py``.

An :class:`Impl` names a provider ("torch", "softk", or a peer package) and
maps each op it serves to a builder; :func:`load` imports the provider once
and returns either its functions or the reason it cannot run ("not
installed: ..."), so a missing peer becomes a row that says so, never a
crash.  Map functions take x (rows × cols, reduced along dim −1) and return
the tensor to back-propagate through; loss functions take (x, target) and
return a scalar.

Peers (``isolate=True``) run in a child process (``gpu_isolate``): the
entmax package hits a device-side assert on a fully masked row, which kills
the CUDA context of the process it runs in, and a Triton peer that faults
would do the same.  Import names were read from the released wheels
(adasplash 0.2.2: ``adasplash.triton_sparsemax``, ``triton_entmax15``,
``triton_entmax(x, alpha)``; liger-kernel 0.8.5:
``liger_kernel.transformers.functional.liger_sparsemax`` and
``liger_cross_entropy``); where a release lacks that name, the other
layouts listed in the builders are tried in turn, and an op none of them
provides is reported "not available".
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import dataclass
from typing import Callable

SOFT_TOPK_OPS = {f"soft_topk_{m}_k{k}": (m, k) for m in ("exp", "sigmoid", "laplace", "sparse") for k in (2, 64)}


@dataclass(frozen=True)
class Impl:
    """A provider: ``build(module) -> {op: fn}``; ``dist`` is the pip name whose version is reported."""

    name: str
    modules: tuple[str, ...]
    build: Callable[[dict], dict]
    dist: str | None = None
    isolate: bool = False
    mutates_input: bool = False  # writes into x (Liger's cross-entropy stores the gradient there)


def _first(mods: dict, *paths: str):
    """The first attribute path ``module:attr`` that resolves, and its name; (None, None) otherwise."""
    for path in paths:
        mod_name, attr = path.split(":")
        mod = mods.get(mod_name)
        if mod is None:
            try:
                mod = importlib.import_module(mod_name)
            except Exception:  # noqa: BLE001 - any import failure means "not this layout"
                continue
        fn = getattr(mod, attr, None)
        if fn is not None:
            return fn, path
    return None, None


def _build_torch(mods):
    import torch
    import torch.nn.functional as F

    def route_top2(x):
        w, _ = torch.softmax(x, -1).topk(2, dim=-1)
        return w / w.sum(-1, keepdim=True)

    return {
        "softmax": lambda x: torch.softmax(x, -1),
        "route_top2": route_top2,
        "cross_entropy": lambda x, t: F.cross_entropy(x, t),
    }


def _build_softk(mods):
    softk = mods["softk"]
    fns = {
        "softmax": softk.softmax,
        "sparsemax": softk.sparsemax,
        "entmax15": softk.entmax15,
        "entmax_a1.3": lambda x: softk.entmax(x, 1.3),
        "route_top2": lambda x: softk.topk_softmax(x, 2),
        "cross_entropy": lambda x, t: softk.losses.cross_entropy(x, t),
        "sparsemax_loss": lambda x, t: softk.losses.sparsemax_loss(x, t),
        "entmax15_loss": lambda x, t: softk.losses.entmax15_loss(x, t),
        "softmax_loss": lambda x, t: softk.losses.softmax_loss(x, t),
    }
    for op, (method, k) in SOFT_TOPK_OPS.items():
        fns[op] = lambda x, k=k, method=method: softk.soft_topk(x, k, method=method)
    return fns


def _build_entmax(mods):
    em = mods["entmax"]
    return {
        "sparsemax": lambda x: em.sparsemax(x, dim=-1),
        "entmax15": lambda x: em.entmax15(x, dim=-1),
        "entmax_a1.3": lambda x: em.entmax_bisect(x, alpha=1.3, dim=-1),
        "sparsemax_loss": lambda x, t: em.sparsemax_loss(x, t).mean(),
        "entmax15_loss": lambda x, t: em.entmax15_loss(x, t).mean(),
    }


def _build_adasplash(mods):
    sp, _ = _first(mods, "adasplash:triton_sparsemax", "adasplash.triton_entmax_v2:triton_sparsemax")
    e15, _ = _first(mods, "adasplash:triton_entmax15", "adasplash.triton_entmax_v2:triton_entmax15")
    ea, _ = _first(mods, "adasplash:triton_entmax", "adasplash.triton_entmax_v2:triton_entmax", "adasplash.triton_entmax:triton_entmax")
    fns = {}
    if sp is None and ea is not None:  # older releases: only the α-generic entry point
        sp = lambda x: ea(x, alpha=2.0)  # noqa: E731
    if e15 is None and ea is not None:
        e15 = lambda x: ea(x, alpha=1.5)  # noqa: E731
    if sp is not None:
        fns["sparsemax"] = sp
    if e15 is not None:
        fns["entmax15"] = e15
    if ea is not None:
        fns["entmax_a1.3"] = lambda x: ea(x, alpha=1.3)
    if not fns:
        raise ImportError("adasplash has none of triton_sparsemax / triton_entmax15 / triton_entmax")
    return fns


def _build_liger(mods):
    sp, _ = _first(mods, "liger_kernel.transformers.functional:liger_sparsemax", "liger_kernel.ops.sparsemax:LigerSparsemaxFunction")
    ce, _ = _first(mods, "liger_kernel.transformers.functional:liger_cross_entropy")
    fns = {}
    if sp is not None:
        fns["sparsemax"] = (lambda x: sp.apply(x, -1)) if hasattr(sp, "apply") else (lambda x: sp(x, dim=-1))
    if ce is not None:
        fns["cross_entropy"] = lambda x, t: ce(x, t)
    if not fns:
        raise ImportError("liger_kernel has neither liger_sparsemax nor liger_cross_entropy")
    return fns


IMPLS = {
    "torch": Impl("torch", ("torch",), _build_torch, dist="torch"),
    "softk": Impl("softk", ("softk",), _build_softk, dist=None),
    "entmax": Impl("entmax", ("entmax",), _build_entmax, dist="entmax", isolate=True),
    "adasplash": Impl("adasplash", ("adasplash",), _build_adasplash, dist="adasplash", isolate=True),
    "liger": Impl("liger", ("liger_kernel",), _build_liger, dist="liger-kernel", isolate=True, mutates_input=True),
}
# Which impls are listed for each op (an impl that turns out not to serve it is "not available").
SERVES = {
    "softmax": ("torch", "softk"),
    "sparsemax": ("softk", "entmax", "adasplash", "liger"),
    "entmax15": ("softk", "entmax", "adasplash"),
    "entmax_a1.3": ("softk", "entmax", "adasplash"),
    "route_top2": ("torch", "softk"),
    "cross_entropy": ("torch", "softk", "liger"),
    "sparsemax_loss": ("softk", "entmax"),
    "entmax15_loss": ("softk", "entmax"),
    "softmax_loss": ("softk",),
}
SERVES.update({op: ("softk",) for op in SOFT_TOPK_OPS})
# A router row is a MoE gate: AdaSplash's row kernels are the only peer kernels listed there.
ROUTER_SERVES = {"softmax": ("torch",), "sparsemax": ("softk", "adasplash"), "entmax15": ("softk", "adasplash"),
                 "soft_topk_exp_k2": ("softk",), "route_top2": ("torch", "softk")}


def impls_for(group: str, op: str) -> tuple[str, ...]:
    """The impl names timed for ``op`` in ``group``; the group's baseline impl first."""
    table = ROUTER_SERVES if group == "router" else SERVES
    return table.get(op, ())


_LOADED: dict[str, tuple[dict | None, str, str | None]] = {}


def load(name: str, registry: dict | None = None) -> tuple[dict | None, str, str | None]:
    """``(fns or None, detail, version)`` for impl ``name``: detail is "ok" or why it cannot run."""
    registry = IMPLS if registry is None else registry
    cache_key = f"{id(registry)}:{name}"
    if cache_key in _LOADED:
        return _LOADED[cache_key]
    impl = registry[name]
    mods = {}
    try:
        for m in impl.modules:
            mods[m] = importlib.import_module(m)
        fns, detail = impl.build(mods), "ok"
    except ImportError as e:
        fns, detail = None, f"not installed: {type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a peer that fails to import on this torch/triton is reported, not fatal
        fns, detail = None, f"import failed: {type(e).__name__}: {e}"
    version = None
    if impl.dist:
        try:
            version = importlib.metadata.version(impl.dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
    elif fns is not None:
        version = getattr(mods.get(impl.modules[0]), "__version__", None)
    _LOADED[cache_key] = (fns, detail, version)
    return _LOADED[cache_key]
