"""adapters.lm.heap: with freed memory kept, a 64 MiB block freed stays resident and a 48 MiB
block allocated next reuses it, no page faulted in; without, the freed block goes back to the
kernel and the next is faulted in page by page. Each side runs in its own process (the setting
lasts for the process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raptb.adapters.lm.heap import glibc_mallopt

PROBE = """
import resource, sys, torch
from raptb.adapters.lm.heap import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
def blocks(out):
    block = torch.ones(16 * 2**20)  # 64 MiB: over glibc's largest mmap threshold (32 MiB)
    held = resident_mib()
    del block
    out.append(held - resident_mib())
    before = faults()
    block = torch.ones(12 * 2**20)  # 48 MiB: fits in the freed block
    out.insert(0, faults() - before)
out = []
if sys.argv[2] == "thread":  # a thread of its own (a lane), started after the setting
    import threading
    lane = threading.Thread(target=blocks, args=(out,))
    lane.start()
    lane.join()
else:
    blocks(out)
print(applied, *out)
"""

pytestmark = pytest.mark.skipif(glibc_mallopt() is None, reason="glibc's malloc only")


def _probe(mode: str, where: str = "main") -> tuple[str, int, float]:
    """(whether the setting applied, the second block's page faults, MiB released on free), the
    blocks allocated in the main thread or in a ``thread`` started after the setting."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, where], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1]), float(out[2])


@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_freed_block_stays_and_is_reused_without_faults(where: str) -> None:
    applied, faults, freed = _probe("keep", where)
    assert applied == "True"
    assert freed < 8  # still resident
    assert faults < 500  # 12,288 pages of 4 KiB when the block is mapped anew


@pytest.mark.parametrize("where", ["main", "thread"])
def test_without_it_the_block_goes_back_and_the_next_is_faulted_in(where: str) -> None:
    applied, faults, freed = _probe("default", where)
    assert applied == "False"
    assert freed > 56
    assert faults > 8000
