"""The training progress bar (stderr): step, loss, logZ, accuracy and distinct successes."""

from __future__ import annotations

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
