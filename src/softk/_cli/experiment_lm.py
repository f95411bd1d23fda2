"""`softk experiment lm`: a small GPT-2 trained on Shakespeare with each of softk's
losses and attention maps (:mod:`softk._experiments.lm`).

    softk experiment lm [--quick] [--seeds 0 1 2] [--arm ARM ...] [--steps N] [--ft-steps N]
                        [--corpus PATH] [--out DIR] [--figure PNG] [--json] [--quiet] [--[no-]throughput]

``--out DIR`` writes ``lm.json`` (every run and the configuration), ``lm.md``
(the table), ``runs/ARM-seedS.json`` (one per run, as it ends) and the
tokenizer, and lists them on stderr, one ``wrote PATH`` line each.  Needs
``transformers`` and ``tokenizers`` (the ``hf`` extra) and the corpus
(:data:`softk._experiments.corpus.CORPUS_HELP`); without them it exits 2
saying what to install.

``--quick`` trains every arm once on :data:`softk._experiments.lm.QUICK` (a
one-layer model of width 32, 16 steps; 8 more to fine-tune) on one thread,
and leaves out the memory and throughput measurements (``--throughput`` puts
them back): the smoke run the tests use.  One thread, because with two every
op on the tiny tensors waits at a barrier for the other thread, which a
shared machine may have descheduled; no measurements, because the memory
measurement's child process imports torch and transformers over again.
"""

from __future__ import annotations

import argparse
import os

from .experiment_common import COST_NOTE, check as _check, corpus_experiment, emit, out_dir as _out_dir
from .experiment_common import corpus_options, output_options, positive as _positive


def register(kinds) -> None:
    from .._experiments.lm_arms import ARMS

    text = ("a small GPT-2 trained on Shakespeare (held-out plays) with every softk loss (cross_entropy, sparsemax, "
            "entmax15, ts2, topk_softmax_ce) and attention (softmax, entmax15, learned α), from scratch and "
            "fine-tuned; ε-perplexity, sparsemax score, JS, accuracy, support, ECE, softmax perplexity, "
            "distinct-n, tokens/s and memory")
    q = kinds.add_parser("lm", help=text, description=f"{text}. {COST_NOTE}")
    corpus_options(q)
    q.add_argument("--quick", action="store_true",
                   help="a one-layer model of width 32 on a slice of the corpus, every arm once, one seed, one "
                   "thread, no memory or throughput measurement: a smoke test (the tests run it), not a result")
    q.add_argument("--arm", nargs="+", metavar="ARM", help=f"arms, among {', '.join(ARMS)} (default: all)")
    q.add_argument("--steps", type=int, metavar="N", help="training steps from scratch (default 300; --quick 16)")
    q.add_argument("--ft-steps", type=int, metavar="N", help="fine-tuning steps (default 100; --quick 8)")
    output_options(q, "lm.json, lm.md, runs/*.json and tokenizer.json", "the held-out curves")
    q.add_argument("--throughput", action=argparse.BooleanOptionalAction,
                   help="measure the peak memory of each arm's training step (in a child process) and compare "
                   "each loss's tokens/s and memory fused and unfused (default: on; --quick: off, its peak MiB "
                   "column then reads n/a); --no-throughput keeps the memory and drops the comparison")
    q.set_defaults(run=run)


def run(args) -> int:
    import torch

    from .._experiments import lm

    _positive(args.steps, "--steps")
    _positive(args.ft_steps, "--ft-steps")
    arms = args.arm or list(lm.ARMS)
    _check(arms, lm.ARMS, "--arm")
    _out_dir(args)
    cfg = lm.QUICK if args.quick else lm.Config()
    if args.steps is not None:
        cfg = cfg._replace(steps=args.steps, eval_every=min(cfg.eval_every, args.steps))
    if args.ft_steps is not None:
        cfg = cfg._replace(ft_steps=args.ft_steps)
    seeds = [args.seed] if args.seed is not None else (args.seeds or ([0] if args.quick else [0, 1, 2]))
    # --quick: the tiny model runs on one thread (two threads on tiny tensors wait on each other, most
    # of all on a shared machine), and measures no throughput or memory unless --throughput asks
    throughput = args.throughput if args.throughput is not None else not args.quick
    with corpus_experiment(args.corpus, args.figure):
        if args.quick:
            torch.set_num_threads(1)
        report = lm.run_lm(seeds, arms, cfg, args.corpus, progress=not args.quiet, out_dir=args.out,
                           throughput=throughput, memory=throughput or not args.quick)
    report["torch"] = torch.__version__
    text = lm.markdown(report)
    written = []
    if args.out:
        written += [os.path.join(args.out, "runs", "") + f" ({len(report['runs'])} files)",
                    os.path.join(args.out, "tokenizer.json")]
    if args.figure:
        written.append(lm.figure(report, args.figure))
    return emit(report, text, args.out, "lm", args.json, written)
