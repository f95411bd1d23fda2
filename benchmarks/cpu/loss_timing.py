"""Forward+backward time of softk's losses against ``F.cross_entropy`` on the
CPU, providers interleaved within each repeat, ratios from one run.

Run through ``benchmarks/cpu/cpu_targets.py --losses`` (or directly:
``python benchmarks/cpu/loss_timing.py --threads 1``).  Each provider computes a
mean loss over class indices (soft_topk_loss: multi-hot rows with ``K`` ones)
on the same float32 scores and runs its backward; a repeat times a batch of
calls per provider in turn, and the table reports the median over repeats
in µs per call and its ratio to F.cross_entropy's median.
"""

import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = ["64x10", "256x1024", "1024x16000", "2048x32000"]
K = 5  # soft_topk_loss's ones per row and topk_softmax_cross_entropy's k


def providers():
    import softk.losses as L

    return {
        "F.cross_entropy": lambda x, t, m: F.cross_entropy(x, t),
        "softk.cross_entropy": lambda x, t, m: L.cross_entropy(x, t),
        "sparsemax_loss": lambda x, t, m: L.sparsemax_loss(x, t),
        "entmax15_loss": lambda x, t, m: L.entmax15_loss(x, t),
        "entmax_loss(1.3)": lambda x, t, m: L.entmax_loss(x, t, alpha=1.3),
        "softmax_loss": lambda x, t, m: L.softmax_loss(x, t),
        "soft_topk_loss(exp)": lambda x, t, m: L.soft_topk_loss(x, m, K),
        "topk_softmax_ce": lambda x, t, m: L.topk_softmax_cross_entropy(x, t, K),
    }


def _time(fn, x, t, m, calls):
    start = time.perf_counter()
    for _ in range(calls):
        x.grad = None
        fn(x, t, m).backward()
    return (time.perf_counter() - start) / calls * 1e6


def measure(shape: str, repeats: int, budget_s: float = 0.05):
    n, c = map(int, shape.split("x"))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, c, generator=g).requires_grad_()
    t = torch.randint(0, c, (n,), generator=g)
    m = torch.zeros(n, c)
    m[:, :K] = 1.0
    provs = providers()
    per_call = {name: _time(fn, x, t, m, 2) for name, fn in provs.items()}  # warm-up, and the batch size
    calls = {name: max(1, int(budget_s * 1e6 / us)) for name, us in per_call.items()}
    times = {name: [] for name in provs}
    for _ in range(repeats):
        for name, fn in provs.items():
            times[name].append(_time(fn, x, t, m, calls[name]))
    return {name: sorted(v)[len(v) // 2] for name, v in times.items()}


def table(results) -> str:
    names = list(next(iter(results.values())))
    lines = ["| loss (fwd+bwd, mean) | " + " | ".join(f"{s}: µs (× F.ce)" for s in results) + " |",
             "|---|" + "---:|" * len(results)]
    for name in names:
        cells = [f"{r[name]:.1f} ({r[name] / r['F.cross_entropy']:.2f}×)" for r in results.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(shapes, threads: int, repeats: int, json_path=None):
    torch.set_num_threads(threads)
    results = {s: measure(s, repeats) for s in shapes}
    print(f"threads={threads}, repeats={repeats}, torch {torch.__version__}")
    print(table(results))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    run(a.shapes, a.threads, a.repeats, a.json)
