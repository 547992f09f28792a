"""Reward functions for the robustness tests, importable as ``tests.app.flaky_rewards:NAME``."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

HOLD_ENV = "FLAKY_REWARDS_HOLD"
"""A folder: while it holds a file ``hold``, ``held`` waits there (see ``held``)."""
HOLD_CAP = 300.0
"""Seconds ``held`` waits at most, so that a test gone wrong does not leave processes behind."""


def count_a(prompt: str, text: str) -> float:
    return text.count("a") / 5.0


def paced(prompt: str, text: str) -> float:
    """``count_a`` slowed down so that a test can signal or kill a run between steps."""
    time.sleep(0.004)
    return count_a(prompt, text)


def flaky(prompt: str, text: str) -> float:
    """Raises KeyError on texts of length 1 and ValueError on length 2; NaN on length 3."""
    if len(text) == 1:
        raise KeyError(text)
    if len(text) == 2:
        raise ValueError(f"cannot score {text}")
    if len(text) == 3:
        return math.nan
    return count_a(prompt, text)


def always_raises(prompt: str, text: str) -> float:
    raise RuntimeError("reward service unreachable")


def slow(prompt: str, text: str) -> float:
    """A 0.1 s reward, like a property predictor or a docking call."""
    time.sleep(0.1)
    return count_a(prompt, text)


def held(prompt: str, text: str) -> float:
    """``paced``, except while the folder named by ``HOLD_ENV`` holds a file ``hold``: then the
    call writes ``held-PID`` there (the test sees this process is inside its step) and waits until
    a file ``release`` appears, so that a test decides when the step may end, whatever the
    machine's speed."""
    folder = Path(os.environ.get(HOLD_ENV, "/nonexistent"))
    if (folder / "hold").exists():
        (folder / f"held-{os.getpid()}").touch()
        deadline = time.monotonic() + HOLD_CAP
        while not (folder / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return paced(prompt, text)


def hydrophobic_oracle(sequences: list[str]) -> list[float]:
    """A toy AMP oracle: the fraction of hydrophobic residues (A, I, L, M, F, V, W)."""
    return [sum(c in "AILMFVW" for c in s) / len(s) for s in sequences]


def broken_oracle(sequences: list[str]) -> list[float]:
    raise RuntimeError("oracle service down")
