"""Where the host's time of one small softk call goes, layer by layer.

Run (CUDA GPU, repository root)::

    PYTHONPATH=src python benchmarks/gpu/host_layers.py --json layers.json --md layers.md
    PYTHONPATH=src python benchmarks/gpu/host_layers.py --device cpu   # the same flow on the CPU

``host_overhead.py`` says what a whole call costs the host; this script
takes ``softk.sparsemax`` forward + backward apart on a tiny input
(``--rows`` × ``--cols`` float32, so that every kernel is shorter than the
host's work): an allocation, the bare kernel launches (the lean forward,
the backward), the backend's forward, the call without and with autograd,
``torch.softmax`` forward + backward (the autograd engine's own cost), a
Python ``autograd.Function`` that only clones (the engine's cost of a
Python backward) and softk's forward + backward, each as µs a call over ``--calls`` calls in a
row (median of ``--repeats``).  During the forward + backward runs it also
times the Python inside softk's backward (it runs on the autograd engine's
thread for a CUDA tensor) and, with ``--cprofile``, profiles that code and
the forward's, the ``--top`` functions by own time.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from host_overhead import call_options, per_call_us, report  # noqa: E402


class _Timed:
    """A wrapper of ``fn`` that adds the wall time of each call to ``seconds``
    (and runs it under ``prof`` when one is given)."""

    def __init__(self, fn, prof=None):
        self.fn, self.prof, self.seconds, self.calls = fn, prof, 0.0, 0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        if self.prof is not None:
            self.prof.enable()
        try:
            return self.fn(*args, **kwargs)
        finally:
            if self.prof is not None:
                self.prof.disable()
            self.seconds += time.perf_counter() - t0
            self.calls += 1


def layers(device: str, rows: int, cols: int, calls: int, repeats: int) -> list[dict]:
    """(layer, µs a call) for each layer of a sparsemax call."""
    import torch

    import softk
    from softk._backends.triton import function as fn
    from softk._backends.triton import threshold as tt
    from softk.threshold.families import KERNEL_IDS, by_name

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(rows, cols, generator=gen, device=device)
    g = torch.randn(rows, cols, generator=gen, device=device)
    xg = x.detach().requires_grad_(True)
    fam, family = KERNEL_IDS["sparsemax"], by_name("sparsemax")
    p = softk.sparsemax(x)

    class Clone(torch.autograd.Function):
        """The least a Python autograd.Function can do: one kernel each way.
        Its forward + backward against torch.softmax's is the engine's cost
        of running a Python backward (on its own thread for a CUDA tensor)."""

        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad.clone()

    def fwd_bwd(f):
        def call():
            xg.grad = None
            f(xg).backward(g)
        return call

    cases = [("torch.empty_like", lambda: torch.empty_like(x)),
             ("torch.softmax, no grad", lambda: torch.softmax(x, -1))]
    if device == "cuda":
        cases += [("lean forward kernel (lean_forward_rows)", lambda: fn.lean_forward_rows(x, fam, 1.0, 1.0)),
                  ("backward kernel (backward_rows)", lambda: fn.backward_rows(p, g, fam, 1.0)),
                  ("triton backend forward", lambda: tt.forward(family, x, 1, 1.0))]
    cases += [("a Python autograd.Function (a clone), forward + backward", fwd_bwd(Clone.apply)),
              ("softk.sparsemax, no grad", lambda: softk.sparsemax(x)),
              ("softk.sparsemax, grad mode, no backward", lambda: softk.sparsemax(xg)),
              ("torch.softmax forward + backward", fwd_bwd(lambda t: torch.softmax(t, -1))),
              ("softk.sparsemax forward + backward", fwd_bwd(softk.sparsemax))]
    out = []
    for name, call in cases:
        grad = "grad" in name or "backward" in name
        with torch.set_grad_enabled(grad):
            out.append({"layer": name, "us": round(per_call_us(call, sync, calls, repeats), 2)})
    # the Python inside softk's backward, timed where it runs
    from softk._ops import op

    eager = op._PATHS.eager_function
    inner = _Timed(eager.backward)
    eager.backward = staticmethod(inner)
    try:
        call = fwd_bwd(softk.sparsemax)
        per_call_us(call, sync, calls, 1)
    finally:
        eager.backward = staticmethod(inner.fn)
    out.append({"layer": "inside softk's backward (its Python, the launch included)", "us": round(inner.seconds / inner.calls * 1e6, 2)})
    return out


def profiles(device: str, rows: int, cols: int, calls: int, top: int) -> str:
    """cProfile of ``calls`` forward + backward calls: the forward's thread, and
    softk's backward where it runs (the engine's thread on a GPU)."""
    import torch

    import softk
    from softk._ops import op

    x = torch.randn(rows, cols, device=device).requires_grad_(True)
    g = torch.randn_like(x)
    for _ in range(5):
        softk.sparsemax(x).backward(g)
    eager = op._PATHS.eager_function
    back = cProfile.Profile()
    inner = _Timed(eager.backward, back)
    eager.backward = staticmethod(inner)
    fwd = cProfile.Profile()
    try:
        for _ in range(calls):
            x.grad = None
            fwd.enable()
            y = softk.sparsemax(x)
            fwd.disable()
            y.backward(g)
    finally:
        eager.backward = staticmethod(inner.fn)
    if device == "cuda":
        torch.cuda.synchronize()
    text = []
    for name, prof in (("forward (the caller's thread)", fwd), ("softk's backward (where the engine runs it)", back)):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        text.append(f"### cProfile, {name}, {calls} calls\n\n```\n{buf.getvalue().strip()}\n```\n")
    return "\n".join(text)


def main(argv=None) -> int:
    ap = call_options(__doc__.split("\n")[0])
    ap.add_argument("--cprofile", action="store_true", help="also cProfile the forward and softk's backward")
    ap.add_argument("--top", type=int, default=25, help="functions per cProfile table (default 25)")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--md", metavar="PATH")
    args = ap.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("host_layers.py: no CUDA device here; --device cpu runs the flow on the CPU", file=sys.stderr)
        return 2
    if args.device == "cpu":
        torch.set_num_threads(1)
    from gpu import meta_info

    meta = {**meta_info(args.device), "shape": f"{args.rows}x{args.cols}", "calls": args.calls, "repeats": args.repeats}
    rows = layers(args.device, args.rows, args.cols, args.calls, args.repeats)
    md = [f"Host time per call, softk.sparsemax's layers ({meta['shape']}, float32, {meta['device']}), µs, median of "
          f"{meta['repeats']} runs of {meta['calls']} calls:", "", "| layer | µs |", "|---|---:|"]
    md += [f"| {r['layer']} | {r['us']} |" for r in rows]
    md = "\n".join(md) + "\n"
    if args.cprofile:
        md += "\n" + profiles(args.device, args.rows, args.cols, args.calls, args.top)
    return report(md, meta, rows, args)


if __name__ == "__main__":
    sys.exit(main())
