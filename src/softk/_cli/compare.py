"""`softk compare`: every map on the same scores, one row per operator."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

from . import UsageError, finite_number, one_line

DEFAULT_VALUES = [1.0, 2.0, 3.0, 4.0]
DEFAULT_K = 2  # capped at n, so a single score still runs
# soft_topk's constructions kept for comparison with the literature: Σp = k is
# all they keep (their entries can exceed 1); the table marks their rows.
COMPARISON_ONLY = ("iterative", "weighted")


def k_number(text: str) -> int | float:
    """--k: a whole number (as an int) or a fractional one (the threshold methods take it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    return int(value) if value.is_integer() else value


def register(sub):
    p = sub.add_parser(
        "compare",
        help="every map on the same scores (default: 1 2 3 4)",
        description="Apply every operator to one row of scores and print a table "
        "(one row per operator, one column per entry, plus the sum and support size). "
        "Negative values go after `--`, e.g. `softk compare -- -1 0 2`. "
        "Scores are numbers; -inf masks an entry, NaN and +inf are refused. "
        "--input takes ONE row: a 1-D .npy array, or text (csv or whitespace) holding "
        "one line of numbers or one number per line; a 2-D table or 3-D array is refused "
        "with its shape (run compare once per row, e.g. on x[i]).",
    )
    p.add_argument("values", nargs="*", metavar="VALUES", help="the scores (default: 1 2 3 4)")
    p.add_argument("--k", type=k_number, default=None,
                   help="k for the top-k maps: a whole number in [1, n] (default: 2, or 1 for a single score), "
                   "or a fractional one in (0, n), which only the threshold methods of soft_topk take "
                   "(exp, sigmoid, laplace, sparse: the other top-k rows are left out)")
    p.add_argument("--tau", type=float, default=1.0, help="temperature, a finite number > 0 (default 1)")
    p.add_argument("--alpha", type=float, default=1.3, help="α >= 1 of the extra entmax row (default 1.3)")
    p.add_argument("--input", metavar="PATH|-",
                   help="read one row of scores from a .npy file, a csv or whitespace text file, or - for stdin")
    p.add_argument("--json", action="store_true",
                   help="print strict JSON instead of a table (non-finite numbers as the strings \"inf\", \"-inf\", \"nan\")")
    p.set_defaults(run=run)


def read_values(args) -> np.ndarray:
    """The scores as a 1-D float64 array, or a UsageError naming VALUES or --input."""
    if args.input is not None and args.values:
        raise UsageError("give the scores either as VALUES or with --input, not both")
    if args.input is None:
        raw = args.values or [str(v) for v in DEFAULT_VALUES]
        values = []
        for i, v in enumerate(raw, 1):
            try:
                values.append(float(v))
            except ValueError:
                raise UsageError(f"VALUES must be numbers, got {v!r} (value {i})") from None
        return check_scores(np.array(values, dtype=np.float64), "VALUES")
    if args.input == "-":
        source = "--input - (stdin)"
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError:
            raise UsageError(f"{source}: not UTF-8 text (pass a .npy file by its path)") from None
        return check_scores(parse_text(text, source), source)
    if not args.input:
        raise UsageError("--input: an empty path (pass a file, or - for stdin)")  # Path('') is the folder '.'
    path = Path(args.input)
    source = f"--input {path}"
    if not path.exists():
        raise UsageError(f"{source}: no such file")
    if path.is_dir():
        raise UsageError(f"{source}: is a folder, not a file")
    try:
        if path.suffix.lower() == ".npy":
            return check_scores(load_npy(path, source), source)
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{source}: cannot read it: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")  # (a spreadsheet's export may begin with a byte-order mark)
    except UnicodeDecodeError:
        raise UsageError(f"{source}: not a UTF-8 text file (a .npy file must end in .npy)") from None
    return check_scores(parse_text(text, source), source)


def load_npy(path: Path, source: str) -> np.ndarray:
    """A 1-D (or 0-d) real array from ``path``; bool, complex, object, 2-D and 3-D are refused."""
    try:
        arr = np.load(path, allow_pickle=False)
    except (ValueError, EOFError, OSError, MemoryError) as exc:  # (a header claiming a huge shape: MemoryError)
        raise UsageError(f"{source}: not a readable .npy file ({one_line(exc) or type(exc).__name__})") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive under a .npy name
        raise UsageError(f"{source}: holds an .npz archive, not one array")
    if arr.dtype.kind not in "iuf":
        what = {"b": "bool", "c": "complex"}.get(arr.dtype.kind, str(arr.dtype))
        raise UsageError(f"{source}: holds {what} values ({arr.dtype}); scores must be real numbers "
                         "(save x.astype(float) if that is what you mean)")
    if arr.ndim > 1:
        raise UsageError(f"{source}: holds a {arr.ndim}-D array of shape {arr.shape}; compare takes one "
                         "row of scores, a 1-D array (save x[i] for row i)")
    return arr.astype(np.float64).reshape(-1)


def parse_text(text: str, source: str) -> np.ndarray:
    """One row of numbers from csv or whitespace text (one line, or one number per line)."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split(",") if "," in line else line.split()
        row = []
        for j, field in enumerate(fields, 1):
            field = field.strip()
            if not field:
                raise UsageError(f"{source}: line {lineno}, field {j} is empty; every field must hold a number")
            try:
                row.append(float(field))
            except ValueError:
                raise UsageError(f"{source}: line {lineno}, field {j} is not a number: {field!r}") from None
        rows.append(row)
    if len(rows) > 1 and any(len(r) > 1 for r in rows):
        widths = sorted({len(r) for r in rows})
        shape = f"{len(rows)} rows x {widths[0]} columns" if len(widths) == 1 else \
            f"{len(rows)} lines of {' to '.join(map(str, (widths[0], widths[-1])))} numbers"
        raise UsageError(f"{source}: holds a table of {shape}; compare takes one row of scores "
                         "(one line, or one number per line): run it once per row")
    return np.array([v for r in rows for v in r], dtype=np.float64)


def check_scores(values: np.ndarray, source: str) -> np.ndarray:
    """At least one score, no NaN or +inf, at least one finite (-inf masks an entry)."""
    if values.size == 0:
        raise UsageError(f"{source}: no scores; compare needs at least one number")
    for i, v in enumerate(values, 1):
        if np.isnan(v) or v == np.inf:
            raise UsageError(f"{source}: value {i} is {v}; scores must be numbers other than NaN and +inf (-inf masks an entry)")
    if not np.isfinite(values).any():
        raise UsageError(f"{source}: every value is -inf (masked); at least one score must be finite")
    return values


def operators(k, tau: float, alpha: float):
    """(name, function of a 1-D float64 tensor) for every operator, in display order."""
    import softk

    ops = [
        ("softmax", lambda x: softk.softmax(x, tau=tau)),
        ("sparsemax", lambda x: softk.sparsemax(x, tau=tau)),
        ("entmax15", lambda x: softk.entmax15(x, tau=tau)),
        (f"entmax[alpha={_num(alpha)}]", lambda x: softk.entmax(x, alpha, tau=tau)),
    ]
    if hasattr(softk, "topk_softmax"):
        ops.append(("topk_softmax", lambda x: softk.topk_softmax(x, k, tau=tau)))
    for method in softk._maps.soft_topk.METHODS:
        ops.append((f"soft_topk[{method}]", (lambda m: lambda x: softk.soft_topk(x, k, tau=tau, method=m))(method)))
    return ops


def takes_fractional_k(name: str) -> bool:
    """Whether the operator ``name`` takes a fractional k: the k = 1 maps ignore
    k, and of the top-k maps only soft_topk's threshold methods take one."""
    from ..threshold import THRESHOLD_METHODS

    if not name.startswith(("topk_softmax", "soft_topk[")):
        return True
    return name.startswith("soft_topk[") and name[len("soft_topk["):-1] in THRESHOLD_METHODS


def compute(values: np.ndarray, k, tau: float, alpha: float) -> dict:
    """Every operator on ``values``; ``k=None`` is min(DEFAULT_K, n).  A
    fractional k leaves out the operators that need a whole one."""
    n = values.size
    if k is None:
        k = min(DEFAULT_K, n)
    whole = isinstance(k, int)
    if not (1 <= k <= n if whole else 0 < k < n):
        raise UsageError(f"--k must be a whole number in [1, n] = [1, {n}] or a fractional one in (0, {n}) "
                         f"for {n} value{'s' * (n != 1)}, got {k}")
    finite_number(tau, "--tau", low=0)
    finite_number(alpha, "--alpha", low=1, strict=False)
    x = torch.tensor(values, dtype=torch.float64)
    rows, left_out = {}, []
    for name, fn in operators(k, tau, alpha):
        if not whole and not takes_fractional_k(name):
            left_out.append(name)
            continue
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
        "left_out": left_out,
    }


def number(v: float) -> str:
    """Four decimals where that is readable, else 5 significant digits (no 300-digit lines).

    >>> number(4.44018), number(1.3862943611198906e300), number(-2.5e-9)
    ('4.4402', '1.3863e+300', '-2.5e-09')
    """
    if v == 0 or not math.isfinite(v) or 1e-3 <= abs(v) < 1e7:
        return f"{v:.4f}"
    return f"{v:.5g}"


def cell(v: float) -> str:
    """An entry of p: four decimals, so 0.0000 is an exact zero; a non-zero entry
    that would round to it in scientific notation (the support counts it).

    >>> cell(0.02341), cell(0.0), cell(6.1e-05), cell(4.1e-06)
    ('0.0234', '0.0000', '0.0001', '4.1e-06')
    """
    text = f"{v:.4f}"
    return f"{v:.1e}" if v != 0 and float(text) == 0 else text


def _marked(name: str) -> str:
    return name + "*" if any(name == f"soft_topk[{m}]" for m in COMPARISON_ONLY) else name


def format_table(result: dict) -> str:
    n = len(result["input"])
    head = ["operator"] + [f"x={v:g}" for v in result["input"]] + ["sum", "support"]
    lines = [[_marked(name)] + [cell(v) for v in r["values"]] + [f"{r['sum']:.4f}", str(r["support"])]
             for name, r in result["rows"].items()]
    widths = [max(len(row[i]) for row in [head] + lines) for i in range(n + 3)]
    fmt = lambda row: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    out = [f"k = {_num(result['k'])}, tau = {_num(result['tau'])}  (top-k maps use k; softmax, sparsemax, entmax have k = 1)"]
    if result["left_out"]:
        out.append(f"k = {_num(result['k'])} is fractional: left out {', '.join(result['left_out'])} (they take a whole k)")
    out += [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines]
    if any(name.endswith("*") for name, *_ in lines):
        out.append("* kept for comparison only: entries can exceed 1 (Σp = k is the one constraint they keep)")
    out.append(f"logsumexp (smooth max) = {number(result['logsumexp'])}")
    return "\n".join(out)


def run(args) -> int:
    values = read_values(args)
    result = compute(values, args.k, args.tau, args.alpha)
    print(json.dumps(_strict(result), indent=2, allow_nan=False) if args.json else format_table(result))
    return 0


def _strict(obj):
    """JSON has no inf/NaN (json.dumps would write Infinity/NaN, which strict
    parsers reject): non-finite floats become the strings "inf", "-inf", "nan"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if obj != obj else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _num(v) -> str:
    """A number as short as ``:g`` writes it, or in full where that would
    round it (k = 3.9999999999999996 is not 4)."""
    short = f"{v:g}"
    return short if float(short) == v else repr(float(v))
