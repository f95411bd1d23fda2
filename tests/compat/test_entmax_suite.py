"""entmax's own test-suite, as the installed package ships it, run against
softk.compat.entmax (slow: about a minute and a half on two cores).

The entmax wheel installs its tests (entmax/test_*.py).  They run unmodified:
a child Python registers softk.compat.entmax and its submodules under the
names ``entmax``, ``entmax.activations``, ``entmax.root_finding`` and
``entmax.losses`` in ``sys.modules`` before pytest imports the test files,
which are copied into a temporary directory (outside the entmax package, so
the real package is never imported).  Every one of them must pass.

The suite draws its inputs from torch's global generator without a seed, and
one of its checks fails by chance (``test_index_ignored`` needs the ignored
row's loss to be non-zero, and a sparsemax loss is exactly 0 on a row whose
target leads by a margin of 1): a conftest seeds the generator before each
test, so that the run is the same every time.
"""

import importlib.util
import os
import pathlib
import shutil
import sys

import pytest

RUNNER = """
import sys
import softk.compat.entmax as compat
sys.modules["entmax"] = compat
for name in ("activations", "root_finding", "losses"):
    sys.modules["entmax." + name] = getattr(compat, name)
import pytest
sys.exit(pytest.main([sys.argv[1], "-q", "-p", "no:cacheprovider"]))
"""

SEED = """
import pytest, torch

@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
"""


def _installed_entmax_tests():
    spec = importlib.util.find_spec("entmax")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(pathlib.Path(list(spec.submodule_search_locations)[0]).glob("test_*.py"))


from .. import safety_net
from ..paths import REPO


@pytest.mark.slow
def test_entmax_test_suite_passes_against_the_compat_layer(tmp_path):
    files = _installed_entmax_tests()
    if not files:
        pytest.skip("the entmax package (with its bundled tests) is not installed")
    for f in files:
        shutil.copy(f, tmp_path / f"test_entmax_{f.name[len('test_'):]}")
    (tmp_path / "conftest.py").write_text(SEED)
    src = REPO / "src"  # this checkout's softk first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH")]))}
    result = safety_net.run([sys.executable, "-c", RUNNER, str(tmp_path)], capture_output=True, text=True,
                            cwd=tmp_path, env=env)
    summary = (result.stdout.strip().splitlines() or [""])[-1]
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
