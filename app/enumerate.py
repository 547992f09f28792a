"""``raptb enumerate TASK``: the exact solution set of an enumerable task, counted by length.

Only Expr24 is enumerable (its Y* has 75,445 expressions of lengths 3..9). The set is computed
once and cached on disk (``$RAPTB_CACHE_DIR``, default ``~/.cache/raptb``).
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from raptb.adapters.expr24 import (
    MAX_ENUMERABLE_LENGTH,
    enumerate_solutions,
    solution_counts,
    solutions_cache_path,
)


class EnumerableTask(StrEnum):
    """Tasks whose solution set can be enumerated exactly."""

    expr24 = "expr24"


def enumerate_command(
    task: Annotated[EnumerableTask, typer.Argument(help="Task to enumerate (only 'expr24').")],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the counts as JSON instead of a table.")
    ] = False,
) -> None:
    """Enumerate a task's exact solution set and print the counts by length."""
    start = time.perf_counter()
    solutions = enumerate_solutions(MAX_ENUMERABLE_LENGTH)
    seconds = time.perf_counter() - start
    counts = solution_counts(solutions)
    if json_output:
        payload = {
            "task": task.value,
            "counts": {str(length): count for length, count in counts.items()},
            "total": len(solutions),
        }
        typer.echo(json.dumps(payload))
        return
    table = Table(title=f"{task.value} solutions")
    table.add_column("length", justify="right")
    table.add_column("solutions", justify="right")
    for length, count in counts.items():
        table.add_row(str(length), f"{count:,}")
    table.add_row("total", f"{len(solutions):,}", style="bold")
    console = Console()
    console.print(table)
    console.print(f"{seconds:.2f} s; cache: {solutions_cache_path(MAX_ENUMERABLE_LENGTH)}")
