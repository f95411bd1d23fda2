"""`softk experiment moe`: a small Mixtral-shaped language model trained on
Shakespeare with each softk router (:mod:`softk._experiments.moe`).

    softk experiment moe [--quick] [--seeds 0 1 2] [--arm ARM ...] [--steps N]
                         [--corpus PATH] [--out DIR] [--figure PNG] [--json] [--quiet]

``--out DIR`` writes ``moe.json`` (every run, its routing along training and
the configuration) and ``moe.md`` (the tables), and lists them on stderr, one
``wrote PATH`` line each.  Needs ``transformers`` and ``tokenizers`` (the
``hf`` extra) and the corpus (:data:`softk._experiments.corpus.CORPUS_HELP`);
without them it exits 2 saying what to install.  It runs on one thread (the
model is tiny: a second thread only waits at the barriers) and restores the
thread count after.

``--quick`` trains every arm once on :data:`softk._experiments.moe.QUICK`
(width 32, 12 steps of 8 windows of 32 tokens, one seed): the smoke run the
tests use, not a result.
"""

from __future__ import annotations

from .experiment_common import COST_NOTE, check as _check, corpus_experiment, emit, out_dir as _out_dir
from .experiment_common import corpus_options, output_options, positive as _positive


def register(kinds) -> None:
    from .._experiments.moe_arms import ARMS, K_MAX, TARGET

    text = ("a small Mixtral-shaped language model trained on Shakespeare (held-out plays) with its router replaced "
            f"by softmax top-2 (the control), sparsemax, entmax15, learned-α entmax (each up to {K_MAX} experts, "
            f"some held at a mean of {TARGET:g} by a controller on τ), soft top-k and budget sparsemax (k = 2): "
            "held-out perplexity, live experts per token, load CV, expert FLOPs per token, tokens/s and the load "
            "per expert along training")
    q = kinds.add_parser("moe", help=text, description=f"{text}. {COST_NOTE}")
    corpus_options(q)
    q.add_argument("--quick", action="store_true",
                   help="a two-layer model of width 32 on a slice of the corpus, 12 steps, every arm once, one seed: "
                   "a smoke test (the tests run it), not a result; options given still apply")
    q.add_argument("--arm", nargs="+", metavar="ARM", help=f"arms, among {', '.join(ARMS)} (default: all)")
    q.add_argument("--steps", type=int, metavar="N", help="training steps (default 200; --quick 12)")
    output_options(q, "moe.json and moe.md", "the load per expert along training")
    q.set_defaults(run=run)


def run(args) -> int:
    import torch

    from .._experiments import moe

    _positive(args.steps, "--steps")
    arms = args.arm or list(moe.ARMS)
    _check(arms, moe.ARMS, "--arm")
    _out_dir(args)
    cfg = moe.QUICK if args.quick else moe.Config()
    if args.steps is not None:
        cfg = cfg._replace(steps=args.steps)
    seeds = [args.seed] if args.seed is not None else (args.seeds or ([0] if args.quick else [0, 1, 2]))
    with corpus_experiment(args.corpus, args.figure):
        torch.set_num_threads(1)
        report = moe.run_moe(seeds, arms, cfg, args.corpus, progress=not args.quiet)
    report["torch"] = torch.__version__
    text = moe.markdown(report)
    written = [moe.figure(report, args.figure)] if args.figure else []
    return emit(report, text, args.out, "moe", args.json, written)
