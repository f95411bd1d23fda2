"""`softk compare`: every map on the same scores, one row per operator."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

DEFAULT_VALUES = [1.0, 2.0, 3.0, 4.0]  # the seeds' example


def register(sub):
    p = sub.add_parser(
        "compare",
        help="every map on the same scores (default: the seeds' 1 2 3 4)",
        description="Apply every operator to one score vector and print a table "
        "(one row per operator, one column per entry, plus the sum and support size). "
        "Negative values go after `--`, e.g. `softk compare -- -1 0 2`.",
    )
    p.add_argument("values", nargs="*", help="the scores (default: 1 2 3 4)")
    p.add_argument("--k", type=int, default=2, help="k for the top-k maps (default 2)")
    p.add_argument("--tau", type=float, default=1.0, help="temperature > 0 (default 1)")
    p.add_argument("--alpha", type=float, default=1.3, help="α of the extra entmax row (default 1.3)")
    p.add_argument("--input", metavar="PATH|-", help="read the scores from a .npy, .csv or whitespace text file, or stdin")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)


def read_values(args) -> np.ndarray:
    from . import UsageError

    if args.input is not None and args.values:
        raise UsageError("give the scores either as VALUES or with --input, not both")
    if args.input is None:
        raw = args.values or [str(v) for v in DEFAULT_VALUES]
        try:
            return np.array([float(v) for v in raw], dtype=np.float64)
        except ValueError:
            bad = next(v for v in raw if not _is_float(v))
            raise UsageError(f"VALUES must be numbers, got {bad!r}") from None
    if args.input == "-":
        text = sys.stdin.read()
    else:
        path = Path(args.input)
        if not path.is_file():
            raise UsageError(f"--input: no such file: {path}")
        if path.suffix == ".npy":
            return np.asarray(np.load(path), dtype=np.float64).ravel()
        text = path.read_text()
    try:
        values = np.array([float(v) for v in text.replace(",", " ").split()], dtype=np.float64)
    except ValueError:
        raise UsageError(f"--input: could not read numbers from {args.input}") from None
    if values.size == 0:
        raise UsageError(f"--input: no numbers in {args.input}")
    return values


def _is_float(v: str) -> bool:
    try:
        float(v)
        return True
    except ValueError:
        return False


def operators(k: int, tau: float, alpha: float):
    """(name, function of a 1-D float64 tensor) for every operator, in display order."""
    import softk

    ops = [
        ("softmax", lambda x: softk.softmax(x, tau=tau)),
        ("sparsemax", lambda x: softk.sparsemax(x, tau=tau)),
        ("entmax15", lambda x: softk.entmax15(x, tau=tau)),
        (f"entmax[alpha={alpha:g}]", lambda x: softk.entmax(x, alpha, tau=tau)),
    ]
    if hasattr(softk, "topk_softmax"):
        ops.append(("topk_softmax", lambda x: softk.topk_softmax(x, k, tau=tau)))
    for method in softk.topk.METHODS:
        ops.append((f"soft_topk[{method}]", (lambda m: lambda x: softk.soft_topk(x, k, tau=tau, method=m))(method)))
    return ops


def compute(values: np.ndarray, k: int, tau: float, alpha: float) -> dict:
    from . import UsageError

    n = values.size
    if not 1 <= k <= n:
        raise UsageError(f"--k must be in [1, n] = [1, {n}] for {n} values, got {k}")
    if not tau > 0:
        raise UsageError(f"--tau must be > 0, got {tau}")
    if not alpha >= 1:
        raise UsageError(f"--alpha must be >= 1, got {alpha}")
    x = torch.tensor(values, dtype=torch.float64)
    rows = {}
    for name, fn in operators(k, tau, alpha):
        p = fn(x)
        rows[name] = {
            "values": [float(v) for v in p],
            "sum": float(p.sum()),
            "support": int((p > 0).sum()),
        }
    import softk

    return {
        "input": [float(v) for v in values],
        "k": k,
        "tau": tau,
        "logsumexp": float(softk.logsumexp(x, tau=tau)),
        "rows": rows,
    }


def format_table(result: dict) -> str:
    n = len(result["input"])
    head = ["operator"] + [f"x={v:g}" for v in result["input"]] + ["sum", "support"]
    lines = [[name] + [f"{v:.4f}" for v in r["values"]] + [f"{r['sum']:.4f}", str(r["support"])]
             for name, r in result["rows"].items()]
    widths = [max(len(row[i]) for row in [head] + lines) for i in range(n + 3)]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    out = [f"k = {result['k']}, tau = {result['tau']:g}  (top-k maps use k; softmax, sparsemax, entmax have k = 1)"]
    out += [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines]
    out.append(f"logsumexp (smooth max) = {result['logsumexp']:.4f}")
    return "\n".join(out)


def run(args) -> int:
    values = read_values(args)
    result = compute(values, args.k, args.tau, args.alpha)
    print(json.dumps(result, indent=2) if args.json else format_table(result))
    return 0
