"""Atomic, resumable checkpoints of a training run.

Layout of ``RUN_DIR/checkpoints/step-000123/``:

    model/          the policy, ``save_pretrained`` (safetensors) with its tokenizer
    trainer.pt      optimizer state, logZ, torch RNG states (``torch.load(weights_only=True)``)
    state.json      step, counters, numpy/python RNG states, and the replay buffer's JSON part
    arrays.npz      the replay buffer's arrays
    manifest.json   every other file's size and sha256, written last

A checkpoint is written to a temporary sibling folder ``.tmp-*``, its files and folders are
fsynced, and it is renamed into place, so neither a crash nor a power loss leaves a half-written
``step-*`` folder; only the newest ``keep`` checkpoints are kept. Temporary folders orphaned by a
kill are removed when the next run starts (``remove_stale_temporaries``).

Loading goes through ``newest_usable``: the manifest is checked (sizes, then checksums) from the
newest checkpoint down; a bad one costs one warning line naming the file and what is wrong, and
the next older one is used. Checkpoints written before manifests existed are loaded unverified,
with a warning, if their files are present.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from raptb.app.run_dir.durable import fsync_dir, fsync_file

PREFIX = "step-"
TMP_PREFIX = ".tmp-"
MANIFEST = "manifest.json"
MODEL_DIR = "model"
REQUIRED = (MODEL_DIR, "trainer.pt", "state.json", "arrays.npz")
"""Entries every checkpoint has; checked for checkpoints without a manifest."""


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message is one line naming the file and the fault."""


def _split_arrays(obj: Any, arrays: dict[str, np.ndarray], path: str) -> Any:
    """Replace every numpy array in a nested dict/list by a reference into ``arrays``."""
    if isinstance(obj, np.ndarray):
        arrays[path] = obj
        return {"__array__": path}
    if isinstance(obj, dict):
        return {str(k): _split_arrays(v, arrays, f"{path}/{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_split_arrays(v, arrays, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _join_arrays(obj: Any, arrays: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__array__"}:
            return arrays[obj["__array__"]]
        return {k: _join_arrays(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join_arrays(v, arrays) for v in obj]
    return obj


def write_state(folder: Path, state: dict[str, Any]) -> None:
    """Write a nested dict of JSON values and numpy arrays as state.json + arrays.npz."""
    arrays: dict[str, np.ndarray] = {}
    skeleton = _split_arrays(state, arrays, "")
    (folder / "state.json").write_text(json.dumps(skeleton))
    np.savez(folder / "arrays.npz", **arrays)


def read_state(folder: Path) -> dict[str, Any]:
    skeleton = json.loads((folder / "state.json").read_text())
    with np.load(folder / "arrays.npz", allow_pickle=False) as arrays:
        return _join_arrays(skeleton, {k: arrays[k] for k in arrays.files})


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_dir(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX)]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def checkpoint_step(folder: Path) -> int:
    """The optimizer step a ``step-*`` folder holds."""
    return int(folder.name[len(PREFIX) :])


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _seal(folder: Path) -> None:
    """Write the manifest, then fsync every file and folder below ``folder`` (itself included)."""
    manifest = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in _files(folder)
    }
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": manifest}, indent=1))
    for path in [*_files(folder), folder / MANIFEST]:
        fsync_file(path)
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(sub)
    fsync_dir(folder)


def verify(folder: Path, needs: tuple[str, ...] = REQUIRED) -> bool:
    """Check the entries ``needs`` of ``folder`` (files, or folders and all below them) against
    its manifest; False when it has none (written before manifests): then they only have to exist.

    Raises:
        CheckpointError: a file is missing, has another size, or fails its checksum.
    """
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        for name in needs:
            if not (folder / name).exists():
                what = f"{name}/ folder" if name == MODEL_DIR else name
                raise CheckpointError(f"{folder} has no {what}")
        return False
    try:
        files = json.loads(manifest_path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{manifest_path} is unreadable ({exc})") from None
    for name, expected in files.items():
        if not any(name == need or name.startswith(f"{need}/") for need in needs):
            continue
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing")
        size = path.stat().st_size
        if size != expected["size"]:
            raise CheckpointError(
                f"{path} has {size} bytes, the manifest says {expected['size']} (truncated?)"
            )
        if _sha256(path) != expected["sha256"]:
            raise CheckpointError(f"{path} fails its sha256 checksum (corrupt)")
    return True


def _warn_stderr(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr)


def newest_usable(
    run_dir: Path,
    warn: Callable[[str], None] = _warn_stderr,
    needs: tuple[str, ...] = REQUIRED,
) -> Path | None:
    """The newest checkpoint that passes ``verify(folder, needs)``; None when the run has no
    checkpoint (evaluation ``needs`` only the model).

    Each bad checkpoint skipped costs one ``warn`` line naming the file and the fault.

    Raises:
        CheckpointError: checkpoints exist but none is usable.
    """
    found = list_checkpoints(run_dir)
    faults = []
    for folder in reversed(found):
        try:
            verified = verify(folder, needs)
        except CheckpointError as exc:
            faults.append(str(exc))
            warn(f"checkpoint {folder.name} is unusable: {exc}; trying an older one")
            continue
        if not verified:
            warn(f"checkpoint {folder.name} has no {MANIFEST} (older raptb); loading it unverified")
        return folder
    if faults:
        raise CheckpointError(
            f"no usable checkpoint in {checkpoint_dir(run_dir)} ({len(faults)} bad, newest: "
            f"{faults[0]}); restore one, or start the run afresh with raptb train --overwrite"
        )
    return None


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete ``.tmp-*`` files and folders that a killed run left in ``run_dir`` and its
    checkpoints folder (call only while holding the run's lock: no writer is using them)."""
    for root in (Path(run_dir), checkpoint_dir(run_dir)):
        if not root.is_dir():
            continue
        for stale in root.glob(f"{TMP_PREFIX}*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)


def save_atomically(run_dir: Path, step: int, write: Any, keep: int) -> Path:
    """Call ``write(tmp_folder)``, seal it (manifest, fsync) and rename the folder to
    ``step-{step:06d}``; prune all but the newest ``keep``."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=root))
    try:
        write(tmp)
        _seal(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(root)  # makes the rename itself durable
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final
