"""Triton's interpreter without its redundant re-patching of triton.language.

Under TRITON_INTERPRET=1 a kernel launch (``GridExecutor.__call__``) swaps
every builtin of ``triton.language`` for its NumPy twin, runs the grid, and
restores them.  Every call of a ``@triton.jit`` helper *inside* the kernel
(``InterpretedFunction.__call__``) asks for that swap again: five
``inspect.getmembers`` sweeps over the language, about a millisecond, to find
that everything is already swapped (the wrappers are not builtins any more, so
nothing is wrapped twice) and to set again a few tensor attributes that the
launch's restore puts back anyway.  softk's kernels call helpers in their
inner loops, so in the tests' small grids this sweep was a large part of
the interpreter's time.

``install()`` skips that swap when the running launch (or a helper in it)
has already made it for the same language modules, and changes nothing else:
the launch still swaps and restores, and the first helper whose module sees a
language module not swapped yet (``triton.language.standard`` sees only
``triton.language.core``) still swaps it.  It needs the interpreter's structure
as Triton 3.x has it (``_patch_lang``, ``GridExecutor``); where that is not
there it installs nothing and the tests run at the interpreter's own speed, as
they do with SOFTK_TEST_PLAIN_INTERPRETER=1.
``tests/backends/triton/test_interpreter_speed.py`` checks that kernels give
bit-identical results either way.
"""

import inspect

_state = {"depth": 0, "langs": frozenset()}
_installed = []


def _langs_of(fn, tl):
    return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))


def install():
    """Speed up the interpreter in this process; True when installed (idempotent)."""
    if _installed:
        return True
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch_lang = getattr(interpreter, "_patch_lang", None)
    grid_executor = getattr(interpreter, "GridExecutor", None)
    if patch_lang is None or grid_executor is None or not hasattr(interpreter, "_LangPatchScope"):
        return False
    launch = grid_executor.__call__

    def patched_launch(self, *args, **kwargs):
        outer = dict(_state)
        _state.update(depth=outer["depth"] + 1, langs=frozenset())
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state.update(outer)

    def once_per_launch(fn):
        langs = _langs_of(fn, tl)
        if _state["depth"] and langs <= _state["langs"]:
            return interpreter._LangPatchScope()  # swapped already in this launch
        scope = patch_lang(fn)
        if _state["depth"]:
            _state["langs"] = _state["langs"] | langs
        return scope

    grid_executor.__call__ = patched_launch
    interpreter._patch_lang = once_per_launch
    _installed.append((interpreter, patch_lang, grid_executor, launch))
    return True


def uninstall():
    """Put the interpreter back as Triton ships it."""
    while _installed:
        interpreter, patch_lang, grid_executor, launch = _installed.pop()
        interpreter._patch_lang = patch_lang
        grid_executor.__call__ = launch
