"""The house rules that a reader relies on, kept by reading the source tree.

* Which kernel runs a call is decided in one place: the registry and its
  dispatcher (``_backends/kernels.py``, ``dispatch.py``, ``registry.py``).
  No other module compares a backend name or keeps a table keyed by them.
* No import circle: the modules of ``src/softk`` form no cycle, counting the
  imports inside functions and ``importlib.import_module`` of a literal name
  (``if TYPE_CHECKING:`` imports are annotations only, not counted).
* No figures, dates or GPU status in the code's comments and docstrings:
  measurements live in BENCHMARKS.md, where they have a command, a machine
  and a date.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from ..paths import REPO

SRC = REPO / "src"
PACKAGE = SRC / "softk"
BACKEND_NAMES = {"torch", "native", "triton", "reference", "blockwise"}
# the registry, the setting and the dispatcher: where backend names are compared
REGISTRY = {PACKAGE / "_backends" / name for name in ("kernels.py", "dispatch.py", "registry.py")}


def _sources():
    return sorted(PACKAGE.rglob("*.py"))


def _backend_name_branches(tree):
    """(line, code) of each comparison with a backend name, and of each dict keyed by two or more."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [n for side in (node.left, *node.comparators) for n in ast.walk(side)
                     if isinstance(n, ast.Constant) and n.value in BACKEND_NAMES]
            if names:
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in BACKEND_NAMES}
            if len(keys) > 1:
                yield node.lineno, "{" + ", ".join(sorted(keys)) + ": ...}"


def test_no_module_outside_the_registry_branches_on_a_backend_name():
    found = [f"{p.relative_to(SRC)}:{line}: {code}" for p in _sources() if p not in REGISTRY
             for line, code in _backend_name_branches(ast.parse(p.read_text(encoding="utf-8")))]
    assert not found, "branches on a backend name outside the registry:\n" + "\n".join(found)


def test_the_branch_finder_finds_branches():
    tree = ast.parse('if backend == "native":\n    pass\nx = {"torch": 1, "triton": 2}\ny = b in ("reference",)\n')
    assert sorted(line for line, _ in _backend_name_branches(tree)) == [1, 3, 4]


# ------------------------------------------------------------------ imports
def _modules():
    out = {}
    for p in _sources():
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (p, package)
    return out


def _type_checking_blocks(tree):
    return {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in node.body for n in ast.walk(child)}


def _imports(name, path, package, modules):
    """The modules of softk that ``name`` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_blocks(tree)
    here = name.split(".") if package else name.split(".")[:-1]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join([*here[: len(here) - node.level + 1], *([node.module] if node.module else [])]) \
                if node.level else node.module
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            out.add(node.args[0].value)
    return {m for m in out if m in modules and m != name}


def _cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    modules = _modules()
    graph = {name: _imports(name, path, package, modules) for name, (path, package) in modules.items()}
    assert not _cycles(graph), _cycles(graph)


def test_the_circle_finder_finds_circles_through_functions_and_import_module(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
    modules = {"softk.p.x": None, "softk.p.y": None, "softk.p.z": None}
    path = tmp_path / "x.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import z\n"
                    "def f():\n    import importlib\n    from . import y\n    importlib.import_module('softk.p.z')\n",
                    encoding="utf-8")
    assert _imports("softk.p.x", path, False, modules) == {"softk.p.y", "softk.p.z"}


# ------------------------------------------------------------- measurements
FIGURE = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"  # a date
    r"|\b(H100|H200|A100|B200|L4|MI300)\b"  # a GPU a figure came from
    r"|until a GPU|unmeasured|for a GPU to measure|GPU measures"  # the state of a measurement
    r"|\b\d+(\.\d+)?\s?(ms|µs|us|ns)\b"  # a time
    r"|\b\d+(\.\d+)?(–\d+(\.\d+)?)?\s?(×|x)\s(faster|slower|the time)"  # a speed-up
)


def _prose(text):
    """(line, text) of every comment and every string (docstrings, messages,
    ``--help`` texts, the pieces of f-strings): a figure in a help text ages as
    one in a docstring does."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_no_figures_dates_or_gpu_status_in_the_code():
    found = [f"{p.relative_to(SRC)}:{line}: {m.group(0)!r}" for p in _sources()
             for line, piece in _prose(p.read_text(encoding="utf-8")) for m in FIGURE.finditer(piece)]
    assert not found, "measurements belong in BENCHMARKS.md:\n" + "\n".join(found)


def test_the_figure_finder_finds_figures():
    text = ('"""Took 18 ns per term (2026-11-23)."""\n# until a GPU measures it, 1.5x faster\n'
            'HELP = f"the defaults take {n} s (measured 2026-11-28 on an H200)"\n')
    assert {m.group(0) for _, piece in _prose(text) for m in FIGURE.finditer(piece)} == {
        "18 ns", "2026-11-23", "until a GPU", "1.5x faster", "2026-11-28", "H200"}
