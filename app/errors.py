"""One line for anything that ends a command: the cause and what to do, never a traceback.

``run_cli`` wraps the command line. An exception that escapes a command is printed as one
``error:`` line and the process exits with

- 2 when the user can fix the cause: configuration, run directory, checkpoints, the reward
  function, a non-finite loss, a full disk, missing permissions, running out of memory;
- 1 for anything else, an internal fault (the line says so and how to see the traceback).

``--debug`` anywhere on the command line, or ``RAPTB_DEBUG=1``, re-raises instead, so the full
traceback is shown.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from raptb.app.configuration.config import ConfigError
from raptb.app.distribution.launch import hand_to_launcher
from raptb.app.distribution.peer_failure import PeerFailure
from raptb.app.reward.calls import RewardFailure
from raptb.app.run_dir.checkpoint import CheckpointError
from raptb.app.run_dir.resume import RunMismatch
from raptb.app.run_dir.run_lock import RunLocked
from raptb.app.training.training_error import TrainingError
from raptb.core.plugins import PluginError

DEBUG_FLAG = "--debug"
DEBUG_ENV = "RAPTB_DEBUG"
USER_FAULTS = (
    CheckpointError,
    ConfigError,
    PeerFailure,
    PluginError,
    RewardFailure,
    RunLocked,
    RunMismatch,
    TrainingError,
)
"""Errors whose own message already names the cause and the remedy."""
MAX_MESSAGE = 400


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


def _out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _peer_lost(exc: BaseException) -> bool:
    """A collective outside raptb's own (e.g. FSDP's) failed because another rank is gone."""
    if type(exc).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "Connection closed by peer" in text or "Connection reset by peer" in text
    )


def _peer_gone(exc: BaseException) -> bool:
    return isinstance(exc, PeerFailure) or _peer_lost(exc)


def describe(exc: BaseException) -> tuple[int, str]:
    """The exit code and the one-line message for ``exc``."""
    if isinstance(exc, USER_FAULTS):
        return 2, str(exc)
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" writing {exc.filename}" if exc.filename else ""
        return 2, (
            f"disk full{where}: free space or train into another --out, then continue with "
            "--resume (the newest checkpoint is intact: checkpoints and config.toml are written "
            "atomically)"
        )
    if _out_of_memory(exc):
        return 2, (
            f"out of memory ({_first_line(exc)}): "
            "lower --batch-size and raise --grad-accum (same effective batch), or use a smaller "
            "model; continue with --resume"
        )
    if _peer_lost(exc):
        return 2, (
            f"a peer process died or stopped answering ({_first_line(exc)}); the run's newest "
            "checkpoint is intact, continue with --resume"
        )
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return 2, f"{exc.strerror or exc}{where}; check the path, its permissions and free space"
    return 1, (
        f"internal error: {type(exc).__name__}: {exc}; rerun with {DEBUG_FLAG} (or "
        f"{DEBUG_ENV}=1) for the traceback and report it"
    )


def run_cli(command: Callable[[], object]) -> None:
    """Run ``command`` (the Typer app), turning any escaping exception into one line and an
    exit code (see the module docstring)."""
    debug = os.environ.get(DEBUG_ENV) == "1" or DEBUG_FLAG in sys.argv[1:]
    sys.argv = [arg for arg in sys.argv if arg != DEBUG_FLAG]
    try:
        command()
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:
        if debug:
            raise
        code, message = describe(exc)
        line = _one_line(message)
        # under raptb launch, the launcher prints one line for the run (a killed rank's, if any)
        if not (_peer_gone(exc) and hand_to_launcher(line)):
            Console(stderr=True).print(f"[red]error:[/] {escape(line)}", soft_wrap=True)
        sys.exit(code)
