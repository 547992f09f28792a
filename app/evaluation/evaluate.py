"""``raptb eval RUN_DIR``: sample the trained policy, score the samples, write metrics and plots.

Protocol (metrics.md): N i.i.d. samples from the run's latest checkpoint at the run's training
temperature (1 for the GFlowNet objectives, ``rl.temperature`` for ``--loss grpo|ppo``: TRL's
defaults 1.0 and 0.7; ``temperature`` overrides it) with the training constraints (the task's
legal tokens, grammar and min/max length), drawn in chunks of ``batch_size`` rows with one
``torch.Generator`` seeded by ``seed``. The same checkpoint, seed, N, batch size and temperature
give the same samples; a different batch size gives a different (equally valid)
draw, because rows of a chunk share the generator in lock step.

Launched on several processes (``accelerate launch -m raptb eval RUN_DIR``), rank r samples
chunks r, r + world, ... with the generator seeded by
``app.distribution.distributed.sampling_seed(seed, r)``; the rows are gathered in chunk order (each
tagged with its ``rank``), so N is the same total, and rank 0 alone computes the metrics and
writes. One process draws exactly what it always drew.

Outputs under ``RUN_DIR/eval/``:

    samples.jsonl   one object per sample: prompt, text, tokens (ids before the stop), length
                    (tau), valid (the text is well-formed), correct (the task's success, from
                    its spec: Expr24 valid and equal to 24, other tasks valid), score (S(x)),
                    log_pterm_stop
                    (= log_pterm[tau]; for CommonGen also ref_log_pterm_stop, the reference
                    model's), and per step log_pf [tau], log_pterm [tau+1] (raw,
                    untempered model log-probs) and u [tau+1] (the task part lambda * S of the
                    per-prefix log-reward; the reference term kappa * log P_ref is not
                    recomputed), so every metric can be recomputed offline
    metrics.json    the task spec's metrics of the samples (Expr24: against the enumerated Y*;
                    SMILES: with ``molecule`` and ``canonical`` added to each sample), the
                    metrics every task gets (``pass_at_k`` for k = 1, 8, 64, 256 and ``vendi``,
                    app.evaluation.task_neutral), plus an ``eval`` entry saying which
                    checkpoint, seed and batch size produced them
    *.png           length histogram of correct samples, prefix diagnostics by depth, score by
                    length, pass@k against k, the spec's per-length plots, and training curves
                    when the run has a ``metrics.jsonl``

The metrics also go to the run's experiment trackers (``report_to``, app.run_dir.trackers) at the
checkpoint's step.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from raptb.adapters.lm.threads import use_threads
from raptb.adapters.tasks.registry import TaskSpec, task_spec
from raptb.app.configuration.config import TrainConfig
from raptb.app.distribution.distributed import DistContext
from raptb.app.evaluation.eval_defaults import DEFAULT_BATCH_SIZE
from raptb.app.evaluation.eval_run import (
    METRICS_FILE,
    EvalError,
    checkpoint_policy,
    load_run,
    training_temperature,
)
from raptb.app.evaluation.eval_sampling import add_reference_pterm, sample_rows
from raptb.app.evaluation.plots import (
    plot_length_histogram,
    plot_metric_by_length,
    plot_pass_at_k,
    plot_prefix_diagnostics,
    plot_score_by_length,
    plot_training_curves,
)
from raptb.app.evaluation.task_neutral import task_neutral_metrics
from raptb.app.reward.prefix import PrefixScorer
from raptb.app.reward.schedule import RewardSchedule
from raptb.app.run_dir.checkpoint import checkpoint_step
from raptb.app.run_dir.durable import write_atomically
from raptb.app.run_dir.eval_folder import eval_dir
from raptb.app.run_dir.run_config import CONFIG_FILE, load_config
from raptb.app.run_dir.run_log import log_path
from raptb.app.run_dir.trackers import Trackers
from raptb.app.task_and_policy import build_policy, build_task
from raptb.core.ports import Task

SAMPLES_FILE = "samples.jsonl"


def _write_plots(
    run_dir: Path, out: Path, spec: TaskSpec, rows: list[dict[str, Any]], metrics: dict[str, Any]
) -> None:
    correct_lengths = [r["length"] for r in rows if r["correct"]]
    plot_length_histogram(
        correct_lengths, out / "length_histogram.png", title="Correct samples by length"
    )
    plot_prefix_diagnostics(metrics["prefix"], out / "prefix_diagnostics.png")
    plot_score_by_length(
        [r["length"] for r in rows], [r["score"] for r in rows], out / "score_by_length.png"
    )
    plot_pass_at_k(metrics["pass_at_k"], out / "pass_at_k.png")
    for key, title in spec.length_plots:
        plot_metric_by_length(metrics["by_length"], key, out / f"{key}_by_length.png", title=title)
    log = log_path(run_dir)
    if log.is_file():
        plot_training_curves(log, out / "training_curves.png")


def evaluate(
    run_dir: Path,
    *,
    samples: int | None = None,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    temperature: float | None = None,
    progress: bool = True,
    dist: DistContext | None = None,
) -> dict[str, Any]:
    """Evaluate the latest checkpoint of ``run_dir``; write samples, metrics and plots.

    dist: the processes sharing the sampling (default: from the launcher's environment); rank 0
        writes, every rank returns the metrics.

    samples: N, default the run's ``eval_samples`` (else the task's default); per prompt for a
    task whose spec sets ``eval_per_prompt`` (CommonGen). Returns the dict
    written to metrics.json.
    temperature: the sampling temperature; None: the run's training temperature
    (``training_temperature``). The recorded log-probs are untempered either way.
    When the run's config sets ``threads``, torch's (process-wide) thread count is set to it.

    Raises:
        EvalError: ``run_dir`` is not a run directory, has no checkpoint, the checkpoint cannot
            be loaded, ``samples``/``batch_size`` < 1 or ``temperature`` not > 0.
        ConfigError: the run's config.toml is invalid.
    """
    run_dir = Path(run_dir)
    if samples is not None and samples < 1:
        raise EvalError(f"samples: must be >= 1, got {samples}")
    if batch_size < 1:
        raise EvalError(f"batch_size: must be >= 1, got {batch_size}")
    if temperature is not None and not (math.isfinite(temperature) and temperature > 0):
        raise EvalError(f"temperature: must be finite and > 0, got {temperature}")
    dist = DistContext.from_accelerate() if dist is None else dist
    # rank 0 checks the run and chooses the checkpoint; the others read the config it validated
    checkpoint = dist.on_main(lambda: load_run(run_dir)[1])
    config = load_config(run_dir / CONFIG_FILE)
    if config.threads is not None:
        # the run's own thread setting: on a few shared cores a small model samples several times
        # faster on one thread than on all of them
        use_threads(config.threads)
    spec = task_spec(config.task)
    task = build_task(config)
    policy = checkpoint_policy(config, checkpoint, task, device=dist.device)
    # u of the target the schedules end at (lambda_end / T_R,end): what the sampler was trained
    # towards, not the schedule's start
    final = RewardSchedule(config.reward, config.schedule_horizon).at(config.schedule_horizon)
    scorer = PrefixScorer(task, policy, final.scale)
    n = config.eval_sample_count if samples is None else samples
    temperature = training_temperature(config) if temperature is None else temperature
    rows = sample_rows(
        policy,
        task,
        spec,
        scorer,
        samples=n,
        seed=seed,
        batch_size=batch_size,
        temperature=temperature,
        progress=progress,
        dist=dist,
    )
    if spec.reference_pterm and dist.is_main:
        adapter = bool(config.lora.rank)
        reference = (
            policy
            if adapter
            else build_policy(
                config.model,
                task,
                config.seed,
                device=dist.device,
                tiny=config.tiny,
                dtype=config.model_dtype,
            )
        )
        add_reference_pterm(rows, reference, adapter=adapter, batch_size=batch_size)
    drawn = {"seed": seed, "batch_size": batch_size, "temperature": temperature}
    return dist.on_main(
        lambda: _write_eval(run_dir, checkpoint, config, spec, task, rows, drawn, dist.world_size)
    )


def _write_eval(
    run_dir: Path,
    checkpoint: Path,
    config: TrainConfig,
    spec: TaskSpec,
    task: Task,
    rows: list[dict[str, Any]],
    drawn: dict[str, Any],
    processes: int,
) -> dict[str, Any]:
    """The metrics of ``rows`` (drawn with the ``seed``, ``batch_size`` and ``temperature`` of
    ``drawn``), written with the samples and plots to ``run_dir``/eval."""
    metrics = spec.metrics(task, rows)
    metrics.update(task_neutral_metrics(task, spec, rows, seed=drawn["seed"]))
    metrics["eval"] = {
        "checkpoint": checkpoint.name,
        "step": checkpoint_step(checkpoint),
        "model": config.model,
        **drawn,
    }
    if processes > 1:
        metrics["eval"]["processes"] = processes
    out = eval_dir(run_dir)
    out.mkdir(exist_ok=True)
    write_atomically(out / SAMPLES_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    write_atomically(out / METRICS_FILE, json.dumps(metrics, indent=2) + "\n")
    _write_plots(run_dir, out, spec, rows, metrics)
    if config.trackers:
        dumped = config.model_dump(mode="json", exclude_none=True)
        with Trackers.open(config.trackers, run_dir, dumped) as trackers:
            trackers.log_eval(metrics, metrics["eval"]["step"])
    return metrics
