"""``raptb enumerate TASK``: the exact solution set of an enumerable task, counted by length.

A task is enumerable when its spec (adapters.tasks.registry) gives ``solutions``; of the built-in
tasks only Expr24 is (its Y* has 75,445 expressions of lengths 3..9, cached on disk under
``$RAPTB_CACHE_DIR``, default ``~/.cache/raptb``). The task is built with its default options.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from raptb.adapters.tasks.registry import task_names, task_spec


def enumerable_tasks() -> list[str]:
    """Names of the registered tasks whose solution set can be enumerated exactly."""
    return [name for name in task_names() if task_spec(name).enumerable]


def enumerate_command(
    task: Annotated[
        str,
        typer.Argument(
            help="Task to enumerate (enumerable tasks: " + ", ".join(enumerable_tasks()) + ")."
        ),
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the counts as JSON instead of a table.")
    ] = False,
) -> None:
    """Enumerate a task's exact solution set and print the counts by length."""
    if task not in enumerable_tasks():
        raise typer.BadParameter(
            f"{task!r} is not an enumerable task; choose from {', '.join(enumerable_tasks())}",
            param_hint="TASK",
        )
    spec = task_spec(task)
    assert spec.solutions is not None  # enumerable
    start = time.perf_counter()
    solutions = spec.solutions(spec.build(spec.options()))
    seconds = time.perf_counter() - start
    counts = dict(sorted(Counter(len(text) for text in solutions).items()))
    if json_output:
        payload = {
            "task": task,
            "counts": {str(length): count for length, count in counts.items()},
            "total": len(solutions),
        }
        typer.echo(json.dumps(payload))
        return
    table = Table(title=f"{task} solutions")
    table.add_column("length", justify="right")
    table.add_column("solutions", justify="right")
    for length, count in counts.items():
        table.add_row(str(length), f"{count:,}")
    table.add_row("total", f"{len(solutions):,}", style="bold")
    console = Console()
    console.print(table)
    console.print(f"{seconds:.2f} s")
