"""Checks of hyperparameter values shared by every loss (the GFlowNet objectives, the RL baselines):
a one-line ValueError naming the hyperparameter."""

from __future__ import annotations

import math


def check_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False) -> None:
    """Raise ValueError naming ``name`` unless lo <= value <= hi (lo < value if ``lo_open``)."""
    ok = (value > lo if lo_open else value >= lo) and value <= hi and math.isfinite(value)
    if not ok:
        bracket = "(" if lo_open else "["
        raise ValueError(f"{name}: must lie in {bracket}{lo}, {hi}], got {value}")
