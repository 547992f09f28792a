"""Statistics across seeds: the two-sided Student-t interval mean +- t_{S-1,(1+c)/2} sd / sqrt(S).

sd is the sample standard deviation (ddof = 1) of the S per-seed values; the quantile comes from
``scipy.stats.t``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from raptb.core.metrics._arrays import as_floats


def student_t_quantile(probability: float, df: float) -> float:
    """Quantile of Student's t with ``df`` > 0 degrees of freedom at ``probability`` in (0, 1).

    Raises on arguments outside those ranges (scipy would return NaN).
    """
    if not 0.0 < probability < 1.0:
        raise ValueError(f"probability must be in (0, 1), got {probability}")
    if not df > 0:
        raise ValueError(f"df must be > 0, got {df}")
    from scipy import stats  # a second to import: only when an interval is computed

    return float(stats.t.ppf(probability, df))


@dataclass(frozen=True)
class ConfidenceInterval:
    """mean +- half_width; half_width is NaN for a single value (no spread to estimate)."""

    mean: float
    half_width: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width


def mean_ci(values: Iterable[float] | np.ndarray, confidence: float = 0.95) -> ConfidenceInterval:
    """Two-sided t-interval over seeds: mean +- t_{S-1,(1+c)/2} * sd(ddof=1) / sqrt(S)."""
    array = as_floats(values, "values")
    if array.size == 0:
        raise ValueError("values must not be empty")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    mean = float(array.mean())
    if array.size == 1:
        return ConfidenceInterval(mean, math.nan)
    quantile = student_t_quantile((1.0 + confidence) / 2.0, array.size - 1)
    return ConfidenceInterval(mean, quantile * float(array.std(ddof=1)) / math.sqrt(array.size))
