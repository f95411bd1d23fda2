"""How the tests run a child process without depending on how busy the machine is.

A test that runs a subprocess has no time limit of its own: on a machine
shared with other jobs a build or a model run can take many times what it
takes alone.  ``run`` bounds it only by a generous safety net (an hour unless
SOFTK_TEST_SAFETY_NET_S says otherwise), there to end a hung child, and a
child still running past it makes the test SKIP, naming the command and the
bound, rather than fail: past that point slowness and a hang look alike, so
the run says which test to rerun alone instead of reporting a defect.
"""

from __future__ import annotations

import os
import subprocess

import pytest


def safety_net_s() -> float:
    """Seconds a child process may run before the test skips (read at each call)."""
    return float(os.environ.get("SOFTK_TEST_SAFETY_NET_S", "3600"))


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, **kwargs)`` under the safety net (no ``timeout`` argument)."""
    if "timeout" in kwargs:
        raise TypeError("run() sets the time bound itself: pass no timeout")
    limit = safety_net_s()
    try:
        return subprocess.run(cmd, timeout=limit, **kwargs)
    except subprocess.TimeoutExpired:
        skip("`" + " ".join(str(c) for c in cmd[:3]) + (" ...`" if len(cmd) > 3 else "`"), limit)


def skip(what: str, limit: float):
    """Skip the running test: ``what`` still ran after ``limit`` seconds."""
    pytest.skip(f"{what} still ran after the {limit:g} s safety net (SOFTK_TEST_SAFETY_NET_S): "
                "a busy machine or a hang; rerun this test alone to tell which")
