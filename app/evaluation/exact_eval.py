"""``raptb eval RUN_DIR --exact``: exact metrics of the run's sampler over the enumerated Y*.

For an enumerable task (its registry entry lists its solutions: Expr24) with one prompt, the
behaviour probability at temperature 1 of every solution is computed exactly
(``raptb.adapters.lm.exact``: same legal tokens, grammar and length rules as sampling, stop
included), then reduced to the exact metrics of ``raptb.core.metrics.exact``:
accuracy pi(Y*), pass@k = 1 - (1 - pi(Y*))^k, mass per length, the distance to p*, uniform on
Y* (the 0/1 reward): both KLs and the total variation, of pi restricted to Y* and of pi over all
texts; uniformity over Y*, the active modes holding 50% and 90% of the correct mass, and the
expected number of distinct solutions at N draws, at the evaluation's N and as a curve over
N = 64 ... 6,400. No sampling is done. When ``eval/metrics.json``
from the same checkpoint exists, its sampled estimates are compared with the exact values
(binomial 95% intervals; a conservative bound for the distinct count).

Output: ``RUN_DIR/eval/exact.json`` (the exact metrics, ``sampled`` when compared, and an
``eval`` entry with the checkpoint and timings) and ``RUN_DIR/eval/exact_diversity.png`` (the
distinct-solution curve and the correct-mass curve, app.evaluation.plots).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from raptb.adapters.lm.exact import exact_log_probs
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.threads import use_threads
from raptb.adapters.tasks.registry import TaskSpec, task_spec
from raptb.app.configuration.config import ConfigError
from raptb.app.evaluation.eval_run import (
    METRICS_FILE,
    EvalError,
    checkpoint_policy,
    load_run,
)
from raptb.app.evaluation.plots import plot_exact_diversity
from raptb.app.run_dir.checkpoint import checkpoint_step
from raptb.app.run_dir.durable import write_atomically
from raptb.app.run_dir.eval_folder import eval_dir
from raptb.app.task_and_policy import build_task
from raptb.core.metrics.exact import compare_with_sampled, exact_metrics
from raptb.core.ports import Task

EXACT_FILE = "exact.json"
EXACT_PLOT = "exact_diversity.png"


def exact_task_metrics(
    policy: HFPolicy,
    task: Task,
    *,
    draws: Sequence[int],
    sampled: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Exact metrics of ``policy``'s sampler on an enumerable ``task`` (module docstring).

    draws: the N values of the expected distinct count (the sampled N is added when ``sampled``
    is given). sampled: an ``expr24_metrics`` dict to compare with, or None. The dict also holds
    ``timings`` (seconds: trie, model, total).
    """
    spec = _require_enumerable(task)
    prompts = task.prompts()
    if len(prompts) != 1:
        raise EvalError(f"--exact: needs a single prompt, task {task.name!r} has {len(prompts)}")
    assert spec.solutions is not None  # _require_enumerable checked it
    solutions = spec.solutions(task)
    result = exact_log_probs(
        policy,
        prompts[0],
        solutions,
        min_length=task.min_length,
        max_length=task.max_length,
    )
    all_draws = sorted({*draws, *([int(sampled["n_samples"])] if sampled else [])})
    metrics = exact_metrics(
        result.log_prob, result.path_log_prob, result.path_length, draws=all_draws
    )
    if sampled is not None:
        metrics["sampled"] = compare_with_sampled(metrics, sampled)
    metrics["timings"] = {
        "trie_s": result.timings.trie_s,
        "model_s": result.timings.model_s,
        "total_s": result.timings.total_s,
    }
    return metrics


def _require_enumerable(task: Task) -> TaskSpec:
    """The task's registry entry, or EvalError when its solution set cannot be enumerated."""
    spec = task_spec(task.name)
    if not spec.enumerable:
        raise EvalError(f"--exact: task {task.name!r} has no enumerable solution set")
    return spec


def _sampled_metrics(out: Path, checkpoint: str) -> dict[str, Any] | None:
    """The sampled eval's metrics when they exist and come from ``checkpoint``."""
    path = out / METRICS_FILE
    if not path.is_file():
        return None
    sampled = json.loads(path.read_text(encoding="utf-8"))
    if sampled.get("eval", {}).get("checkpoint") != checkpoint:
        return None  # a stale evaluation of another checkpoint says nothing about this one
    if not {"acc", "n_samples", "cov_count"} <= sampled.keys():
        return None  # not the solution-set metrics the comparison needs
    return sampled


def exact_evaluate(run_dir: Path, *, draws: Sequence[int] | None = None) -> dict[str, Any]:
    """Exact metrics of the latest checkpoint of ``run_dir``, written to eval/exact.json.

    draws: N values of the expected distinct count, default the run's ``eval_samples``.
    Raises EvalError (not a run, no checkpoint, task not enumerable) or ConfigError.
    """
    run_dir = Path(run_dir)
    config, checkpoint = load_run(run_dir)
    if config.threads is not None:
        use_threads(config.threads)
    task = build_task(config)
    _require_enumerable(task)  # before loading a model for nothing
    policy = checkpoint_policy(config, checkpoint, task)
    out = eval_dir(run_dir)
    metrics = exact_task_metrics(
        policy,
        task,
        draws=[config.eval_samples] if draws is None else draws,
        sampled=_sampled_metrics(out, checkpoint.name),
    )
    metrics["eval"] = {
        "checkpoint": checkpoint.name,
        "step": checkpoint_step(checkpoint),
        "model": config.model,
        "temperature": 1.0,
    }
    out.mkdir(exist_ok=True)
    write_atomically(out / EXACT_FILE, json.dumps(metrics, indent=2) + "\n")
    plot_exact_diversity(metrics, out / EXACT_PLOT)
    return metrics


def print_exact_summary(metrics: dict[str, Any]) -> None:
    """A short table: exact values, and the sampled estimates with their intervals if any."""
    sampled = metrics.get("sampled")
    table = Table(title=f"Exact evaluation of {metrics['eval']['checkpoint']}")
    for column in ("metric", "exact", *(("sampled", "95% interval", "ok") if sampled else ())):
        table.add_column(column, justify="left" if column == "metric" else "right")

    def row(name: str, exact: float, check: dict[str, Any] | None) -> None:
        cells = [name, f"{exact:.4g}"]
        if sampled:
            if check is None:
                cells += ["", "", ""]
            else:
                lo, hi = check["interval"]
                cells += [f"{check['sampled']:.4g}", f"[{lo:.4g}, {hi:.4g}]", _ok(check["inside"])]
        table.add_row(*cells)

    row("acc = pi(Y*)", metrics["acc"], sampled["acc"] if sampled else None)
    for length, mass in metrics["mass_by_length"].items():
        row(f"mass, length {length}", mass, sampled["mass_by_length"][length] if sampled else None)
    for name, key in (
        ("KL(p* || pi|Y*)", "kl_target_pi"),
        ("KL(pi|Y* || p*)", "kl_pi_target"),
        ("KL(p* || pi), all texts", "kl_target_pi_all"),
        ("TV(pi|Y*, p*)", "tv_target_pi"),
        ("TV(pi, p*), all texts", "tv_target_pi_all"),
        ("uniformity H(pi|Y*) / log|Y*|", "uniformity"),
    ):
        row(name, metrics[key], None)
    for k, value in metrics["pass_at_k"].items():
        row(f"pass@{k} = 1 - (1 - acc)^k", value, None)
    for share, count in metrics["active_modes"].items():
        table.add_row(
            f"active modes, {share}% of pi(Y*)", f"{count:,}", *([""] * 3 * bool(sampled))
        )
    for n, expected in metrics["expected_distinct"].items():
        cells = [f"E distinct, N={n}", f"{expected:.2f}"]
        if sampled:
            distinct = sampled["distinct"]
            if str(sampled["n_samples"]) == n:
                sd = metrics["distinct_sd_bound"][n]
                cells += [
                    f"{distinct['sampled']}",
                    f"sd <= {sd:.2f}",
                    _ok(distinct["inside"]),
                ]
            else:
                cells += ["", "", ""]
        table.add_row(*cells)
    for n, expected in metrics["target_expected_distinct"].items():
        table.add_row(
            f"E distinct, N={n}, sampling p*", f"{expected:.2f}", *([""] * 3 * bool(sampled))
        )
    console = Console()
    console.print(table)
    curve = ", ".join(
        f"{n}: {metrics['distinct_curve'][n]:.0f} ({metrics['target_distinct_curve'][n]:.0f})"
        for n in metrics["distinct_curve"]
    )
    console.print(f"E distinct at N (target in brackets): {curve}")
    console.print(f"exact evaluation took {metrics['timings']['total_s']:.1f} s")


def _ok(inside: bool) -> str:
    return "yes" if inside else "NO"


def exact_command(run_dir: Path, *, json_output: bool) -> None:
    """``raptb eval RUN_DIR --exact``: run, then print exact.json or the summary table."""
    try:
        metrics = exact_evaluate(run_dir)
    except (EvalError, ConfigError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_output:
        typer.echo((eval_dir(run_dir) / EXACT_FILE).read_text(encoding="utf-8"), nl=False)
    else:
        print_exact_summary(metrics)
