"""Suite-wide pytest settings: the slowest tests are collected first.

Under ``pytest -n 2`` a 100-second end-to-end test met last leaves the other worker idle for its
whole length. Starting with the end-to-end tests (subprocesses, launchers, studies; slowest first,
by their measured durations on 2 cores) lets the many fast tests fill in around them. pyproject's
``--maxschedchunk=1`` makes xdist hand out tests two at a time as workers free up (its default
sends each worker a first chunk of a quarter of its share, which would give one worker every slow
test). The order changes no test's outcome: each test is independent of the others.

Hypothesis runs under the ``ci`` profile when ``CI`` is set (as ``.ci/run`` is run) or when
``HYPOTHESIS_PROFILE=ci``: derandomised (the same examples on every run, so a red CI is
reproducible), no example database, 100 examples (Hypothesis's default) for a test that does
not set its own count (those that do keep theirs). Locally the ``dev`` profile draws new random
examples each run.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, max_examples=100, deadline=None)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

# node-id prefixes, slowest first (``pytest --durations=30`` on the development machine)
SLOW_FIRST = (
    "tests/benchmarks/test_gpu_driver.py::test_first_plan_dry_run",  # ~9 processes, 1.5-3 min
    "tests/app/test_study_run.py::test_toy_study",
    "tests/app/test_cluster.py::test_sigterm_to_every_process",
    "tests/app/test_cluster.py::test_a_stopped_rank",
    "tests/app/test_plugins.py::test_a_package_adds",
    "tests/app/test_smiles_run.py",
    "tests/app/test_cluster.py",
    "tests/app/test_two_nodes.py",
    "tests/app/test_study_run.py",
    "tests/app/test_distributed.py::test_accelerate_launch",
    "tests/app/test_fsdp.py::test_accelerate_launch",
    "tests/app/test_crash_safety.py",
    "tests/integrations/test_trl_resume.py::test_on_two_processes",
    "tests/app/test_plugins.py",
)


def _rank(item: pytest.Item) -> int:
    for rank, prefix in enumerate(SLOW_FIRST):
        if item.nodeid.startswith(prefix):
            return rank
    return len(SLOW_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the rest keep their order
