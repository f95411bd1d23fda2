import os

# Triton reads TRITON_INTERPRET once, when it is first imported, and
# torch.compile's Inductor imports it (tests/test_compile.py runs before
# tests/triton/): set it before anything can, so the Triton tests run the
# kernels through the CPU interpreter whatever ran first.  It only matters
# where the "triton" backend is asked for; "auto" picks Triton for CUDA tensors.
os.environ.setdefault("TRITON_INTERPRET", "1")

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

# Two modules of torch warn, while they load, that torch.jit.script (or
# script_method) is deprecated, about twenty times per process: the jvp
# decompositions that forward-mode AD (forward_ad.make_dual, torch.func.jvp)
# loads on first use, and torch.utils.mkldnn, which torch.compile's Inductor
# imports.  The warnings are torch's, not softk's (softk scripts nothing): load
# both here, once per process, with exactly those warnings ignored, so that
# any other torch.jit.script call still warns.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script(_method)?` is deprecated",
                            category=DeprecationWarning)
    _load_jvp_decompositions = getattr(torch.autograd.forward_ad, "_maybe_load_decompositions", None)
    if _load_jvp_decompositions is not None:
        _load_jvp_decompositions()
    import torch.utils.mkldnn  # noqa: F401

# Triton's interpreter sweeps its language again on every call of a jitted
# helper inside a kernel; tests/interpreter_speed.py makes that once per launch
# (SOFTK_TEST_PLAIN_INTERPRETER=1 runs the interpreter as Triton ships it).
if os.environ.get("SOFTK_TEST_PLAIN_INTERPRETER") != "1":
    from . import interpreter_speed

    interpreter_speed.install()


settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Under pytest-xdist (-n auto) each worker is a process of its own: one torch
# thread each, so that the workers do not fight over the cores.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else min(2, torch.get_num_threads()))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(params=["torch", "native"])
def each_cpu_backend(request):
    """Run the test once on the PyTorch path and once on the compiled CPU kernels
    (modules opt in with ``pytestmark = pytest.mark.usefixtures("each_cpu_backend")``)."""
    import softk

    with softk.use_backend(request.param):
        yield request.param


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The documentation site, built once per test process with ``mkdocs build
    --strict`` (any warning fails it) where the docs extra is installed; the
    package tests (tests/package) and the figures and maths tests (tests/docs)
    read the same build."""
    import sys

    from . import safety_net
    from .paths import REPO

    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = safety_net.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
