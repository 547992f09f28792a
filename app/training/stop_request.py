"""Stopping a training run cleanly: the first Ctrl-C or SIGTERM (preemption, ``docker stop``)
asks the loop to finish the step in progress, checkpoint and stop. Only signals nobody else
handles are taken, so an embedding application keeps its own handlers.

What a further signal does follows a cluster's pattern, where one preemption arrives several
times: SLURM signals every process of a job step and torch's launcher forwards its own SIGTERM
to the ranks about a millisecond later. So

- a SIGTERM within ``REPEAT_WINDOW`` seconds of the first request is the same request;
- a second SIGINT (an explicit second Ctrl-C), a SIGINT after a SIGTERM, or a SIGTERM after the
  window aborts with the signal's default action (no checkpoint).

A run stopped by a SIGTERM may finish its step and checkpoint within a fraction of a second, so
the repeat can arrive after the loop has left ``catching_signals``: there SIGTERM's default
action is not put back until the window has passed (a repeat inside it is still ignored), so the
process exits with 143 as it means to instead of dying of the repeat. Python's own shutdown puts
the default action back, so ``raptb train`` ignores SIGTERM once it is exiting with 143
(app.training.train_command).

A run also stops once its ``time_limit`` has passed (``stop_at_time_limit``, after a step), and
every rank of a multi-process run ends as the run does (``agree``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from time import monotonic
from typing import Any

from rich.console import Console

REPEAT_WINDOW = 10.0
"""Seconds after a stop request in which a SIGTERM repeats it instead of aborting."""


class StopRequest:
    """Whether the run was asked to stop after the current step, by which signal if any, and
    why (``reason``: the signal's name, "time limit", or None for a plain ``request()``).

    ``time_limit``: minutes from ``started`` (a ``time.monotonic()`` reading) after which the run
    stops, None for no limit; ``speaks``: whether this process says so (rank 0 of a run)."""

    def __init__(
        self,
        console: Console,
        time_limit: float | None = None,
        started: float = 0.0,
        *,
        speaks: bool = True,
    ) -> None:
        self.console = console
        self.time_limit = time_limit
        self.started = started
        self.speaks = speaks
        self.requested = False
        self.signum: int | None = None
        self.reason: str | None = None
        self._since: float | None = None  # time.monotonic() of the first signal

    def request(self, reason: str | None = None) -> None:
        """Ask the loop to stop after the step in progress (as a signal would, without one)."""
        self.requested = True
        if self.reason is None:
            self.reason = reason

    def stop_at_time_limit(self, step: int) -> None:
        """Request a stop, reason "time limit", once ``time_limit`` minutes have passed since
        ``started`` (said once, after step ``step``); nothing when a stop is already requested."""
        limit = self.time_limit
        if limit is None or self.requested or monotonic() - self.started < limit * 60:
            return
        if self.speaks:
            self.console.print(
                f"time limit: {limit:g} min passed; checkpointing after step {step} and stopping",
                style="yellow",
                markup=False,
                highlight=False,
            )
        self.request("time limit")

    def agree(self, all_gather: Callable[[Any], list[Any]]) -> None:
        """Every rank ends as the run does (``all_gather``: each rank's object, in rank order):
        one stopped by another rank's SIGTERM exits 143 too (SIGTERM over SIGINT where ranks got
        different signals), and says why (a time limit one rank reached first)."""
        states = all_gather((self.requested, self.signum, self.reason))
        self.requested = any(requested for requested, _, _ in states)
        self.signum = max((signum for _, signum, _ in states if signum), default=None)
        if self.reason is None:
            self.reason = next((why for _, _, why in states if why), None)

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
                stopping = signum == signal.SIGTERM == self.signum and handler is signal.SIG_DFL
                signal.signal(signum, self._after_stop if stopping else handler)

    def _after_stop(self, signum: int, frame: Any) -> None:
        """SIGTERM after the loop stopped on one: a repeat within the window is ignored, a later
        one takes SIGTERM's default action."""
        if self._since is not None and time.monotonic() - self._since < REPEAT_WINDOW:
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self._since is None:
            self.request(name)
            self.signum = signum
            self._since = now
            self.console.print(f"[yellow]{name}: finishing this step and checkpointing...[/]")
            return
        if signum == signal.SIGTERM and now - self._since < REPEAT_WINDOW:
            return  # the same preemption, delivered again (by the launcher, by the cluster)
        self.console.print(f"[red]{name} again: aborting without a checkpoint[/]")
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
