"""Starting or resuming a run directory: a resumed run is the same run, a new run a clean slate.

A run directory holds one run. ``raptb train`` into a directory that already holds a run's files
(``RUN_ENTRIES``) refuses unless ``--resume`` (continue it) or ``--overwrite`` (delete those
files first) is given. Other files there (a job script's log, say) are neither a run nor deleted.

``--resume`` compares the resolved configuration with the run's ``config.toml`` field by field;
only the fields of ``RESUMABLE_CHANGES`` may differ, because they change how long or how
visibly the run goes on, never what a step computes. The schedule horizon is part of the run: a
new run saves its resolved ``schedule_steps`` (default: ``steps``), and a resumed run keeps it, so
extending ``--steps`` continues the schedules where they were instead of stretching them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from raptb.app.configuration.config import TrainConfig
from raptb.app.configuration.record import recorded_data, resolved_as
from raptb.app.run_dir.checkpoint import checkpoint_dir
from raptb.app.run_dir.eval_folder import eval_dir
from raptb.app.run_dir.run_config import CONFIG_FILE, load_config
from raptb.app.run_dir.run_log import log_path
from raptb.app.run_dir.trackers import tracker_dirs

RESUMABLE_CHANGES = (
    "steps",
    "checkpoint_every",
    "keep_checkpoints",
    "threads",
    "lanes",
    "keep_freed_memory",
    "time_limit",
    "eval_samples",
    "max_nonfinite",
    "reward.workers",
    "reward.max_failed_steps",
    "report_to",
    "distributed.timeout",
)
"""Fields ``--resume`` may change: length, checkpoint cadence and retention, CPU threads and
memory reuse, evaluation size, stop limits, reward workers (scoring in a pool gives identical
rewards), the experiment trackers and the collective timeout."""


class RunMismatch(ValueError):
    """The run directory or its configuration does not fit the request; one-line message."""


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _run_entries(run_dir: Path) -> list[Path]:
    """The files and folders of a run present in ``run_dir``."""
    entries = (Path(run_dir) / CONFIG_FILE, log_path(run_dir), checkpoint_dir(run_dir))
    entries += (eval_dir(run_dir), *tracker_dirs(run_dir))
    return [p for p in entries if p.exists() or p.is_symlink()]


def with_horizon(config: TrainConfig, horizon: int) -> TrainConfig:
    """``config`` with ``schedule_steps`` set, validated again (by its own model class, which
    holds the registered tasks' sections)."""
    data = config.model_dump()
    data["schedule_steps"] = horizon
    return type(config).model_validate(data)


def claim_new_run(run_dir: Path, config: TrainConfig, *, overwrite: bool) -> TrainConfig:
    """Make ``run_dir`` ready for a new run (delete a previous run's files with ``overwrite``);
    the run's config with its schedule horizon resolved, as it will be saved.

    Raises:
        RunMismatch: ``run_dir`` holds something and ``overwrite`` is False.
    """
    entries = _run_entries(run_dir)
    if entries and not overwrite:
        names = ", ".join(p.name for p in entries)
        raise RunMismatch(
            f"{run_dir} already holds a run ({names}); pass --resume to continue it, "
            "--overwrite to delete it and start afresh, or another --out"
        )
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return with_horizon(config, config.schedule_horizon)


def resumed_config(run_dir: Path, config: TrainConfig) -> TrainConfig:
    """``config`` checked against the run's saved ``config.toml``, with the saved schedule
    horizon filled in when ``config`` does not set one.

    Raises:
        RunMismatch: a field outside ``RESUMABLE_CHANGES`` differs; the message lists them all.
    """
    saved = load_config(Path(run_dir) / CONFIG_FILE)
    if config.schedule_steps is None:
        # runs saved before the horizon was recorded ran their schedules over their steps
        config = with_horizon(config, saved.schedule_horizon)
    config = resolved_as(config, saved)  # "auto" continues in the dtype the run resolved it to
    # compared as recorded: a field no part of the run reads is not recorded, nor compared
    old = _flatten(recorded_data(with_horizon(saved, saved.schedule_horizon)))
    new = _flatten(recorded_data(config))
    changed = [
        f"{key} ({old.get(key)!r} -> {new.get(key)!r})"
        for key in sorted(set(old) | set(new))
        if key not in RESUMABLE_CHANGES and old.get(key) != new.get(key)
    ]
    if changed:
        raise RunMismatch(
            f"--resume: the configuration differs from {run_dir / CONFIG_FILE} in "
            f"{', '.join(changed)}; only {', '.join(RESUMABLE_CHANGES)} may change when "
            "resuming (use another --out for a new run)"
        )
    return config


def check_steps(steps: int, done: int) -> None:
    """Refuse a ``--steps`` below the steps a resumed run has already done."""
    if steps < done:
        raise RunMismatch(
            f"--steps {steps} is below the {done} steps this run has done; pass --steps {done} "
            "or more"
        )
