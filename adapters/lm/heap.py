"""The process's freed memory kept for its next allocations, on a CPU under glibc.

glibc's malloc serves a block over its mmap threshold (128 KiB, raised as large blocks are freed,
to at most 32 MiB) from a fresh ``mmap`` and hands it back to the kernel when it is freed, and it
trims the heap's free top. A pretrained model's training step on a CPU allocates and frees many
such blocks: the logits over a 49,152-token vocabulary at 300-1,250 read positions (60-250 MB),
their log-softmax and its gradients, the growing keys and values of the rollout. Each lands on
pages the kernel must map and zero again: SmolLM2-135M + LoRA, the SMILES preset's 128-row step,
one thread, took ~550,000 page faults (2.2 GB) a step. A fresh 64 MiB tensor filled took 25 ms
against 3.4 ms resident on this project's 2-core virtual machine, and far more where the host had
reclaimed the freed memory: profiled, an ``exp`` over a [313, 49152] tensor took 0.8 s instead of
milliseconds (benchmarks/pretrained_step.md, "Freed memory kept").

:func:`keep_freed_memory` sets glibc's ``M_MMAP_MAX`` to 0 (every block from the heap) and
``M_TRIM_THRESHOLD`` to -1 (the heap never trimmed; ``man mallopt``): a freed block is reused
by the next allocation, as a caching allocator would, and the process's resident memory stays
at its peak instead of following each step's rise and fall (that step, six of them in
benchmarks/pretrained_memory.py: 2.88 GiB from the fourth on, ~20,000 pages faulted in at two
steps after the first and none at the others; ~550,000 a step at 2.4 GiB without). The setting
lasts for the process.

It also sets ``M_ARENA_MAX`` to 1: every thread allocates from the one heap those settings keep.
Otherwise glibc gives each new thread an arena of its own, mmapped heaps of at most 64 MiB that
it unmaps again, so a lane (``adapters.lm.lanes``: a step's rows in two threads side by side)
faulted its large blocks in anew: SMILES's four 32-row rescorings and backwards in two lanes took
~740,000 page faults in two rounds, ~230,000 with one arena (the first round's growth).
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
NOT_GLIBC = (
    "keep_freed_memory: this C library is not glibc, whose malloc it sets: the run goes on "
    "without it (keep_freed_memory = false says so)"
)
"""The run's warning where ``keep_freed_memory = true`` meets another C library."""


def glibc_mallopt() -> ctypes._CFuncPtr | None:
    """glibc's ``mallopt``, or None where the C library is not glibc (macOS, musl, Windows)."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Keep every freed block in the process, whichever thread frees it, for its next
    allocations (the module docstring); returns whether glibc took the three settings (False off
    glibc: nothing changed)."""
    mallopt = glibc_mallopt()
    if mallopt is None:
        return False
    settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1), (M_ARENA_MAX, 1))
    return all([bool(mallopt(option, value)) for option, value in settings])  # each one set
