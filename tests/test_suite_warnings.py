"""The suite's output is not buried in warnings that are not softk's: the
first forward-mode AD call of a process makes torch script its jvp
decompositions, and the first torch.compile imports torch.utils.mkldnn, each
with DeprecationWarnings about torch.jit.script; tests/conftest.py loads both
quietly first."""

import os
import sys

from . import safety_net
from .paths import REPO

FIRST_USES = ["tests/autograd/test_lean_path.py::test_forward_mode_ad_on_the_lean_path",
              "tests/attention/test_nn.py::test_compile_fullgraph[auto]"]


def test_forward_mode_ad_and_compile_raise_no_torch_jit_warning():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTORCH_JIT", None)  # torch skips the decompositions when it is 0
    done = safety_net.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-W", "error::DeprecationWarning", *FIRST_USES], capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "jit.script" not in done.stdout
