"""The package's public surface has no stale module paths: the first layout's
paths are gone (no import hook answers for them), and no public package
holds a module named like a function users call."""

import importlib
import pkgutil
import subprocess
import sys
import types

import pytest

import softk

PUBLIC = ["softk", "softk.losses", "softk.nn", "softk.attention", "softk.distributed", "softk.compat", "softk.integrations",
          "softk.threshold", "softk.families"]


@pytest.mark.parametrize("old", ["softk.dispatch", "softk.topk", "softk.simplex", "softk.seed_properties", "softk.native"])
def test_old_module_paths_are_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)
    with pytest.raises(AttributeError):
        getattr(softk, old.split(".", 1)[1])


def test_softk_topk_is_not_a_callable_trap():
    # it was a module alias: softk.topk(x, 3) said "'module' object is not callable"
    assert not hasattr(softk, "topk")
    assert not isinstance(getattr(softk.losses, "topk_softmax_ce", None), types.ModuleType)


def test_no_public_module_is_named_like_a_public_function():
    for name in PUBLIC:
        pkg = importlib.import_module(name)
        if not hasattr(pkg, "__path__"):
            continue
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name.startswith("_"):
                continue
            # a public callable of that name hides the module behind it (softk.losses.cross_entropy
            # was the function, `import softk.losses.cross_entropy` the module)
            callables = {n for n in dir(pkg) if not n.startswith("_") and callable(getattr(pkg, n))
                         and not isinstance(getattr(pkg, n), types.ModuleType)}
            assert info.name not in callables, (name, info.name)


def test_import_installs_no_meta_path_finder():
    code = "import sys; before = list(sys.meta_path); import softk; print(len(sys.meta_path) - len(before))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "0"


def test_the_import_layers_hold():
    # the floors of docs/architecture.md, as the contract in .importlinter states them
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    from tests.paths import REPO

    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
