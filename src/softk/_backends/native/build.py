"""Compile ``kernels.c`` with the machine's C compiler on first use and load it.

No build step at install time (installing softk must not need torch's
headers or a compiler): the first call compiles ``kernels.c`` and the headers it
includes, about 1,100 lines of C (a fifth of them comments), in a few seconds
with ``cc -O3 -march=native`` and caches the shared library under
``$SOFTK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/softk`` or ``~/.cache/softk``),
keyed by the source, the flags, the compiler and the CPU, so a library built
for one CPU is never loaded on another.

``SOFTK_NATIVE=0`` turns the kernels off (softk then runs its PyTorch path);
``SOFTK_CC`` names the compiler (default ``cc``).  When no compiler works,
softk warns once and runs the PyTorch path, which computes the same maps.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SOURCES = ("kernels.c", "kernels_impl.h", "kernels_rows.h", "kernels_exp.h", "kernels_loss.h",
            "kernels_topk_ce.h")
# -march=native: AVX2/AVX-512 loops and libmvec's vector exp/log/pow.  No
# -ffast-math: the row conventions need inf and NaN to behave.  -fopenmp:
# rows are split between OpenMP threads, and on Linux the library then shares
# the libgomp.so.1 that torch has already loaded (same soname), so its
# threads are torch's; where OpenMP is missing the build retries without it
# (serial rows).
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared", "-std=c99")
OPENMP = "-fopenmp"

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


def _compile(cc: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        for extra in ([OPENMP], []):
            cmd = [cc, *FLAGS, *extra, str(_HERE / "kernels.c"), "-o", tmp, "-lm"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode == 0:
                break
        else:
            raise OSError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
        os.replace(tmp, target)  # atomic: concurrent first calls never see half a file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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


def library():
    """The loaded kernels (a ``ctypes.CDLL``), or None when they cannot run here."""
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    with _lock:
        if _lib is not None or _error is not None:
            return _lib
        try:
            cc = os.environ.get("SOFTK_CC", "cc")
            if shutil.which(cc) is None:
                raise OSError(f"no C compiler {cc!r} on PATH")
            version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
            h = hashlib.sha256()
            for name in _SOURCES:
                h.update((_HERE / name).read_bytes())
            h.update(repr((FLAGS, OPENMP, cc, version, _cpu_key())).encode())
            target = _cache_dir() / f"kernels-{h.hexdigest()[:16]}.so"
            if not target.exists():
                _compile(cc, target)
            lib = ctypes.CDLL(str(target))
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
