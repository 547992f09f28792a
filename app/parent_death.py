"""A child process that ends with the process that started it, however that one ends (kill -9
included): the child gets SIGTERM and, being a trainer, finishes its step, checkpoints and exits
instead of running on unwatched. A study's runs and the ranks of ``raptb launch`` use it (Linux;
elsewhere a no-op)."""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
LAUNCHER_PID_ENV = "RAPTB_LAUNCHER_PID"
"""The pid of the ``raptb launch`` process, in the environment of the ranks it starts."""


def die_with(parent: int) -> None:
    """SIGTERM to this process when ``parent`` (its parent process) ends; a parent already gone
    before this point ends this process at once (exit 143)."""
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        sys.exit(128 + signal.SIGTERM)


def die_with_the_launcher() -> None:
    """In a rank of ``raptb launch``: end with that launcher. The variable is removed, so that the
    rank's own children (the reward pool) do not take it for their parent."""
    die_with(int(os.environ.pop(LAUNCHER_PID_ENV, "0") or "0"))
