"""Reading the committed results of benchmarks/results/: a study's runs.csv, grouped by row, and
the mean with its 95% Student-t intervals over seeds (benchmarks/pages.py and
benchmarks/field_table.py write the pages' numbers with them)."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
ACC, DISTINCT = "exact.acc", "exact.expected_distinct.6400"


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def by_row(path: Path) -> dict[str, list[dict[str, str]]]:
    """A study's ``runs.csv`` grouped by its ``row`` column (the method), in file order."""
    groups: dict[str, list[dict[str, str]]] = {}
    for run in read_csv(path):
        groups.setdefault(run["row"], []).append(run)
    return groups


class Spread:
    """Mean, 95% t half-width of the mean and of one more run, over the seeds' values."""

    def __init__(self, values: list[float]) -> None:
        self.n = len(values)
        self.mean = statistics.fmean(values)
        quantile = stats.t.ppf(0.975, self.n - 1) if self.n > 1 else math.nan
        sd = statistics.stdev(values) if self.n > 1 else math.nan
        self.half = quantile * sd / math.sqrt(self.n)
        self.one_run = quantile * sd * math.sqrt(1 + 1 / self.n)

    def cell(self, decimals: int) -> str:
        return f"{self.mean:,.{decimals}f} ± {self.half:,.{decimals}f}"

    def run_range(self, decimals: int, high: float = math.inf) -> str:
        low, top = self.mean - self.one_run, min(self.mean + self.one_run, high)
        return f"{max(low, 0):,.{decimals}f}-{top:,.{decimals}f}"


def spread(runs: list[dict[str, str]], key: str) -> Spread:
    return Spread([float(run[key]) for run in runs])


def seconds_range(runs: list[dict[str, str]]) -> str:
    wall = [float(run["wall_seconds"]) for run in runs]
    return f"{min(wall):.0f}-{max(wall):.0f} s"
