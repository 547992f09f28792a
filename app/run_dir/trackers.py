"""Experiment trackers (``report_to``, TRL's name and values): TensorBoard and Weights & Biases
receive every ``metrics.jsonl`` field per step and the metrics of ``raptb eval``.

- ``tensorboard``: event files in ``RUN_DIR/tensorboard`` (``tensorboard --logdir runs``),
  scalars ``train/<field>`` at the optimizer step and ``eval/<metric>`` at the evaluated
  checkpoint's step. A resumed run opens its writer with ``purge_step`` = the first step it
  trains, so TensorBoard hides what a killed run logged after its checkpoint, as
  ``app.run_dir.run_log`` cuts ``metrics.jsonl``: each step appears once.
- ``wandb``: one W&B run per run directory (its id kept in ``RUN_DIR/wandb/run-id``; resume and
  evaluation continue it with ``resume="allow"``), files under ``RUN_DIR/wandb``, the resolved
  configuration as the run's config, project ``$WANDB_PROJECT`` or ``raptb``. It runs offline
  (``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later) unless the user set ``WANDB_MODE``.

A field that is null at a step (``acc`` without on-policy samples) is not written that step;
evaluation metrics are the numbers of ``metrics.json`` (nested tables flattened with ``/``, lists
and the ``eval`` provenance entry left out). Only the process that writes ``metrics.jsonl``
(rank 0) opens trackers. The packages are optional extras, checked when the configuration is
validated (app.configuration.report_to), so a missing one is a one-line error naming the extra.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_ID_FILE = "run-id"
DEFAULT_WANDB_PROJECT = "raptb"


def tracker_dirs(run_dir: Path) -> list[Path]:
    """The folders trackers may write in ``run_dir`` (part of the run, see app.run_dir.resume)."""
    return [Path(run_dir) / TENSORBOARD_DIR, Path(run_dir) / WANDB_DIR]


class Tracker(Protocol):
    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """Record ``scalars`` (tag -> value) at ``step``."""

    def close(self) -> None:
        """Write out everything logged."""


class TensorBoardTracker:
    """Scalars into TensorBoard event files (torch's writer; needs the ``tensorboard`` package)."""

    def __init__(self, run_dir: Path, purge_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD_DIR), purge_step=purge_step)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()  # as metrics.jsonl: what a step logged survives a kill

    def close(self) -> None:
        self.writer.close()


def _wandb_id(run_dir: Path) -> str:
    """The run directory's W&B run id, created on first use."""
    path = Path(run_dir) / WANDB_DIR / WANDB_ID_FILE
    if path.is_file():
        return path.read_text(encoding="utf-8").strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)
    path.write_text(run_id + "\n", encoding="utf-8")
    return run_id


class WandbTracker:
    """Scalars into the run directory's W&B run (offline unless ``WANDB_MODE`` is set)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        run_dir = Path(run_dir)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", DEFAULT_WANDB_PROJECT),
            name=run_dir.name,
            id=_wandb_id(run_dir),
            resume="allow",
            dir=str(run_dir),
            config=dict(config),
            mode=None if "WANDB_MODE" in os.environ else "offline",
        )

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def train_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """``train/<field>`` for each number of a metrics.jsonl record (its ``step`` is the x-axis)."""
    return {
        f"train/{key}": number
        for key, value in record.items()
        if key != "step" and (number := _number(value)) is not None
    }


def eval_scalars(metrics: Mapping[str, Any], prefix: str = "eval") -> dict[str, float]:
    """``eval/<metric>`` for each number of metrics.json, nested tables flattened with ``/``."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if prefix == "eval" and key == "eval":
            continue  # which checkpoint and seed: provenance, not a metric
        if isinstance(value, Mapping):
            out.update(eval_scalars(value, f"{prefix}/{key}"))
        elif (number := _number(value)) is not None:
            out[f"{prefix}/{key}"] = number
    return out


class Trackers:
    """The run's trackers, opened together, fed together, closed together (a context manager)."""

    def __init__(self, trackers: Iterable[Tracker]) -> None:
        self.trackers = list(trackers)

    @classmethod
    def open(
        cls,
        names: Sequence[str],
        run_dir: Path,
        config: Mapping[str, Any],
        *,
        first_step: int | None = None,
    ) -> Trackers:
        """Open the trackers ``names`` for ``run_dir``; ``first_step``: the step training is
        about to log first (TensorBoard hides what an earlier attempt logged from there on),
        None for evaluation."""
        opened: list[Tracker] = []
        for name in names:
            if name == "tensorboard":
                opened.append(TensorBoardTracker(run_dir, first_step))
            else:
                opened.append(WandbTracker(run_dir, config))
        return cls(opened)

    def log_train(self, record: Mapping[str, Any]) -> None:
        """A metrics.jsonl record, at its step."""
        scalars = train_scalars(record)
        for tracker in self.trackers:
            tracker.log(scalars, int(record["step"]))

    def log_eval(self, metrics: Mapping[str, Any], step: int) -> None:
        """``raptb eval``'s metrics of the checkpoint of ``step``."""
        scalars = eval_scalars(metrics)
        for tracker in self.trackers:
            tracker.log(scalars, step)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def __enter__(self) -> Trackers:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
