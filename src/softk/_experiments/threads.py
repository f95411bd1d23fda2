"""Run the experiments single-threaded (torch and OpenBLAS), restoring afterwards.

The problems here are tiny (a few hundred rows, a few labels, a few thousand
parameters), so thread pools only add synchronisation, and on a machine whose
cores are busy with other work their spin-waiting is ruinous (scipy's
L-BFGS-B inside OpenBLAS and torch's intra-op pool alike).

OpenBLAS is switched through ``openblas_set_num_threads_local`` of every
OpenBLAS library already loaded (numpy's and scipy's bundle their own), the
same mechanism threadpoolctl uses; where that symbol is absent nothing is
changed (results do not depend on it, only the run time).
"""

from __future__ import annotations

import ctypes
import contextlib

import torch


def _openblas_setters() -> list:
    paths = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "openblas" in path.lower() and ".so" in path:
                    paths.add(path)
    except OSError:  # not Linux: leave BLAS alone
        return []
    setters = []
    for path in sorted(paths):
        try:
            fn = ctypes.CDLL(path).openblas_set_num_threads_local
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int]
        setters.append(fn)
    return setters


@contextlib.contextmanager
def single_threaded():
    """Context manager: torch and OpenBLAS on one thread inside the block."""
    import scipy.optimize  # noqa: F401  (load scipy's OpenBLAS before switching it)

    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    restore = [(fn, fn(1)) for fn in _openblas_setters()]
    try:
        yield
    finally:
        for fn, old in restore:
            fn(old)
        torch.set_num_threads(torch_threads)
