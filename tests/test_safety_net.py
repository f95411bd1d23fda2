"""The suite does not depend on how busy the machine is: no test bounds a child
process, a thread or a collective by a wall-clock limit of its own; the only
bound is tests/safety_net.py's, and past it a test skips instead of failing.
The sm_90 build tests (minutes on a loaded machine) are out of the README's
test command and of the quick run, in a step of their own."""

from __future__ import annotations

import ast
import sys

import pytest

from . import safety_net
from .paths import REPO

TESTS = REPO / "tests"


def test_a_child_past_the_safety_net_skips_the_test(monkeypatch):
    monkeypatch.setenv("SOFTK_TEST_SAFETY_NET_S", "0.5")
    with pytest.raises(pytest.skip.Exception, match=r"still ran after the 0.5 s safety net"):
        safety_net.run([sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_child_within_the_safety_net_runs_to_its_end():
    done = safety_net.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "42\n"


def test_run_refuses_a_limit_of_its_own():
    with pytest.raises(TypeError, match="no timeout"):
        safety_net.run([sys.executable, "-c", "pass"], timeout=5)


def _calls(node):
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def test_no_test_sets_a_wall_clock_limit():
    """A ``timeout=`` is allowed only where it polls (``join(timeout=1)`` in a
    loop) or where its value comes from the safety net."""
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path in (TESTS / "safety_net.py", TESTS / "test_safety_net.py"):
            continue
        for call in _calls(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            polls = isinstance(call.func, ast.Attribute) and call.func.attr == "join"
            for kw in call.keywords:
                if kw.arg == "timeout" and not polls and "safety_net" not in ast.unparse(kw.value):
                    found.append(f"{path.relative_to(REPO)}:{call.lineno}: {ast.unparse(call)[:100]}")
    assert not found, "wall-clock limits (use tests/safety_net.py):\n" + "\n".join(found)


def test_the_gpu_build_tests_are_marked_gpu_build():
    unmarked, builds = [], 0
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef) or not any(
                    isinstance(c.func, ast.Attribute) and c.func.attr == "compile_for_gpu" for c in _calls(fn)):
                continue
            builds += 1
            if "pytest.mark.gpu_build" not in [ast.unparse(d) for d in fn.decorator_list]:
                unmarked.append(f"{path.relative_to(REPO)}::{fn.name}")
    assert builds >= 4 and not unmarked, f"not marked gpu_build: {unmarked}"
