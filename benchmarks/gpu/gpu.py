"""GPU benchmark: softk against torch.softmax / F.cross_entropy and the peer packages.

Run (on a machine with a CUDA GPU, from the repository root)::

    PYTHONPATH=src python benchmarks/gpu/gpu.py --json gpu.json --markdown gpu.md
    python benchmarks/gpu/gpu.py --quick            # one shape per group
    python benchmarks/gpu/gpu.py --only 'router/'   # cases whose key matches (group/op/ROWSxCOLS/dtype)
    python benchmarks/gpu/gpu.py --list             # the case list; needs no GPU

Every case (``gpu_cases``) is timed for each implementation that serves it
(``gpu_peers``), forward and forward+backward, with ``triton.testing.do_bench``
(p20/p50/p80, L2 flushed), plus the peak extra CUDA memory and GB/s; each p50
is also given as a multiple of the baseline (torch.softmax, or
F.cross_entropy for losses) timed at the same shape in the same run.  torch
and softk run in this process; peers (entmax, AdaSplash, Liger) run in a
child process each (``gpu_isolate``) and are reported "not installed" when
they are missing.  First, ``--warm-jobs`` processes compile every Triton
kernel the run needs into Triton's on-disk cache, so that no compile (and no
autotuning compile of a peer) runs serially inside the timed process.
``--budget-s`` bounds the whole run (cases not reached say "skipped: time
budget"); ``--json`` and ``--markdown`` are rewritten after every timed
(case, impl), so a run that is killed keeps what it measured.  Exit 2
without CUDA.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from gpu_cases import MODES, build_cases  # noqa: E402
from gpu_isolate import run_items, run_parallel, worker_loop  # noqa: E402
from gpu_peers import IMPLS, impls_for, load  # noqa: E402
from gpu_report import attach_ratios, make_row, markdown, status_counts, write_json  # noqa: E402


PEER_ORDER = {"sparsemax": 0, "entmax15": 1, "cross_entropy": 2, "sparsemax_loss": 3, "entmax15_loss": 4, "entmax_a1.3": 5}


def _import_softk() -> None:
    try:
        import softk  # noqa: F401
    except ImportError:  # running from a checkout without PYTHONPATH=src
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "src"))


def meta_info(device: str = "cuda") -> dict:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    name = torch.cuda.get_device_name() if device.startswith("cuda") else f"{device} (no GPU)"
    return {"device": name, "torch": torch.__version__, "triton": triton_version, "date": datetime.date.today().isoformat()}


@functools.lru_cache(maxsize=None)
def _softk_version() -> str | None:
    try:
        import softk

        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10)
        return softk.__version__ + (f"+{rev.stdout.strip()}" if rev.returncode == 0 else "")
    except Exception:  # noqa: BLE001 - a version string is a nicety
        return None


def run_cases(cases, impl_names, meta, timer, mem_probe, device="cuda", deadline=None, registry=None, progress=print, flush=None):
    """Rows of ``impl_names`` over ``cases`` in this process (both modes each); stops at ``deadline``.

    ``flush(rows)`` is called with the rows so far after each timed impl (the files survive a kill).
    """
    from gpu_timing import Inputs, time_impl

    registry = IMPLS if registry is None else registry
    inputs, rows, lost = Inputs(device), [], None
    for case in cases:
        for name in impls_for(case.group, case.op):
            if name not in impl_names:
                continue
            fns, detail, version = load(name, registry)
            if name == "softk":
                version = version or _softk_version()
            if fns is None or case.op not in fns:
                status = detail if fns is None else "not available: this version has no such function"
                rows += [make_row(case, name, m, meta, status=status, impl_version=version) for m in MODES]
                continue
            if lost or (deadline is not None and time.monotonic() > deadline):
                why = f"skipped: CUDA context lost ({lost})" if lost else "skipped: time budget"
                rows += [make_row(case, name, m, meta, status=why, impl_version=version) for m in MODES]
                continue
            new, was_lost = time_impl(case, name, fns[case.op], inputs, meta, timer, mem_probe, version, registry[name].mutates_input)
            rows += new
            if was_lost:
                lost = f"{name} on {case.key}"
            progress(" ".join(f"{r['mode']}={r['p50']:.3f}ms" if r["p50"] else f"{r['mode']}:{r['status']}" for r in new) + f"  {name} {case.key}")
            if flush is not None:
                flush(rows)
    return rows


def _timers(args):
    """(timer, mem_probe): do_bench and CUDA peak memory; wall clock and no memory for a ``--device cpu`` dry run."""
    from gpu_timing import cpu_peak, cpu_timer, cuda_peak, cuda_timer

    if args.device == "cpu":
        return (lambda call, grads, est: cpu_timer(call, grads, args.min_reps)), cpu_peak
    return (lambda call, grads, est: cuda_timer(call, grads, est, args.min_reps, args.rep_ms)), cuda_peak


def selected_cases(args, everything: bool = False):
    """The cases of this run (``everything``: all of them, for a worker's look-up by key), rows capped by ``--max-rows``."""
    cases = build_cases() if everything else build_cases(args.quick, args.only)
    if args.max_rows:
        cases = [dataclasses.replace(c, rows=min(c.rows, args.max_rows)) for c in cases]
    return cases


def _child_argv(args, *extra):
    """This script in a child process, with the options that shape its cases and clocks."""
    argv = [sys.executable, os.path.abspath(__file__), "--device", args.device, "--min-reps", str(args.min_reps), "--rep-ms", str(args.rep_ms)]
    return argv + (["--max-rows", str(args.max_rows)] if args.max_rows else []) + list(extra)


def _peer_phase(cases, peers, meta, args, deadline, flush):
    """Each isolated peer in ``peers`` over its cases, in a child process of its own."""
    rows = []
    for i, name in enumerate(peers):
        # The headline columns first (sparsemax, entmax15, the losses), so that a budget cut drops α = 1.3.
        mine = sorted((c for c in cases if name in impls_for(c.group, c.op)), key=lambda c: PEER_ORDER.get(c.op, len(PEER_ORDER)))
        if not mine:
            continue
        fns, detail, version = load(name)
        if fns is None:
            rows += [make_row(c, name, m, meta, status=detail, impl_version=version) for c in mine for m in MODES]
            continue
        budget = max(0.0, (deadline - time.monotonic()) / (len(peers) - i))
        print(f"[{name}] {len(mine)} cases in a child process, {budget:.0f} s", flush=True)
        got = run_items(_child_argv(args, "--impls", name), [c.key for c in mine], budget)
        for c in mine:
            payload = got.get(c.key, {})
            done = {r["mode"]: r for r in payload.get("rows", [])}
            for m in MODES:
                rows.append(done.get(m) or make_row(c, name, m, meta, status=payload.get("status", "skipped: context lost"), impl_version=version))
        flush(rows)
    return rows


def _warm_phase(cases, wanted, args) -> None:
    """Compile every Triton kernel the run needs in ``--warm-jobs`` processes at once (the on-disk cache keeps them)."""
    # torch and the entmax package have no Triton kernels to compile
    items = [f"{c.key}|{n}" for c in cases for n in impls_for(c.group, c.op) if n in wanted and n not in ("torch", "entmax") and load(n)[0] is not None]
    t0 = time.monotonic()
    got = run_parallel(_child_argv(args, "--warm"), items, args.warm_jobs, args.warm_timeout_s)
    ok = sum("status" not in v for v in got.values())
    print(f"warm-up: {ok} of {len(items)} (case, impl) compiled in {args.warm_jobs} processes, {time.monotonic() - t0:.0f} s", flush=True)


def _worker(args) -> int:
    """Child-process mode: time ``--impls`` on the case keys listed in ``--worker-items`` (or only compile, ``--warm``)."""
    _import_softk()
    cases = {c.key: c for c in selected_cases(args, everything=True)}
    if args.warm:
        from gpu_timing import warm

        def compile_only(item):
            key, name = item.split("|")
            warm(cases[key], load(name)[0][cases[key].op], args.device)
            return {"compiled": item}

        worker_loop(args.worker_items, args.worker_out, compile_only)
        return 0
    meta = meta_info(args.device)
    timer, mem = _timers(args)
    names = args.impls.split(",")
    from gpu_timing import Inputs, time_impl

    inputs = Inputs(args.device)

    def handle(key):
        case, rows, lost = cases[key], [], False
        for name in names:
            fns, detail, version = load(name)
            if fns is None or case.op not in fns:
                rows += [make_row(case, name, m, meta, status=detail if fns is None else "not available", impl_version=version) for m in MODES]
                continue
            new, lost = time_impl(case, name, fns[case.op], inputs, meta, timer, mem, version, IMPLS[name].mutates_input)
            rows += new
            if lost:
                break
        return {"rows": rows, "context_lost": lost}

    worker_loop(args.worker_items, args.worker_out, handle)
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Time softk against torch and peer packages on a CUDA GPU (see the module docstring).")
    ap.add_argument("--quick", action="store_true", help="one shape per group")
    ap.add_argument("--only", metavar="REGEX", help="cases whose key (group/op/ROWSxCOLS/dtype) matches; baselines are kept")
    ap.add_argument("--json", metavar="PATH", help="write tidy rows as JSON")
    ap.add_argument("--markdown", metavar="PATH", help="write the tables for BENCHMARKS.md")
    ap.add_argument("--list", action="store_true", help="print the cases and implementations, then exit (no GPU needed)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting cases after this many seconds (default 420)")
    ap.add_argument("--min-reps", type=int, default=20, help="timed runs per measurement, at least (default 20)")
    ap.add_argument("--rep-ms", type=float, default=60.0, help="do_bench's timed window in ms when that gives more runs (default 60)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="comma-separated implementations to run (default: all)")
    ap.add_argument("--warm-jobs", type=int, default=min(12, os.cpu_count() or 1),
                    help="processes that compile the Triton kernels before timing (0: none; default min(12, CPUs))")
    ap.add_argument("--warm-timeout-s", type=float, default=180.0, help="time allowed for that warm-up (default 180)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a dry run of the whole flow (wall-clock times, use with --max-rows)")
    ap.add_argument("--max-rows", type=int, help="cap every case's rows (a dry run; the reported shapes change with it)")
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-items", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    _import_softk()
    cases = selected_cases(args)
    wanted = args.impls.split(",")
    if args.list:
        for c in cases:
            print(c.key, " ".join(n for n in impls_for(c.group, c.op) if n in wanted))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu.py: no CUDA device here (torch.cuda.is_available() is False); this benchmark needs a GPU", file=sys.stderr)
        return 2
    if args.worker_items:
        return _worker(args)
    start = time.monotonic()
    meta = meta_info(args.device)
    print(f"{meta['device']}, torch {meta['torch']}, triton {meta['triton']}, {len(cases)} cases", flush=True)

    def flush(extra):
        rows = attach_ratios(list(extra))
        if args.json:
            write_json(rows, args.json)
        if args.markdown:
            with open(args.markdown, "w") as f:
                f.write(markdown(rows))
        return rows

    if args.warm_jobs > 0:
        _warm_phase(cases, wanted, args)
    timer, mem = _timers(args)
    local = [n for n in wanted if n in IMPLS and not IMPLS[n].isolate]
    # torch and softk get 60% of what the warm-up left, so that the peers are reached in a run cut short.
    local_deadline = time.monotonic() + 0.6 * max(0.0, start + args.budget_s - time.monotonic())
    rows = run_cases(cases, local, meta, timer, mem, device=args.device, deadline=local_deadline, progress=lambda s: print(s, flush=True), flush=flush)
    flush(rows)
    peers = [n for n in wanted if n in IMPLS and IMPLS[n].isolate]
    rows += _peer_phase(cases, peers, meta, args, start + args.budget_s, lambda more: flush(rows + more))
    rows = flush(rows)
    print(f"{len(rows)} rows in {time.monotonic() - start:.0f} s: {status_counts(rows)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
