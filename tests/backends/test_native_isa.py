"""The compiled CPU kernels built for narrower instruction sets, against the float64 oracle.

``-march=native`` picks the widest vector code the machine has: on an AVX-512
machine the candidate gather packs 16 entries at a time, on an AVX2 one 4 at
a time, elsewhere it goes through a bit mask.  A machine runs only one of
these in the library it loads, so this module builds ``kernels.c`` again with
AVX-512, then AVX2 too, turned off, loads each build and checks its
zero-below maps (sparsemax, entmax15, α-entmax) against the NumPy oracle on
rows whose widths cover whole blocks of 32 and ragged tails.
"""

import ctypes
import platform
import shutil
import subprocess

import numpy as np
import pytest

from softk._backends.native import build
from softk.threshold import ENTMAX15, SPARSEMAX, entmax_family

from ..oracle import maps as oracle

CC = shutil.which(build._compiler()[0])
pytestmark = [pytest.mark.skipif(CC is None, reason="needs a C compiler"),
              pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 flags")]

# (name, extra flags after -march=native): each turns off what the one before used
ISAS = [("no-avx512", ["-mno-avx512f"]), ("no-avx2", ["-mno-avx512f", "-mno-avx2"])]
MAPS = [("sparsemax", SPARSEMAX, None), ("entmax15", ENTMAX15, 1.5),
        *[(f"entmax{a}", entmax_family(a), a) for a in (1.05, 1.3, 1.45, 1.8)]]


@pytest.fixture(scope="module", params=ISAS, ids=[name for name, _ in ISAS])
def library(request, tmp_path_factory):
    _, extra = request.param
    target = tmp_path_factory.mktemp("isa") / "kernels.so"
    cmd = [CC, *build.FLAGS, *extra, str(build._HERE / "kernels.c"), "-o", str(target), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lib = ctypes.CDLL(str(target))
    build._declare(lib)
    return lib


def _forward(lib, family, x):
    z = np.ascontiguousarray(x, dtype=np.float32)
    p = np.full_like(z, np.nan)
    rc = lib.softk_forward_threads_f32(family.kernel, z.ctypes.data, p.ctypes.data, z.shape[0], z.shape[1], 1.0,
                                       family.alpha_value, None, 1)
    assert rc == 0
    return p


@pytest.mark.parametrize("name,family,alpha", MAPS, ids=[m[0] for m in MAPS])
@pytest.mark.parametrize("n", [31, 32, 96, 1000, 1024])
def test_narrow_isa_builds_match_the_oracle(library, name, family, alpha, n):
    rng = np.random.default_rng(n)
    x = (rng.normal(size=(40, n)) * rng.uniform(0.3, 4.0, size=(40, 1))).astype(np.float32)
    x[::7, ::3] = -np.inf  # masked entries inside whole blocks
    p = _forward(library, family, x)
    xd = x.astype(np.float64)
    ref = oracle.sparsemax(xd) if alpha is None else oracle.entmax(xd, alpha)
    np.testing.assert_allclose(p, ref, rtol=0, atol=2e-6)
