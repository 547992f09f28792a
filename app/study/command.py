"""``raptb study STUDY.toml``: plan, run (resumably, in parallel), and report a study.

Output under ``--out`` (default ``runs/studies/<study name>/``): ``runs/<run name>/`` (one run
directory per run), ``runs.csv``, ``table.md`` and one PNG per plotted metric.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from raptb.app.study.plan import PlannedRun, format_value, plan_study, select_runs
from raptb.app.study.plots import curve_file, plot_curve, plot_file, plot_metric
from raptb.app.study.report import (
    CSV_NAME,
    TABLE_NAME,
    collect_results,
    markdown_report,
    write_csv,
)
from raptb.app.study.run import Failure, RunTask, StudyRunner
from raptb.app.study.spec import StudyError, StudySpec, load_study
from raptb.app.study.state import run_state

_err = Console(stderr=True, highlight=False)


def _fail(message: str) -> typer.Exit:
    _err.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code=2)


def plan_tasks(
    spec: StudySpec, runs: list[PlannedRun], runs_root: Path, *, resume: bool
) -> list[RunTask]:
    """Each run with its directory, evaluation settings and what its directory still needs."""
    tasks = []
    for run in runs:
        samples = spec.eval.samples or run.config.eval_sample_count
        seed = run.seed if spec.eval.seed is None else spec.eval.seed
        run_dir = runs_root / run.name
        state = run_state(run.config, run_dir, samples, seed, resume=resume, exact=spec.eval.exact)
        tasks.append(RunTask(run, run_dir, state, samples, seed, exact=spec.eval.exact))
    return tasks


def write_report(
    spec: StudySpec, runs: list[PlannedRun], out: Path, command: str
) -> tuple[int, int]:
    """runs.csv, plots and table.md from the runs' directories; (with metrics, missing)."""
    results, missing = collect_results(spec, runs, out / "runs")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(spec, results, out / CSV_NAME)
    plots = []
    if results:
        for metric in spec.plot_metrics:
            plot_metric(spec, results, metric, out / plot_file(metric))
            plots.append((metric, plot_file(metric)))
        for curve in spec.table.curves:
            plot_curve(spec, results, curve, out / curve_file(curve), out / "runs")
            plots.append((curve, curve_file(curve)))
    text = markdown_report(spec, results, missing, plots, command=command)
    (out / TABLE_NAME).write_text(text, encoding="utf-8")
    return len(results), len(missing)


def _print_plan(tasks: list[RunTask]) -> None:
    width = max(len(t.run.name) for t in tasks)
    for task in tasks:
        overrides = ", ".join(f"{k} = {format_value(v)}" for k, v in task.run.overrides.items())
        at = f" (checkpoint {task.state.step})" if task.state.step is not None else ""
        line = f"{task.run.name:{width}s}  {task.state.action}{at}  {overrides} {task.state.reason}"
        _err.print(escape(line.rstrip()), soft_wrap=True)
    counts: dict[str, int] = {}
    for task in tasks:
        counts[task.state.action] = counts.get(task.state.action, 0) + 1
    _err.print(f"{len(tasks)} runs: " + ", ".join(f"{n} {a}" for a, n in counts.items()))


def study_command(
    study: Annotated[Path, typer.Argument(help="Study file (TOML); see docs/studies.md.")],
    workers: Annotated[
        int,
        typer.Option(
            help="Runs at a time (threads: cores // workers, or the run's own when fewer)."
        ),
    ] = 1,
    out: Annotated[
        Path | None, typer.Option(help="Output folder. (default: runs/studies/<study name>)")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue interrupted runs from their checkpoint (else restart them)."),
    ] = False,
    only: Annotated[
        list[str] | None,
        typer.Option(
            help="Only runs matching KEY=VALUE[,KEY=VALUE] (KEY: axis path, row or seed); "
            "repeat to add more."
        ),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print the plan, start nothing.")] = False,
    report_only: Annotated[
        bool, typer.Option(help="Write runs.csv, table.md and plots from existing runs.")
    ] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Run a study (axes x rows x seeds), evaluate each run, report mean ± 95% CI per cell."""
    if workers < 1:
        raise _fail(f"--workers: must be >= 1, got {workers}")
    try:
        spec = load_study(study)
        planned = plan_study(spec, str(study))
        runs = select_runs(planned, only or [])
    except StudyError as exc:
        raise _fail(str(exc)) from None
    out = out or Path("runs") / "studies" / str(spec.name)
    flags = [f"--workers={workers}", *(f"--only={o}" for o in only or [])]
    command = shlex.join(["raptb", "study", str(study), *flags])
    failures: list[Failure] = []
    if not report_only:
        tasks = plan_tasks(spec, runs, out / "runs", resume=resume)
        if dry_run:
            _print_plan(tasks)
            return
        conflicts = [t for t in tasks if t.state.action == "conflict"]
        for task in conflicts:
            _err.print(escape(f"conflict: {task.run_dir} {task.state.reason}"), soft_wrap=True)
        if conflicts:
            raise _fail(
                "runs of another configuration, or still being written, are in the way; use "
                "another --out, or wait for them"
            )
        todo = [t for t in tasks if t.state.action != "done"]
        if not todo:
            _err.print(f"nothing to run ({len(tasks)}/{len(tasks)} runs done)")
        else:
            _err.print(
                f"{len(todo)} runs to do ({len(tasks) - len(todo)} done), {workers} at a time"
            )
            runner = StudyRunner(workers, _err, progress=progress)

            def report(task: RunTask, failure: Failure | None) -> None:
                what = "failed" if failure else "done"
                note = f": {failure.reason}" if failure else ""
                _err.print(escape(f"{what} {task.run.name}{note}"), soft_wrap=True)

            runner.run(todo, report)
            failures = runner.failures
            if runner.stopping.is_set():
                _err.print("stopped; run the same command again (with --resume) to continue")
                raise typer.Exit(code=130)
    # the report covers the whole study, also when --only ran a part of it
    count, missing = write_report(spec, planned, out, command)
    _err.print(f"report: {count} runs ({missing} missing) -> {out / TABLE_NAME}, {out / CSV_NAME}")
    if failures:
        for failure in failures:
            _err.print(escape(f"failed {failure.name}: {failure.reason}"), soft_wrap=True)
        _err.print(f"{len(failures)} of {len(planned)} runs failed")
        raise typer.Exit(code=1)
