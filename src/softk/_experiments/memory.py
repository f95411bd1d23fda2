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
    For the same reason the figure is meant for small fresh processes (the
    memory benchmarks run one per measurement): the kernel may reclaim a
    process's cold pages while the block runs (shared libraries' code, pages
    untouched for a while), and in a large long-lived process what it
    reclaims can hide much of the block.

    >>> with PeakRSS() as mem:                                   # doctest: +SKIP
    ...     block = bytearray(64 << 20)
    >>> mem.extra >> 20                                         # doctest: +SKIP
    64
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
