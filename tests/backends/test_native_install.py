"""The compiled CPU kernels are built at install (setup.py's build_kernels step)
and loaded only under a matching key; a first-use build is the fallback and
says so in one line on stderr (softk._backends.native.build)."""

import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

import softk
from softk._backends.native import build

from .. import safety_net
from ..paths import REPO

needs_cc = pytest.mark.skipif(build._compiler()[1] is None, reason="needs a C compiler")


def _here():
    cc, version = build._compiler()
    return build.key(cc, version)


@needs_cc
def test_install_build_loads_under_its_key_only(tmp_path):
    built = build.build_for_install(tmp_path)
    assert built == tmp_path / build.INSTALLED and built.is_file()
    here = _here()
    assert json.loads((tmp_path / build.INSTALLED_KEY).read_text()) == here
    lib = build._installed(tmp_path, here)
    assert lib is not None
    build._declare(lib)  # every entry point is there

    def tampered(**change):
        (tmp_path / build.INSTALLED_KEY).write_text(json.dumps({**here, **change}))
        return build._installed(tmp_path, here)

    assert tampered(cpu="flags : fpu sse sse2\n") is None  # built for another CPU
    assert tampered(sources="0" * 64) is None  # from other sources
    assert tampered(flags=["-O2"]) is None
    assert tampered(cc="clang") is None
    assert tampered(cc_version="cc 1.0") is None  # another version of the compiler
    # no compiler on PATH now: the version cannot be compared, the rest must match
    no_cc = {**here, "cc_version": None}
    (tmp_path / build.INSTALLED_KEY).write_text(json.dumps({**here, "cc_version": "cc 1.0"}))
    assert build._installed(tmp_path, no_cc) is not None
    assert build._installed(tmp_path, {**no_cc, "cpu": "flags : fpu\n"}) is None
    (tmp_path / build.INSTALLED_KEY).write_text("not json")
    assert build._installed(tmp_path, here) is None


def test_a_key_for_edited_sources_differs(tmp_path):
    for name in build._SOURCES:
        shutil.copy(build._HERE / name, tmp_path / name)
    cc, version = build._compiler()
    before = build.key(cc, version, tmp_path)
    with open(tmp_path / "kernels_impl.h", "a") as fh:
        fh.write("\n/* edited */\n")
    after = build.key(cc, version, tmp_path)
    assert before["sources"] != after["sources"] and build.cache_name(before) != build.cache_name(after)


@pytest.fixture
def fresh_loader(monkeypatch, tmp_path):
    """A loader that has loaded nothing yet, finds no installed library and
    caches under tmp_path/cache; compiling copies the library this process
    already loaded (the compiler itself is exercised by the other tests)."""
    if not softk._backends.registry.native_available():
        pytest.skip("needs the compiled kernels")
    loaded = Path(build.library()._name)
    compiled = []

    def fake_compile(cc, target, src=build._HERE):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(loaded, target)
        compiled.append(target)

    monkeypatch.setattr(build, "_lib", None)
    monkeypatch.setattr(build, "_error", None)
    monkeypatch.setattr(build, "_HERE", tmp_path / "no-install")
    monkeypatch.setattr(build, "_cache_dir", lambda: tmp_path / "cache")
    monkeypatch.setattr(build, "_compile", fake_compile)
    return compiled


def test_first_use_build_says_so_in_one_line_once(fresh_loader, capsys):
    assert build.library() is not None
    assert build.library() is not None
    err = capsys.readouterr().err
    assert err == build.COMPILING + "\n" and len(fresh_loader) == 1
    # the next process finds it in the cache: nothing compiled, nothing printed
    build._lib = None
    assert build.library() is not None
    assert capsys.readouterr().err == "" and len(fresh_loader) == 1


def test_a_matching_installed_library_is_loaded_without_a_word(fresh_loader, capsys, tmp_path):
    folder = build._HERE
    folder.mkdir()
    # an install's library and key, as build_for_install leaves them (the library copied)
    (folder / build.INSTALLED_KEY).write_text(json.dumps(_here()))
    build._compile("cc", folder / build.INSTALLED)  # the fake: a copy of the loaded library
    fresh_loader.clear()
    lib = build.library()
    assert lib is not None and Path(lib._name) == folder / build.INSTALLED
    assert capsys.readouterr().err == "" and not fresh_loader
    assert not (tmp_path / "cache").exists()


def _run(code, **env):
    full = {**os.environ, **env}
    full.pop("SOFTK_NATIVE", None)
    return safety_net.run([sys.executable, "-c", code], env=full, capture_output=True, text=True)


def test_install_without_a_compiler_succeeds_with_a_note(tmp_path):
    done = safety_net.run([sys.executable, str(REPO / "setup.py"), "-q", "build_kernels", "--build-lib", str(tmp_path)],
                          cwd=REPO, env={**os.environ, "SOFTK_CC": "no-such-cc"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "softk: note: the CPU kernels were not built (no C compiler 'no-such-cc' on PATH)" in done.stdout
    assert not list(tmp_path.rglob("_kernels*"))


CHECK = r"""
import os, sys, torch, softk
from softk._backends import dispatch
from softk._backends.native import build
assert softk.__file__.startswith(sys.argv[1]), softk.__file__  # the unpacked wheel, not the checkout
x = torch.randn(5, 33, dtype=torch.float64)
assert dispatch.pick("threshold", x, softk.families.SPARSEMAX).backend == "native", "native kernels did not load"
with softk.use_backend("native"):
    p = softk.sparsemax(x)
with softk.use_backend("torch"):
    q = softk.sparsemax(x)
torch.testing.assert_close(p, q, rtol=0, atol=1e-12)
print(os.path.basename(build.library()._name))
"""


@pytest.mark.slow
@needs_cc
def test_wheel_carries_the_built_library_and_loads_it_without_compiling(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "setup.py"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "src", project / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so", "_kernels.*"))
    built = safety_net.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(project)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("softk-*.whl")
    assert not wheel.name.endswith("-none-any.whl")  # it holds a library built for this platform
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"softk/_backends/native/_kernels.so", "softk/_backends/native/_kernels.json"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    cache = tmp_path / "cache"
    env = {"PYTHONPATH": str(site), "SOFTK_CACHE_DIR": str(cache), "SOFTK_BACKEND": "auto"}

    ran = _run(CHECK.replace("sys.argv[1]", repr(str(site))), **env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "_kernels.so" and ran.stderr == "" and not cache.exists()

    # the same wheel on another CPU: the key does not match, the first use builds into the cache
    key_file = site / "softk/_backends/native/_kernels.json"
    key_file.write_text(json.dumps({**json.loads(key_file.read_text()), "cpu": "flags : fpu\n"}))
    ran = _run(CHECK.replace("sys.argv[1]", repr(str(site))), **env)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stderr == build.COMPILING + "\n"
    assert ran.stdout.strip().startswith("kernels-") and len(list(cache.glob("kernels-*.so"))) == 1
