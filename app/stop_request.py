"""Stopping a training run cleanly: the first Ctrl-C or SIGTERM (preemption, ``docker stop``)
asks the loop to finish the step in progress, checkpoint and stop; a second one aborts with the
signal's default action. Only signals nobody else handles are taken, so an embedding application
keeps its own handlers."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console


class StopRequest:
    """Whether the run was asked to stop after the current step, and by which signal if any."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.requested = False
        self.signum: int | None = None

    def request(self) -> None:
        """Ask the loop to stop after the step in progress (as a signal would, without one)."""
        self.requested = True

    @contextmanager
    def catching_signals(self) -> Iterator[None]:
        """SIGINT and SIGTERM request a stop inside the block (when they still have their
        default handlers); the previous handlers are back afterwards."""
        previous = {
            signum: handler
            for signum, handler in (
                (signal.SIGINT, signal.getsignal(signal.SIGINT)),
                (signal.SIGTERM, signal.getsignal(signal.SIGTERM)),
            )
            if handler in (signal.default_int_handler, signal.SIG_DFL)
        }
        for signum in previous:
            signal.signal(signum, self._on_signal)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.requested = True
        self.signum = signum
        default = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, default)
        name = signal.Signals(signum).name
        self.console.print(f"[yellow]{name}: finishing this step and checkpointing...[/]")
