"""benchmarks/diversity_zoo.py's check of runs at unseen seeds: the 95% prediction interval for
one more run, by hand, and a run inside or outside it in ``unseen.md``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.benchmarks import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "diversity_zoo.py"


@pytest.fixture(scope="module")
def zoo():
    return load_script("diversity_zoo")


def test_prediction_interval_by_hand(zoo):
    # 1, 2, 3: mean 2, sd 1, t_{2, 0.975} = 4.302653, sqrt(1 + 1/3)
    mean, half = zoo.prediction([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert half == pytest.approx(4.302653 * math.sqrt(4 / 3), rel=1e-6)
    # the interval of the mean is narrower by sqrt(1 + n)
    assert zoo.interval([1.0, 2.0, 3.0])[1] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)


def test_unseen_runs_against_the_comparison(zoo, tmp_path):
    header = "row,seed,exact.acc,exact.expected_distinct.6400,exact.uniformity\n"
    study = tmp_path / "study.csv"
    study.write_text(header + "A,0,0.8,100,0.4\nA,1,0.9,120,0.5\nA,2,0.85,110,0.45\n")
    unseen = tmp_path / "unseen.csv"
    unseen.write_text(header + "A,13,0.86,111,0.46\nA,14,0.2,400,0.9\nB,13,1.0,1,0.0\n")
    lines = zoo.unseen_table(zoo.by_row([study]), unseen).splitlines()
    inside, outside, missing = lines[2], lines[3], lines[4]
    assert "(out)" not in inside and inside.count("(in)") == 6
    assert outside.count("(out)") == 6  # far outside both intervals on every metric
    assert "not in the comparison" in missing


def test_the_committed_frontier_table_is_that_of_every_default_study(zoo):
    """frontier.md holds each study's rows (rerun ``python benchmarks/diversity_zoo.py`` after
    adding runs to one of them)."""
    paths = [zoo.RESULTS / study / "runs.csv" for study in zoo.STUDIES]
    rows = zoo.by_row(paths)
    assert {"RapTB + SubM", "G2RPO", "IPS-GRPO"} <= set(rows)
    assert (zoo.RESULTS / "diversity_zoo" / "frontier.md").read_text() == zoo.table(rows)
