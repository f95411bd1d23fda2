"""`softk bench`: time softk against torch.softmax and the entmax package (see :mod:`softk.bench`)."""

from __future__ import annotations

import csv
import json
import sys

from . import UsageError


def _shape(text: str):
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise UsageError(f"--shapes entries must look like 256x32000, got {text!r}") from None
    if len(dims) != 2 or min(dims) < 1:
        raise UsageError(f"--shapes entries must be two positive ints like 256x32000, got {text!r}")
    return dims


def register(sub):
    p = sub.add_parser("bench", help="time softk vs torch.softmax and the entmax package")
    p.add_argument("--shapes", nargs="+", default=["64x4096", "256x1024"], help="ROWSxCOLS sizes (default: small, < 1 min)")
    p.add_argument("--ops", nargs="+", default=None, help="ops to time (default: all)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--format", default="markdown", choices=["markdown", "csv", "json"])
    p.add_argument("--output", default="-", help="file to write (default: stdout)")
    p.set_defaults(run=_run)


def _run(args) -> int:
    import torch

    from .. import bench

    if args.threads is not None:
        if args.threads < 1:
            raise UsageError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {args.repeats}")
    shapes = [_shape(s) for s in args.shapes]
    rows = bench.run(args.ops, shapes, getattr(torch, args.dtype), args.device, args.repeats)
    out = sys.stdout if args.output == "-" else open(args.output, "w", newline="")
    try:
        if args.format == "json":
            json.dump(rows, out, indent=1)
            out.write("\n")
        elif args.format == "csv":
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        else:
            out.write(bench.markdown(rows) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0
