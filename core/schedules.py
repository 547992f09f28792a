"""Linear schedules of training factors (paper table "Factor schedulers").

A factor moves linearly from ``start`` to ``end`` over ``horizon`` optimizer steps and then stays at
``end``. Integer factors (k_min) are truncated toward zero, as the paper's code does with ``int()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class LinearSchedule:
    """value(step) = start + (end - start) * min(step, horizon) / horizon.

    ``integer=True`` truncates the value toward zero (k_min 7 -> 3 over 5000 steps is 7 until the
    first step where the interpolation drops below 7, then 6, ...). ``horizon == 0`` means the
    schedule is at ``end`` from step 0.
    """

    start: float
    end: float
    horizon: int
    integer: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ValueError(f"LinearSchedule: start and end must be finite, got {self}")
        if self.horizon < 0:
            raise ValueError(f"LinearSchedule.horizon: must be >= 0, got {self.horizon}")

    def __call__(self, step: int) -> float:
        if step < 0:
            raise ValueError(f"LinearSchedule: step must be >= 0, got {step}")
        if self.horizon == 0 or step >= self.horizon:
            value = float(self.end)
        else:
            value = self.start + (self.end - self.start) * (step / self.horizon)
        return float(math.trunc(value)) if self.integer else value

    @classmethod
    def constant(cls, value: float, integer: bool = False) -> LinearSchedule:
        return cls(value, value, 0, integer)


def schedule_value(value: float | LinearSchedule, step: int) -> float:
    """Resolve a hyperparameter that may be a constant or a schedule at ``step``."""
    return value(step) if isinstance(value, LinearSchedule) else float(value)
