"""softk's attention on the CPU against torch's SDPA: every map, L = S in
{2048, 8192}, causal and not, forward and forward + backward, and decoding
(one query per sequence against S keys), with the share of the values a
sparse map lets P·V skip (keys with p = 0 for every query of the head, and
pages of 16 such keys: what a paged cache could leave unread).

    python benchmarks/cpu/attention.py [--threads 1] [--lengths 2048 8192] [--reps 3] [--json out.json]

B = 1, H = 4, E = 64, float32 (decoding: B = 4, H = 8, S from 4096 to
32768).  Implementations are interleaved: each repetition times every one
of them once, and a cell is the median over repetitions of its time divided
by SDPA's in the same repetition.  The backend is softk's default on the
CPU ("auto": the blockwise kernels).  Benchmarks are not tests: nothing
asserts on time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import softk
from softk._backends.blockwise import support
from softk.attention import scaled_dot_product_attention as softk_sdpa

MAPS = ["softmax", "sparsemax", "entmax15", "entmax_a1.3"]


def _call(name, q, k, v, causal):
    if name == "torch":
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if name == "entmax_a1.3":
        return softk_sdpa(q, k, v, is_causal=causal, map="entmax", alpha=1.3)
    return softk_sdpa(q, k, v, is_causal=causal, map=name)


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _case(shape, causal, backward, reps):
    B, H, L, S, E = shape
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, E, generator=g, requires_grad=backward)
    k = torch.randn(B, H, S, E, generator=g, requires_grad=backward)
    v = torch.randn(B, H, S, E, generator=g, requires_grad=backward)
    dout = torch.randn(B, H, L, E, generator=g)

    def run(name):
        out = _call(name, q, k, v, causal)
        if backward:
            torch.autograd.grad(out, (q, k, v), dout)

    names = ["torch"] + MAPS
    for name in names:  # warm-up
        run(name)
    times = {n: [] for n in names}
    for _ in range(reps):
        for name in names:
            times[name].append(_time(lambda: run(name)))
    base = [t for t in times["torch"]]
    return {"torch_ms": statistics.median(base) * 1e3,
            **{n: statistics.median(t / b for t, b in zip(times[n], base)) for n in MAPS}}


def _skips(shape):
    """{map: (share of keys, share of 16-key pages) whose values P·V skips} on
    the decoding case's inputs (the same generator as :func:`_case`)."""
    B, H, L, S, E = shape
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(B, H, L, E, generator=g), torch.randn(B, H, S, E, generator=g)
    s = (q @ k.transpose(-1, -2)) / E ** 0.5
    maps = {"softmax": softk.softmax, "sparsemax": softk.sparsemax, "entmax15": softk.entmax15,
            "entmax_a1.3": lambda t: softk.entmax(t, alpha=1.3)}
    return {m: support.skipped(maps[m](s)) for m in MAPS}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--decode", type=int, nargs="+", default=[4096, 32768])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    cases = [((1, 4, n, n, 64), causal, bwd) for n in args.lengths for causal in (False, True) for bwd in (False, True)]
    cases += [((4, 8, 1, s, 64), False, bwd) for s in args.decode for bwd in (False,)]
    for shape, causal, bwd in cases:
        r = _case(shape, causal, bwd, args.reps)
        rows.append({"shape": list(shape), "causal": causal, "pass": "fwd+bwd" if bwd else "fwd", **r})
        if shape[2] == 1:
            rows[-1]["skipped"] = _skips(shape)
        print(json.dumps(rows[-1]), flush=True)
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.machine(), "threads": args.threads,
            "torch": torch.__version__, "softk_backend": softk.get_backend() if hasattr(softk, "get_backend") else "auto"}
    print(f"\n{meta['date']}, {meta['machine']}, {args.threads} thread(s), torch {meta['torch']}\n")
    print("| B, H, L, S | causal | pass | SDPA ms | " + " | ".join(MAPS) + " |")
    print("|---|---|---|---:|" + "---:|" * len(MAPS))
    for r in rows:
        print(f"| {', '.join(map(str, r['shape'][:4]))} | {'yes' if r['causal'] else 'no'} | {r['pass']} | "
              f"{r['torch_ms']:.1f} | " + " | ".join(f"{r[m]:.2f}" for m in MAPS) + " |")
    print("\nDecoding: the values P·V skips, share of keys / of 16-key pages\n")
    print("| B, H, L, S | " + " | ".join(MAPS) + " |")
    print("|---|" + "---|" * len(MAPS))
    for r in rows:
        if "skipped" in r:
            print(f"| {', '.join(map(str, r['shape'][:4]))} | "
                  + " | ".join(f"{r['skipped'][m][0]:.3f} / {r['skipped'][m][1]:.3f}" for m in MAPS) + " |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
