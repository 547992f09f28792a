"""``raptb eval``: the command line of the evaluation (``app.evaluation.evaluate``), its options
and its summary table.

Light to import (no torch, no model, no plotting): ``raptb --help`` builds every command's
options without loading what the commands run; the evaluation is imported when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from raptb.adapters.tasks.registry import TaskSpec, task_names, task_spec
from raptb.app.evaluation.eval_defaults import DEFAULT_BATCH_SIZE


def _samples_help() -> str:
    defaults = ", ".join(
        f"{name} {task_spec(name).eval_samples}{' per prompt' * task_spec(name).eval_per_prompt}"
        for name in task_names()
    )
    return f"Number of samples N. Default: the run's eval_samples, else the task's ({defaults})."


def eval_command(
    run_dir: Annotated[
        Path, typer.Argument(help="Run directory (holds config.toml and checkpoints/).")
    ],
    samples: Annotated[
        int | None,
        typer.Option(help=_samples_help()),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampling generator.")] = 0,
    batch_size: Annotated[
        int, typer.Option(help="Rows sampled in lock step per chunk (changes the draw).")
    ] = DEFAULT_BATCH_SIZE,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="Sampling temperature. Default: the run's training temperature (rl.temperature "
            "for --loss grpo|ppo, 1 for the GFlowNet objectives)."
        ),
    ] = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print metrics.json to stdout instead of a table.")
    ] = False,
    exact: Annotated[
        bool,
        typer.Option(
            "--exact",
            help="Instead of sampling, compute exact metrics over the enumerated solutions "
            "(Expr24) and compare them with eval/metrics.json if present: eval/exact.json.",
        ),
    ] = False,
) -> None:
    """Sample the run's latest checkpoint at its training temperature; write samples, metrics and
    plots.

    Outputs go to RUN_DIR/eval/: samples.jsonl, metrics.json and PNG plots.
    """
    # the evaluation itself (torch, the model, the plots) is imported when the command runs
    from raptb.app.configuration.config import ConfigError
    from raptb.app.distribution.distributed import dist_rank, leave_process_group
    from raptb.app.evaluation.eval_run import METRICS_FILE, EvalError
    from raptb.app.evaluation.evaluate import evaluate
    from raptb.app.evaluation.exact_eval import exact_command
    from raptb.app.run_dir.eval_folder import eval_dir
    from raptb.app.run_dir.run_config import CONFIG_FILE, load_config

    if exact:
        return exact_command(run_dir, json_output=json_output)
    try:
        metrics = evaluate(
            run_dir, samples=samples, seed=seed, batch_size=batch_size, temperature=temperature
        )
        leave_process_group()
    except (EvalError, ConfigError) as exc:
        if dist_rank() == 0:
            typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if dist_rank() != 0:
        return None  # rank 0 reports
    out = eval_dir(run_dir)
    if json_output:
        typer.echo((out / METRICS_FILE).read_text(encoding="utf-8"), nl=False)
    else:
        task = load_config(run_dir / CONFIG_FILE).task  # evaluate() has validated it
        _print_summary(metrics, out, task_spec(task))


def _print_summary(metrics: dict[str, Any], out: Path, spec: TaskSpec) -> None:
    table = Table(title=f"Evaluation of {metrics['eval']['checkpoint']} (N={metrics['n_samples']})")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in spec.headline:
        table.add_row(key, _cell(metrics[key]))
    for k, value in metrics["pass_at_k"].items():
        table.add_row(f"pass@{k}", "n < k" if value is None else _cell(value))
    if metrics["vendi"] is not None:
        table.add_row("vendi", _cell(metrics["vendi"]))
    console = Console()
    console.print(table)
    if spec.length_table:
        lengths = Table(title="Valid samples by length")
        for column in ("length", *spec.length_table):
            lengths.add_column(column, justify="right")
        for n, cells in metrics["by_length"].items():
            lengths.add_row(n, *(_cell(cells[column]) for column in spec.length_table))
        console.print(lengths)
    if "n_solutions" in metrics:
        console.print(_solution_context(metrics))
    console.print(f"wrote {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")


def _solution_context(metrics: dict[str, Any]) -> str:
    """The coverage figures beside what the target would give at the same N (Expr24)."""
    n, found, total = metrics["n_samples"], metrics["cov_count"], metrics["n_solutions"]
    return (
        f"found {found:,} of the {total:,} solutions in N = {n:,} samples "
        f"(NormCov {metrics['norm_cov']:.3f}); sampling the target (uniform over the solutions) "
        f"would find {metrics['target_unique']:,.0f} in expectation (NormCov "
        f"{metrics['target_norm_cov']:.3f})"
    )


def _cell(value: float) -> str:
    """Counts with thousands separators, rates with four decimals."""
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"
