"""Run a function on `world` gloo CPU processes (tests only), with a deadline instead of a hang.

``run(world, fn, tmp_path, *args)`` spawns ``fn(rank, world, *args)`` in each
process after ``init_process_group("gloo", file://...)`` with a 60 s
collective timeout; a process still running after ``timeout`` seconds is
killed and the test fails, so a missing collective shows up as a failure.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank, world, init_file, fn, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        fn(rank, world, *args)
        dist.barrier()  # every rank came out of fn at the same collective count
    except BaseException:
        with open(f"{init_file}.rank{rank}.err", "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run(world: int, fn, tmp_path, *args, timeout: float = 240.0) -> None:
    init_file = os.path.join(str(tmp_path), f"pg_{world}_{time.monotonic_ns()}")
    ctx = mp.spawn(_entry, args=(world, init_file, fn, args), nprocs=world, join=False)
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise AssertionError(f"distributed test did not finish within {timeout} s (a rank hung)")
    except mp.ProcessRaisedException:
        # Report every rank's own traceback: the first to be noticed is often
        # only a peer's "connection closed".
        errs = []
        for r in range(world):
            path = f"{init_file}.rank{r}.err"
            if os.path.exists(path):
                errs.append(f"--- rank {r} ---\n" + open(path).read())
        raise AssertionError("\n".join(errs)) from None
