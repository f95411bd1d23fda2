"""Benchmark harness: softk against torch.softmax and the entmax package.

Times forward, backward and forward+backward for each (op, provider, shape),
*interleaving* providers round by round so that machine drift (other jobs on
a shared CPU) hits all of them alike, and reports p20/p50/p80, effective GB/s
(bytes of one read of x and one write of p for forward; read of p and g and
write of the gradient for backward; their sum for fwd+bwd) and the peak CUDA
memory where there is a GPU.  Rows are tidy dicts:
op, provider, pass, shape, dtype, device, p20_ms, p50_ms, p80_ms, gbps,
peak_mb, version, date.  Benchmarks are not tests: nothing asserts on time.
"""

from __future__ import annotations

import datetime
import platform
import time

import torch

import softk
from softk._experiments.memory import PeakRSS  # noqa: F401  (the memory benchmarks import it from here)

def _on_torch_path(fn):
    """``fn`` on softk's PyTorch path (the reference implementation; its
    backward also stays there, see ThresholdFunction)."""

    def run(x):
        with softk.use_backend("torch"):
            return fn(x)

    return run


_SOFTK = {
    "sparsemax": softk.sparsemax,
    "entmax15": softk.entmax15,
    "entmax1.3": lambda x: softk.entmax(x, 1.3),
    "soft_topk_exp64": lambda x: softk.soft_topk(x, 64, method="exp"),
}
# op -> provider -> function of x.  "softk" is the default backend ("auto":
# the compiled kernels on CPU, Triton on CUDA); "softk-torch" the PyTorch path.
OPS = {"softmax": {"torch": lambda x: torch.softmax(x, -1)}}
OPS.update({op: {"softk": fn, "softk-torch": _on_torch_path(fn)} for op, fn in _SOFTK.items()})
try:  # the reference implementation, when installed
    import entmax as _entmax

    OPS["sparsemax"]["entmax"] = _entmax.sparsemax
    OPS["entmax15"]["entmax"] = _entmax.entmax15
    OPS["entmax1.3"]["entmax"] = lambda x: _entmax.entmax_bisect(x, 1.3)
except ImportError:  # pragma: no cover
    _entmax = None

# The fewest columns an op runs on (soft_topk_exp64 selects k = 64 entries).
MIN_COLS = {"soft_topk_exp64": 64}
DEFAULT_SHAPES = ((256, 32000), (2048, 1024))
PASSES = ("fwd", "bwd", "fwd+bwd")


class AllocationError(ValueError):
    """The inputs of one shape could not be allocated (the message starts with the shape)."""


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    """Wall clock on CPU; CUDA events on GPU (device time, no host overhead)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.a, self.b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) / 1e3
        return time.perf_counter() - self.t0


def _time_once(fn, x, g, which: str) -> float:
    device = x.device
    clock = _Clock(device)
    xx = x.detach().requires_grad_(which != "fwd")
    if which == "fwd":
        _sync(device)
        clock.start()
        with torch.no_grad():
            fn(xx)
        return clock.stop()
    if which == "bwd":
        y = fn(xx)
        _sync(device)
        clock.start()
        y.backward(g)
        return clock.stop()
    _sync(device)
    clock.start()
    fn(xx).backward(g)
    return clock.stop()


def _quantile(ts, q):
    ts = sorted(ts)
    return ts[min(len(ts) - 1, int(round(q * (len(ts) - 1))))]


def run(ops=None, shapes=DEFAULT_SHAPES, dtype=torch.float32, device="cpu", repeats=5, warmup=1, seed=0):
    """Time every (op, provider) on every shape; returns a list of tidy rows.

    ``ops`` selects op names from :data:`OPS` (all by default); torch.softmax
    is always included as the baseline.  Each round runs every provider once
    per pass, in turn, so drift is shared.
    """
    ops = list(OPS) if ops is None else list(ops)
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise ValueError(f"ops must be among {sorted(OPS)}, got {unknown}")
    if "softmax" not in ops:
        ops = ["softmax"] + ops
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    for op in ops:
        small = [s for s in shapes if s[-1] < MIN_COLS.get(op, 1)]
        if small:
            raise ValueError(f"op {op} needs at least {MIN_COLS[op]} columns, got shapes {small}")
    device = torch.device(device)
    date = datetime.date.today().isoformat()
    rows = []
    for shape in shapes:
        gen = torch.Generator().manual_seed(seed)
        try:
            x = torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
            g = torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)
        except (RuntimeError, MemoryError) as exc:  # too large for this machine
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise AllocationError(f"{'x'.join(map(str, shape))}: cannot allocate the inputs on {device} ({first})") from None
        jobs = [(op, prov, fn) for op in ops for prov, fn in OPS[op].items()]
        times = {(op, prov, w): [] for op, prov, _ in jobs for w in PASSES}
        peak = {}
        for r in range(warmup + repeats):
            for op, prov, fn in jobs:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                for w in PASSES:
                    t = _time_once(fn, x, g, w)
                    if r >= warmup:
                        times[(op, prov, w)].append(t)
                if device.type == "cuda":
                    peak[(op, prov)] = torch.cuda.max_memory_allocated(device) / 2**20
        nbytes = x.numel() * x.element_size()
        for (op, prov, w), ts in times.items():
            moved = {"fwd": 2, "bwd": 3, "fwd+bwd": 5}[w] * nbytes
            p50 = _quantile(ts, 0.5)
            rows.append(
                dict(
                    op=op, provider=prov, **{"pass": w}, shape="x".join(map(str, shape)),
                    dtype=str(dtype).replace("torch.", ""), device=device_name(device),
                    p20_ms=1e3 * _quantile(ts, 0.2), p50_ms=1e3 * p50, p80_ms=1e3 * _quantile(ts, 0.8),
                    gbps=moved / p50 / 1e9, peak_mb=peak.get((op, prov)),
                    version=f"softk {softk.__version__}, torch {torch.__version__}"
                    + (f", entmax {getattr(_entmax, '__version__', '?')}" if _entmax else ""),
                    date=date,
                )
            )
    return rows


def markdown(rows) -> str:
    """A Markdown table of p50 times with the ratio to torch.softmax (same shape and pass)."""
    base = {(r["shape"], r["pass"]): r["p50_ms"] for r in rows if r["op"] == "softmax"}
    lines = [
        "| shape | pass | op | provider | p20 ms | p50 ms | p80 ms | × softmax | GB/s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        ratio = r["p50_ms"] / base[(r["shape"], r["pass"])]
        lines.append(
            f"| {r['shape']} | {r['pass']} | {r['op']} | {r['provider']} | {r['p20_ms']:.2f} | "
            f"{r['p50_ms']:.2f} | {r['p80_ms']:.2f} | {ratio:.2f} | {r['gbps']:.2f} |"
        )
    return "\n".join(lines)
