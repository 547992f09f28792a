"""A study's charts: one PNG per plotted metric, a bar per table cell with 95% CI whiskers, and
one PNG per training curve, a line per run.

Bars are the mean over seeds, whiskers the same t-interval as table.md, dots the seeds; bars
share a colour per value of the table's first row key (e.g. per replay scheme). Curves plot two
fields of each run's metrics.jsonl against each other, y as a trailing moving average; a cell's
runs share a colour, seeds differ in line style.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from raptb.app.run_dir.run_log import log_path, read_log
from raptb.app.study.report import RunResult, cell_stats, value_label
from raptb.app.study.spec import CurveSpec, MetricSpec, StudySpec


def plot_file(metric: MetricSpec) -> str:
    """Chart file of a metric: ``log_pterm_by_length.9`` -> ``log_pterm_by_length_9.png``."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in metric.key) + ".png"


def _cell_label(spec: StudySpec, keys: Sequence[str], values: Sequence[str]) -> str:
    return "\n".join(value_label(spec, k, v) for k, v in zip(keys, values, strict=True))


def plot_metric(
    spec: StudySpec, results: Sequence[RunResult], metric: MetricSpec, path: Path
) -> Path:
    """Bar chart of ``metric`` over the study's cells, written to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cells = cell_stats(spec, results)
    keys = [*spec.table_rows, *spec.table.columns]
    groups = list(dict.fromkeys(cell.row[:1] for cell in cells))
    palette = [f"C{i % 10}" for i in range(len(groups))]
    figure = Figure(figsize=(max(6.0, 0.75 * len(cells) + 1.5), 4.5), layout="constrained")
    axes = figure.add_subplot()
    positions = np.arange(len(cells))
    for x, cell in zip(positions, cells, strict=True):
        mean, half = cell.stats.get(metric.key, (math.nan, math.nan))
        axes.bar(
            x,
            mean,
            width=0.7,
            color=palette[groups.index(cell.row[:1])],
            alpha=0.75,
            yerr=None if math.isnan(half) else half,
            capsize=3,
        )
        seeds = [
            r.values[metric.key]
            for r in results
            if (r.run.cell(spec.table_rows), r.run.cell(spec.table.columns))
            == (cell.row, cell.column)
            and metric.key in r.values
        ]
        axes.scatter([x] * len(seeds), seeds, s=10, color="black", zorder=3)
    axes.set_xticks(
        positions, [_cell_label(spec, keys, (*c.row, *c.column)) for c in cells], fontsize=7
    )
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_ylabel(metric.label)
    axes.set_title(f"{spec.title or spec.name}: {metric.label}", fontsize=9)
    axes.set_xlabel("bars: mean over seeds; whiskers: 95% CI; dots: seeds", fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=110)
    return path


def curve_file(curve: CurveSpec) -> str:
    """Chart file of a curve: y=acc, x=unique_correct -> ``curve_acc_unique_correct.png``."""
    name = f"curve_{curve.y}_{curve.x}"
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name) + ".png"


def trailing_mean(values: Sequence[float], window: int) -> np.ndarray:
    """Mean of the last ``window`` values at each position (fewer at the start)."""
    data = np.asarray(values, dtype=np.float64)
    sums = np.cumsum(np.concatenate([[0.0], data]))
    ends = np.arange(1, data.size + 1)
    starts = np.maximum(0, ends - window)
    return (sums[ends] - sums[starts]) / (ends - starts)


def curve_points(records: Sequence[dict], curve: CurveSpec) -> tuple[np.ndarray, np.ndarray]:
    """(x, smoothed y) over the records that hold both fields as numbers."""
    pairs = [
        (r[curve.x], r[curve.y])
        for r in records
        if isinstance(r.get(curve.x), (int, float)) and isinstance(r.get(curve.y), (int, float))
    ]
    if not pairs:
        return np.zeros(0), np.zeros(0)
    xs, ys = zip(*pairs, strict=True)
    return np.asarray(xs, dtype=np.float64), trailing_mean(ys, curve.window)


def plot_curve(
    spec: StudySpec, results: Sequence[RunResult], curve: CurveSpec, path: Path, runs_root: Path
) -> Path:
    """Line chart of ``curve`` with one line per run, written to ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = [*spec.table_rows, *spec.table.columns]
    cells = list(
        dict.fromkeys(
            (*r.run.cell(spec.table_rows), *r.run.cell(spec.table.columns)) for r in results
        )
    )
    styles = ["-", "--", ":", "-."]
    seeds = list(spec.seeds)
    figure = Figure(figsize=(7.0, 4.5), layout="constrained")
    axes = figure.add_subplot()
    for result in results:
        cell = (*result.run.cell(spec.table_rows), *result.run.cell(spec.table.columns))
        xs, ys = curve_points(read_log(log_path(runs_root / result.run.name)), curve)
        label = _cell_label(spec, keys, cell).replace("\n", " + ")
        if len(seeds) > 1:
            label += f" (seed {result.run.seed})"
        axes.plot(
            xs,
            ys,
            color=f"C{cells.index(cell) % 10}",
            linestyle=styles[seeds.index(result.run.seed) % len(styles)],
            linewidth=1.2,
            label=label,
        )
    axes.set_xlabel(curve.x)
    axes.set_ylabel(curve.y + (f" (moving mean over {curve.window})" if curve.window > 1 else ""))
    axes.set_title(f"{spec.title or spec.name}: {curve.label}", fontsize=9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=110)
    return path
