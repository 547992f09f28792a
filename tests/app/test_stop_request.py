"""A stop requested by SIGTERM: a repeat of it shortly after the loop has already stopped (the
step and checkpoint can take a fraction of a second) is the same request, not a kill; after the
window a SIGTERM takes its default action again. Each case runs in a child process, whose
signals the test can send and whose exit status it reads."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

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
