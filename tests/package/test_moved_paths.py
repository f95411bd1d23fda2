"""The module paths of the first layout still work for one release: each
gives the module at its new place, with a DeprecationWarning that names it.
Checked in one fresh interpreter (an import already cached would not warn
again), where every old path is used for the first time."""

import subprocess
import sys

import pytest

CHECK = r"""
import importlib, warnings
import softk
from softk._moved import MOVED, MOVED_NAMES

def warned(seen, old, new):
    msgs = [str(w.message) for w in seen if issubclass(w.category, DeprecationWarning)]
    assert any(old in m and new in m for m in msgs), (old, msgs)

cases = [(old, new, "attribute") for old, new in MOVED.items() if old.count(".") == 1]
cases += [(old, new, "import") for old, new in MOVED.items() if old.count(".") > 1]
cases += [("softk.native.build", "softk._backends.native.build", "import")]
cases += [(old, new, "name") for old, new in MOVED_NAMES.items()]
for old, new, how in cases:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if how == "import":
            got, want = importlib.import_module(old), importlib.import_module(new)
        elif how == "attribute":
            got, want = getattr(softk, old.split(".", 1)[1]), importlib.import_module(new)
        else:
            package, name = old.rsplit(".", 1)
            got, want = getattr(importlib.import_module(package), name), getattr(importlib.import_module(new), name)
    assert got is want, (old, got, want)
    warned(seen, old, new)
# after its first use an old top-level path also imports, as the same module
for old, new in MOVED.items():
    assert importlib.import_module(old) is importlib.import_module(new), old
print(len(cases))
"""


def test_every_old_path_gives_the_new_module_with_a_warning():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) >= 20  # every moved module was checked


def test_import_softk_warns_about_nothing():
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c",
                           "import softk, softk.threshold, softk.losses, softk.nn, softk.attention, softk.compat"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_unknown_name_is_still_an_attribute_error():
    import softk
    import softk.threshold

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        softk.nope
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        softk.threshold.nope
