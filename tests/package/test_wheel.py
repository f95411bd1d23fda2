"""The wheel a user installs: built from a copy of the project (pip wheel, the
build backend of pyproject.toml), unpacked alone on a fresh path, it carries the
C sources the native kernels are compiled from and the py.typed marker, and the
kernels build and run from it with an empty cache."""

import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from .. import safety_net
from ..paths import REPO

ROOT = REPO

CHECK = r"""
import os, sys, torch, softk
from softk._backends import dispatch
assert softk.__file__.startswith(sys.argv[1]), softk.__file__  # the unpacked wheel, not the checkout
x = torch.randn(5, 33, dtype=torch.float64)
assert dispatch.pick("threshold", x, softk.families.SPARSEMAX).backend == "native", "native kernels did not build"
with softk.use_backend("native"):
    p = softk.sparsemax(x)
with softk.use_backend("torch"):
    q = softk.sparsemax(x)
torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
assert any(f.endswith(".so") for f in os.listdir(os.environ["SOFTK_CACHE_DIR"]))
print("ok", softk.__version__)
"""


@pytest.mark.slow
def test_wheel_carries_the_kernel_sources_and_runs_them(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    built = safety_net.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(project)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("softk-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = {f"softk/_backends/native/{p.name}" for p in (ROOT / "src/softk/_backends/native").iterdir() if p.suffix in (".c", ".h")}
    assert sources and sources <= names
    assert "softk/py.typed" in names and "softk/_cli/__init__.py" in names
    test_only = [n for n in names if n.rsplit("/", 1)[-1] in ("conftest.py",) or "/tests/" in n
                 or n.rsplit("/", 1)[-1].startswith("test_")]
    assert not test_only, test_only  # nothing of the test run ships
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "SOFTK_CACHE_DIR": str(tmp_path / "cache"),
           "SOFTK_BACKEND": "auto"}
    env.pop("SOFTK_NATIVE", None)
    ran = safety_net.run([sys.executable, "-c", CHECK, str(site)], capture_output=True, text=True,
                         cwd=tmp_path, env=env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.startswith("ok ")


def test_the_cpu_test_extra_leaves_out_only_triton():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert not [r for r in extras["test-cpu"] if r.startswith("triton")], extras["test-cpu"]
    assert sorted(extras["test"]) == sorted(["softk[test-cpu]", *[r for r in extras["test"] if r.startswith("triton")]])
    assert any(r.startswith("triton") for r in extras["test"])
