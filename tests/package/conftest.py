import os
import sys

import pytest

from .. import safety_net
from ..paths import REPO


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The documentation site, built once with ``mkdocs build --strict`` (any
    warning fails it) where the docs extra is installed."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = safety_net.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out
