"""A stop requested by SIGTERM: a repeat of it shortly after the loop has already stopped (the
step and checkpoint can take a fraction of a second) is the same request, not a kill; after the
window a SIGTERM takes its default action again. Each case runs in a child process, whose
signals the test can send and whose exit status it reads. The other ways a run stops: the time
limit, and every rank of a run ending as the run does."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from rich.console import Console

from raptb.app.training import stop_request

BODY = """
import os, signal, sys, time
import raptb.app.training.stop_request as module
from rich.console import Console

module.REPEAT_WINDOW = {window}
stop = module.StopRequest(Console(stderr=True))
with stop.catching_signals():
    os.kill(os.getpid(), signal.SIGTERM)  # the stop request, handled inside the loop
    time.sleep(0.05)
assert stop.requested and stop.signum == signal.SIGTERM
time.sleep({wait})
os.kill(os.getpid(), signal.SIGTERM)  # its repeat, after the loop has stopped
time.sleep(0.2)
sys.exit(143)
"""


def run(window: float, wait: float) -> int:
    code = textwrap.dedent(BODY.format(window=window, wait=wait))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60).returncode


def test_a_repeated_sigterm_after_the_loop_stopped_is_the_same_request() -> None:
    assert run(window=10.0, wait=0.0) == 143


def test_a_sigterm_after_the_window_takes_its_default_action() -> None:
    assert run(window=0.1, wait=0.3) == -signal.SIGTERM


def test_every_rank_ends_as_the_run_does() -> None:
    """A rank that saw nothing takes the run's stop: SIGTERM over SIGINT, the first reason."""
    states = [(False, None, None), (True, signal.SIGINT, "SIGINT"), (True, signal.SIGTERM, "x")]
    quiet = stop_request.StopRequest(Console(stderr=True))
    quiet.agree(lambda own: [own, *states[1:]])
    assert (quiet.requested, quiet.signum, quiet.reason) == (True, signal.SIGTERM, "SIGINT")
    alone = stop_request.StopRequest(Console(stderr=True))
    alone.agree(lambda own: [own])
    assert (alone.requested, alone.signum, alone.reason) == (False, None, None)


def test_the_time_limit_requests_a_stop_once_it_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(stop_request, "monotonic", lambda: now[0])
    stop = stop_request.StopRequest(Console(stderr=True), time_limit=1.5, started=10.0)
    now[0] = 99.0  # 89 s of 90
    stop.stop_at_time_limit(3)
    assert not stop.requested
    now[0] = 100.0
    stop.stop_at_time_limit(4)
    assert (stop.requested, stop.reason, stop.signum) == (True, "time limit", None)
    unlimited = stop_request.StopRequest(Console(stderr=True), started=10.0)
    now[0] = 1e9
    unlimited.stop_at_time_limit(5)
    assert not unlimited.requested
