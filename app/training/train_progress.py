"""The training progress bar (stderr): step, loss, logZ, accuracy and distinct successes; and the
expected step time, said once after the first steps."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn


def progress_bar(console: Console, enabled: bool) -> Progress:
    """A bar whose task takes the fields of :func:`bar_fields`."""
    return Progress(
        TextColumn("[bold]step[/] {task.completed}/{task.total}"),
        BarColumn(),
        TextColumn(
            "loss {task.fields[loss]} logZ {task.fields[log_z]} acc {task.fields[acc]} "
            "correct {task.fields[unique_correct]}"
        ),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


def bar_fields(record: dict[str, Any] | None = None) -> dict[str, str]:
    """The bar's fields from a metrics record ('-' for what it does not hold)."""
    record = record or {}

    def fmt(key: str, spec: str) -> str:
        value = record.get(key)
        return "-" if value is None else format(value, spec)

    return {
        "loss": fmt("loss", ".3g"),
        "log_z": fmt("log_z", ".2f"),
        "acc": fmt("acc", ".2f"),
        "unique_correct": fmt("unique_correct", "d"),
    }


class StepPace:
    """The run's expected step time, said once: after ``FIRST + MEASURED`` steps of this process,
    the mean seconds of the last ``MEASURED`` (the first ones, which warm up and compile, left out)
    and the minutes the remaining steps take at that pace."""

    FIRST, MEASURED = 1, 3

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.since: float | None = None

    def step(self, step: int) -> str | None:
        """Call after each optimizer step (``step``: steps done); the line to print, once."""
        self.done += 1
        if self.done == self.FIRST:
            self.since = time.perf_counter()
        elif self.since is not None and self.done == self.FIRST + self.MEASURED:
            seconds = (time.perf_counter() - self.since) / self.MEASURED
            left = max(self.total - step, 0)
            return (
                f"step ~{seconds:.2f} s (steps {self.FIRST + 1}-{self.done} of this run); "
                f"the {left} steps left ~{seconds * left / 60:.1f} min"
            )
        return None
