"""The ``softk`` command: one module per subcommand, each with ``register(subparsers)``.

A subcommand module adds its parser with ``subparsers.add_parser(...)`` and sets
``parser.set_defaults(run=handler)``; ``handler(args) -> int`` is the exit code.
Bad input raises :class:`UsageError`, printed as one line on stderr with exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = ("compare", "check", "plot", "bench", "experiment")


class UsageError(Exception):
    """Bad input from the command line: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr (exit 2), no usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="softk",
        description="Compare, check, plot and benchmark maps from scores to the (top-k) simplex.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    try:
        return int(args.run(args) or 0)
    except (UsageError, ValueError, TypeError, FileNotFoundError) as exc:
        print(f"softk {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `softk compare --json | head`
        sys.stderr.close()
        return 0
