"""What a study run's directory still needs, read from the files ``raptb train``/``eval`` leave.

    done      eval/metrics.json from the final checkpoint, with the study's N and eval seed
              (and eval/exact.json from that checkpoint when the study asks for it)
    eval      trained to the final step; evaluate only
    resume    a checkpoint before the final step and ``--resume``: continue training
    restart   the same without ``--resume``: train from scratch (the directory is cleared)
    train     no checkpoint yet, or checkpoints without config.toml beside the study's planned
              config (a start interrupted before train wrote config.toml): train from scratch
              (leftovers of a failed start are cleared)
    conflict  the directory holds a run of another configuration, or a live process (a trainer
              of an earlier, killed study) holds its run lock; the study will not touch it

A run counts as the study's when its saved config.toml equals the planned one up to ``threads``
(the runner's choice, not the experiment's).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raptb.app.configuration.config import ConfigError, TrainConfig
from raptb.app.configuration.record import recorded_data, resolved_as
from raptb.app.run_dir.checkpoint import checkpoint_step, latest_checkpoint
from raptb.app.run_dir.run_config import load_config
from raptb.app.run_dir.run_lock import lock_holder

METRICS = Path("eval") / "metrics.json"
EXACT = Path("eval") / "exact.json"
PLANNED_CONFIG = "study-config.toml"
"""The study's planned config, written into a run directory before its trainer starts."""


@dataclass(frozen=True)
class RunState:
    action: str
    step: int | None = None
    reason: str = ""


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when missing, torn or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def latest_step(run_dir: Path) -> int | None:
    checkpoint = latest_checkpoint(run_dir)
    return None if checkpoint is None else checkpoint_step(checkpoint)


def _comparable(config: TrainConfig) -> dict[str, Any]:
    """The fields that make a run, as a run records them (``recorded_data``): threads aside, and
    the schedule horizon resolved (a run saves its resolved ``schedule_steps``; a planned None
    means ``steps``)."""
    update = {"threads": None, "schedule_steps": config.schedule_horizon}
    return recorded_data(config.model_copy(update=update))


def config_difference(planned: TrainConfig, run_dir: Path, name: str = "config.toml") -> str | None:
    """None when ``run_dir/name`` is the planned config, else the first differing field."""
    try:
        saved = load_config(run_dir / name)
    except ConfigError as exc:
        return f"its {name} is unreadable ({exc})"
    want, have = _comparable(resolved_as(planned, saved)), _comparable(saved)
    for path, value in _leaves(want):
        found = _get(have, path)
        if found != value:
            return f"{path} = {found!r}, planned {value!r}"
    return None


def _leaves(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.extend(_leaves(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _get(data: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(part)
    return data


def run_state(
    config: TrainConfig,
    run_dir: Path,
    samples: int,
    eval_seed: int,
    *,
    resume: bool,
    exact: bool = False,
) -> RunState:
    """What ``run_dir`` needs to hold the evaluated run of ``config``."""
    step = latest_step(run_dir)
    holder = lock_holder(run_dir)
    if holder is not None:
        return RunState(
            "conflict", step, f"is being written by {holder}; wait for it to end or stop it"
        )
    if step is None:
        return RunState("train")
    if not (run_dir / "config.toml").exists() and (
        config_difference(config, run_dir, PLANNED_CONFIG) is None
    ):
        return RunState("train", step, "(a start interrupted before config.toml was written)")
    difference = config_difference(config, run_dir)
    if difference is not None:
        return RunState("conflict", step, f"holds another run ({difference})")
    if step > config.steps:
        return RunState("conflict", step, f"has a checkpoint at step {step} > steps")
    if step < config.steps:
        return RunState("resume" if resume else "restart", step)
    metrics = read_json(run_dir / METRICS)
    evaluated = metrics is not None and metrics.get("eval", {}).get("step") == config.steps
    exact_metrics = read_json(run_dir / EXACT) if exact else None
    if (
        evaluated
        and metrics.get("n_samples") == samples
        and metrics.get("eval", {}).get("seed") == eval_seed
        and (
            not exact
            or (
                exact_metrics is not None
                and exact_metrics.get("eval", {}).get("step") == config.steps
            )
        )
    ):
        return RunState("done", step)
    return RunState("eval", step)
