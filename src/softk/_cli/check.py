"""`softk check`: which properties of a smooth top-k each soft_topk method has, measured.

The properties: sum_k (Σp = k), range (0 ≤ p ≤ 1), monotone (x_i > x_j ⇒
p_i ≥ p_j), shift_invariant (p(x + c) = p(x)), limit_hard_topk (the k-hot
mask as τ → 0) and k1_softmax (softmax at k = 1).  Each cell is measured by
:func:`softk.property_violations` on seeded generated inputs; a method failing a property is a finding, not an error, so
the exit code is 0 either way.  ``shift_invariant`` compares p(z + c) with
p(z) for offsets up to c = ±2^-6/eps ≈ ±7e13 on rows where z + c is exact, so
a solver that loses c·eps to cancellation is caught.  The backend in force is
measured (``SOFTK_BACKEND=torch softk check`` for the PyTorch path).
"""

from __future__ import annotations

import json

from . import int_at_least, plain


def register(sub):
    p = sub.add_parser("check", help="measure which properties of a smooth top-k each soft_topk method has",
                       description=plain(__doc__))
    p.add_argument("--json", action="store_true", help="print {METHOD: {PROPERTY: bool}} as JSON")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs, an integer >= 0 (default 0)")
    p.set_defaults(run=run)


def measure(seed: int = 0) -> dict:
    """{method: {property: (holds, worst violation)}} for every soft_topk method."""
    from .._maps.properties import properties, property_violations
    from .._maps.soft_topk import METHODS

    out = {}
    for method in METHODS:
        holds = properties(method, seed=seed)
        worst = property_violations(method, seed=seed)
        out[method] = {name: (holds[name], worst[name]) for name in holds}
    return out


def format_table(table: dict) -> str:
    from .._maps.properties import PROPERTY_NAMES

    head = ["method"] + list(PROPERTY_NAMES)
    rows = []
    for method, props in table.items():
        cells = []
        for name in PROPERTY_NAMES:
            ok, worst = props[name]
            cells.append("yes" if ok else f"NO ({worst:.2g})")
        rows.append([method] + cells)
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    lines.append("NO (v): the property fails; v is the worst violation measured (see softk.property_violations).")
    return "\n".join(lines)


def run(args) -> int:
    table = measure(int_at_least(args.seed, "--seed", 0))
    if args.json:
        print(json.dumps({m: {name: ok for name, (ok, _) in props.items()} for m, props in table.items()}, indent=2))
    else:
        print(format_table(table))
    return 0
