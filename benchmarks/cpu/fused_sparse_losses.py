"""The fused sparse losses (sparsemax, entmax15, TS²) against softk's fused
cross-entropy, torch's ``F.linear_cross_entropy`` and the unfused losses,
forward and backward, on hidden states with small supports and on random ones.

    python benchmarks/cpu/fused_sparse_losses.py [--threads 1] [--reps 3]
        [--shapes 4096x256x32768 4096x256x131072 4096x1024x32768] [--no-unfused] [--generic-sparsemax]

Shapes are N×H×V, float32, every row kept.  "trained": each hidden state is
its target's weight row times 200 plus noise (0.05), so that the sparsemax
support is a class or two, as in a trained language model; "random": standard
normal hidden states (early training; W's entries are N(0, 0.05²), so the
logits are N(0, H·0.0025)).  For each setting the mean sparsemax support and
the union of the supports over the rows (as a share of V) are printed with
the times.  Providers are interleaved round by round, median of ``reps``;
the ratio column is each provider's time over softk's fused cross-entropy.
``--generic-sparsemax`` adds the fused sparsemax loss without its one-pass
form on the CPU (rows and live columns from the support): the generic path,
autograd on each chunk's loss and a scan of G for its live columns.
Nothing asserts on time.
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import softk
from softk.losses import fused_linear_loss, sparsemax_loss, cross_entropy
from softk.losses._registry import LOSSES


def _generic_sparsemax(x, w, y):
    """The fused sparsemax loss on the generic chunk path (the one-pass form switched off)."""
    real = LOSSES["sparsemax"]
    LOSSES["sparsemax"] = real._replace(live_in_place=None)
    try:
        return fused_linear_loss(x, w, y, "sparsemax")
    finally:
        LOSSES["sparsemax"] = real


def providers(unfused: bool, generic: bool = False):
    out = {
        "softk fused cross_entropy": lambda x, w, y: fused_linear_loss(x, w, y, "cross_entropy"),
        "softk fused sparsemax": lambda x, w, y: fused_linear_loss(x, w, y, "sparsemax"),
        **({"softk fused sparsemax, generic path": _generic_sparsemax} if generic else {}),
        "softk fused entmax15": lambda x, w, y: fused_linear_loss(x, w, y, "entmax15"),
        "softk fused ts2": lambda x, w, y: fused_linear_loss(x, w, y, "ts2"),
    }
    if hasattr(F, "linear_cross_entropy"):
        out["torch F.linear_cross_entropy"] = lambda x, w, y: F.linear_cross_entropy(x, w, y)
    if unfused:
        out["unfused F.cross_entropy"] = lambda x, w, y: F.cross_entropy(x @ w.t(), y)
        out["unfused softk cross_entropy"] = lambda x, w, y: cross_entropy(x @ w.t(), y)
        out["unfused softk sparsemax_loss"] = lambda x, w, y: sparsemax_loss(x @ w.t(), y)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--shapes", nargs="+", default=["4096x256x32768", "4096x256x131072", "4096x1024x32768"])
    ap.add_argument("--no-unfused", action="store_true", help="leave out the losses on materialised logits")
    ap.add_argument("--generic-sparsemax", action="store_true",
                    help="also time the fused sparsemax loss without its one-pass form")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, softk {softk.__version__}, {args.threads} thread(s), "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    g = torch.Generator().manual_seed(1)
    for fn in providers(True).values():  # first calls (lazy imports, kernel loads) on a small problem, untimed
        fn(torch.randn(64, 32, generator=g, requires_grad=True), torch.randn(1024, 32, generator=g,
           requires_grad=True), torch.randint(0, 1024, (64,), generator=g)).backward()
    print("| N×H×V | hidden states | mean support | union / V | provider | seconds | × fused CE |")
    print("|---|---|---:|---:|---|---:|---:|")
    for shape in args.shapes:
        N, H, V = map(int, shape.split("x"))
        g = torch.Generator().manual_seed(0)
        W = torch.randn(V, H, generator=g) * 0.05
        y = torch.randint(0, V, (N,), generator=g)
        for setting in ("trained", "random"):
            if setting == "trained":
                x = W[y] * 200.0 + torch.randn(N, H, generator=g) * 0.05
            else:
                x = torch.randn(N, H, generator=g)
            with torch.no_grad():
                support, union = 0.0, torch.zeros(V, dtype=torch.bool)
                for i in range(0, N, 512):
                    p = softk.sparsemax(x[i:i + 512] @ W.t())
                    support += float((p > 0).sum())
                    union |= (p > 0).any(0)
            fns = providers(not args.no_unfused and N * V * 4 <= 2**31, args.generic_sparsemax)
            times = {name: [] for name in fns}
            for _ in range(args.reps):
                for name, fn in fns.items():
                    xs, ws = x.clone().requires_grad_(), W.clone().requires_grad_()
                    t0 = time.perf_counter()
                    fn(xs, ws, y).backward()
                    times[name].append(time.perf_counter() - t0)
            base = statistics.median(times["softk fused cross_entropy"])
            for name, ts in times.items():
                t = statistics.median(ts)
                print(f"| {shape} | {setting} | {support / N:.1f} | {float(union.float().mean()):.3f} | {name} | "
                      f"{t:.2f} | {t / base:.2f} |", flush=True)


if __name__ == "__main__":
    main()
