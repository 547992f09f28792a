"""Durable file writes: a file is either its old content or its complete new content.

``write_atomically`` writes a sibling temporary file, fsyncs it, renames it over the target and
fsyncs the folder, so neither a crash, a full disk nor a power loss leaves a truncated or empty
file behind (POSIX rename is atomic; the folder fsync makes the rename itself durable).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def fsync_file(path: Path) -> None:
    """Flush ``path``'s data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush ``path``'s entries (names created, renamed or removed in it) to the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: str | bytes) -> None:
    """Replace ``path`` by ``data`` (text is UTF-8) durably; on any error ``path`` is untouched."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as tmp_file:
            tmp_file.write(payload)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
