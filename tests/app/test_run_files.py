"""The pieces under the crash guarantees: log cutting, checkpoint verification, the run lock,
and the one-line classification of errors."""

from __future__ import annotations

import errno
import json
import os

import pytest

from raptb.app.errors import describe
from raptb.app.run_dir.checkpoint import CheckpointError, newest_usable, save_atomically, verify
from raptb.app.run_dir.run_lock import PID_FILE, RunLocked, run_lock
from raptb.app.run_dir.run_log import cut_log, log_path


def test_cut_log_keeps_the_checkpointed_steps_and_drops_a_torn_line(tmp_path):
    lines = [json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (1, 2, 3, 4)]
    log_path(tmp_path).write_text("".join(lines) + '{"step": 5, "lo')
    assert cut_log(tmp_path, 2) == 3
    assert log_path(tmp_path).read_text() == "".join(lines[:2])
    assert cut_log(tmp_path, 2) == 0


def write_files(folder):
    (folder / "model").mkdir()
    for name in ("model/model.safetensors", "trainer.pt", "state.json", "arrays.npz"):
        (folder / name).write_text(f"content of {name}")


def test_manifest_catches_garbled_files_and_old_checkpoints_load_with_a_warning(tmp_path):
    for step in (2, 4):
        save_atomically(tmp_path, step, write_files, keep=2)
    newest = tmp_path / "checkpoints" / "step-000004"
    (newest / "state.json").write_text("content of state.jsoX")  # same size, other bytes
    with pytest.raises(CheckpointError, match=r"state\.json fails its sha256 checksum"):
        verify(newest)
    warnings = []
    assert newest_usable(tmp_path, warnings.append).name == "step-000002"
    assert len(warnings) == 1 and "step-000004 is unusable" in warnings[0]
    (tmp_path / "checkpoints" / "step-000002" / "manifest.json").unlink()
    warnings.clear()
    assert newest_usable(tmp_path, warnings.append).name == "step-000002"
    assert "no manifest.json (older raptb); loading it unverified" in warnings[-1]


def test_the_run_lock_refuses_a_second_holder_and_takes_over_a_stale_one(tmp_path):
    (tmp_path / PID_FILE).write_text("999999999\n")  # a pid that cannot be running
    warnings = []
    with run_lock(tmp_path, warnings.append):
        assert (tmp_path / PID_FILE).read_text().strip() == str(os.getpid())
        with pytest.raises(RunLocked, match=f"pid {os.getpid()}"), run_lock(tmp_path, print):
            pass
    assert warnings == [
        f"took over the lock of {tmp_path} from pid 999999999, which is no longer running"
    ]
    assert not (tmp_path / PID_FILE).exists()


@pytest.mark.parametrize(
    ("exc", "code", "start"),
    [
        (OSError(errno.ENOSPC, "No space left on device", "x.pt"), 2, "disk full writing x.pt"),
        (MemoryError(), 2, "out of memory"),
        (RuntimeError("CUDA out of memory. Tried to allocate 2 GiB"), 2, "out of memory"),
        (PermissionError(errno.EACCES, "Permission denied", "/runs"), 2, "Permission denied"),
        (ZeroDivisionError("division by zero"), 1, "internal error: ZeroDivisionError"),
    ],
)
def test_errors_are_classified(exc, code, start):
    got_code, message = describe(exc)
    assert got_code == code and message.startswith(start)
