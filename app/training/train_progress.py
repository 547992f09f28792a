"""What a run shows while it runs: the progress bar (stderr: step, loss, logZ, accuracy and
distinct successes), the expected step time, said once after the first steps, and one line when
raptb's Numba kernels compile (stdout, where ``raptb train`` says what it runs), since a first run
is otherwise silent for a minute.

The kernels (``core/subm``, ``adapters/lm``'s compiled rollout and rescoring) are jitted with
``cache=True``: the first call of each compiles it and writes it to the ``__pycache__`` beside
its source (or to ``NUMBA_CACHE_DIR``), and later processes load it from there. Numba announces
a compilation, and only a compilation, with its ``"numba:compile"`` event (Numba's event API):
a function found in the cache, or compiled earlier in the process, raises none. So the line is
said on the first such event from a function of raptb's, which happens exactly when the cache
is cold for a kernel the run uses (a fresh install, a new Numba or an edited kernel), never on a
warm run. What it costs is measured in docs/install.md ("The first run").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from numba.core.event import Event, Listener, install_listener
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

COMPILING_LINE = "compiling kernels, first run only, about a minute"


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


class CompileNotice(Listener):
    """Calls ``say(COMPILING_LINE)`` once, when a function of a module under ``package`` (a
    dotted prefix such as ``"raptb."``) starts compiling; ``said`` tells whether it has."""

    def __init__(self, say: Callable[[str], None], package: str) -> None:
        self.say = say
        self.package = package
        self.said = False

    def on_start(self, event: Event) -> None:
        if self.said:
            return
        module = getattr(event.data["dispatcher"].py_func, "__module__", None) or ""
        if module.startswith(self.package):
            self.said = True
            self.say(COMPILING_LINE)

    def on_end(self, event: Event) -> None:
        pass


@contextmanager
def compile_notice(say: Callable[[str], None], package: str = "raptb.") -> Iterator[CompileNotice]:
    """Within the block, say :data:`COMPILING_LINE` before the first kernel of ``package`` that
    is compiled rather than loaded from Numba's cache."""
    notice = CompileNotice(say, package)
    with install_listener("numba:compile", notice):
        yield notice


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
