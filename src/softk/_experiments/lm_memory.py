"""Peak memory of one training step of ``softk experiment lm``'s model, per
(loss, attention, fused or not), measured in a child process.

In a long-lived process the CPU allocator keeps freed memory resident and
hands it out again, so a step's peak hardly moves the resident set: the
child sets glibc's mmap threshold to 64 KiB (``MALLOC_MMAP_THRESHOLD_``), so
that every tensor of 64 KiB or more is mapped on allocation and unmapped when
freed.  For each configuration it builds the model, runs one step on a
1 × 8 batch (libraries, kernels and the optimiser's state become resident),
then measures the next step on a full batch with
:class:`~softk._experiments.memory.PeakRSS`: its peak extra resident memory,
activations, logits (when the loss is not fused), gradients and temporaries.
Linux only; elsewhere the figures are None.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

# the child: a module of its own, which imports the model (this one is imported by it)
_CHILD = [sys.executable, "-m", "softk._experiments.lm_memory_child"]


def step_memory(cfg, configs) -> dict:
    """{(loss arm, attention, fused): peak extra MiB} for ``configs``, a list of such
    triples, measured in one child process; None values where /proc is missing."""
    configs = list(dict.fromkeys(configs))
    if not os.path.exists("/proc/self/clear_refs"):
        return {c: None for c in configs}
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    payload = json.dumps({"cfg": cfg._asdict(), "configs": configs})
    out = subprocess.run(_CHILD, input=payload, capture_output=True, text=True, env=env,
                         check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the memory measurement failed:\n{out.stderr[-3000:]}")
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    return {tuple(r[:3]): r[3] for r in rows}
