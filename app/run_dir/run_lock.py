"""One writer per run directory: an OS file lock held for the whole run, plus the holder's pid.

``filelock.FileLock`` takes an ``flock`` on ``RUN_DIR/.lock``: the kernel releases it when the
holder exits in any way (kill -9 included), so a lock can never outlive its process on a local
disk. The pid file beside it says who holds the lock, for the refusal message; one left behind by
a killed run is stale, and the next run takes over with a warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from raptb.app.run_dir.durable import write_atomically

LOCK_FILE = ".lock"
PID_FILE = ".lock.pid"
LOCK_FILES = (LOCK_FILE, PID_FILE)
"""Names in a run directory that belong to the lock, not to the run."""


class RunLocked(RuntimeError):
    """Another process is writing to the run directory; the message names its pid."""


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def lock_holder(run_dir: Path) -> str | None:
    """Who holds ``run_dir``'s lock now ("pid N", or "another process" when its pid file is
    missing); None when nobody does."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return None
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        pid = _read_pid(Path(run_dir) / PID_FILE)
        return "another process" if pid is None else f"pid {pid}"
    lock.release()
    return None


@contextmanager
def run_lock(run_dir: Path, warn: Callable[[str], None]) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the ``with`` block (``run_dir`` is created if needed).

    Raises:
        RunLocked: another process holds the lock.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pid_file = run_dir / PID_FILE
    lock = FileLock(run_dir / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        holder = _read_pid(pid_file)
        who = "another process" if holder is None else f"another raptb (pid {holder})"
        raise RunLocked(
            f"{who} is writing to {run_dir}; wait for it to finish or use another --out"
        ) from None
    try:
        stale = _read_pid(pid_file)
        if stale is not None and stale != os.getpid():
            state = "still exists but held no lock" if _alive(stale) else "is no longer running"
            warn(f"took over the lock of {run_dir} from pid {stale}, which {state}")
        write_atomically(pid_file, f"{os.getpid()}\n")
        yield
    finally:
        pid_file.unlink(missing_ok=True)
        lock.release()
