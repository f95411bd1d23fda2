"""The documentation is true to the code.

Every Python example in README.md and docs/**/*.md runs: a ```pycon block is a
doctest (its shown output is checked), a ```python block is executed, in order,
in one namespace per page; a block that runs itself under
``if __name__ == "__main__":`` (it may spawn processes) runs as a script in a
subprocess.  The API reference names every public name by its public path, the
site builds with ``mkdocs build --strict`` where the docs extra is installed,
and no page uses the project's internal vocabulary."""

from __future__ import annotations

import doctest
import importlib
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

from .. import safety_net
from ..paths import REPO

ROOT = REPO
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^( *)```(python|pycon)[^\n]*\n(.*?)^\1```", re.MULTILINE | re.DOTALL)
PUBLIC = ("softk", "softk.losses", "softk.nn", "softk.distributed", "softk.integrations.transformers",
          "softk.integrations.hf_moe", "softk.attention",
          "softk.compat.entmax")


def blocks(page: Path):
    """(kind, code, first line) of each Python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    for m in FENCE.finditer(text):
        yield m.group(2), textwrap.dedent(m.group(3)), text[: m.start()].count("\n") + 2


def is_script(code: str) -> bool:
    return 'if __name__ == "__main__":' in code


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", [p for p in PAGES if any(True for _ in blocks(p))], ids=_name)
def test_examples_run(page):
    namespace = {"__name__": "docs_example"}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for kind, code, line in blocks(page):
        where = f"{_name(page)}:{line}"
        try:
            if kind == "pycon":
                test = doctest.DocTestParser().get_doctest(code, namespace, where, str(page), line - 1)
                report = []
                result = runner.run(test, out=report.append, clear_globs=False)
                assert result.failed == 0, "".join(report)
                namespace.update(test.globs)  # DocTest ran on a copy: later blocks see its names
            elif not is_script(code):
                exec(compile(code, where, "exec"), namespace)
        except ModuleNotFoundError as exc:  # an optional extra this machine lacks
            if exc.name and exc.name.split(".")[0] != "softk":
                pytest.skip(f"{where} needs {exc.name}")
            raise


SCRIPTS = [pytest.param(page, line, code, id=f"{_name(page)}:{line}", marks=pytest.mark.slow)
           for page in PAGES for kind, code, line in blocks(page) if kind == "python" and is_script(code)]


@pytest.mark.parametrize("page,line,code", SCRIPTS)
def test_script_examples_run(tmp_path, page, line, code):
    script = tmp_path / "example.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = safety_net.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    if _teardown_abort(done.stderr):  # once more: a second abort fails the test
        done = safety_net.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, f"{_name(page)}:{line}\n{done.stderr[-3000:]}"


def _teardown_abort(stderr: str) -> bool:
    """Whether a spawned rank died of the abort torch's gloo threads sometimes
    raise at interpreter exit under load (SIGABRT, "terminate called without an
    active exception"), with no rank's Python traceback: a failed check in a
    rank prints "terminated with the following error" and is never retried."""
    return ("terminate called without an active exception" in stderr and "signal SIGABRT" in stderr
            and "terminated with the following error" not in stderr)


def test_only_a_bare_teardown_abort_is_run_again():
    abort = ("terminate called without an active exception\n"
             "torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with signal SIGABRT\n")
    assert _teardown_abort(abort)
    failed = "-- Process 0 terminated with the following error:\nTraceback ...\nAssertionError\n"
    assert not _teardown_abort(failed + abort)
    assert not _teardown_abort("process 1 terminated with signal SIGABRT\n")


def _documented() -> set[str]:
    names = set()
    for page in (ROOT / "docs" / "api").glob("*.md"):
        names |= set(re.findall(r"^::: (\S+)", page.read_text(encoding="utf-8"), re.MULTILINE))
    return names


def test_api_reference_names_every_public_name_by_its_public_path():
    documented = _documented()
    # a name re-exported from a public subpackage (softk.scaled_dot_product_attention
    # is softk.attention's) is documented once, under the subpackage's path
    reexports = {f"{m}.{n}" for m in PUBLIC for n in importlib.import_module(m).__all__
                 for d in documented if d.rpartition(".")[0] in PUBLIC and d.rpartition(".")[2] == n
                 and d != f"{m}.{n}" and getattr(importlib.import_module(d.rpartition(".")[0]), n) is getattr(importlib.import_module(m), n)}
    missing = [f"{m}.{n}" for m in PUBLIC for n in importlib.import_module(m).__all__
               if f"{m}.{n}" not in documented | reexports]
    assert not missing, f"not in docs/api/*.md: {missing}"
    assert "softk.families" in documented


def test_api_reference_names_resolve():
    for name in _documented():
        module, _, attr = name.rpartition(".")
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            assert hasattr(importlib.import_module(module), attr), name


JARGON = re.compile(r"seeds?'s?\b|seed_properties|\bthe seed\b", re.IGNORECASE)
OWN_PAGES = [p for p in PAGES if p.name != "architecture.md"]


@pytest.mark.parametrize("page", OWN_PAGES, ids=_name)
def test_no_internal_vocabulary(page):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            if JARGON.search(line)]
    assert not hits, f"{_name(page)} uses the project's internal vocabulary:\n" + "\n".join(hits)


def test_site_builds_strictly(site):
    assert (site / "api" / "maps" / "index.html").is_file()


TEXT = re.compile(r"^```text\n\$ softk compare\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", [p for p in PAGES if TEXT.search(p.read_text(encoding="utf-8"))], ids=_name)
def test_shown_compare_output_is_what_softk_compare_prints(page, capsys):
    from softk._cli import main

    assert main(["compare"]) == 0
    printed = capsys.readouterr().out.splitlines()
    for block in TEXT.findall(page.read_text(encoding="utf-8")):
        shown = block.rstrip("\n").splitlines()
        if shown[-1] == "...":  # an excerpt: its first lines
            shown, printed = shown[:-1], printed[: len(shown) - 1]
        assert [s.rstrip() for s in shown] == [p.rstrip() for p in printed]
