"""The expected step time a run says once after its first steps: the mean of steps 2-4 (the first,
which warms up, left out) and the minutes of the steps left at that pace."""

from __future__ import annotations

import pytest

from raptb.app.training import train_progress
from raptb.app.training.train_progress import StepPace


def said(monkeypatch: pytest.MonkeyPatch, total: int, first: int, ends: list[float]) -> list:
    """What ``StepPace(total)`` says after each step of a run resumed at step ``first - 1`` whose
    steps end at ``ends`` seconds."""
    now = [0.0]
    monkeypatch.setattr(train_progress.time, "perf_counter", lambda: now[0])
    pace = StepPace(total)
    lines = []
    for step, end in enumerate(ends, start=first):
        now[0] = end
        lines.append(pace.step(step))
    return lines


def test_said_once_after_the_first_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    # steps end at 10 s (warm-up), 12, 15 and 19 s: steps 2-4 took 9 s, 3 s each
    lines = said(monkeypatch, 104, 1, [10.0, 12.0, 15.0, 19.0, 30.0])
    assert lines[:3] == [None, None, None] and lines[4] is None
    assert lines[3] == "step ~3.00 s (steps 2-4 of this run); the 100 steps left ~5.0 min"


def test_a_resumed_run_counts_its_own_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = said(monkeypatch, 50, 41, [5.0, 6.0, 8.0, 11.0])
    assert lines[3] == "step ~2.00 s (steps 2-4 of this run); the 6 steps left ~0.2 min"
