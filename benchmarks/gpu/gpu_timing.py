"""Timing one (case, impl, mode) on the GPU: inputs, the timed closure, do_bench, peak memory.

:func:`time_impl` is the unit of work of ``benchmarks/gpu/gpu.py``.  Its clocks
are injected (``timer``, ``mem_probe``) so that the tests can run it on the
CPU with fake timings; the real ones are :func:`cuda_timer` (Triton's
``do_bench``: L2 flushed before every run, p20/p50/p80 over at least
``min_reps`` runs) and :func:`cuda_peak` (``torch.cuda.max_memory_allocated``
minus what was allocated before the call: inputs, the incoming gradient and
targets are not counted; outputs, saved tensors and x.grad are).
"""

from __future__ import annotations

import time

import torch

from gpu_cases import Case
from gpu_isolate import context_lost, short_error
from gpu_report import make_row

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Inputs:
    """x (and class-index targets for losses) of the current shape; one shape is held at a time."""

    def __init__(self, device: str, seed: int = 0):
        self.device, self.seed, self.key, self.x, self.target = device, seed, None, None, None

    def get(self, case: Case):
        key = (case.rows, case.cols, case.dtype)
        if key != self.key:
            self.x = self.target = None
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
            gen = torch.Generator(device=self.device).manual_seed(self.seed)
            self.x = torch.randn(case.rows, case.cols, generator=gen, device=self.device, dtype=DTYPES[case.dtype])
            self.target = torch.randint(0, case.cols, (case.rows,), generator=gen, device=self.device)
            self.key = key
        return self.x, (self.target if case.is_loss else None)


def closure(fn, case: Case, x: torch.Tensor, target, mode: str):
    """``(call, grads)``: ``call()`` runs one forward (no_grad) or forward+backward; ``grads`` are the leaves to reset."""
    args = (target,) if case.is_loss else ()
    if mode == "fwd":

        def call():
            with torch.no_grad():
                fn(x, *args)

        return call, None
    xg = x.detach().requires_grad_(True)
    if case.is_loss:

        def call():
            fn(xg, target).backward()

        return call, [xg]
    with torch.no_grad():
        y0 = fn(xg)
    gen = torch.Generator(device=x.device).manual_seed(1)
    g = torch.randn(y0.shape, generator=gen, device=x.device, dtype=y0.dtype)
    del y0

    def call():
        fn(xg).backward(g)

    return call, [xg]


def cuda_timer(call, grads, est_ms: float, min_reps: int = 20, rep_ms: float = 60.0):
    """(p20, p50, p80) in ms from ``triton.testing.do_bench`` with at least ``min_reps`` timed runs."""
    from triton.testing import do_bench

    rep = max(rep_ms, min_reps * est_ms)
    warmup = max(10.0, 2 * est_ms)
    return tuple(do_bench(call, warmup=warmup, rep=rep, grad_to_none=grads, quantiles=[0.2, 0.5, 0.8]))


def cpu_timer(call, grads, reps: int = 20):
    """(p20, p50, p80) in ms of ``reps`` wall-clock runs: for a CPU dry run of the flow, not for reporting."""
    times = []
    for _ in range(max(1, reps)):
        for t in grads or ():
            t.grad = None
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    q = torch.quantile(torch.tensor(times, dtype=torch.float64), torch.tensor([0.2, 0.5, 0.8], dtype=torch.float64))
    return tuple(float(v) for v in q)


def cpu_peak(call, grads):
    """(None, wall ms): no memory figure on the CPU."""
    t0 = time.perf_counter()
    call()
    return None, (time.perf_counter() - t0) * 1e3


def cuda_peak(call, grads):
    """(peak extra MiB, wall ms of that one call); the wall time sizes do_bench's repetitions."""
    for t in grads or ():
        t.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    for t in grads or ():
        t.grad = None
    return peak, wall


def warm(case: Case, fn, device: str) -> None:
    """Run ``fn`` once per mode on two rows of the case's width: compiles every kernel it needs."""
    small = Case(case.group, case.op, 2, case.cols, case.dtype)
    inputs = Inputs(device)
    x, target = inputs.get(small)
    from gpu_cases import MODES

    for mode in MODES:
        call, _ = closure(fn, small, x, target, mode)
        call()
    _sync(device)


def _sync(device: str):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_impl(case: Case, impl: str, fn, inputs: Inputs, meta: dict, timer, mem_probe, version=None, mutates_input=False) -> tuple[list[dict], bool]:
    """Rows for both modes of ``impl`` on ``case``, and whether the CUDA context was lost.

    An exception becomes an "error: ..." row (the Triton compile error of a
    peer, a width it refuses); a lost context stops the remaining modes.
    """
    from gpu_cases import MODES

    rows = []
    for mode in MODES:
        try:
            x, target = inputs.get(case)
            if mutates_input:
                x = x.clone()
            call, grads = closure(fn, case, x, target, mode)
            call()  # compile / autotune outside the clocks
            _sync(inputs.device)
            peak, est = mem_probe(call, grads)
            times = timer(call, grads, est)
            rows.append(make_row(case, impl, mode, meta, times=times, peak_mib=peak, impl_version=version))
        except Exception as e:  # noqa: BLE001 - a failure is a result here
            lost = context_lost(e)
            rows.append(make_row(case, impl, mode, meta, status=f"error: {short_error(e)}", impl_version=version))
            if lost:
                return rows, True
        finally:
            call = grads = None
    return rows, False
