"""CI keeps the house rules a tool can check: ruff (pycodestyle's errors and
warnings, pyflakes) and mypy on src/softk, configured in pyproject.toml,
pinned in the test extra and run by .ci/run.  Text checks, so that an edit
that drops either tool fails here."""

import re

from ..paths import REPO


def _table(text: str, name: str) -> str:
    """The body of the TOML table ``[name]``, up to the next table."""
    found = re.search(rf"^\[{re.escape(name)}\]\n(.*?)(?=^\[|\Z)", text, re.MULTILINE | re.DOTALL)
    assert found, f"pyproject.toml has no [{name}]"
    return found.group(1)


def _array(table: str, key: str) -> list:
    """The strings of the array ``key = [...]`` in ``table``."""
    found = re.search(rf"^{re.escape(key)}\s*=\s*\[(.*?)\]", table, re.MULTILINE | re.DOTALL)
    assert found, f"no {key} = [...]"
    return re.findall(r'"([^"]*)"', found.group(1))


def test_pyproject_configures_ruff_and_mypy_for_the_package():
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r"^line-length\s*=", _table(text, "tool.ruff"), re.MULTILINE), "[tool.ruff] sets no line-length"
    assert {"E", "W", "F"} <= set(_array(_table(text, "tool.ruff.lint"), "select"))
    mypy = _table(text, "tool.mypy")
    assert _array(mypy, "files") == ["src/softk"]
    assert re.search(r"^python_version\s*=", mypy, re.MULTILINE), "[tool.mypy] sets no python_version"
    pins = _array(_table(text, "project.optional-dependencies"), "test-cpu")
    for tool in ("ruff", "mypy"):
        assert [p for p in pins if re.fullmatch(rf"{tool}==[\w.]+", p)], f"test-cpu does not pin {tool}: {pins}"


def test_ci_runs_them_after_the_import_contract_and_before_the_tests():
    run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    steps = [line.strip() for line in run.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for step in ("lint-imports", "ruff check src", "mypy"):
        assert step in steps, f".ci/run does not run {step}"
    tests = next(i for i, step in enumerate(steps) if step.startswith("python -m pytest"))
    assert steps.index("lint-imports") < steps.index("ruff check src") < tests
    assert steps.index("lint-imports") < steps.index("mypy") < tests


def _readme_test_command() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.findall(r"(python -m pytest -n auto -m \"[^\"]+\")", readme)
    assert found, "README.md shows no test command"
    return found[0]


def test_ci_runs_the_readmes_test_command_then_the_slow_tier_and_the_gpu_builds():
    run = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    steps = [line.strip() for line in run.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    command = _readme_test_command()
    assert command in steps, f".ci/run does not run the README's {command!r}"
    assert "not slow and not gpu_build" in command
    rest = 'python -m pytest -n auto -m "slow or gpu_build"'
    assert rest in readme, "README.md does not show the slow tier's command"
    assert steps.index(command) < steps.index(rest)
