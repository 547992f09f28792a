"""The suite's Hypothesis ``ci`` profile (tests/conftest.py) draws the same examples on every run,
with no example database, so a red CI run fails the same way when it is run again."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


def _drawn() -> list[list[int]]:
    seen: list[list[int]] = []

    @settings(settings.get_profile("ci"), max_examples=20)
    @given(st.lists(st.integers(-(10**6), 10**6), min_size=3, max_size=8))
    def record(values: list[int]) -> None:
        seen.append(values)

    record()
    return seen


def test_the_ci_profile_is_derandomised_without_a_database() -> None:
    profile = settings.get_profile("ci")
    assert profile.derandomize and profile.database is None and profile.max_examples == 100
    first, second = _drawn(), _drawn()
    assert len(first) >= 10 and first == second
    assert len({tuple(v) for v in first}) > 5  # examples, not one repeated value
