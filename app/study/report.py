"""A study's report: ``runs.csv`` (one row per run) and ``table.md`` (mean +- 95% CI per cell).

A cell is one combination of the table's keys (axis values and row); its runs differ only in
the seed. The interval is the two-sided t-interval over seeds, ``core.metrics.mean_ci`` (no
+- with one seed). Table rows and column groups follow the study's ``[table]`` layout, so the
Markdown reads like the paper's table it reproduces.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from raptb.app.run_dir.run_log import read_log
from raptb.app.study.plan import SEED_KEY, PlannedRun, format_value
from raptb.app.study.spec import ROW_KEY, CurveSpec, MetricSpec, StudySpec
from raptb.app.study.state import EXACT, METRICS, read_json
from raptb.core.metrics import mean_ci

CSV_NAME = "runs.csv"
TABLE_NAME = "table.md"
TRAIN_PREFIX = "train."
EXACT_PREFIX = "exact."


@dataclass(frozen=True)
class RunResult:
    """A finished run: its plan, its scalar eval metrics and table metrics, its wall time."""

    run: PlannedRun
    values: dict[str, float]
    steps: int | None
    samples: int | None
    wall_seconds: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _last_record(path: Path) -> dict[str, Any]:
    """The last JSON object of a run's metrics.jsonl (the final training step), or {}."""
    records = read_log(path)
    return records[-1] if records else {}


def metric_value(
    metrics: dict[str, Any],
    train: dict[str, Any],
    key: str,
    exact: dict[str, Any] | None = None,
) -> float | None:
    """A table metric: dotted path into metrics.json, ``train.<field>`` of the last step, or
    ``exact.<path>`` into exact.json."""
    if key.startswith(TRAIN_PREFIX):
        return _number(train.get(key[len(TRAIN_PREFIX) :]))
    if key.startswith(EXACT_PREFIX):
        metrics, key = exact or {}, key[len(EXACT_PREFIX) :]
    value: Any = metrics
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return _number(value)


def collect_results(
    spec: StudySpec, runs: Iterable[PlannedRun], runs_root: Path
) -> tuple[list[RunResult], list[PlannedRun]]:
    """Results of the runs that have eval metrics, and the runs that have none."""
    results, missing = [], []
    keys = [m.key for m in spec.table.metrics] + [m.key for m in spec.plot_metrics]
    for run in runs:
        run_dir = runs_root / run.name
        metrics = read_json(run_dir / METRICS)
        if metrics is None:
            missing.append(run)
            continue
        values = {k: v for k, raw in metrics.items() if (v := _number(raw)) is not None}
        train = (
            _last_record(run_dir / "metrics.jsonl")
            if any(k.startswith(TRAIN_PREFIX) for k in keys)
            else {}
        )
        exact = (
            read_json(run_dir / EXACT) if any(k.startswith(EXACT_PREFIX) for k in keys) else None
        )
        for key in keys:
            if (value := metric_value(metrics, train, key, exact)) is not None:
                values[key] = value
        record = read_json(run_dir / "study.json") or {}
        seconds = [_number(record.get("train_seconds")), _number(record.get("eval_seconds"))]
        wall = None if None in seconds else round(sum(s for s in seconds if s is not None), 1)
        step = metrics.get("eval", {}).get("step")
        results.append(RunResult(run, values, step, metrics.get("n_samples"), wall))
    return results, missing


def write_csv(spec: StudySpec, results: Sequence[RunResult], path: Path) -> Path:
    """One row per run: axis values, row name, seed, steps, every scalar metric, wall time."""
    metric_keys: list[str] = []
    for result in results:
        metric_keys.extend(k for k in result.values if k not in metric_keys)
    head = [*spec.table_keys, SEED_KEY, "steps"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow([*head, *metric_keys, "wall_seconds"])
        for r in results:
            writer.writerow(
                [format_value(r.run.key(k)) for k in head[:-1]]
                + ["" if r.steps is None else r.steps]
                + [_csv_number(r.values.get(k)) for k in metric_keys]
                + ["" if r.wall_seconds is None else r.wall_seconds]
            )
    return path


def _csv_number(value: float | None) -> str:
    if value is None:
        return ""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


@dataclass(frozen=True)
class Cell:
    """The runs of one table cell: mean and CI half width per metric key."""

    row: tuple[str, ...]
    column: tuple[str, ...]
    n: int
    stats: dict[str, tuple[float, float]]


def cell_stats(spec: StudySpec, results: Sequence[RunResult]) -> list[Cell]:
    """Cells in plan order, with mean +- 95% CI half width of every table/plot metric."""
    row_keys, column_keys = spec.table_rows, spec.table.columns
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[RunResult]] = {}
    for result in results:
        key = (result.run.cell(row_keys), result.run.cell(column_keys))
        groups.setdefault(key, []).append(result)
    cells = []
    metric_keys = {m.key for m in spec.table.metrics} | {m.key for m in spec.plot_metrics}
    for (row, column), group in groups.items():
        stats = {}
        for key in metric_keys:
            values = [r.values[key] for r in group if key in r.values]
            if values:
                interval = mean_ci(values)
                stats[key] = (interval.mean, interval.half_width)
        cells.append(Cell(row, column, len(group), stats))
    return cells


def format_stat(stat: tuple[float, float] | None, decimals: int) -> str:
    if stat is None:
        return "–"
    mean, half = stat
    if math.isnan(half):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} ± {half:.{decimals}f}"


def value_label(spec: StudySpec, key: str, text: str) -> str:
    """How the table shows a key's value (``[table.labels]``, else the value itself)."""
    return spec.table.labels.get(key, {}).get(text, text)


def _header(spec: StudySpec, key: str) -> str:
    return spec.table.headers.get(key, "Variant" if key == ROW_KEY else key)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def table_lines(spec: StudySpec, cells: Sequence[Cell]) -> list[str]:
    """The Markdown table: row labels, n (seeds), then metric columns per column group."""
    row_keys, column_keys = spec.table_rows, spec.table.columns
    rows = list(dict.fromkeys(c.row for c in cells))
    columns = list(dict.fromkeys(c.column for c in cells))
    by_key = {(c.row, c.column): c for c in cells}
    metric_headers = []
    for column in columns:
        prefix = " ".join(
            f"{_header(spec, k)} = {value_label(spec, k, v)}"
            for k, v in zip(column_keys, column, strict=True)
        )
        metric_headers += [f"{prefix} {m.label}" if prefix else m.label for m in spec.table.metrics]
    header = [*(_header(spec, k) for k in row_keys), "n", *metric_headers]
    lines = ["| " + " | ".join(_escape(h) for h in header) + " |"]
    lines.append("|" + "|".join(":--" if i < len(row_keys) else "--:" for i in range(len(header))))
    lines[-1] += "|"
    previous: str | None = None
    for row in rows:
        labels = [value_label(spec, k, v) for k, v in zip(row_keys, row, strict=True)]
        if len(row_keys) > 1:  # the first key labels a group of rows, shown once
            shown = labels[0] if labels[0] != previous else ""
            previous, labels[0] = labels[0], shown
        counts = sorted({by_key[(row, c)].n for c in columns if (row, c) in by_key})
        n = "–".join(str(x) for x in dict.fromkeys(counts[:1] + counts[-1:])) or "–"
        body = [
            format_stat(
                by_key[(row, column)].stats.get(m.key) if (row, column) in by_key else None,
                m.decimals,
            )
            for column in columns
            for m in spec.table.metrics
        ]
        lines.append("| " + " | ".join(_escape(x) for x in [*labels, n, *body]) + " |")
    return lines


def machine_description() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return f"{cores}-core CPU"
    return f"{cores}-core CPU, {memory:.0f} GiB"


def markdown_report(
    spec: StudySpec,
    results: Sequence[RunResult],
    missing: Sequence[PlannedRun],
    plots: Sequence[tuple[MetricSpec | CurveSpec, str]],
    *,
    command: str,
) -> str:
    """table.md: what ran (command, machine, budget), the table, the plots."""
    cells = cell_stats(spec, results)
    steps = sorted({r.steps for r in results if r.steps is not None})
    samples = sorted({r.samples for r in results if r.samples is not None})
    walls = [r.wall_seconds for r in results if r.wall_seconds is not None]
    lines = [f"# {spec.title or spec.name}", ""]
    if spec.description:
        lines += [spec.description.strip(), ""]
    lines += [
        f"- Command: `{command}`",
        f"- Machine: {machine_description()}",
        f"- Date: {datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}",
        f"- Steps: {', '.join(map(str, steps)) or '–'} optimizer steps per run"
        + (" (WARNING: runs with different steps are mixed)" if len(steps) > 1 else ""),
        f"- Samples: N = {', '.join(map(str, samples)) or '–'} per run (temperature 1)",
        f"- Seeds: {', '.join(map(str, spec.seeds))}; {len(results)} runs with metrics"
        + (f", {len(missing)} missing: {', '.join(r.name for r in missing)}" if missing else ""),
    ]
    if walls:
        lines.append(
            f"- Wall time per run (train + eval): mean {sum(walls) / len(walls):.0f} s, "
            f"total {sum(walls) / 3600:.2f} h of run time"
        )
    lines += [
        "",
        f"Per-run values: [`{CSV_NAME}`]({CSV_NAME}). Cells: mean ± 95% CI over seeds",
        "(t-interval, mean ± t_{S-1,0.975} sd / sqrt(S); no ± with one seed); n: seeds.",
        "",
        *table_lines(spec, cells),
    ]
    if plots:
        lines += ["", "## Plots", ""]
        for metric, file in plots:
            lines += [f"![{metric.label}]({file})", ""]
    return "\n".join(lines).rstrip() + "\n"
