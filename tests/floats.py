"""Comparing float results of two code paths: equal up to a tolerance that covers another order
of summation or another kernel (another CPU, instruction set or thread count), never bit for bit.
Bit-exact comparisons stay where the same operations run in the same order on the same machine
(a resumed run against the uninterrupted one, two ranks of one run)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def assert_records_close(
    got: Sequence[dict[str, Any]], want: Sequence[dict[str, Any]], rel_tol: float, abs_tol: float
) -> None:
    """The same keys and non-float values; each float within ``rel_tol`` or ``abs_tol``."""
    assert len(got) == len(want), (len(got), len(want))
    for step, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys(), step
        for key, value in a.items():
            other = b[key]
            if isinstance(value, float) or isinstance(other, float):
                close = math.isclose(value, other, rel_tol=rel_tol, abs_tol=abs_tol)
                assert close, (step, key, value, other)
            else:
                assert value == other, (step, key, value, other)
