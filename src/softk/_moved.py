"""Old module paths, kept for one release after the reorganisation.

``MOVED`` maps each module path of softk's first layout to where the code
lives now, and ``MOVED_NAMES`` the names that left a package which stays.  Importing an old path (``import softk.dispatch``,
``from softk.seed_properties import properties``) or reaching it as an
attribute (``softk.topk.METHODS``) still works and gives the new module
itself, with a DeprecationWarning that names the new place.  Nothing here
runs unless an old path is used: the finder answers only for these names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "softk._backend": "softk._backends.registry",
    "softk.dispatch": "softk._backends.dispatch",
    "softk.native": "softk._backends.native",
    "softk.triton": "softk._backends.triton",
    "softk.simplex": "softk._maps.simplex",
    "softk.simplex_triton": "softk._maps.simplex_triton_ops",
    "softk.topk": "softk._maps.soft_topk",
    "softk.hard": "softk._maps.hard",
    "softk.iterative": "softk._maps.iterative",
    "softk.gradtopk": "softk._maps.gradtopk",
    "softk.gradtopk_scan": "softk._maps.gradtopk_scan",
    "softk.gradtopk_tree": "softk._maps.gradtopk_tree",
    "softk.topk_smooth_sum": "softk._maps.topk_sum",
    "softk.routing": "softk._maps.routing",
    "softk.support_info": "softk._maps.support",
    "softk.seed_properties": "softk._maps.properties",
    "softk.cli": "softk._cli",
    "softk.experiments": "softk._experiments",
    "softk.bench": "softk._cli.harness",
    "softk.threshold.op": "softk._contract.op",
    "softk.threshold.op_rowk": "softk._contract.per_row_k",
    "softk.threshold.family_keys": "softk._contract.family_keys",
    "softk.threshold.potential": "softk._contract.potential",
}


# names that left a package which stays (the package's __getattr__ asks here)
MOVED_NAMES = {
    "softk.threshold.threshold_map": "softk._contract.op",
}


def new_name(old: str) -> str | None:
    """Where an old dotted module path lives now (None: it did not move)."""
    for prefix, target in MOVED.items():
        if old == prefix or old.startswith(prefix + "."):
            return target + old[len(prefix):]
    return None


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"{old} is an old path: it now lives in {new} (private). Import the public "
        f"names from softk (e.g. softk.soft_topk); the old path goes in the next release.",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _AliasLoader(importlib.abc.Loader):
    """Hands back the module at its new path: one module object under two names."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        return importlib.import_module(self.new)

    def exec_module(self, module):  # the new module has run already
        pass


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        warn(fullname, new, stacklevel=4)
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


def moved_name(package: str, name: str):
    """``package.name`` for a name that moved out of a package that stays."""
    where = MOVED_NAMES.get(f"{package}.{name}")
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warn(f"{package}.{name}", f"{where}.{name}", stacklevel=4)
    return getattr(importlib.import_module(where), name)


def attribute(name: str):
    """``softk.<name>`` for an old top-level module name, else AttributeError."""
    new = new_name(f"softk.{name}")
    if new is None or "." in name:
        raise AttributeError(f"module 'softk' has no attribute {name!r}")
    warn(f"softk.{name}", new, stacklevel=4)
    return importlib.import_module(new)
