"""PeakRSS in a small fresh process: a 64 MiB block reads as 64 MiB."""

import os
import sys

import pytest

from .. import safety_net

MEMORY = os.path.join(os.path.dirname(__file__), "..", "..", "src", "softk", "_experiments", "memory.py")

# memory.py is loaded on its own (no torch, no softk): a process of a few MiB, which the kernel has little
# cold memory to reclaim from while the block runs
CHILD = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("memory", {MEMORY!r})
memory = importlib.util.module_from_spec(spec)
spec.loader.exec_module(memory)
with memory.PeakRSS() as small:
    pass
with memory.PeakRSS() as mem:
    block = bytearray(64 << 20)  # zero-filled by memset: every page touched
print(mem.extra, small.extra)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="PeakRSS reads Linux's /proc")
def test_a_64_mib_block_reads_64_mib():
    out = safety_net.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    extra, small = map(int, out.stdout.split())
    assert 64 << 20 <= extra <= (64 << 20) + (4 << 20)  # the block, and at most a few pages of the interpreter's
    assert small <= 1 << 20
