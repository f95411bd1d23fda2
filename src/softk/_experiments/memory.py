"""Peak resident memory of a block of code (Linux), for the memory benchmarks
and ``softk experiment lm``."""

from __future__ import annotations

import gc


def _proc_status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status (Linux only)")


class PeakRSS:
    """The peak extra resident memory of a block, in bytes (Linux): VmHWM
    after it minus VmRSS before it, with VmHWM reset to the current RSS on
    entry (``/proc/self/clear_refs``), so every byte the CPU allocator takes
    inside the block counts, torch's or not.  Garbage is collected on entry:
    memory that a collection would free inside the block lowers the resident
    set under the baseline and hides as much of the block's own allocation.
    Used by the memory benchmarks in their own fresh processes.  The resident
    set also holds file-backed
    pages (the shared libraries' code), which the kernel may evict while the
    block runs when other processes need memory: on a busy machine the figure
    can fall short of what the block allocated by what was evicted.

    >>> import os
    >>> if os.path.exists("/proc/self/clear_refs"):
    ...     with PeakRSS() as mem:
    ...         block = bytearray(64 << 20)
    ...     assert mem.extra >= 32 << 20  # 64 MiB, less what a busy machine evicted
    """

    extra: int = 0

    def __enter__(self) -> "PeakRSS":
        gc.collect()
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset VmHWM to the current RSS
        self._base = _proc_status("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        self.extra = _proc_status("VmHWM") - self._base
