"""The work the Triton fused loss kernel issues for cross-entropy (softmax's
Fenchel–Young loss with class indices), counted in Triton's interpreter
(``softk._backends.triton.work``): element-wise operations per element
(reductions apart), bytes read and written per element, against softk's
softmax kernel on the same rows.

    TRITON_INTERPRET=1 python benchmarks/cpu/loss_work.py [--widths 64 1024 8192 32768] [--dtype bfloat16] [--json out.json]

Rows are normal (seed 0): 64 rows at widths ≤ 64, 4 above; class indices
uniform.  The counts are exact and the same on every machine; they are not
times.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from softk._backends.triton.loss import fenchel_young_fused_rows  # noqa: E402
from softk._backends.triton.softmax import softmax_rows  # noqa: E402
from softk._backends.triton.work import count  # noqa: E402
from softk.threshold.families import KERNEL_IDS  # noqa: E402


def measure(widths, dtype) -> list[dict]:
    out = []
    for n in widths:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64 if n <= 64 else 4, n, generator=g).to(dtype)
        t = torch.randint(0, n, (x.shape[0],), generator=g)
        with count() as sm:
            softmax_rows(x)
        with count() as ce:
            fenchel_young_fused_rows(x, t, torch.ones(1), KERNEL_IDS["softmax"], 1, 1.0)
        e = x.numel()
        out.append({"n": n, "rows": x.shape[0], "dtype": str(dtype).replace("torch.", ""),
                    **{f"{name}_{what}": v for name, w in (("softmax", sm), ("cross_entropy", ce))
                       for what, v in (("alu", w.alu / e), ("read_bytes", w.load_bytes / e),
                                       ("write_bytes", w.store_bytes / e))}})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=[64, 1024, 8192, 32768])
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--json")
    a = p.parse_args()
    rows = measure(a.widths, getattr(torch, a.dtype))
    print("| n | softmax ops/entry | cross-entropy ops/entry | softmax read/write B | cross-entropy read/write B |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']} | {r['softmax_alu']:.1f} | {r['cross_entropy_alu']:.1f} | "
              f"{r['softmax_read_bytes']:.2f} / {r['softmax_write_bytes']:.2f} | "
              f"{r['cross_entropy_read_bytes']:.2f} / {r['cross_entropy_write_bytes']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
