"""A study's report (runs.csv, table.md, plots) from per-run values already written, for a study
whose runs ran at different times or in different folders.

Usage (from the repository root):

    python benchmarks/study_table.py studies/NAME.toml --runs A/runs.csv B/runs.csv \
        --out benchmarks/results/NAME

``raptb study`` writes its report from the run folders under its ``--out``; a study extended by
rows or seeds later (or one whose run folders are gone while their ``runs.csv`` is committed) has
its runs' values in several ``runs.csv`` files. This reads them (a later file's run replaces an
earlier file's run of the same cell and seed), matches each row to the study's planned runs, and
writes the same report ``raptb study --report-only`` would, its header saying where the values
came from instead of one machine and date (each file's own table.md, in git history, has those).
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from pathlib import Path

from raptb.app.study.plan import SEED_KEY, format_value, plan_study
from raptb.app.study.plots import plot_file, plot_metric
from raptb.app.study.report import CSV_NAME, TABLE_NAME, RunResult, markdown_report, write_csv
from raptb.app.study.spec import load_study

NOT_METRICS = {SEED_KEY, "steps", "wall_seconds"}


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def merged_results(study: Path, paths: list[Path]) -> tuple[list[RunResult], list[str]]:
    """The study's runs found in ``paths`` (in plan order) and the names of those not found."""
    spec = load_study(study)
    planned = plan_study(spec, str(study))
    keys = list(spec.table_keys)
    found: dict[tuple[str, ...], dict[str, str]] = {}
    for path in paths:
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                found[(*(row.get(k, "") for k in keys), row[SEED_KEY])] = row
    results, missing = [], []
    for run in planned:
        row = found.get((*(format_value(run.key(k)) for k in keys), str(run.seed)))
        if row is None:
            missing.append(run.name)
            continue
        values = {
            k: v
            for k, text in row.items()
            if k not in NOT_METRICS and k not in keys and (v := _float(text)) is not None
        }
        steps = int(row["steps"]) if row.get("steps") else None
        samples = int(values["n_samples"]) if "n_samples" in values else None
        wall = _float(row.get("wall_seconds", ""))
        results.append(RunResult(run, values, steps, samples, wall))
    return results, missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("--runs", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    spec = load_study(args.study)
    results, missing = merged_results(args.study, args.runs)
    args.out.mkdir(parents=True, exist_ok=True)
    # read every input before writing: --out's own runs.csv may be one of them
    write_csv(spec, results, args.out / CSV_NAME)
    plots = []
    for metric in spec.plot_metrics if results else []:
        plot_metric(spec, results, metric, args.out / plot_file(metric))
        plots.append((metric, plot_file(metric)))
    command = shlex.join(["python", "benchmarks/study_table.py", *sys.argv[1:]])
    text = markdown_report(spec, results, [], plots, command=command)
    sources = ", ".join(f"`{p}`" for p in args.runs)
    lines = []
    for line in text.splitlines():
        if line.startswith("- Machine:"):
            line = f"- Runs merged from {sources}: each file's table.md (in git history) names its"
            line += " machine and date"
        elif line.startswith("- Seeds:") and missing:
            line += f", {len(missing)} missing: {', '.join(missing)}"
        lines.append(line)
    (args.out / TABLE_NAME).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{len(results)} runs ({len(missing)} missing) -> {args.out / TABLE_NAME}")


if __name__ == "__main__":
    main()
