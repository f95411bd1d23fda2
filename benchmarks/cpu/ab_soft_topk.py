"""A/B timing of softk.soft_topk's smooth methods on the PyTorch path, forward
and forward+backward (the minimum and the median in ms over ``--rounds``
calls, 1 thread, float32), for comparing two checkouts in separate
processes, run in turns:

    PYTHONPATH=src python benchmarks/cpu/ab_soft_topk.py LABEL [--methods sigmoid laplace] [--rounds 40]

Shapes: 256 x 1024 at k = 8 and 4096 x 64 at k = 2, normal scores (seed 0).
"""

import argparse
import time

import torch

import softk


def _time(f, n):
    for _ in range(3):
        f()
    ts = []
    for _ in range(n):
        a = time.perf_counter()
        f()
        ts.append(time.perf_counter() - a)
    ts.sort()
    return round(ts[0] * 1e3, 2), round(ts[n // 2] * 1e3, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("label")
    p.add_argument("--methods", nargs="+", default=["sigmoid", "laplace"])
    p.add_argument("--rounds", type=int, default=40)
    a = p.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    for shape, k in (((256, 1024), 8), ((4096, 64), 2)):
        x = torch.randn(*shape, generator=gen)
        g = torch.randn(*shape, generator=gen)
        for method in a.methods:
            def fwd():
                softk.soft_topk(x, k, method=method)

            def fwd_bwd():
                xg = x.clone().requires_grad_()
                softk.soft_topk(xg, k, method=method).backward(g)

            with softk.use_backend("torch"):
                print(a.label, f"{shape[0]}x{shape[1]}", f"k={k}", method, "fwd", _time(fwd, a.rounds), "fwd+bwd", _time(fwd_bwd, a.rounds))


if __name__ == "__main__":
    main()
