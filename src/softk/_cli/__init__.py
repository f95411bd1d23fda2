"""The ``softk`` command: one module per subcommand, each with ``register(subparsers)``.

A subcommand module adds its parser with ``subparsers.add_parser(...)`` and sets
``parser.set_defaults(run=handler)``; ``handler(args) -> int`` is the exit code.
Bad input raises :class:`UsageError` (or a ValueError/TypeError from softk, or
an OSError for a file), printed as one line ``softk <cmd>: error: ...`` on
stderr with exit status 2 and no traceback; ``<cmd>`` is the full subcommand
(``softk experiment lm: error: ...``).  The checks shared by several
subcommands (numbers, files) live here so every command words them alike.
The top floor: only ``softk.__main__`` imports it, and it may import anything.
"""

from __future__ import annotations

import argparse
import importlib
import math
import re
import sys

SUBCOMMANDS = ("compare", "check", "plot", "bench", "experiment")


class UsageError(Exception):
    """Bad input from the command line: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (exit 2), no usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def one_line(message) -> str:
    """``message`` with every run of whitespace (newlines included) made one space."""
    return " ".join(str(message).split())


_ROLE = re.compile(r":(?:py:)?[a-z]+:`~?([^`]+)`")


def plain(doc: str) -> str:
    """A docstring with its reST markup made plain text for ``--help``.

    Roles keep their target, double backquotes become single ones:

    >>> plain("Measured by :func:`~softk.properties` on ``x + c``.")
    'Measured by softk.properties on `x + c`.'
    """
    return _ROLE.sub(r"\1", doc).replace("``", "`")


def finite_number(value: float, option: str, *, low: float | None = None, strict: bool = True) -> float:
    """``value`` if it is finite (and > ``low``, or >= with ``strict=False``), else a UsageError naming ``option``."""
    bound = "" if low is None else f" {'>' if strict else '>='} {low:g}"
    ok = math.isfinite(value) and (low is None or (value > low if strict else value >= low))
    if not ok:
        raise UsageError(f"{option} must be a finite number{bound}, got {value:g}")
    return value


def int_at_least(value: int, option: str, low: int) -> int:
    if value < low:
        raise UsageError(f"{option} must be an integer >= {low}, got {value}")
    return value


def os_message(exc: OSError) -> str:
    """An OSError as 'FILE: reason' (no errno, no traceback)."""
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename is not None else reason


def version_line() -> str:
    """``softk VERSION (torch VERSION)``, what ``softk --version`` prints."""
    import torch

    from .. import __version__

    return f"softk {__version__} (torch {torch.__version__})"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="softk",
        description="Compare, check, plot and benchmark maps from scores to the (top-k) simplex.",
    )
    parser.add_argument("--version", action="version", version=version_line(),
                        help="print softk's version (and torch's) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def _subparser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the deepest subcommand ``args`` chose (``softk experiment lm``'s
    for ``softk experiment lm ...``), else ``parser``: its ``prog`` words the
    errors, ``softk experiment lm: error: ...``."""
    while True:
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, action.dest, None) if action is not None else None
        if action is None or chosen not in action.choices:
            return parser
        parser = action.choices[chosen]


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub = _subparser(parser, args)
    if extra:
        hint = "; negative values go after --, e.g. softk compare -- -1 0 2" if any(_is_number(a) for a in extra) else ""
        sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        return int(args.run(args) or 0)
    except BrokenPipeError:  # `softk compare --json | head`
        sys.stderr.close()
        return 0
    except (UsageError, ValueError, TypeError) as exc:
        message = str(exc)
    except OSError as exc:  # a file a subcommand could not read or write
        message = os_message(exc)
    print(f"{sub.prog}: error: {one_line(message)}", file=sys.stderr)
    return 2
