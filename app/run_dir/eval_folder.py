"""The folder of a run directory that ``raptb eval`` writes to (``eval/``): its metrics, samples
and exact metrics (app.evaluation). Part of the run: ``--overwrite`` deletes it with the rest."""

from __future__ import annotations

from pathlib import Path

EVAL_DIR = "eval"


def eval_dir(run_dir: Path) -> Path:
    """Folder the evaluation of ``run_dir`` writes to."""
    return Path(run_dir) / EVAL_DIR
