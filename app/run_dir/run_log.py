"""``metrics.jsonl``, the per-step training log, kept in step with the checkpoints, and its one
reader (``read_log``: evaluation's plots and a study's tables and curves read it).

The log is appended one JSON line per optimizer step. A run that is killed and resumed restarts
from its newest usable checkpoint, so the lines written after that checkpoint would otherwise
appear twice; ``cut_log`` drops them (and a line torn by the kill) before training continues,
replacing the file atomically, so the log of a resumed run equals the uninterrupted run's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raptb.app.run_dir.durable import write_atomically

LOG_FILE = "metrics.jsonl"


def log_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOG_FILE


def _record(line: str) -> dict[str, Any] | None:
    """The JSON object of a log line; None for a blank, torn or foreign line."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _step_of(line: str) -> int | None:
    """The ``step`` of a complete log line; None for a torn or foreign line."""
    step = (_record(line) or {}).get("step")
    return step if isinstance(step, int) else None


def read_log(path: Path) -> list[dict[str, Any]]:
    """The records of the log at ``path`` (a run's ``log_path``), one per line. Lines that are
    not a JSON object are skipped (a run killed while writing leaves a torn last line, which
    should not hide the rest); a missing file gives []."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return [record for record in map(_record, lines) if record is not None]


def cut_log(run_dir: Path, step: int) -> int:
    """Keep only the lines of steps 1..``step`` in ``run_dir``'s log; return how many were dropped.

    Nothing is written when nothing has to go.
    """
    path = log_path(run_dir)
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = []
    for line in lines:
        line_step = _step_of(line)
        if line_step is not None and line_step <= step and line.endswith("\n"):
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    write_atomically(path, "".join(kept))
    return len(lines) - len(kept)
