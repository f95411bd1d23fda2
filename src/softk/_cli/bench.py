"""`softk bench`: time softk against torch.softmax and the entmax package (see :mod:`softk._cli.harness`)."""

from __future__ import annotations

import csv
import json
import os
import sys
import time

from . import UsageError, int_at_least
from .experiment_common import writable_file

NOISE_NOTE = ("timings on a shared or busy machine are noisy (other processes take the cores, the "
              "first touch of fresh buffers costs page faults): compare providers within one run, "
              "repeat the run, and quote figures measured on a quiet machine")


def _shape(text: str):
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--shapes entries must look like 256x32000, got {text!r}") from None
    if len(dims) != 2 or min(dims) < 1 or max(dims) >= 2**62:
        raise UsageError(f"--shapes entries must be two positive ints like 256x32000, got {text!r}")
    return dims


def register(sub):
    p = sub.add_parser(
        "bench",
        help="time softk vs torch.softmax and the entmax package",
        description="Time forward, backward and both for each op and provider, interleaved round by round "
        "(so that drift on a shared machine hits every provider alike); prints p20/p50/p80 ms, the ratio to "
        "torch.softmax and GB/s (the bytes each pass must read and write, over its time). Progress goes to "
        f"stderr, one line per shape. Note: {NOISE_NOTE}.",
    )
    p.add_argument("--shapes", nargs="+", default=["64x4096", "256x1024"], metavar="ROWSxCOLS",
                   help="input sizes, e.g. 256x32000 (default: 64x4096 256x1024, under a minute)")
    p.add_argument("--ops", nargs="+", default=None, metavar="OP",
                   help="ops to time, among softmax, sparsemax, entmax15, entmax1.3, soft_topk_exp64 "
                   "(default: all; torch.softmax is always timed as the baseline)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"],
                   help="dtype of the random inputs (default float32)")
    p.add_argument("--device", default="cpu",
                   help="cpu, cuda or cuda:N (default cpu); cuda needs a GPU and a CUDA build of torch")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed rounds per op after one warm-up round, >= 1 (default 5)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads, from 1 to the number of CPUs (default: torch's own)")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "json"],
                   help="output format (default markdown)")
    p.add_argument("--output", default="-", metavar="PATH",
                   help="file to write, created or overwritten (default -: stdout)")
    p.add_argument("--quiet", action="store_true", help="no progress and no note on stderr")
    p.set_defaults(run=_run)


def _timed(bench, ops, shapes, dtype, device, repeats, quiet):
    """bench.run one shape at a time (each shape is timed on its own anyway), with a
    line of progress per shape on stderr, so a long run shows it is alive."""
    import torch

    for shape in shapes:  # refuse a shape that cannot be held before any progress is printed
        try:
            torch.empty(2, *shape, dtype=dtype, device=device)
        except (RuntimeError, MemoryError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UsageError(f"--shapes {'x'.join(map(str, shape))}: cannot allocate the inputs on {device} "
                             f"({first})") from None
    say = (lambda text: None) if quiet else (lambda text: print(f"softk bench: {text}", file=sys.stderr, flush=True))
    say(f"note: {NOISE_NOTE}")
    providers = sum(len(bench.OPS[op]) for op in dict.fromkeys(["softmax", *ops]))
    rows = []
    for i, shape in enumerate(shapes, 1):
        name = "x".join(map(str, shape))
        say(f"[{i}/{len(shapes)}] {name}: {providers} op/provider pairs x 3 passes x {repeats + 1} rounds ...")
        start = time.perf_counter()
        try:
            rows += bench.run(ops, [shape], dtype, device, repeats)
        except bench.AllocationError as exc:
            raise UsageError(f"--shapes {exc}") from None
        say(f"[{i}/{len(shapes)}] {name}: done in {time.perf_counter() - start:.1f} s")
    return rows


def _device(text: str):
    """``text`` as a torch.device bench can time on: cpu, or a CUDA device that exists here."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {text!r}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise UsageError(f"--device must be cpu, cuda or cuda:N (bench times CPU and CUDA only), got {text!r}")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {text}: CUDA is not available here (torch {torch.__version__}, "
                         f"{'no CUDA build' if torch.version.cuda is None else 'no GPU found'}); use --device cpu")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {text}: there are only {torch.cuda.device_count()} CUDA device(s) here")
    return device


def _check_output(path: str) -> None:
    """Refuse an --output that cannot be written, before minutes of timing."""
    if path == "-":
        return
    if not path:
        raise UsageError("--output must name a file (or - for stdout), got an empty string")
    writable_file(path, "--output")


def _run(args) -> int:
    import torch

    from . import harness as bench

    if args.threads is not None:
        int_at_least(args.threads, "--threads", 1)
        cpus = os.cpu_count() or 1
        if args.threads > cpus:  # OpenMP with 100000 threads crashes the process
            raise UsageError(f"--threads must be in [1, {cpus}] (the CPUs of this machine), got {args.threads}")
    int_at_least(args.repeats, "--repeats", 1)
    shapes = [_shape(s) for s in args.shapes]
    if args.ops is not None:
        unknown = [o for o in args.ops if o not in bench.OPS]
        if unknown:
            raise UsageError(f"--ops must be among {', '.join(bench.OPS)}; got {', '.join(unknown)}")
    ops = list(bench.OPS) if args.ops is None else args.ops
    for op in ops:
        need = bench.MIN_COLS.get(op, 1)
        small = [f"{r}x{c}" for r, c in shapes if c < need]
        if small:
            which = f"--ops {op}" if args.ops is not None else f"op {op} (one of the default --ops)"
            raise UsageError(f"{which} needs at least {need} columns, but --shapes has {', '.join(small)}; "
                             f"use wider --shapes or leave {op} out of --ops")
    device = _device(args.device)
    _check_output(args.output)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = _timed(bench, ops, shapes, getattr(torch, args.dtype), device, args.repeats, args.quiet)
    try:
        out = sys.stdout if args.output == "-" else open(args.output, "w", newline="")
    except OSError as exc:
        raise UsageError(f"--output {args.output}: cannot write it: {exc.strerror or exc}") from None
    try:
        try:
            if args.format == "json":
                json.dump(rows, out, indent=1)
                out.write("\n")
            elif args.format == "csv":
                writer = csv.DictWriter(out, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            else:
                out.write(bench.markdown(rows) + "\n\n")
                out.write(f"Note: {NOISE_NOTE}.\n")
        finally:
            if out is not sys.stdout:
                out.close()
    except OSError as exc:  # a full disk, a closed pipe: found on the write (or the close that flushes it)
        where = "stdout" if out is sys.stdout else f"--output {args.output}"
        raise UsageError(f"{where}: the results could not be written: {exc.strerror or exc}") from None
    return 0
