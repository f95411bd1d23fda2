"""What every ``softk experiment`` subcommand shares: the checks of its
options (each a :class:`~softk._cli.UsageError` naming the option) and the
writing of its results."""

from __future__ import annotations

import json
import os
import sys

from . import UsageError


def check(values, allowed, option):
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UsageError(f"{option} must be among {', '.join(allowed)}; got {', '.join(bad)}")
    if len(set(values)) != len(values):
        raise UsageError(f"{option} lists a value twice: {' '.join(values)}")


def positive(value, option):
    if value is not None and value < 1:
        raise UsageError(f"{option} must be >= 1, got {value}")


def out_dir(out):
    if out and os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: exists and is not a directory")


def emit(result: dict, text: str, out: str | None, name: str, as_json: bool) -> int:
    """Write NAME.md and NAME.json to ``out`` (when given) and print the JSON or the Markdown; exit status 0."""
    if out:
        os.makedirs(out, exist_ok=True)
        stem = os.path.join(out, name)
        with open(stem + ".md", "w") as fh:
            fh.write(text)
        with open(stem + ".json", "w") as fh:
            json.dump(result, fh, indent=1)
    if as_json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print(text, flush=True)
    return 0
