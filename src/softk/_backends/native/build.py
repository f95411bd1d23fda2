"""Build ``kernels.c`` into a shared library, at install time or on first use, and load it.

The library is plain C loaded with ``ctypes`` (not a Python extension module),
built from ``kernels.c`` and the headers it includes, about 2,300 lines of C (a
fifth of them comments), with ``cc -O3 -march=native``.  Building it needs no
torch headers.

**At install.**  ``pip install .``, ``pip wheel .`` and ``pip install -e .``
build it (``setup.py``'s ``build_kernels`` step calls :func:`build_for_install`):

- a regular install or a wheel carries ``_kernels.so`` in this folder, next to
  ``_kernels.json``, the key it was built under;
- an editable install writes it into the cache below, under the name a
  first-use build would give it, so that editing the sources (the point of an
  editable install) just misses it, as any stale cache entry is missed.

Where the build fails at install (no compiler), installing still succeeds,
with a note, and the library is built on first use if a compiler turns up.

**The key.**  A library is loaded only where its key matches this process:
the sources' SHA-256, the flags, the compiler (``SOFTK_CC``, default ``cc``, and
what its ``--version`` prints) and the CPU (the flags line of /proc/cpuinfo),
so a library built for one CPU, by another compiler or from other sources is
never loaded.  Where no compiler is on PATH when softk runs, an installed
library whose other parts match is loaded all the same (the compiler part says
which compiler a rebuild would use; none would run).

**On first use, as a fallback.**  When neither the installed library nor the
cache holds one for this key, the first call compiles it (a few seconds; more
on a busy machine), printing one line on stderr, once per process, and caches
it under ``$SOFTK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/softk`` or
``~/.cache/softk``) as ``kernels-<key>.so``.

``SOFTK_NATIVE=0`` turns the kernels off (softk then runs its PyTorch path).
When no library can be had (no compiler and none installed that matches),
softk warns once and runs the PyTorch path, which computes the same maps.

This module imports nothing outside the standard library: ``setup.py`` loads
it by path, before softk's dependencies are installed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SOURCES = ("kernels.c", "kernels_impl.h", "kernels_rows.h", "kernels_narrow.h", "kernels_exp.h", "kernels_loss.h",
            "kernels_topk_ce.h", "kernels_products.h")
# -march=native: AVX2/AVX-512 loops and libmvec's vector exp/log/pow.  No
# -ffast-math: the row conventions need inf and NaN to behave.  -fopenmp:
# rows are split between OpenMP threads, and on Linux the library then shares
# the libgomp.so.1 that torch has already loaded (same soname), so its
# threads are torch's; where OpenMP is missing the build retries without it
# (serial rows).
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-std=c99")
OPENMP = "-fopenmp"
# What an install puts in this folder: the library and the key it was built under.
INSTALLED = "_kernels.so"
INSTALLED_KEY = "_kernels.json"
COMPILING = "softk: compiling the CPU kernels (first use, a few seconds)..."

_lock = threading.Lock()
_lib = None
_error = None


def enabled() -> bool:
    """False when ``SOFTK_NATIVE=0``."""
    return os.environ.get("SOFTK_NATIVE", "1") != "0"


def _cpu_key() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get("SOFTK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "softk"
    )
    return Path(root)


def _compiler() -> tuple[str, str | None]:
    """The compiler's name and what its ``--version`` prints (None: not on PATH)."""
    cc = os.environ.get("SOFTK_CC", "cc")
    if shutil.which(cc) is None:
        return cc, None
    return cc, subprocess.run([cc, "--version"], capture_output=True, text=True).stdout


def key(cc: str, version: str | None, src: Path = _HERE) -> dict:
    """The key a library built by ``cc`` (``version``: what its ``--version``
    printed) from the sources in ``src`` is loaded under."""
    h = hashlib.sha256()
    for name in _SOURCES:
        h.update((src / name).read_bytes())
    return {"sources": h.hexdigest(), "flags": [*FLAGS, OPENMP], "cc": cc, "cc_version": version,
            "cpu": _cpu_key()}


def cache_name(k: dict) -> str:
    """The cache's file name for the library built under key ``k``."""
    return "kernels-" + hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:16] + ".so"


def matches(built: dict, here: dict) -> bool:
    """Whether a library built under key ``built`` may be loaded where the key is ``here``.

    Every part must be equal, except the compiler's version where no compiler
    is on PATH now (``here["cc_version"]`` is None): the library was built for
    this CPU from these sources with these flags, and no rebuild could run."""
    if here["cc_version"] is None:
        built = {**built, "cc_version": None}
    return built == here


def _compile(cc: str, target: Path, src: Path = _HERE) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for extra in ([OPENMP], []):
            cmd = [cc, *FLAGS, *extra, str(src / "kernels.c"), "-o", tmp, "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                break
        else:
            raise OSError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
        os.replace(tmp, target)  # atomic: concurrent first calls never see half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_for_install(dest: Path | None, src: Path = _HERE) -> Path:
    """Compile the sources in ``src`` at install time; return the library's path.

    With a folder ``dest`` (a regular install or a wheel: the package's
    ``softk/_backends/native`` in the build tree), write ``INSTALLED`` and its key
    ``INSTALLED_KEY`` there; with None (an editable install), write the library
    into the cache under :func:`cache_name`.  Raises OSError where no compiler
    works (``setup.py`` then notes it and installs without the library)."""
    cc, version = _compiler()
    if version is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    k = key(cc, version, src)
    if dest is None:
        target = _cache_dir() / cache_name(k)
        _compile(cc, target, src)
        return target
    dest = Path(dest)
    _compile(cc, dest / INSTALLED, src)
    (dest / INSTALLED_KEY).write_text(json.dumps(k, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return dest / INSTALLED


def _installed(folder: Path, here: dict):
    """The library an install left in ``folder``, loaded, when its key matches ``here``; else None."""
    try:
        built = json.loads((folder / INSTALLED_KEY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not matches(built, here) or not (folder / INSTALLED).is_file():
        return None
    try:
        return ctypes.CDLL(str(folder / INSTALLED))
    except OSError:  # e.g. built against another C library: rebuild it below
        return None


def _declare(lib) -> None:
    i64, i32, dbl, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_double, ctypes.c_void_p
    for suffix in ("f32", "f64"):
        fwd = getattr(lib, f"softk_forward_threads_{suffix}")
        fwd.argtypes = [i32, ptr, ptr, i64, i64, dbl, dbl, ptr, i32]
        fwd.restype = i32
        bwd = getattr(lib, f"softk_backward_threads_{suffix}")
        bwd.argtypes = [i32, ptr, ptr, ptr, i64, i64, dbl, dbl, i32]
        bwd.restype = i32
        loss = getattr(lib, f"softk_fy_loss_threads_{suffix}")
        loss.argtypes = [i32, ptr, ptr, ptr, ptr, ptr, ptr, ptr, i64, i64, dbl, dbl, dbl, i64, i32, dbl, i32, i32]
        loss.restype = i32
        ce = getattr(lib, f"softk_topk_ce_threads_{suffix}")
        ce.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, dbl, i64, i32, i32]
        ce.restype = i32
        for name, args in (("sparse_mm", [ptr, ptr, ptr, i64, i64, i64, i64, i64, i32]),
                           ("sparse_sampled", [ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i32]),
                           ("sparse_mm_t", [ptr, ptr, ptr, i64, i64, i64, i64, i64, i32])):
            fn = getattr(lib, f"softk_{name}_{suffix}")
            fn.argtypes, fn.restype = args, i32
    fast = lib.softk_fastmath_f32  # the float kernels' inline log2/exp2/pow, for the tests
    fast.argtypes = [i32, ptr, ptr, i64, dbl]
    fast.restype = None


def _load():
    """Find or build the library for this process's key (see the module's docstring)."""
    cc, version = _compiler()
    here = key(cc, version)
    lib = _installed(_HERE, here)
    if lib is not None:
        return lib
    if version is None:
        raise OSError(f"no C compiler {cc!r} on PATH")
    target = _cache_dir() / cache_name(here)
    if not target.exists():
        print(COMPILING, file=sys.stderr, flush=True)
        _compile(cc, target)
    return ctypes.CDLL(str(target))


def library():
    """The loaded kernels (a ``ctypes.CDLL``), or None when they cannot run here."""
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    with _lock:
        if _lib is not None or _error is not None:
            return _lib
        try:
            lib = _load()
            _declare(lib)
            _lib = lib
        except OSError as err:
            _error = err
            warnings.warn(
                f"softk: compiled CPU kernels unavailable ({err}); using the PyTorch path "
                "(same results, slower). Set SOFTK_NATIVE=0 to silence this.",
                RuntimeWarning,
                stacklevel=3,
            )
    return _lib
