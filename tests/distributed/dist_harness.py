"""Run a function on `world` gloo CPU processes (tests only).

``run(world, fn, tmp_path, *args)`` spawns ``fn(rank, world, *args)`` in each
process after ``init_process_group("gloo", file://...)``.  A rank that raises
fails the test with every rank's traceback; a rank whose peer exited while it
waits on a collective fails too (gloo reports the closed connection).  The
ranks' work has no time limit of its own: ranks still running past the suite's
safety net (tests/safety_net.py) are killed and the test skips, since a busy
machine and a hang then look alike.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .. import safety_net


def _entry(rank, world, init_file, fn, args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
        # longer than the safety net, which run() enforces
        timeout=datetime.timedelta(seconds=2 * safety_net.safety_net_s()),
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
    # The rank's work is done and checked: leave without the interpreter's
    # teardown, where a native library's stray thread once aborted a finished
    # rank under load (SIGABRT, "terminate called without an active exception").
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(world: int, fn, tmp_path, *args) -> None:
    init_file = os.path.join(str(tmp_path), f"pg_{world}_{time.monotonic_ns()}")
    ctx = mp.spawn(_entry, args=(world, init_file, fn, args), nprocs=world, join=False)
    limit = safety_net.safety_net_s()
    deadline = time.monotonic() + limit
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                safety_net.skip(f"the {world} ranks", limit)
    except mp.ProcessRaisedException:
        # Report every rank's own traceback: the first to be noticed is often
        # only a peer's "connection closed".
        errs = []
        for r in range(world):
            path = f"{init_file}.rank{r}.err"
            if os.path.exists(path):
                errs.append(f"--- rank {r} ---\n" + open(path).read())
        raise AssertionError("\n".join(errs)) from None
