"""The CPU targets: fwd+bwd, fp32, 256x32000 and 2048x1024, softk (the
default backend and the PyTorch path) vs torch.softmax vs the entmax package,
providers interleaved.

    python benchmarks/cpu/cpu_targets.py [--threads 2] [--repeats 7] [--json rows.json] > results.md
    python benchmarks/cpu/cpu_targets.py --from-json rows_2threads.json rows_1thread.json
    python benchmarks/cpu/cpu_targets.py --losses --threads 1 [--shapes 64x10 256x1024 ...] [--json losses.json]

The second form prints the targets table and the per-pass tables from saved
rows (every ratio in BENCHMARKS.md is computed here, not by hand).  The
third times forward+backward of the losses (a mean over class
indices, multi-hot rows with k ones for soft_topk_loss) against
``F.cross_entropy`` on the same scores, providers interleaved within each
repeat, and prints the µs and the ratios of one run (:mod:`loss_timing`).
"""

import argparse
import json
from pathlib import Path

# (op, baseline provider, limit): softk's fwd+bwd p50 / the baseline's p50 must be <= limit.
TARGETS = [
    ("sparsemax", "entmax", 0.5),
    ("sparsemax", "softmax", 3.0),
    ("entmax15", "entmax", 0.5),
    ("entmax15", "softmax", 3.0),
    ("entmax1.3", "entmax", 0.3),
    ("entmax1.3", "softmax", 6.0),
    ("soft_topk_exp64", "softmax", 5.0),
]
BASELINE_NAMES = {"entmax": "entmax package", "softmax": "softmax"}
SHAPES = ["256x32000", "2048x1024"]


def _p50(rows, op, provider, shape, which="fwd+bwd"):
    for r in rows:
        if (r["op"], r["provider"], r["shape"], r["pass"]) == (op, provider, shape, which):
            return r["p50_ms"]
    return None


def _ratio(rows, op, base, shape, provider="softk", which="fwd+bwd"):
    mine = _p50(rows, op, provider, shape, which)
    ref = _p50(rows, "softmax", "torch", shape, which) if base == "softmax" else _p50(rows, op, "entmax", shape, which)
    return None if mine is None or ref is None else mine / ref


def targets_table(runs) -> str:
    """runs: [(label, rows)]; one column per shape, one 'a / b' entry per run."""
    labels = " / ".join(label for label, _ in runs)
    lines = [
        f"| target (softk fwd+bwd p50 ÷ baseline) | " + " | ".join(f"{s}: {labels}" for s in SHAPES) + " |",
        "|---|" + "---|" * len(SHAPES),
    ]
    for op, base, limit in TARGETS:
        cells = []
        for shape in SHAPES:
            ratios = [_ratio(rows, op, base, shape) for _, rows in runs]
            if any(r is None for r in ratios):
                cells.append("–")
                continue
            met = [r <= limit for r in ratios]
            verdict = "**met**" if all(met) else ("**not met**" if not any(met) else "**met in " + ", ".join(
                label for (label, _), m in zip(runs, met) if m) + " only**")
            cells.append(" / ".join(f"{r:.2f}" for r in ratios) + " — " + verdict)
        lines.append(f"| {op} ≤ {limit}× {BASELINE_NAMES[base]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pass_table(rows) -> str:
    """softk (default backend), its PyTorch path, torch.softmax and the entmax package, per pass."""
    lines = [
        "| shape | op | pass | softk p50 ms (p20–p80) | softk-torch p50 ms | torch.softmax p50 ms | × softmax | entmax pkg p50 ms | × entmax |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for shape in SHAPES:
        for op, *_ in dict.fromkeys((t[0],) for t in TARGETS):
            for which in ("fwd", "bwd", "fwd+bwd"):
                r = next((r for r in rows if (r["op"], r["provider"], r["shape"], r["pass"]) == (op, "softk", shape, which)), None)
                if r is None:
                    continue
                soft = _p50(rows, "softmax", "torch", shape, which)
                tp = _p50(rows, op, "softk-torch", shape, which)
                ent = _p50(rows, op, "entmax", shape, which)
                lines.append(
                    f"| {shape} | {op} | {which} | {r['p50_ms']:.2f} ({r['p20_ms']:.2f}–{r['p80_ms']:.2f}) | "
                    + (f"{tp:.2f}" if tp is not None else "–")
                    + f" | {soft:.2f} | {r['p50_ms'] / soft:.2f} | "
                    + (f"{ent:.1f} | {r['p50_ms'] / ent:.3f} |" if ent is not None else "– | – |")
                )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the tidy rows here")
    ap.add_argument("--from-json", nargs="+", default=None, help="print the tables from saved rows instead of running")
    ap.add_argument("--losses", action="store_true", help="time the losses against F.cross_entropy instead")
    ap.add_argument("--shapes", nargs="+", default=None, help="NxC shapes for --losses")
    a = ap.parse_args()
    if a.losses:
        from loss_timing import SHAPES as LOSS_SHAPES, run as run_losses

        run_losses(a.shapes or LOSS_SHAPES, a.threads, a.repeats, a.json)
        return
    if a.from_json:
        runs = []
        for path in a.from_json:
            with open(path) as f:
                rows = json.load(f)
            runs.append((Path(path).stem.replace("cpu_", "").replace("_2026-11-21", ""), rows))
        print(targets_table(runs))
        for label, rows in runs:
            print(f"\n### {label}\n\n{pass_table(rows)}")
        return
    import torch

    from softk._cli import harness as bench

    torch.set_num_threads(a.threads)
    rows = bench.run(None, [tuple(map(int, s.split("x"))) for s in SHAPES], repeats=a.repeats)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(targets_table([(f"{a.threads} threads", rows)]))
    print()
    print(pass_table(rows))


if __name__ == "__main__":
    main()
