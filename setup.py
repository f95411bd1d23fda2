"""Build the compiled CPU kernels when softk is installed.

``pip install .``, ``pip wheel .`` and ``pip install -e .`` run the
``build_kernels`` step below, which compiles ``src/softk/_backends/native/kernels.c``
into a plain shared library that softk loads with ctypes (not a Python
extension module; no torch headers needed).  Everything else about the package
is in pyproject.toml.

- A regular install or a wheel carries the library inside the package
  (``softk/_backends/native/_kernels.so``, with ``_kernels.json``: the key it was
  built under, which the loader checks before loading it).
- An editable install writes it into softk's cache (``$SOFTK_CACHE_DIR``,
  default ``~/.cache/softk``) under the name a first-use build would give it:
  the source folder stays free of build products, and editing the sources,
  which changes the key, makes softk rebuild on first use as it always did.
- Where no C compiler works, installing still succeeds with a note, and softk
  builds the library on first use, or runs its PyTorch path without one.

``SOFTK_NATIVE=0`` at install time skips the build.  See
``softk._backends.native.build`` for the loader and the key.
"""

import importlib.util
import os
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build import build
from setuptools.dist import Distribution

NATIVE = Path(__file__).resolve().parent / "src" / "softk" / "_backends" / "native"


def _native_build():
    # build.py imports only the standard library: load it by path, since softk's
    # own imports (torch) need not be installed yet (build isolation).
    spec = importlib.util.spec_from_file_location("_softk_native_build", NATIVE / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class build_kernels(Command):
    """Compile the CPU kernels into the build tree (or, editable, into the cache)."""

    description = "compile softk's CPU kernels (plain C, loaded with ctypes)"
    user_options = [("build-lib=", "b", "directory the package is built into")]

    def initialize_options(self):
        self.build_lib = None
        self.editable_mode = False
        self._outputs = []

    def finalize_options(self):
        self.set_undefined_options("build", ("build_lib", "build_lib"))

    def run(self):
        if os.environ.get("SOFTK_NATIVE", "1") == "0":
            print("softk: SOFTK_NATIVE=0, not building the CPU kernels")
            return
        native = _native_build()
        dest = None if self.editable_mode else Path(self.build_lib, "softk", "_backends", "native")
        try:
            if dest is not None:
                dest.mkdir(parents=True, exist_ok=True)
            built = native.build_for_install(dest)
        except OSError as err:
            print(f"softk: note: the CPU kernels were not built ({err}); softk will build them on "
                  "first use if a C compiler is there then, and otherwise runs its PyTorch path "
                  "(same results, slower)")
            return
        print(f"softk: built the CPU kernels: {built}")
        if dest is not None:
            self._outputs = [str(built), str(dest / native.INSTALLED_KEY)]

    def get_outputs(self):
        return list(self._outputs)

    def get_output_mapping(self):
        return {}

    def get_source_files(self):
        return []


class BinaryDistribution(Distribution):
    """The wheel holds a library compiled for this platform: tag it so (not py3-none-any)."""

    def has_ext_modules(self):
        return True


build.sub_commands = [*build.sub_commands, ("build_kernels", None)]

setup(cmdclass={"build_kernels": build_kernels}, distclass=BinaryDistribution)
