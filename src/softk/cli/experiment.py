"""`softk experiment multilabel`: the sparsemax multi-label benchmark on Mulan data.

    softk experiment multilabel --data ../shared/data/mulan/emotions [--loss sparsemax ...]
                                [--folds contiguous shuffled] [--cv-score per-fold pooled]
                                [--fold-sizes ceil|even] [--seed 0] [--out DIR] [--json] [--quiet]
                                [--lambdas 1 1e-3 ...]

For each ``--data`` directory (a Mulan train/test ARFF pair with its .xml
header) and each loss, runs the protocol of :mod:`softk.experiments.multilabel`
and prints a Markdown table (or, with ``--json``, the results as JSON: one
object for one data set, a list for several).  ``--out DIR`` also writes
``NAME.md`` and ``NAME.json`` there.  Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys

from . import UsageError

from ..experiments.multilabel import CV_SCORES, FOLD_SIZES
from ..experiments.multilabel import FOLD_SCHEMES as FOLDS
from ..experiments.objectives import LOSSES


def register(sub):
    p = sub.add_parser("experiment", help="run an experiment on real data (multilabel: Mulan benchmark)")
    kinds = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    m = kinds.add_parser(
        "multilabel",
        help="sigmoid/softmax/sparsemax/entmax15/soft_topk losses on Mulan data (Martins & Astudillo 2016)",
        description="Train a linear multi-label classifier with each loss (L-BFGS, λ and the prediction "
        "threshold chosen by 5-fold CV on the training file) and report test micro/macro F1.",
    )
    m.add_argument("--data", nargs="+", required=True, metavar="DIR",
                   help="Mulan data set directory (NAME.xml, NAME-train.arff, NAME-test.arff); several allowed")
    m.add_argument("--loss", nargs="+", default=list(LOSSES), metavar="LOSS",
                   help=f"losses to run, among {', '.join(LOSSES)} (default: all)")
    m.add_argument("--folds", nargs="+", default=list(FOLDS), metavar="SCHEME",
                   help="CV fold schemes; the first is the headline: contiguous (the paper's), "
                   "shuffled (seeded) (default: both)")
    m.add_argument("--cv-score", nargs="+", default=list(CV_SCORES), metavar="SCORE",
                   help="how CV F1 is scored; the first is the headline: per-fold (F1 on each fold, averaged; "
                   "the authors' code), pooled (F1 of all held-out predictions) (default: both, from the same fits)")
    m.add_argument("--fold-sizes", default="ceil", choices=FOLD_SIZES,
                   help="ceil: folds of ceil(n/5) rows, the authors' (default); even: np.array_split")
    m.add_argument("--lambdas", nargs="+", type=float, metavar="L",
                   help="ridge grid instead of the paper's 1, 1e-1, ..., 1e-9 (quicker runs; not the protocol)")
    m.add_argument("--seed", type=int, default=0, help="seed of the shuffled folds (default 0)")
    m.add_argument("--out", metavar="DIR", help="also write NAME.md and NAME.json to this directory")
    m.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    m.add_argument("--quiet", action="store_true", help="no progress on stderr")
    m.set_defaults(run=_run_multilabel)

    def no_experiment(args) -> int:  # `softk experiment` alone: usage, exit 2
        p.print_usage(sys.stderr)
        raise UsageError(f"choose an experiment: {', '.join(kinds.choices)}")

    p.set_defaults(run=no_experiment)


def _check(values, allowed, option):
    bad = [v for v in values if v not in allowed]
    if bad:
        raise UsageError(f"{option} must be among {', '.join(allowed)}; got {', '.join(bad)}")
    if len(set(values)) != len(values):
        raise UsageError(f"{option} lists a value twice: {' '.join(values)}")


def _run_multilabel(args) -> int:
    _check(args.loss, LOSSES, "--loss")
    _check(args.folds, FOLDS, "--folds")
    _check(args.cv_score, CV_SCORES, "--cv-score")
    for d in args.data:
        if not os.path.isdir(d):
            raise UsageError(f"--data {d}: not a directory")
    if args.lambdas is not None and not all(l > 0 and l != float("inf") for l in args.lambdas):
        raise UsageError(f"--lambdas must be numbers > 0, got {' '.join(map(str, args.lambdas))}")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    try:
        import scipy  # noqa: F401
    except ImportError:
        raise UsageError("this experiment needs scipy: pip install scipy") from None
    from ..experiments.data import load_mulan
    from ..experiments.multilabel import LAMBDAS, run_multilabel, stderr_progress
    from ..experiments.report import markdown_report

    reports = []
    for d in args.data:
        data = load_mulan(d)
        try:
            report = run_multilabel(data, args.loss, args.folds, args.seed,
                                    None if args.quiet else stderr_progress, args.lambdas or LAMBDAS,
                                    args.cv_score, args.fold_sizes)
        except ValueError as exc:  # e.g. too few rows for ceil-sized folds
            raise UsageError(f"--data {d}: {exc}") from None
        reports.append(report)
        text = markdown_report(report)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, f"{data.name}.md"), "w") as fh:
                fh.write(text)
            with open(os.path.join(args.out, f"{data.name}.json"), "w") as fh:
                json.dump(report, fh, indent=2)
        if not args.json:
            print(text, flush=True)
    if args.json:
        json.dump(reports[0] if len(reports) == 1 else reports, sys.stdout, indent=2)
        print()
    return 0
