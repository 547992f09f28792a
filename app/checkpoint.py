"""Atomic, resumable checkpoints of a training run.

Layout of ``RUN_DIR/checkpoints/step-000123/``:

    model/          the policy, ``save_pretrained`` (safetensors) with its tokenizer
    trainer.pt      optimizer state, logZ, torch RNG states (``torch.load(weights_only=True)``)
    state.json      step, counters, numpy/python RNG states, and the replay buffer's JSON part
    arrays.npz      the replay buffer's arrays

A checkpoint is written to a temporary sibling folder and renamed into place, so a crash never
leaves a half-written ``step-*`` folder; only the newest ``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

PREFIX = "step-"


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
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def save_atomically(run_dir: Path, step: int, write: Any, keep: int) -> Path:
    """Call ``write(tmp_folder)`` and rename the folder to ``step-{step:06d}``; prune old ones."""
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        write(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final
