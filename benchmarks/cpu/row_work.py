"""The work the Triton row kernels issue, counted in Triton's interpreter
(``softk._backends.triton.work``): forward element-wise operations per
element (reductions apart, and with them) and reads of the row, for every
row map, as a multiple of softk's softmax kernel on the same rows; with
``--backward``, the same of the backward kernel against softmax's backward
(reads in arrays of the row's size: p and g, and x as well for sigmoid and
laplace, whose slope is formed from the input).

    TRITON_INTERPRET=1 python benchmarks/cpu/row_work.py [--widths 16 64 1024 8192] [--route default|general] [--backward] [--json out.json]

Rows are normal (seed 0): 512 rows at the router widths (≤ 64), 8 above.
``--route general`` forces the general λ-search kernel (on chip up to its
limit, looped above) where the default takes the lean forward.  The counts
are exact and the same on every machine; they are not times.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from softk._backends.triton import function as tf  # noqa: E402
from softk._backends.triton.softmax import softmax_backward_rows, softmax_rows  # noqa: E402
from softk._backends.triton.work import count  # noqa: E402

# (label, family, k, α)
MAPS = [("sparsemax", "sparsemax", 1, 2.0), ("entmax15", "entmax15", 1, 1.5), ("entmax a=1.3", "entmax", 1, 1.3),
        ("top-k exp k=2", "exp", 2, 1.5), ("top-k sigmoid k=2", "sigmoid", 2, 1.5),
        ("top-k laplace k=2", "laplace", 2, 1.5)]


def _rows(n: int) -> torch.Tensor:
    return torch.randn(512 if n <= 64 else 8, n, generator=torch.Generator().manual_seed(0))


def measure(widths, route: str, backward: bool = False) -> list[dict]:
    out = []
    for n in widths:
        x = _rows(n)
        g = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
        y = softmax_rows(x)
        with count() as base:
            softmax_backward_rows(y, g) if backward else softmax_rows(x)
        row = {"n": n, "rows": x.shape[0], "softmax_alu_per_element": base.alu / x.numel()}
        for label, fam, k, alpha in MAPS:
            kw = {"onchip": n <= tf.ONCHIP_MAX} if route == "general" else {}
            fid = tf.FAMILY_IDS[fam]
            if backward:
                p = tf.forward_rows(x, fid, k, 1.0, alpha, **kw)
                with count() as w:
                    # (the input only where the kernel reads it: checkouts before it did run too)
                    tf.backward_rows(p, g, fid, 1.0, alpha, **({"x": x} if fid in getattr(tf, "FROM_X", ()) else {}))
            else:
                with count() as w:
                    tf.forward_rows(x, fid, k, 1.0, alpha, **kw)
            row[label] = {"alu": w.alu / base.alu, "alu_and_reductions": (w.alu + w.reduce) / (base.alu + base.reduce),
                          "reads": w.load_bytes / (x.numel() * x.element_size())}
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=[16, 64, 1024, 8192])
    p.add_argument("--route", choices=["default", "general"], default="default")
    p.add_argument("--backward", action="store_true")
    p.add_argument("--json")
    a = p.parse_args()
    rows = measure(a.widths, a.route, a.backward)
    labels = [m[0] for m in MAPS]
    print(f"{'backward' if a.backward else 'forward'}, route: {a.route}; element-wise work per element "
          "× softk softmax's (with reductions), reads per row")
    print("| n (rows) | softmax ops/el | " + " | ".join(labels) + " |")
    print("|---|---|" + "---|" * len(labels))
    for r in rows:
        cells = [f"{r[m]['alu']:.2f}× ({r[m]['alu_and_reductions']:.2f}×), {r[m]['reads']:.2f}" for m in labels]
        print(f"| {r['n']} ({r['rows']}) | {r['softmax_alu_per_element']:.1f} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"route": a.route, "backward": a.backward, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
